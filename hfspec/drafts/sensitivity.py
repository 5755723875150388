"""Which of a target's matrices cost a quantised draft its acceptance: one unit quantised at a time.

For each unit (a layer's attention matrices, a layer's MLP matrices, the head; or each matrix alone with
by="matrix") the target runs over text it wrote itself (`hfspec.quant.calibrate.self_samples`, seeded) with only
that unit's weights replaced by their quantised values (RTN, or GPTQ from the Hessians of the same text), and
the mean overlap Σ_v min(p, q) with the float target is taken (`hfspec.drafts.fidelity`: the expected acceptance
at T = 1). 1 − overlap is the unit's loss. The fully quantised copy (every unit at once) is measured the same way
for reference; the losses of single units do not add up to its loss exactly (errors compound or cancel), but
the units costing most are where more bits or the calibrated method pay.

The target is never changed: each unit's modules get forward hooks that replace their output with the same
product over dequantised weights (x @ Ŵᵀ + b), removed before the next unit, so the float weights stay as they
are. One forward over the whole text per unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from hfspec import report
from hfspec.drafts.rtn import DEFAULT_GROUP_SIZE, GROUP_SIZES, RTN_BITS
from hfspec.errors import HfspecError, bad_value
from hfspec.io import memory
from hfspec.kernels.lean import HEAD_FLOAT_BELOW, HEAD_TOP, lean_reason
from hfspec.quant import groupwise
from hfspec.quant.calibrate import Coded, calibration_matrices, gptq_codes, hessians, self_samples
from hfspec.quant.known_layers import Conv1D

METHODS = ("rtn", "gptq")
BY = ("layer", "matrix")
DEFAULT_TOKENS = 512  # self-sampled tokens measured on (and calibrated on, for gptq)
TOKENS_RANGE = (16, 65536)
SEQUENCE = 64  # tokens per self-sampled sequence (the text is `tokens` / SEQUENCE sequences)
ROWS_PER_PASS = 8  # sequences per forward
TOP = 3  # units named in the advice
_ATTENTION = ("attn", "attention")
_MLP = ("mlp", "ffn", "feed_forward", "fc1", "fc2", "experts")


@dataclass
class UnitLoss:
    """One unit's row: its matrices, their weights and bytes at the width, and what quantising it alone costs."""

    name: str
    kind: str  # "attention" | "mlp" | "head" | "matrix" | "other"
    matrices: list[str]
    weights: int
    bytes: int  # packed codes plus fp16 scale and zero per group, at `bits`
    overlap: float  # mean Σ min(p, q) with only this unit quantised
    loss: float  # 1 - overlap (clipped at 0)
    share: float  # loss / the sum of all units' losses


@dataclass
class SensitivityReport:
    """`sensitivity`'s result: the settings, each unit's row and the fully quantised copy's overlap."""

    bits: int
    group_size: int
    method: str
    by: str
    tokens: int  # positions measured (sequences × length)
    sequences: int
    seed: int
    full_overlap: float  # every unit quantised at once
    units: list[UnitLoss]  # sorted by loss, largest first
    top_float_overlap: float  # every unit quantised but the `TOP` costing most (kept float)
    notes: list[str] = field(default_factory=list)

    @property
    def full_loss(self) -> float:
        return max(0.0, 1.0 - self.full_overlap)

    @property
    def sum_loss(self) -> float:
        return sum(u.loss for u in self.units)

    @property
    def recovered(self) -> float:
        """Overlap won back when the `TOP` units costing most stay float (what more bits can win at most)."""
        return max(0.0, self.top_float_overlap - self.full_overlap)

    def to_dict(self) -> dict:
        return asdict(self) | {"full_loss": self.full_loss, "sum_loss": self.sum_loss, "recovered": self.recovered,
                               "advice": self.advice()}

    def rows(self) -> list[dict]:
        """The table's rows (a dict per unit, largest loss first)."""
        return [{"unit": u.name, "loss": u.loss, "share": f"{u.share:.1%}", "overlap": u.overlap,
                 "weights": u.weights, "bytes": u.bytes} for u in self.units]

    def advice(self, gptq: str = "--method gptq") -> str:
        """One line: the units costing most and what giving them more bits (or GPTQ) could win back. `gptq` names
        the switch to GPTQ in the caller's words (the CLI flag here, the Sensitivity tab's method box in the
        dashboard)."""
        top = [u for u in self.units[:TOP] if u.loss > 0]
        if not top:
            return (f"no unit loses measurable overlap at {self.bits} bits ({self.method}); fewer bits may do")
        names = ", ".join(f"{u.name} ({u.share:.0%})" for u in top)
        them = "them" if len(top) > 1 else "it"
        calibrated = "" if self.method == "gptq" else f"; {gptq} measures the calibrated codes (usually less loss)"
        return (f"the {len(top)} unit{'s' if len(top) > 1 else ''} costing most: {names}; giving {them} more bits "
                f"recovers up to {self.recovered:.3f} of the {self.full_loss:.3f} overlap the full "
                f"{self.method}{self.bits}-g{self.group_size} draft loses (measured with {them} in float){calibrated}")

    def lines(self) -> list[str]:
        head = (f"sensitivity of {self.method}{self.bits}-g{self.group_size} by {self.by}: one unit quantised at a "
                f"time, mean Σmin(p, q) over {self.tokens} positions of the target's own text (seed {self.seed})")
        tail = (f"all units quantised: overlap {self.full_overlap:.3f} (loss {self.full_loss:.3f}); sum of the "
                f"units' losses {self.sum_loss:.3f}")
        return [head, report.table(self.rows(), ["unit", "loss", "share", "overlap", "weights", "bytes"]), tail,
                *(f"note: {n}" for n in self.notes), self.advice()]


def check_arguments(bits, group_size, method, by, tokens) -> None:
    """HfspecError naming the field and what is allowed, before anything runs."""
    lo, hi = RTN_BITS
    if isinstance(bits, bool) or not isinstance(bits, int) or not lo <= bits <= hi:
        raise bad_value("bits", bits, f"an integer {lo}..{hi}")
    g_lo, g_hi = GROUP_SIZES
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not g_lo <= group_size <= g_hi:
        raise bad_value("group_size", group_size, f"an integer {g_lo}..{g_hi} (e.g. 32, 64, 128)")
    if method not in METHODS:
        raise bad_value("method", method, ", ".join(METHODS))
    if by not in BY:
        raise bad_value("by", by, ", ".join(BY))
    t_lo, t_hi = TOKENS_RANGE
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not t_lo <= tokens <= t_hi:
        raise bad_value("tokens", tokens, f"an integer {t_lo}..{t_hi}")


def units_of(target: nn.Module, by: str = "layer") -> list[tuple[str, str, list[str]]]:
    """(name, kind, matrix module names) of each unit, in model order. by="layer": a layer's attention
    matrices, its MLP matrices (other matrices of a layer: "layer i other"), the head, and any other matrix
    alone; by="matrix": every matrix alone."""
    if by not in BY:
        raise bad_value("by", by, ", ".join(BY))
    head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    units: dict[str, tuple[str, list[str]]] = {}
    for name, module in calibration_matrices(target).items():
        if by == "matrix":
            units[name] = ("head" if module is head else "matrix", [name])
            continue
        if module is head:
            unit, kind = "head", "head"
        else:
            unit, kind = _layer_unit(target, name)
        units.setdefault(unit, (kind, []))[1].append(name)
    return [(unit, kind, names) for unit, (kind, names) in units.items()]


def _layer_unit(target: nn.Module, name: str) -> tuple[str, str]:
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit() and isinstance(target.get_submodule(".".join(parts[:i])), nn.ModuleList):
            rest = [p.lower() for p in parts[i + 1:-1]] + [parts[-1].lower()]
            for kind, words in (("attention", _ATTENTION), ("mlp", _MLP)):
                if any(w in p for p in rest for w in words):
                    return f"layer {part} {kind}", kind
            return f"layer {part} other", "other"
    return name, "other"


def _weight(module: nn.Module) -> torch.Tensor:
    """[out, in] (Conv1D stores it transposed)."""
    return module.weight.t() if isinstance(module, Conv1D) else module.weight


def _bytes(n: int, k: int, bits: int, group_size: int) -> int:
    return math.ceil(n * k * bits / 8) + 4 * n * groupwise.n_groups(k, group_size)


@torch.no_grad()
def _codes(target: nn.Module, names: list[str], bits: int, group_size: int, method: str,
           ids: torch.Tensor) -> dict[str, Coded]:
    """Codes of each named matrix (tied weights quantised once, from the first module's Hessian for gptq)."""
    owner: dict[int, str] = {}
    for name in names:
        owner.setdefault(id(target.get_submodule(name).weight), name)
    unique = list(dict.fromkeys(owner.values()))
    codes: dict[str, Coded] = {}
    if method == "rtn":
        for name in unique:
            codes[name] = Coded(*groupwise.group_quantize(_weight(target.get_submodule(name)).detach(), bits,
                                                          group_size))
    else:
        with memory.kept_heap():  # (GPTQ's many large temporaries: see kept_heap)
            found = hessians(target, ids, unique, ROWS_PER_PASS)
            codes = gptq_codes(target, found, unique, bits, group_size)
    return {name: codes[owner[id(target.get_submodule(name).weight)]] for name in names}


class _Quantised:
    """Forward hooks giving `modules` the product over dequantised codes while the block runs; removed after."""

    def __init__(self, target: nn.Module, names: list[str], codes: dict[str, Coded], group_size: int):
        self.items = [(target.get_submodule(n), codes[n]) for n in names]
        self.group_size = group_size
        self.handles = []

    def __enter__(self):
        for module, coded in self.items:
            self.handles.append(module.register_forward_hook(self._hook(coded)))
        return self

    def _hook(self, coded: Coded):
        def hook(module, args, out):
            x = args[0]
            w = groupwise.group_dequantize(coded.q, coded.scale, coded.zero, self.group_size, x.dtype)
            return F.linear(x, w, module.bias)
        return hook

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


@torch.no_grad()
def _probs(target: nn.Module, ids: torch.Tensor):
    """The target's next-token probabilities (T = 1) over `ids`, `ROWS_PER_PASS` sequences at a time."""
    for start in range(0, ids.shape[0], ROWS_PER_PASS):
        chunk = ids[start:start + ROWS_PER_PASS]
        logits = target(input_ids=chunk, attention_mask=torch.ones_like(chunk), use_cache=False).logits
        yield F.softmax(logits.float(), dim=-1)


def _overlap(target: nn.Module, ids: torch.Tensor, p: list[torch.Tensor]) -> float:
    """Mean Σ min(p, q) of the float probabilities `p` and the target's as it runs now."""
    total = sum(float(torch.minimum(a, b).sum()) for a, b in zip(p, _probs(target, ids), strict=True))
    return total / ids.numel()


def coded_overlap(target: nn.Module, names: list[str], codes: dict[str, Coded], group_size: int, ids: torch.Tensor,
                  p: list[torch.Tensor]) -> float:
    """Mean Σ min(p, q) over `ids` of the float probabilities `p` (`_probs`) and the target's with the named
    matrices' outputs taken from their dequantised codes (the weights are never changed): a draft's expected
    acceptance at T = 1 without building it."""
    with _Quantised(target, names, codes, group_size):
        return _overlap(target, ids, p)


def sensitivity(target: nn.Module, bits: int = 4, group_size: int = DEFAULT_GROUP_SIZE, method: str = "rtn",
                by: str = "layer", tokens: int = DEFAULT_TOKENS, seed: int = 0,
                progress: Callable[[str], None] | None = None,
                on_step: Callable[[int, int], None] | None = None) -> SensitivityReport:
    """Per-unit overlap loss of a `method``bits`-g`group_size` draft of `target` (see the module docstring).

    tokens: positions measured on, as sequences of up to `SEQUENCE` tokens the target samples from its BOS at
    T = 1 with `seed` (gptq is calibrated on the same text). progress(message) and on_step(i, n) (unit i, from
    1, of n) are called before each unit; an exception they raise stops the work (the target is restored).
    Returns a `SensitivityReport` whose units are sorted by loss, largest first. The target is left as it was.
    """
    check_arguments(bits, group_size, method, by, tokens)
    if any(p.device.type == "meta" for p in target.parameters()):
        raise HfspecError("sensitivity: the target's weights must be in memory (offloaded weights are on the meta "
                          "device); allowed: a target loaded whole")
    say = progress or (lambda message: None)
    units = units_of(target, by)
    if not units:
        raise HfspecError(f"sensitivity: {type(target).__name__} has no Linear / Conv1D matrices to quantise; "
                          "allowed: a transformer causal LM")
    length = min(tokens, SEQUENCE)
    sequences = math.ceil(tokens / length)
    say(f"sensitivity: the target writes {sequences} × {length} tokens of its own text")
    ids = self_samples(target, sequences, length, seed)[:, :-1]  # every position predicts a sampled token
    names = [n for _, _, unit_names in units for n in unit_names]
    say(f"sensitivity: {method} codes of {len(names)} matrices at {bits} bits")
    codes = _codes(target, names, bits, group_size, method, ids)
    p = list(_probs(target, ids))
    full = coded_overlap(target, names, codes, group_size, ids, p)
    rows = []
    for i, (unit, kind, unit_names) in enumerate(units):
        say(f"sensitivity: unit {i + 1}/{len(units)}: {unit}")
        if on_step is not None:
            on_step(i + 1, len(units))
        overlap = coded_overlap(target, unit_names, codes, group_size, ids, p)
        shapes = [tuple(_weight(target.get_submodule(n)).shape) for n in unit_names]
        rows.append(UnitLoss(unit, kind, unit_names, sum(n * k for n, k in shapes),
                             sum(_bytes(n, k, bits, group_size) for n, k in shapes), overlap,
                             max(0.0, 1.0 - overlap), 0.0))
    total = sum(r.loss for r in rows)
    for r in rows:
        r.share = r.loss / total if total > 0 else 0.0
    rows.sort(key=lambda r: -r.loss)
    kept = {n for r in rows[:TOP] if r.loss > 0 for n in r.matrices}
    say(f"sensitivity: every unit quantised but the {TOP} costing most")
    top_float = coded_overlap(target, [n for n in names if n not in kept], codes, group_size, ids, p)
    return SensitivityReport(bits, group_size, method, by, int(ids.numel()), sequences, seed, full, rows,
                             top_float, _notes(target, units))


def _notes(target: nn.Module, units) -> list[str]:
    heads = [names for _, kind, names in units if kind == "head"]
    if not heads or lean_reason(target) is not None:
        return []
    size = _weight(target.get_submodule(heads[0][0])).numel()
    if size < HEAD_FLOAT_BELOW:
        return [f"the lean draft step keeps a head of fewer than {HEAD_FLOAT_BELOW} weights in float (this one has "
                f"{size}): the head's loss above is what a quantised head would cost"]
    return [f"the lean draft step re-scores the quantised head's top {HEAD_TOP} logits with float rows "
            "(head_top): the head costs a lean draft less than shown"]
