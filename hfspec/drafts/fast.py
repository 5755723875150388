"""RTN drafts: a lean decode step of their own where the family is supported, else the HF forward."""

from __future__ import annotations

from torch import nn


def make_rtn_draft(target: nn.Module, bits: int, group_size: int, fused: bool | None = None,
                   lean: bool | None = None) -> nn.Module:
    """RTN copy of `target` at `bits` in groups of `group_size`."""
    from hfspec.quant.swap import quantize_model

    return quantize_model(target, bits, group_size, fused=fused)
