"""Drafts for speculative decoding: a quantised copy of the target (RTN, bitsandbytes), a smaller sibling, or
prompt lookup. Every kind is registered in `hfspec.drafts.registry`.

    draft = make_draft(target, "rtn4")          # also "rtn3-g64", "bnb-nf4", "lookup", a folder, a hub id, a model
"""

from __future__ import annotations

from torch import nn

from hfspec.attrs import DRAFT_SPEC, STEP_PATH, get_attr, set_attr
from hfspec.drafts import bnb, calibrated, int8, lookup, mixed, registry, rtn, sibling
from hfspec.drafts.base import Draft, ModelDraft, NoDraft, as_draft
from hfspec.drafts.cost import CostReport, measure_cost, weight_bytes
from hfspec.drafts.fidelity import fidelity, warn_if_unfaithful
from hfspec.drafts.registry import DraftSpec
from hfspec.drafts.registry import parse as parse_draft_spec
from hfspec.drafts.sibling import check_same_tokenizer, check_sibling, load_sibling
from hfspec.errors import HfspecError
from hfspec.kernels import native_step
from hfspec.kernels.lean import LeanDecoder
from hfspec.quant.swap import summary

# The modules of the built-in kinds, each defining `KIND`, in display order (a kind naming a model goes last).
BUILTIN = (rtn, calibrated, bnb, int8, mixed, lookup, sibling)
registry.load_builtin(module.KIND for module in BUILTIN)

__all__ = [
    "ALLOWED",
    "CostReport",
    "Draft",
    "DraftSpec",
    "ModelDraft",
    "NoDraft",
    "as_draft",
    "check_same_tokenizer",
    "check_sibling",
    "describe",
    "fidelity",
    "load_sibling",
    "make_draft",
    "measure_cost",
    "parse_draft_spec",
    "registry",
    "weight_bytes",
]


def __getattr__(name: str):
    if name == "ALLOWED":
        return registry.allowed()
    raise AttributeError(name)


def make_draft(target: nn.Module, spec, **options) -> nn.Module:
    """Build a draft for `target` from `spec` (see `hfspec.drafts.registry`). The target is not changed.

    Options: rtn: lean (bool, default: the lean decode step where the family is supported), head_top (int,
    default 32: the lean step re-scores its quantised head's top logits with the target's head rows), fused (bool,
    default: on CPU use the int4 kernel where it fits); sibling / model: target_tokenizer, draft_tokenizer
    (checked to match), plus `load_model` options.
    """
    parsed = parse_draft_spec(spec)
    if parsed.kind == "model":
        _only(options, {"target_tokenizer", "draft_tokenizer"}, parsed)
        draft = parsed.source
        check_sibling(target, draft, options.get("target_tokenizer"), options.get("draft_tokenizer"))
        return draft
    kind = registry.KINDS[parsed.kind]
    if kind.options is not None:
        _only(options, set(kind.options), parsed)
    draft = kind.build(target, parsed, options)
    set_attr(draft, DRAFT_SPEC, parsed.label)
    if kind.copies_target:
        warn_if_unfaithful(target, draft)  # a quantised copy far from its target: warn, with the number
    return draft


def describe(draft) -> dict:
    """How a draft runs: its kind, label, the path of its decode step and, for quantised layers, each layer's; for a
    compiled draft also what runs a two-token catch-up ("pair") and a token tree's levels ("tree_level"); for a lean
    draft whether its steps and short feeds take the native C step ("native", `hfspec.kernels.native_step`)."""
    label = get_attr(draft, DRAFT_SPEC) or type(draft).__name__
    step = get_attr(draft, STEP_PATH) or "Hugging Face forward"
    out = {"label": label, "step": step, "layers": summary(draft) if isinstance(draft, nn.Module) else {}}
    if isinstance(draft, LeanDecoder):
        out["native"] = native_step.path_of(draft)
    compiled = getattr(draft, "compiled_step", None)
    if compiled is not None:
        out["pair"], out["tree_level"] = compiled.pair_path, compiled.tree_level.path
    return out


def _only(options: dict, allowed: set[str], spec: DraftSpec) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise HfspecError(f"draft options: {', '.join(unknown)} not used by {spec.label!r}; allowed: "
                          f"{', '.join(sorted(allowed)) or 'none'}")
