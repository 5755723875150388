"""Load a target or draft model (and its tokenizer) the way its users keep it.

``source`` may be

* a local Hugging Face folder (``config.json`` + weights) — loaded with ``local_files_only=True``, so no
  network call is ever made for it;
* a ``.gguf`` file (``folder/file.gguf``, or ``source=folder`` with ``gguf_file="file.gguf"``) — loaded by
  transformers' GGUF reader, which dequantises the weights to ``dtype`` (needs the optional ``gguf`` package:
  ``pip install 'hfspec[gguf]'``);
* a hub id (``"HuggingFaceTB/SmolLM2-135M-Instruct"``) — taken from the local hub cache, downloaded when
  online; with ``HF_HUB_OFFLINE=1`` or no network an uncached id is a clear :class:`HfspecError`.

A loaded model must be exactly its checkpoint: a config.json that does not match the weights (missing, extra
or mis-shaped tensors) and a truncated or empty ``.safetensors`` file are refused by name. Loads are serialised
process-wide (transformers' loading is not thread-safe) and each is checked for tensors left on the meta
device and for tied weights that are not tied (:func:`check_loaded`).

Every user mistake (missing path, folder without ``config.json``, uncached hub id, missing ``gguf`` package,
unknown dtype or device, unavailable CUDA device) raises :class:`hfspec.errors.HfspecError` naming the field
(``role``: ``"target"``, ``"draft"``, ...) and what is allowed; errors from inside transformers for these
mistakes are re-raised as ``HfspecError`` with the original exception chained as ``__cause__``.

Placement: ``device`` puts the whole model on one device ("cpu", "cuda", "cuda:N", "mps", or "auto" = the
best single device available). ``device_map`` (``"auto"``/``"balanced"``/``"sequential"``/... or an explicit
``{module: device}`` dict, ``"disk"`` allowed together with ``offload_folder``) and ``max_memory`` are passed
to accelerate for sharded or offloaded targets; such a model still decodes exactly (hooks move the weights).
"""

from __future__ import annotations

import os
import time

import torch

from hfspec.dtypes import dtype_str
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.io.loading.checks import _LOAD_LOCK, check_loaded, drop_gguf_quantizer
from hfspec.io.loading.errors import damaged_weights, translate
from hfspec.io.loading.placement import (
    DEVICE_MAP_NAMES,
    DEVICE_NAMES,
    DTYPE_NAMES,
    check_placement,
    describe_placement,
    parse_device,
    parse_dtype,
)
from hfspec.io.loading.progress import Progress, human, report, reporting
from hfspec.io.loading.sources import (
    TOKENIZER_FILES,
    ResolvedSource,
    common_kwargs,
    need_gguf,
    resolve_source,
)

__all__ = [
    "DTYPE_NAMES",
    "DEVICE_NAMES",
    "DEVICE_MAP_NAMES",
    "ResolvedSource",
    "check_loaded",
    "load_model",
    "load_tokenizer",
    "parse_device",
    "parse_dtype",
    "resolve_source",
]


def load_model(
    source,
    *,
    dtype=None,
    device=None,
    device_map=None,
    max_memory=None,
    offload_folder=None,
    trust_remote_code: bool = False,
    gguf_file=None,
    progress: Progress = True,
    role: str = "model",
    **from_pretrained_kwargs,
):
    """Load a causal LM from a local folder, a .gguf file or a hub id, ready for decoding (eval mode).

    dtype: "float32" | "bfloat16" | "float16" | "auto" | a torch dtype | None. None means "auto", the dtype
        the checkpoint was saved in (as transformers 5 loads it: bf16 for most modern models, fp32 for an
        fp32 checkpoint), except GGUF files, which are dequantised to float32.
    device: "cpu" | "cuda" | "cuda:N" | "mps" | "auto" (best single device) | None (CPU). Mutually exclusive
        with device_map.
    device_map, max_memory, offload_folder: accelerate placement (sharding, CPU/disk offload). ``max_memory``
        alone implies ``device_map="auto"``.
    trust_remote_code: off unless turned on.
    gguf_file: file name inside ``source`` (a folder or hub id); a path ending in .gguf works on its own.
    progress: True prints "loading <source> (<dtype>, <device>)…" and "loaded <source> in N s" to stderr,
        next to transformers' own tqdm bars; a callable receives those lines instead, plus throttled
        "Loading weights: n/total" lines in place of the bars (for a GUI busy state or progress bar);
        False/None is silent (bars off for this load only, thread-local; the GGUF dequantisation bar of
        transformers does not go through its hook and still shows).
    role: the name used in error messages ("target", "draft").
    Extra keyword arguments go to ``AutoModelForCausalLM.from_pretrained`` unchanged (e.g. revision).
    """
    role = role or "model"
    torch_dtype, dev, dmap = check_placement(dtype, device, device_map, max_memory, offload_folder, role)
    src = resolve_source(source, gguf_file=gguf_file, role=role)
    if src.gguf_file:
        need_gguf(role, src)
    if torch_dtype is None:  # the checkpoint's own dtype, as transformers 5 loads it; GGUF dequantises to fp32
        torch_dtype = torch.float32 if src.gguf_file else "auto"
    dtype_name = dtype_str(torch_dtype)
    if src.local and not src.gguf_file and describe_placement(dev, dmap) == "cpu":
        memory.check_fits(src.path, torch_dtype, role)  # too big for RAM: a clear error now, not an OOM kill later
        dtype_name = memory.dtype_name(src.path, torch_dtype)
    kwargs = common_kwargs(src, trust_remote_code) | {"dtype": torch_dtype}
    if dev is not None and dev != "cpu":
        kwargs["device_map"] = dev
    if dmap is not None:
        kwargs["device_map"] = dmap
    if max_memory is not None:
        kwargs["max_memory"] = dict(max_memory)
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)
        kwargs["offload_folder"] = os.fspath(offload_folder)
    kwargs.update(from_pretrained_kwargs)

    if src.note:
        report(progress, f"{role}: {src.note}")
    report(progress, f"loading {src.describe()} ({dtype_name}, {describe_placement(dev, dmap)})…")
    start = time.perf_counter()
    want_info = bool(kwargs.pop("output_loading_info", False))
    model, info = _from_pretrained(src, kwargs, progress, role)
    elapsed = time.perf_counter() - start
    n_params = sum(p.numel() for p in model.parameters())
    report(progress, f"loaded {src.describe()} in {elapsed:.1f} s ({human(n_params)} parameters)")
    return (model, info) if want_info else model


def _from_pretrained(src: ResolvedSource, kwargs: dict, progress: Progress, role: str):
    """`AutoModelForCausalLM.from_pretrained`, one at a time, checked (`check_loaded`), in eval mode."""
    from transformers import AutoModelForCausalLM

    ignore_mismatched = bool(kwargs.pop("ignore_mismatched_sizes", False))
    try:
        with reporting(progress), _LOAD_LOCK:  # transformers swaps class attributes while loading: one at a time
            loaded = AutoModelForCausalLM.from_pretrained(
                src.path, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
            model, info = loaded if isinstance(loaded, tuple) else (loaded, {})
            check_loaded(model, info, role, src.describe(), ignore_mismatched)
    except HfspecError:
        raise
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise translate(exc, src, role, "model") from exc
    except Exception as exc:
        if type(exc).__name__ != "SafetensorError":
            raise
        raise damaged_weights(exc, src, role) from exc
    if src.gguf_file:
        drop_gguf_quantizer(model)
    model.eval()
    return model, info


def load_tokenizer(
    source, *, gguf_file=None, trust_remote_code: bool = False, role: str = "model", **from_pretrained_kwargs
):
    """Load the tokenizer that goes with ``source`` (same spellings as :func:`load_model`)."""
    role = role or "model"
    src = resolve_source(source, gguf_file=gguf_file, role=role)
    if src.gguf_file:
        need_gguf(role, src)
    elif src.kind == "folder" and not any(
        os.path.isfile(os.path.join(src.path, n)) for n in TOKENIZER_FILES
    ):
        raise HfspecError(
            f"{role}: folder {src.path!r} has no tokenizer (allowed: a folder with "
            f"{', '.join(TOKENIZER_FILES[:3])}, a .gguf file, or a hub id)"
        )
    kwargs = common_kwargs(src, trust_remote_code)
    kwargs.update(from_pretrained_kwargs)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src.path, **kwargs)
    except HfspecError:
        raise
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise translate(exc, src, role, "tokenizer") from exc

