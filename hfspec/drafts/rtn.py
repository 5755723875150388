"""The RTN draft kind: a round-to-nearest copy of the target in groups (`rtn4`, `rtn3-g64`, `rtn4-compiled`,
`rtn4-top0`: `-topK` sets how many of the quantised head's largest logits the lean step re-scores, `head_top`).

It takes a lean decode step of its own where the family allows it (`hfspec.kernels.lean`, optionally compiled by
`hfspec.kernels.compiled`), else the HF forward over swapped quantised modules (any architecture).
"""

from __future__ import annotations

import re

from torch import nn

from hfspec.attrs import DRAFT_SPEC, set_attr
from hfspec.drafts.fidelity import warn_if_unfaithful
from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.kernels.lean import HEAD_TOP_MAX, LeanDecoder, lean_reason
from hfspec.quant.swap import quantize_model

DEFAULT_GROUP_SIZE = 32
RTN_BITS = (2, 8)
GROUP_SIZES = (8, 8192)
STEPS = ("eager", "compiled")  # how an RTN draft's lean one-token step runs
HEAD_DEFAULT = "default"  # the form's head_top value for no -topK: the draft's own choice (`hfspec.kernels.lean`)


def make_rtn_draft(target: nn.Module, bits: int, group_size: int, fused: bool | None = None,
                   lean: bool | None = None, compiled: bool = False, progress=None,
                   head_top: int | None = None, codes: dict | None = None) -> nn.Module:
    """RTN copy of `target` at `bits` in groups of `group_size`.

    lean: None (default) takes the lean step (`hfspec.kernels.lean`) when the family is supported and the weights
    are on the CPU; True requires it (error naming why not); False keeps the HF forward. fused applies to the
    HF-forward path only (the int4 kernel where a layer allows it). compiled: also compile the lean one-token
    step (`hfspec.kernels.compiled`; needs the lean step), reporting through `progress(message)`.
    head_top: on the lean step, how many of the quantised head's largest logits are re-scored with the target's
    own head rows (default `hfspec.kernels.lean.HEAD_TOP`; 0 keeps the quantised head's logits as they are).
    codes: id(float weight) -> `hfspec.quant.calibrate.Coded`, codes at `bits` / `group_size` used instead of
    RTN's for those weights (a calibrated draft, `hfspec.drafts.calibrated`).
    """
    if head_top is not None and (isinstance(head_top, bool) or not isinstance(head_top, int)
                                 or not 0 <= head_top <= HEAD_TOP_MAX):
        raise HfspecError(f"draft option head_top: got {head_top!r}; allowed: an integer 0..{HEAD_TOP_MAX} "
                          "(0: no re-scoring)")
    if head_top and (lean is False or fused is not None):
        raise HfspecError("draft options: head_top re-scores the lean step's head; allowed: head_top without "
                          "lean=False or fused")
    memory.check_draft_fits(target, bits, group_size)  # an error before building, not an OOM kill midway

    if compiled and (lean is False or fused is not None):
        raise HfspecError("draft options: a compiled step needs the lean step; allowed: compiled drafts without "
                          "lean=False or fused")
    if lean is not False and fused is None:
        why = lean_reason(target)
        if why is None:
            draft = LeanDecoder(target, bits, group_size, progress=progress, head_top=head_top, codes=codes)
            if compiled:
                draft.compile_step(progress)
            return draft
        if compiled:
            raise HfspecError(f"draft: a compiled step needs the lean step, which {type(target).__name__} cannot "
                              f"take ({why}); allowed: the eager draft (drop '-compiled')")
        if head_top:
            raise HfspecError(f"draft option head_top: {type(target).__name__} cannot take the lean step ({why}), "
                              "whose head it re-scores; allowed: head_top=None or 0")
        if lean:
            raise HfspecError(f"draft option lean=True: {type(target).__name__} cannot take the lean step ({why}); "
                              "allowed: lean=None or lean=False (the Hugging Face forward)")
    elif lean and fused is not None:
        raise HfspecError("draft options: fused applies to the Hugging Face forward only; allowed: lean=True "
                          "without fused, or fused with lean=False")
    return quantize_model(target, bits, group_size, fused=fused, codes=codes)


class GroupSpecs:
    """The spec grammar of a kind of group-quantised copy, `<prefix>B[-gN][-topK][-compiled]` (rtn, gptq): how a
    string reads, its label, the string of form values, the head_top option, HF assisted generation."""

    def __init__(self, prefix: str, bits: tuple[int, int]):
        self.prefix, self.bits = prefix, bits
        self.pattern = re.compile(prefix + r"(\d+)(?:-g(\d+))?(?:-top(\d+))?(-compiled)?")
        self.allowed = f"{prefix}{bits[0]}..{prefix}{bits[1]}[-gN][-topK][-compiled]"

    def parse(self, text: str, low: str) -> DraftSpec | None:
        p = self.prefix
        if not low.startswith(p) or "+" in low:  # "rtn4+int8:…" is the mixed kind's (hfspec.drafts.mixed)
            return None
        match = self.pattern.fullmatch(low)
        if not match:
            raise fail(f"cannot read {text!r} (write {p}B, {p}B-gN, optionally -topK, optionally ending in "
                       f"-compiled, e.g. {p}4, {p}3-g64, {p}4-top0, {p}4-compiled)")
        bits = int(match.group(1))
        if not self.bits[0] <= bits <= self.bits[1]:
            raise fail(f"bits must be {self.bits[0]}..{self.bits[1]}, got {bits}")
        group = int(match.group(2)) if match.group(2) else DEFAULT_GROUP_SIZE
        if not GROUP_SIZES[0] <= group <= GROUP_SIZES[1]:
            raise fail(f"group size must be {GROUP_SIZES[0]}..{GROUP_SIZES[1]}, got {group}")
        params = ()
        if match.group(3) is not None:
            top = int(match.group(3))
            if top > HEAD_TOP_MAX:
                raise fail(f"-topK (head logits re-scored) must be 0..{HEAD_TOP_MAX}, got {top}")
            params += (("head_top", top),)
        if match.group(4):
            params += (("step", "compiled"),)
        return DraftSpec(p, bits=bits, group_size=group, params=params)

    def spec_of(self, values: dict) -> str:
        group = int(values.get("group") or DEFAULT_GROUP_SIZE)
        step = values.get("step") or STEPS[0]
        if step not in STEPS:
            raise fail(f"step must be one of {', '.join(STEPS)}, got {step!r}")
        top = values.get("head_top")
        return (f"{self.prefix}{int(values['bits'])}" + (f"-g{group}" if group != DEFAULT_GROUP_SIZE else "")
                + _top_suffix(None if top in ("", HEAD_DEFAULT) else top) + _step_suffix(step))

    def label(self, spec: DraftSpec) -> str:
        return (f"{self.prefix}{spec.bits}-g{spec.group_size}" + _top_suffix(spec.param("head_top"))
                + _step_suffix(spec.param("step", STEPS[0])))

    @staticmethod
    def options(spec: DraftSpec, options: dict) -> dict:
        """`options` with the spec's head_top (-topK) in; a different head_top option is an error naming both."""
        top = spec.param("head_top")
        if top is None:
            return options
        if options.get("head_top") is not None and options["head_top"] != top:
            raise HfspecError(f"draft options: the spec {spec.label} says head_top={top} and the option says "
                              f"head_top={options['head_top']!r}; allowed: one of them, or both the same")
        return {**options, "head_top": top}

    @staticmethod
    def assisted(target, draft, spec: DraftSpec, gamma: int):
        """A lean draft has no `generate`: HF assisted generation runs its HF-forward copy (no compiled step)."""
        if callable(getattr(draft, "generate", None)):
            return None
        eager = DraftSpec(spec.kind, bits=spec.bits, group_size=spec.group_size)
        assistant = _build(target, eager, {"lean": False})  # what make_draft(target, eager, lean=False) builds
        set_attr(assistant, DRAFT_SPEC, eager.label)
        warn_if_unfaithful(target, assistant)
        return {"assistant_model": assistant}, f"{eager.label} through the HF forward"

    def fields(self) -> tuple[Field, ...]:
        return (Field("bits", "bits", 4, low=self.bits[0], high=self.bits[1]),
                Field("group", "group size", DEFAULT_GROUP_SIZE, choices=(32, 64, 128, 256)),
                Field("step", "draft step", STEPS[0], choices=STEPS),
                Field("head_top", "head logits re-scored", HEAD_DEFAULT, choices=(HEAD_DEFAULT, 0, 8, 32, 128)))


def _top_suffix(top) -> str:
    """How a spec string spells head_top: "-topK", or nothing for the draft's own choice (None)."""
    return "" if top is None else f"-top{int(top)}"


def _step_suffix(step: str) -> str:
    """How a spec string ends for a step: "-compiled" or nothing."""
    return "-compiled" if step == "compiled" else ""


SPECS = GroupSpecs("rtn", RTN_BITS)


def _build(target, spec: DraftSpec, options: dict):
    return make_rtn_draft(target, spec.bits, spec.group_size, compiled=spec.param("step") == "compiled",
                          **SPECS.options(spec, options))


KIND = DraftKind(
    name="rtn", title="quantised copy (RTN)", allowed=SPECS.allowed,
    parse=SPECS.parse, build=_build, label=SPECS.label, fields=SPECS.fields(),
    spec_of=SPECS.spec_of, values=lambda s: {"bits": s.bits, "group": s.group_size},
    options=frozenset({"fused", "lean", "progress", "head_top"}), copies_target=True, assisted=SPECS.assisted,
    examples=("rtn4", "rtn3", "rtn8", "rtn4-g64", "rtn4-top0", "rtn4-compiled"),
)
