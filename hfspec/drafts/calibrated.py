"""The calibrated draft kind: GPTQ codes in RTN's format (`gptq4`, `gptq3-g64`, `gptq4-top0`, `gptq4-compiled`).

Same bytes and the same step as `rtnB-gN` (the lean step, the int4 kernel, the compiled step, the head's top-K
re-scoring), but its codes come from `hfspec.quant.calibrate`: the target writes its own calibration text and
each matrix is quantised so that its outputs, not its weights, stay close (`hfspec.quant.gptq`). On weights that
were never on a 4-bit grid this is what keeps the draft's acceptance up (benchmarks/bench_calibrated.py).

Calibrating takes seconds to minutes, so the codes are cached on disk (`CALIBRATION_DIR`), keyed by a digest of
the target's weights, the bits, the group size and the calibration settings: a cache entry for other weights or
settings is never used, and an entry is written to a temporary file and renamed into place, so an interrupted or
out-of-disk calibration leaves nothing half-written (the draft is still built; only the caching is skipped).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from hfspec.attrs import CALIBRATION, set_attr
from hfspec.drafts.registry import DraftKind, DraftSpec
from hfspec.drafts.rtn import GroupSpecs, make_rtn_draft
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.kernels import fast_linear
from hfspec.quant.calibrate import (
    CAPTURE_BYTES,
    Calibration,
    Coded,
    calibrate,
    calibration_matrices,
    default_calibration,
)
from hfspec.quant.packing import pack_rows, unpack_rows

GPTQ_BITS = (2, 8)
FORMAT = 4  # the cache file's layout and the algorithm's version: a change makes older entries unused (3: the text
# and the Hessians' forwards run on oneDNN-prepacked weights, `_prepacked`, which rounds differently; 4: the
# Hessians come from the inputs captured while the text is written, which round differently again)
PREPACK_MARGIN = 2 << 30  # memory left free beyond twice the prepacked copy, or calibration runs on the weights as
# they are (the copy, and the calibration's own working memory: 6.3 GB at the 1.7B shape, about the weights again)
CAPTURE_MARGIN = 3 << 30  # memory left free beyond the inputs captured while the text is written (for GPTQ's
# sweeps and the Hessians held: at the 1.7B shape those inputs are 5.7 GB), else forwards take them after the text
CALIBRATION_DIR = Path(os.environ.get("HFSPEC_CALIBRATION_DIR", Path.home() / ".cache" / "hfspec" / "calibrated"))


def weights_digest(model: nn.Module) -> str:
    """A digest of the model's class, parameter names, shapes, dtypes and bytes (tied parameters once): each
    tensor's bytes by SHA-256 (the CPU's SHA instructions: 2.4x blake2b's speed here), two at a time on threads
    (hashlib lets go of the GIL), then those digests and the names in one blake2b. At the 1.7B shape 7.7 s became
    about 2 s."""
    h = hashlib.blake2b(digest_size=16)
    h.update(type(model).__name__.encode())
    seen, tensors = set(), []
    for name, p in model.named_parameters(remove_duplicate=False):
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            tensors.append(p)
    with ThreadPoolExecutor(max(1, min(2, torch.get_num_threads()))) as pool:
        for digest in pool.map(_bytes_digest, tensors):
            h.update(digest)
    return h.hexdigest()


def _bytes_digest(p: torch.Tensor) -> bytes:
    t = p.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).reshape(-1).numpy().data if t.numel() else b"").digest()


def cache_path(model: nn.Module, bits: int, group_size: int, settings: Calibration, folder: Path | None = None) -> Path:
    """Where the codes of `model` at these settings are cached."""
    key = hashlib.blake2b(f"{weights_digest(model)}|gptq{bits}-g{group_size}|{settings.key()}|v{FORMAT}".encode(),
                          digest_size=16).hexdigest()
    return Path(folder or CALIBRATION_DIR) / f"gptq{bits}-g{group_size}-{key}.safetensors"


def calibrated_codes(model: nn.Module, bits: int, group_size: int, settings: Calibration | None = None,
                     progress=None, folder: Path | None = None) -> tuple[dict[str, Coded], str]:
    """GPTQ codes of every matrix of `model` by module name, from the cache or calibrated now (and cached);
    also says where they came from ("cache: PATH", "calibrated in N s, cached: PATH" or "... not cached: why")."""
    say = progress or (lambda message: None)
    settings = settings or default_calibration(model)
    path = cache_path(model, bits, group_size, settings, folder)
    names = list(calibration_matrices(model))
    if path.exists():
        try:
            codes = _read(path, model, names, bits, group_size)
            say(f"calibrated draft: loaded from {path}")
            return codes, f"cache: {path}"
        except Exception as why:  # noqa: BLE001 - a damaged entry (any reader error) is replaced, never used
            warnings.warn(f"calibration cache entry {path} is unusable ({why}); calibrating again", stacklevel=2)
    began = time.perf_counter()
    with memory.kept_heap(), _prepacked(model, settings, say) as release:  # (many large temporaries: see kept_heap)
        free = memory.available_bytes()
        budget = CAPTURE_BYTES if free is None else max(0, free - CAPTURE_MARGIN)
        codes = calibrate(model, bits, group_size, settings, names, progress, budget, release)
    spent = time.perf_counter() - began
    try:
        _write(path, model, codes, bits, group_size, settings)
        where = f"calibrated in {spent:.0f} s, cached: {path}"
    except OSError as why:
        warnings.warn(f"calibrated draft not cached ({why}); the next build calibrates again", stacklevel=2)
        where = f"calibrated in {spent:.0f} s, not cached: {why}"
    say(f"calibrated draft: {where}")
    return codes, where


@contextlib.contextmanager
def _prepacked(model: nn.Module, settings: Calibration, say):
    """The model's fp32 CPU linears oneDNN-prepacked while it calibrates (`hfspec.kernels.fast_linear`): at 64 rows,
    the self-sampled text's batch, oneDNN's product took 0.41-0.65x MKL's at SmolLM2-1.7B's shapes (3 December,
    2-core EPYC), and the Hessians' forwards gain too. Skipped where it would not help or is not safe: no oneDNN,
    a model already prepacked (it stays so), `sequential` (its weights are swapped under the linears), or less
    memory free than twice the copy plus PREPACK_MARGIN (at the 1.7B shape the peak rose from 13.1 to 19.5 GiB with
    it). Unpacked again after, also on an error."""
    needed = fast_linear.unpacked_bytes(model)
    free = memory.available_bytes()
    if (not needed or settings.sequential or not fast_linear.available() or fast_linear.prepacked_bytes(model)
            or (free is not None and free < 2 * needed + PREPACK_MARGIN)):
        yield lambda: None
        return
    added = fast_linear.prepack(model)
    say(f"calibrating on oneDNN-prepacked weights ({memory.gib(added)} for the calibration)")
    try:
        yield lambda: fast_linear.unprepack(model)  # (early, once no forward is left: the copy's memory is free)
    finally:
        fast_linear.unprepack(model)


def _write(path: Path, model: nn.Module, codes: dict[str, Coded], bits: int, group_size: int,
           settings: Calibration) -> None:
    """Write the codes (packed at `bits`) to a temporary file beside `path`, then rename it into place."""
    from safetensors.torch import save_file

    owner: dict[int, str] = {}
    for name, coded in codes.items():
        owner.setdefault(id(coded), name)
    tensors = {}
    for name in dict.fromkeys(owner.values()):
        c = codes[name]
        tensors.update({f"{name}.packed": pack_rows(c.q, bits), f"{name}.scale": c.scale.contiguous(),
                        f"{name}.zero": c.zero.contiguous()})
    meta = {"format": str(FORMAT), "bits": str(bits), "group_size": str(group_size), "settings": settings.key(),
            "owners": json.dumps({name: owner[id(c)] for name, c in codes.items()})}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path, model: nn.Module, names: list[str], bits: int, group_size: int) -> dict[str, Coded]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != str(FORMAT) or meta.get("bits") != str(bits) or meta.get("group_size") != str(group_size):
            raise ValueError("written by another format or for other settings")
        owners = json.loads(meta["owners"])
        if sorted(owners) != sorted(names):
            raise ValueError("its matrices are not this model's")
        unique = {}
        for owner in set(owners.values()):
            w = model.get_submodule(owner).weight
            k = w.shape[1] if type(model.get_submodule(owner)) is nn.Linear else w.shape[0]
            q = unpack_rows(f.get_tensor(f"{owner}.packed"), bits, k)
            unique[owner] = Coded(q, f.get_tensor(f"{owner}.scale"), f.get_tensor(f"{owner}.zero"))
    return {name: unique[owner] for name, owner in owners.items()}


def make_calibrated_draft(target: nn.Module, bits: int, group_size: int, compiled: bool = False, progress=None,
                          head_top: int | None = None, lean: bool | None = None,
                          calibration: Calibration | None = None) -> nn.Module:
    """A draft of `target` with GPTQ codes at `bits` in groups of `group_size` (see the module docstring); the
    step and its options are `hfspec.drafts.rtn.make_rtn_draft`'s."""
    if any(p.device.type == "meta" for p in target.parameters()):
        raise HfspecError("draft: a calibrated draft needs the target's weights in memory (offloaded weights are "
                          "on the meta device); allowed: rtnB drafts for offloaded targets")
    if calibration is not None and not isinstance(calibration, Calibration):
        raise HfspecError(f"draft option calibration: got {calibration!r}; allowed: a "
                          "hfspec.quant.calibrate.Calibration")
    codes, where = calibrated_codes(target, bits, group_size, calibration, progress)
    by_weight = {id(target.get_submodule(name).weight): c for name, c in codes.items()}
    draft = make_rtn_draft(target, bits, group_size, lean=lean, compiled=compiled, progress=progress,
                           head_top=head_top, codes=by_weight)
    set_attr(draft, CALIBRATION, where)
    return draft


SPECS = GroupSpecs("gptq", GPTQ_BITS)


def _build(target, spec: DraftSpec, options: dict):
    return make_calibrated_draft(target, spec.bits, spec.group_size, compiled=spec.param("step") == "compiled",
                                 **SPECS.options(spec, options))


KIND = DraftKind(
    name="gptq", title="calibrated quantised copy (GPTQ)", allowed=SPECS.allowed,
    parse=SPECS.parse, build=_build, label=SPECS.label, fields=SPECS.fields(),
    spec_of=SPECS.spec_of, values=lambda s: {"bits": s.bits, "group": s.group_size},
    options=frozenset({"lean", "progress", "head_top", "calibration"}), copies_target=True, assisted=SPECS.assisted,
    examples=("gptq4", "gptq3", "gptq4-g64", "gptq4-compiled"),
)
