"""Calibration for error-compensating drafts: text the target writes itself, the input Hessians of its matrices,
and GPTQ codes for all of them (`calibrate`).

No data set is downloaded: the target samples `sequences` texts of `tokens` tokens from its BOS at temperature 1
(seeded), which is the distribution the draft must imitate. Every matrix's inputs are kept while it writes
(`capture.TextInputs`), and give each matrix's Hessian Σ x xᵀ; matrices of one shape are then quantised together
(`gptq.gptq_quantize` batched), which makes the sweep's Python loop run once per column for all layers.

Where the captured inputs would not fit in memory (or for `sequential`), the Hessians are taken by forwards over
the text after it; for a decoder with a layer list (`model.model.layers`) one layer at a time on the hidden
states streamed through the layers (`_streamed`): memory holds one layer's Hessians, not every layer's (at the
1.7B shape every layer's at once would be ~17 GB in fp64 beside the 7 GB model).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from hfspec.quant import gptq, groupwise, refit
from hfspec.quant.capture import TextInputs
from hfspec.quant.capture import gram as _gram
from hfspec.quant.known_layers import Conv1D
from hfspec.quant.selftext import bos_id, self_samples  # noqa: F401  (bos_id: its old home, for importers)

HESSIAN_BYTES = 1 << 30  # Hessians held before their layers are quantised (more layers: fewer, larger GPTQ sweeps)
CAPTURE_BYTES = 4 << 30  # the inputs captured while the text is written, unless the caller gives its own budget
BATCH_ELEMENTS = 64 << 20  # weights per batched GPTQ sweep (bounds the fp32 scratch to a few hundred MB)
PROGRESS_EVERY = 2.0  # seconds between progress messages
# how the calibration text is drawn (`self_samples`), part of the cache key: the same seed under another sampler is
# another text, so other codes ("inverse-cdf" since 8 December 2026; "gumbel" from 7 December; before it generate's
# own draw, a key without it)
TEXT_SAMPLER = "inverse-cdf"


@dataclass(frozen=True)
class Calibration:
    """How a calibrated draft is made: `sequences` self-sampled texts of `tokens` tokens (seed `seed`; on SmolLM2-135M
    off the grid, held-out overlap Σ min(p, q) on 16 × 128 tokens, three text seeds each (docs/drafts.md): 64 × 64
    0.829-0.833, 128 × 32 0.831-0.833 written in four fifths of the time, 256 × 16 0.829-0.830; twice the text,
    256 × 32 0.840-0.841 and 128 × 64 0.838, for 15-20 s more at 135M), GPTQ
    with `damp`, the clipping search `shrink` and act-order (`gptq.gptq_quantize`); `sequential`: Hessians of
    each layer taken on the outputs of the already quantised layers below it (on SmolLM2-135M off the grid:
    overlap Σ min(p, q) 0.826 -> 0.829 for 40 % more time, so off by default). All of it is part of the cache
    key: other settings make other codes."""

    sequences: int = 128
    tokens: int = 32
    seed: int = 0
    damp: float = gptq.DAMP
    shrink: tuple[float, ...] = gptq.SHRINK
    act_order: bool = True
    sequential: bool = False
    refits: int = 1

    def key(self) -> str:
        return (f"s{self.sequences}-t{self.tokens}-seed{self.seed}-d{self.damp:g}-c{','.join(f'{x:g}' for x in self.shrink)}"
                f"-a{int(self.act_order)}-q{int(self.sequential)}-r{self.refits}-{TEXT_SAMPLER}")


SMALL_TARGET = 200_000_000  # parameters up to which `default_calibration` writes SMALL_TEXT_SEQUENCES texts


SMALL_TEXT_SEQUENCES = 256


def default_calibration(model: nn.Module) -> Calibration:
    """The calibration a draft of `model` gets unless the caller gives one: `Calibration()` (128 × 32 tokens), or for a
    target of at most SMALL_TARGET parameters twice the text (256 × 32), which closes more of the gap and still
    calibrates in about a minute. On SmolLM2-135M off the grid (8 December 2026, AVX2 EPYC, 2 cores;
    docs/drafts.md): Σ min(p, q) 0.847 against 0.854, rtn4's gap closed 48 % against 50 %, first build 47 s against
    59-63 s. At the 1.7B shape the text and its Hessians are most of a 15-minute calibration, so it keeps 4096."""
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return Calibration(sequences=SMALL_TEXT_SEQUENCES) if parameters <= SMALL_TARGET else Calibration()


@dataclass
class Coded:
    """A weight [N, K] as group-quantised codes: w ≈ q * scale + zero per group of `group_size` along K.
    Row indexing and `split` along N give Coded views, so code that permutes or splits a weight's rows (the lean
    step's rotary pairing, fused projections) treats it like a tensor."""

    q: torch.Tensor  # uint8 [N, K]
    scale: torch.Tensor  # fp16 [N, G]
    zero: torch.Tensor  # fp16 [N, G]

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    def dim(self) -> int:
        return 2

    def __getitem__(self, rows) -> Coded:
        return Coded(self.q[rows], self.scale[rows], self.zero[rows])

    def split(self, sizes: list[int]) -> list[Coded]:
        out, start = [], 0
        for size in sizes:
            out.append(self[start:start + size])
            start += size
        return out

    @staticmethod
    def cat(parts: list[Coded]) -> Coded:
        return Coded(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "scale", "zero")))


def calibration_matrices(model: nn.Module) -> dict[str, nn.Module]:
    """The plain Linear / Conv1D modules of `model` by name (what a quantised draft's matmuls read)."""
    return {name: m for name, m in model.named_modules()
            if (type(m) is nn.Linear or isinstance(m, Conv1D)) and m.weight.dim() == 2}


@torch.no_grad()
def hessians(model: nn.Module, ids: torch.Tensor, names: list[str], rows_per_pass: int = 8) -> dict[str, torch.Tensor]:
    """Σ x xᵀ [K, K] (fp64) of the inputs of each named matrix over a forward of `ids`, `rows_per_pass`
    sequences at a time."""
    def run():
        for start in range(0, ids.shape[0], rows_per_pass):
            model(ids[start:start + rows_per_pass], use_cache=False)
    return _hooked_hessians(model, names, run)


def _weight(module: nn.Module) -> torch.Tensor:
    return module.weight.t() if isinstance(module, Conv1D) else module.weight


def calibrate(model: nn.Module, bits: int, group_size: int, settings: Calibration | None = None,
              names: list[str] | None = None, progress: Callable[[str], None] | None = None,
              capture_bytes: int = CAPTURE_BYTES, after_text: Callable[[], None] | None = None) -> dict[str, Coded]:
    """GPTQ codes for each named matrix of `model` (default: `calibration_matrices`), keyed by module name.

    Tied matrices (one Parameter in several modules) are quantised once, from the Hessian of the module named
    first, and appear under each name. The matrices' inputs are captured while the target writes its text
    (`capture.TextInputs`, up to `capture_bytes`; then `after_text()` runs, no forward being left), or, over that
    budget or with `settings.sequential`, taken by forwards over the text after it."""
    say = progress or (lambda message: None)
    settings = settings or default_calibration(model)
    began = time.perf_counter()
    names = list(calibration_matrices(model)) if names is None else list(names)
    owner: dict[int, str] = {}
    for name in names:
        owner.setdefault(id(model.get_submodule(name).weight), name)
    unique = list(dict.fromkeys(owner.values()))
    say(f"calibrating: the target writes {settings.sequences} × {settings.tokens} tokens of its own text")
    rows = settings.sequences * (settings.tokens + 1)
    with TextInputs(model, unique, rows, 0 if settings.sequential else capture_bytes) as captured:
        ids = self_samples(model, settings.sequences, settings.tokens, settings.seed)
        captured.finish(ids)
    say(f"calibrating: input statistics of {len(names)} matrices ({time.perf_counter() - began:.0f} s)")
    if captured.complete:
        if after_text is not None:
            after_text()
        meter = _Meter(say, began, *_work(model, unique, ids.numel(), forward=False))
        codes = _from_captured(model, captured, unique, bits, group_size, settings, meter)
    else:
        meter = _Meter(say, began, *_work(model, unique, ids.numel()))
        layers = _layers(model)
        if layers is not None:
            codes = _streamed(model, layers, ids, unique, bits, group_size, settings, meter)
        else:
            found = hessians(model, ids, unique)
            meter.passed(unique)
            codes = gptq_codes(model, found, unique, bits, group_size, settings, meter)
    return {name: codes[owner[id(model.get_submodule(name).weight)]] for name in names}


def _from_captured(model: nn.Module, captured: TextInputs, names: list[str], bits: int, group_size: int,
                   settings: Calibration, meter: _Meter) -> dict[str, Coded]:
    """GPTQ codes from the captured inputs, Hessians taken in the model's order and quantised (matrices of one
    shape together) whenever HESSIAN_BYTES of them are held, so the captured inputs are freed as they go."""
    codes: dict[str, Coded] = {}
    pending: dict[str, torch.Tensor] = {}
    for i, name in enumerate(names):
        pending[name] = captured.hessian(name)
        meter.passed([name])
        if i == len(names) - 1 or _nbytes(pending) >= HESSIAN_BYTES:
            codes.update(gptq_codes(model, pending, list(pending), bits, group_size, settings, meter))
            pending.clear()
    return codes


class _Meter:
    """Says how many matrices are quantised, with an ETA, every PROGRESS_EVERY seconds. The ETA weighs each matrix
    by its work (`_work`): its GPTQ sweep and grid refit, counted when it is quantised (`add`), and its forward and
    Hessian, counted when they are taken (`passed`: layers' Hessians are taken before their matrices are
    quantised, all of a small model's at once). It reads the rate since the Hessians began, not since the
    calibration began (the sampled text's time says nothing about the matrices'). With GPTQ's work alone, the ETA
    of SmolLM2-135M after its 60 smallest matrices said 139 s where 18 s were left."""

    def __init__(self, say, began: float, weights: dict[str, float], passes: dict[str, float] | None = None):
        self.say, self.began, self.weights, self.passes = say, began, weights, passes or {}
        self.total, self.done, self.work = len(weights), 0, 0.0
        self.all_work = sum(weights.values()) + sum(self.passes.values())
        self.started = self.shown = time.perf_counter()

    def passed(self, names: list[str]) -> None:
        """The named matrices' Hessians are taken."""
        self.work += sum(self.passes.get(name, 0.0) for name in names)

    def add(self, names: list[str]) -> None:
        """The named matrices are quantised."""
        self.done += len(names)
        self.work += sum(self.weights.get(name, 0.0) for name in names)
        now = time.perf_counter()
        if now - self.shown >= PROGRESS_EVERY or self.done == self.total:
            left = self.all_work - self.work
            eta = (now - self.started) / self.work * left if self.work > 0 else 0.0
            self.say(f"calibrating: {self.done}/{self.total} matrices quantised ({now - self.began:.0f} s, "
                     f"about {eta:.0f} s left)")
            self.shown = now


PASS_WORK = 0.15  # a calibration token's forward and xᵀx work, N·K + K²/2 a matrix, against GPTQ's N·K² (_work)


def _work(model: nn.Module, names: list[str], tokens: int = 0, forward: bool = True
          ) -> tuple[dict[str, float], dict[str, float]]:
    """Each named matrix's share of the calibration's time after the text, in two parts: N·K² (its GPTQ sweep and
    grid refit) and PASS_WORK · T · (N·K + K²/2) (its part of the T calibration tokens' forward, and their xᵀx).
    At the 1.7B shape (2 cores) a layer took about 25 s for its Σ N·K² = 239 G and 7 s for its forward and
    Hessians over T = 4096 tokens, Σ T (N·K + K²/2) = 438 G: 0.105 and 0.016 s per G. At 135M the second part
    is most of the time. forward=False: the inputs were captured while the text was written (xᵀx only)."""
    gptq_work, pass_work = {}, {}
    for name in names:
        n, k = (float(x) for x in _weight(model.get_submodule(name)).shape)
        gptq_work[name], pass_work[name] = n * k * k, PASS_WORK * tokens * (n * k * forward + k * k / 2)
    return gptq_work, pass_work


def gptq_codes(model: nn.Module, found: dict[str, torch.Tensor], names: list[str], bits: int, group_size: int,
               settings: Calibration | None = None, meter: _Meter | None = None) -> dict[str, Coded]:
    """GPTQ codes of the named matrices from their Hessians `found` (then grids refit, `settings.refits` times),
    matrices of one shape in one sweep. Every calibrated draft and `hfspec sensitivity --method gptq` use it."""
    settings = settings or Calibration()
    by_shape: dict[tuple, list[str]] = {}
    for name in names:
        by_shape.setdefault(tuple(_weight(model.get_submodule(name)).shape), []).append(name)
    codes: dict[str, Coded] = {}
    for (n, k), group in by_shape.items():
        per_batch = max(1, BATCH_ELEMENTS // (n * k))
        for start in range(0, len(group), per_batch):
            part = group[start:start + per_batch]
            w = torch.stack([_weight(model.get_submodule(name)).detach().float() for name in part])
            h = torch.stack([found[name] for name in part])
            q, scale, zero = gptq.gptq_quantize(w, h, bits, group_size, settings.damp, settings.shrink,
                                                settings.act_order)
            for round_ in range(settings.refits):
                if round_:  # sweep again against the moved grids, then move them again
                    q, scale, zero = gptq.gptq_quantize(w, h, bits, group_size, settings.damp, settings.shrink,
                                                        settings.act_order, (scale, zero))
                for i in range(len(part)):
                    scale[i], zero[i] = refit.refit_grid(w[i], h[i], q[i], scale[i], zero[i], group_size,
                                                         settings.damp)
            for i, name in enumerate(part):
                codes[name] = Coded(q[i].clone(), scale[i].clone(), zero[i].clone())
            if meter is not None:
                meter.add(part)
    return codes


def _layers(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(name, the decoder's layer list) of a `model.model.layers` family, else None."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return ("model.layers", layers) if isinstance(layers, nn.ModuleList) and len(layers) else None


@torch.no_grad()
def _streamed(model: nn.Module, layers: tuple[str, nn.ModuleList], ids: torch.Tensor, names: list[str],
              bits: int, group_size: int, settings: Calibration, meter: _Meter) -> dict[str, Coded]:
    """GPTQ layer by layer on a stream of hidden states, so only one layer's Hessians are held at a time.

    A pass of the model with its layers passing their input through records each layer's call (positions and
    masks do not depend on the hidden states; this costs the embeddings and little more); then every layer runs
    on the stream with hooks for its Hessians, its matrices are quantised, and the stream moves on through the
    layer (layers are quantised together while their Hessians fit in HESSIAN_BYTES, so that matrices of one
    shape share a sweep). With `settings.sequential` it moves on through the layer with its weights briefly swapped for their
    quantised values (restored exactly): the paper's sequential order, where later layers absorb the errors of
    earlier ones; without, through the float layer: the Hessians one forward of the whole model would give.
    Matrices outside the layers (the head) get theirs from a last pass whose layers hand on the final stream."""
    prefix, blocks = layers
    calls: dict[int, tuple] = {}
    shape: list = []  # a layer's real output (its structure: a tensor, or a tuple led by the hidden states)

    def record(index, real, *args, **kwargs):
        calls[index] = (args, kwargs)
        x = args[0] if args else kwargs["hidden_states"]
        if not shape:
            shape.append(real(*args, **kwargs))
        return _like(shape[0], x)
    with _layers_replaced(blocks, record):
        model.get_submodule(prefix.rpartition(".")[0] or prefix)(ids, use_cache=False)  # the decoder, no head
    args0, kwargs0 = calls[0]
    stream = args0[0] if args0 else kwargs0["hidden_states"]
    codes: dict[str, Coded] = {}
    pending: dict[str, torch.Tensor] = {}  # Hessians of layers not yet quantised (batched by shape when quantised)
    for i, block in enumerate(blocks):
        args, kwargs = calls[i]
        here = [name for name in names if name.startswith(f"{prefix}.{i}.")]

        def run(x, block=block, args=args, kwargs=kwargs):
            out = block(x, *args[1:], **kwargs) if args else block(**{**kwargs, "hidden_states": x})
            return out[0] if isinstance(out, tuple) else out
        outputs: list[torch.Tensor] = []
        pending.update(_hooked_hessians(model, here, lambda run=run, x=stream, out=outputs: out.append(run(x))))
        meter.passed(here)
        if settings.sequential or i == len(blocks) - 1 or _nbytes(pending) >= HESSIAN_BYTES:
            codes.update(gptq_codes(model, pending, list(pending), bits, group_size, settings, meter))
            pending.clear()
        stream = outputs.pop() if not settings.sequential else _through_quantised(model, here, codes, group_size,
                                                                                   functools.partial(run, stream))
    rest = [name for name in names if name not in codes]
    if rest:
        last = len(blocks) - 1

        def hand_on(index, real, *args, **kwargs):
            return _like(shape[0], stream if index == last else (args[0] if args else kwargs["hidden_states"]))
        with _layers_replaced(blocks, hand_on):
            found = _hooked_hessians(model, rest, lambda: model(ids, use_cache=False))
        meter.passed(rest)
        codes.update(gptq_codes(model, found, rest, bits, group_size, settings, meter))
    return codes


def _through_quantised(model: nn.Module, names: list[str], codes: dict[str, Coded], group_size: int,
                       run: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`run()` with the named matrices' weights swapped for their dequantised codes, restored exactly after."""
    saved = {}
    try:
        for name in names:
            module = model.get_submodule(name)
            saved[name] = module.weight.data
            c = codes[name]
            deq = groupwise.group_dequantize(c.q, c.scale, c.zero, group_size, module.weight.dtype)
            module.weight.data = deq.t().contiguous() if isinstance(module, Conv1D) else deq
        return run()
    finally:
        for name, data in saved.items():
            model.get_submodule(name).weight.data = data


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _like(real, x: torch.Tensor):
    """x in the structure of a layer's real output (a tensor, or a tuple with the hidden states first)."""
    return (x, *real[1:]) if isinstance(real, tuple) else x


@contextlib.contextmanager
def _layers_replaced(blocks: nn.ModuleList, fn: Callable):
    """Every layer's forward is `fn(index, real_forward, *args, **kwargs)` inside the block (hooks still run);
    the real forwards are back after it, also on an error."""
    for i, block in enumerate(blocks):
        block.forward = functools.partial(fn, i, block.forward)
    try:
        yield
    finally:
        for block in blocks:
            block.__dict__.pop("forward", None)


def _hooked_hessians(model: nn.Module, names: list[str], run: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Σ x xᵀ of each named matrix's inputs while `run()` runs. Matrices fed the same tensor object (q/k/v,
    gate/up) share one product: it is computed once per input (in fp32, added to fp64 sums)."""
    found: dict[str, torch.Tensor] = {}
    last: list = [None, None, None]  # the latest input tensor (held, so its memory cannot be reused) and its xᵀx
    hooks = []
    for name in names:
        def hook(mod, args, name=name):
            x = args[0]
            if last[0] is not x or last[2] != x._version:
                flat = x.detach().reshape(-1, x.shape[-1]).float()
                last[:] = [x, _gram(flat).double(), x._version]
            found[name] = last[1].clone() if name not in found else found[name].add_(last[1])
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return found
