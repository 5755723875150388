"""The int8 draft kind: a weight-only 8-bit copy of the target with one scale per output row (`int8`,
`int8-top0`, `int8-compiled`; `-topK` as for `rtnB`: how many of the quantised head's largest logits the lean step
re-scores with the target's own head rows).

Not `rtn8` under another name: rtn8-gN keeps a scale and a zero per group of N (asymmetric) and its lean step
runs a dequantised bf16 copy (two bytes a weight, through oneDNN's bf16 GEMM, slow at one row). int8 is
symmetric per output channel (codes -127..127, a bf16 scale per row: one byte a weight plus two a row), which is
what the CPU kernel `aten._weight_int8pack_mm` takes: one call per linear, bf16 activations
(`hfspec.quant.int8`). Every linear of the lean step and, above `lean.HEAD_FLOAT_BELOW` weights, the LM head are
int8; the input embedding is read from the target's table.

It needs the lean step (Llama-style families on the CPU, `hfspec.kernels.lean.lean_reason`) and the kernel;
elsewhere it is refused by name, and `rtn8` (which has a Hugging Face-forward path) is the alternative.
"""

from __future__ import annotations

import re

from torch import nn

from hfspec.attrs import DRAFT_SPEC, set_attr
from hfspec.drafts.fidelity import warn_if_unfaithful
from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail
from hfspec.drafts.rtn import HEAD_DEFAULT, STEPS, GroupSpecs, _step_suffix, _top_suffix, make_rtn_draft
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.kernels.lean import HEAD_TOP_MAX, LeanDecoder, lean_reason
from hfspec.quant import int8

NAME = "int8"
_PATTERN = re.compile(r"int8(?:-top(\d+))?(-compiled)?")
ALLOWED = "int8[-topK][-compiled]"


def make_int8_draft(target: nn.Module, compiled: bool = False, progress=None, head_top: int | None = None,
                    lean: bool | None = None) -> nn.Module:
    """The per-channel int8 copy of `target` on the lean step (see the module docstring); compiled / head_top /
    progress as in `hfspec.drafts.rtn.make_rtn_draft`. lean=False is refused (there is no HF-forward int8)."""
    if head_top is not None and (isinstance(head_top, bool) or not isinstance(head_top, int)
                                 or not 0 <= head_top <= HEAD_TOP_MAX):
        raise HfspecError(f"draft option head_top: got {head_top!r}; allowed: an integer 0..{HEAD_TOP_MAX} "
                          "(0: no re-scoring)")
    if lean is False:
        raise HfspecError("draft option lean=False: an int8 draft runs only on the lean step; allowed: lean=None "
                          "or True, or rtn8 for a Hugging Face-forward 8-bit draft")
    why = lean_reason(target) or int8.kernel_reason()
    if why is not None:
        raise HfspecError(f"draft: an int8 draft needs the lean step and the CPU int8 kernel, which "
                          f"{type(target).__name__} cannot take ({why}); allowed: rtn8 (any family)")
    check_fits(target)
    draft = LeanDecoder(target, 8, int8.PER_CHANNEL, progress=progress, head_top=head_top)
    if compiled:
        draft.compile_step(progress)
    return draft


def draft_bytes(target: nn.Module) -> int:
    """Bytes an int8 draft of `target` stores: a byte per weight of every ≥2-D CPU matrix and a bf16 scale per
    row (an upper bound: the lean step does not copy the input embedding, nor a small head)."""
    seen, total = set(), 0
    for p in target.parameters():
        if p.dim() >= 2 and p.device.type == "cpu" and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() + 2 * p.shape[0]
    return total


def check_fits(target: nn.Module, available: int | None = None) -> int:
    """Raise HfspecError when an int8 draft would not fit in the available memory; return the estimate."""
    need = draft_bytes(target) + memory.DRAFT_SCRATCH_BYTES
    free = available if available is not None else memory.available_bytes()
    if free is not None and need > free:
        raise HfspecError(f"draft: an int8 draft of this target needs about {memory.gib(need)} of memory but only "
                          f"{memory.gib(free)} is available; nothing was built; allowed: a 2-4-bit draft, a "
                          "prompt-lookup draft (no weights), or more free memory")
    return need


def _parse(text: str, low: str) -> DraftSpec | None:
    if not low.startswith(NAME):
        return None
    match = _PATTERN.fullmatch(low)
    if not match:
        if re.fullmatch(r"int8-g\d+.*", low):
            raise fail(f"cannot read {text!r}: int8 has one scale per output row, no group size -gN (write int8, "
                       "or rtn8-gN for 8 bits in groups)")
        raise fail(f"cannot read {text!r} (write int8, optionally -topK, optionally ending in -compiled, e.g. "
                   "int8, int8-top0, int8-compiled)")
    params = ()
    if match.group(1) is not None:
        top = int(match.group(1))
        if top > HEAD_TOP_MAX:
            raise fail(f"-topK (head logits re-scored) must be 0..{HEAD_TOP_MAX}, got {top}")
        params += (("head_top", top),)
    if match.group(2):
        params += (("step", "compiled"),)
    return DraftSpec(NAME, bits=8, params=params)


def _label(spec: DraftSpec) -> str:
    return NAME + _top_suffix(spec.param("head_top")) + _step_suffix(spec.param("step", STEPS[0]))


def _spec_of(values: dict) -> str:
    step = values.get("step") or STEPS[0]
    if step not in STEPS:
        raise fail(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    top = values.get("head_top")
    return NAME + _top_suffix(None if top in (None, "", HEAD_DEFAULT) else top) + _step_suffix(step)


def _build(target, spec: DraftSpec, options: dict):
    return make_int8_draft(target, compiled=spec.param("step") == "compiled", **GroupSpecs.options(spec, options))


def _assisted(target, draft, spec: DraftSpec, gamma: int):
    """HF assisted generation has no int8 forward to run: it gets the nearest HF-forward copy, rtn8, and says so."""
    eager = DraftSpec("rtn", bits=8, group_size=32)
    assistant = make_rtn_draft(target, 8, 32, lean=False)  # what make_draft(target, eager, lean=False) builds
    set_attr(assistant, DRAFT_SPEC, eager.label)
    warn_if_unfaithful(target, assistant)
    return ({"assistant_model": assistant},
            f"{eager.label} through the HF forward (int8 has no HF forward)")


KIND = DraftKind(
    name=NAME, title="8-bit copy, one scale per output row (int8 kernel)", allowed=ALLOWED,
    parse=_parse, build=_build, label=_label,
    fields=(Field("step", "draft step", STEPS[0], choices=STEPS),
            Field("head_top", "head logits re-scored", HEAD_DEFAULT, choices=(HEAD_DEFAULT, 0, 8, 32, 128))),
    spec_of=_spec_of, values=lambda s: {"step": s.param("step", STEPS[0])},
    options=frozenset({"lean", "progress", "head_top"}), copies_target=True, assisted=_assisted,
    examples=("int8", "int8-top0", "int8-compiled"),
)
