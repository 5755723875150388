"""A dtype's name as hfspec writes it everywhere (messages, priors' keys, SpecStats.target_dtype): "bfloat16", not
"torch.bfloat16"."""

from __future__ import annotations


def dtype_str(dtype) -> str:
    """torch.bfloat16 -> "bfloat16"; a name given as a string is returned as it is."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def model_dtype_str(model) -> str:
    """The name of a model's first floating-point parameter's dtype ("" for a model without one)."""
    for p in model.parameters():
        if p.is_floating_point():
            return dtype_str(p.dtype)
    return ""


__all__ = ["dtype_str", "model_dtype_str"]
