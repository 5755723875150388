"""Drafts for speculative decoding: a quantised copy of the target (RTN, bitsandbytes) or a smaller sibling.

    draft = make_draft(target, "rtn4")          # also "rtn3-g64", "bnb-nf4", "bnb-int8", a folder, a hub id, a model
"""

from __future__ import annotations

from torch import nn

from hfspec.drafts.cost import CostReport, measure_cost, weight_bytes
from hfspec.drafts.sibling import check_same_tokenizer, check_sibling, load_sibling
from hfspec.drafts.spec import ALLOWED, DraftSpec, parse_draft_spec
from hfspec.errors import HfspecError

__all__ = [
    "ALLOWED",
    "CostReport",
    "DraftSpec",
    "check_same_tokenizer",
    "check_sibling",
    "make_draft",
    "measure_cost",
    "parse_draft_spec",
    "weight_bytes",
]


def make_draft(target: nn.Module, spec, **options) -> nn.Module:
    """Build a draft for `target` from `spec` (see `parse_draft_spec`). The target is not changed.

    Options: rtn: fused (bool, default: on CPU use the int4 kernel where it fits);
    sibling / model: target_tokenizer, draft_tokenizer (checked to match), plus `load_model` options.
    """
    parsed = parse_draft_spec(spec)
    if parsed.kind == "rtn":
        from hfspec.quant.swap import quantize_model

        _only(options, {"fused"}, parsed)
        draft = quantize_model(target, parsed.bits, parsed.group_size, fused=options.get("fused"))
    elif parsed.kind == "bnb":
        from hfspec.drafts.bnb import make_bnb_draft

        _only(options, set(), parsed)
        draft = make_bnb_draft(target, parsed.bnb_type)
    elif parsed.kind == "model":
        _only(options, {"target_tokenizer", "draft_tokenizer"}, parsed)
        draft = parsed.source
        check_sibling(target, draft, options.get("target_tokenizer"), options.get("draft_tokenizer"))
    else:
        draft = load_sibling(target, parsed.source, **options)
    if parsed.kind != "model":
        draft.hfspec_draft_spec = parsed.label
    return draft


def _only(options: dict, allowed: set[str], spec: DraftSpec) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise HfspecError(f"draft options: {', '.join(unknown)} not used by {spec.label!r}; allowed: "
                          f"{', '.join(sorted(allowed)) or 'none'}")
