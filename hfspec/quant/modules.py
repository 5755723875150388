"""Modules holding packed RTN weights: one `QuantWeight` storage, used by `QuantLinear` and `QuantEmbedding`.

A tied embedding / LM head pair shares one `QuantWeight` module, so the packed bytes exist once.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hfspec.quant import groupwise, packing

FUSED_GROUP_SIZES = (32, 64, 128, 256)


def fused_int4_reason(bits: int, group_size: int, out_features: int, in_features: int, device) -> str | None:
    """None when a [N, K] weight can use the CPU int4 kernel; otherwise why not."""
    if bits != 4:
        return f"{bits}-bit"
    if torch.device(device).type != "cpu":
        return "not on CPU"
    if group_size not in FUSED_GROUP_SIZES:
        return f"group size {group_size} not in {FUSED_GROUP_SIZES}"
    if in_features % group_size:
        return f"K={in_features} not a multiple of {group_size}"
    if out_features % 64:
        return f"N={out_features} not a multiple of 64"
    if not packing.int4_cpu_kernel_ok():
        return "torch has no matching CPU int4 kernel"
    return None


class QuantWeight(nn.Module):
    """Packed codes of a weight [N, K] plus per-group scale and zero.

    layout "rows": `packed` [N, ceil(K/8)*bits] uint8, `scale`/`zero` [N, G] fp16.
    layout "int4_cpu": `packed` [N, K/2] uint8 in the CPU kernel's order, `scales_and_zeros` [G, N, 2] bf16 in the
    kernel's convention w = (q - 8) * scale + zero'  (zero' = zero + 8 * scale).
    """

    def __init__(self, shape, bits: int, group_size: int, layout: str, dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = shape
        self.bits, self.group_size, self.layout, self.dtype = bits, group_size, layout, dtype

    @classmethod
    def from_float(cls, w: torch.Tensor, bits: int, group_size: int, fused: bool = False) -> QuantWeight:
        """Quantise a float weight [N, K]; `fused` picks the CPU int4 kernel layout (caller checks eligibility)."""
        q, scale, zero = groupwise.group_quantize(w, bits, group_size)
        return cls.from_codes(q, scale, zero, bits, group_size, w.dtype, fused)

    @classmethod
    def from_codes(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, group_size: int,
                   dtype: torch.dtype, fused: bool = False) -> QuantWeight:
        """Store given codes uint8 [N, K] with fp16 scale / zero [N, G] (e.g. a calibrated draft's); `dtype`: the
        float weight's, which `dequantize` returns."""
        layout = "int4_cpu" if fused else "rows"
        self = cls(tuple(q.shape), bits, group_size, layout, dtype)
        if fused:
            sz = torch.stack([scale.float(), zero.float() + 8 * scale.float()], dim=-1)
            self.register_buffer("packed", packing.pack_int4_cpu(q))
            self.register_buffer("scales_and_zeros", sz.transpose(0, 1).contiguous().to(torch.bfloat16))
        else:
            self.register_buffer("packed", packing.pack_rows(q, bits))
            self.register_buffer("scale", scale)
            self.register_buffer("zero", zero)
        return self

    def codes(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Integer codes uint8 [R, K] of `rows` (all when None)."""
        if self.layout == "int4_cpu":
            return packing.unpack_int4_cpu(self.packed, self.in_features, rows)
        packed = self.packed if rows is None else self.packed[rows]
        return packing.unpack_rows(packed, self.bits, self.in_features)

    def scale_zero(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, zero) [R, G] such that w = q * scale + zero."""
        if self.layout == "int4_cpu":
            sz = self.scales_and_zeros if rows is None else self.scales_and_zeros[:, rows]
            scale, zero8 = sz[..., 0].t().float(), sz[..., 1].t().float()
            return scale, zero8 - 8 * scale
        if rows is None:
            return self.scale, self.zero
        return self.scale[rows], self.zero[rows]

    def dequantize(self, rows: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Float weights [R, K] of `rows` (all when None), in the original dtype unless `dtype` is given."""
        scale, zero = self.scale_zero(rows)
        return groupwise.group_dequantize(self.codes(rows), scale, zero, self.group_size, dtype or self.dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] @ W.T -> [M, N]; the fused kernel (bf16 activations) when the layout allows it."""
        if self.layout == "int4_cpu" and x.device.type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16).contiguous(), self.packed, self.group_size, self.scales_and_zeros)
            return y.to(x.dtype)
        return F.linear(x, self.dequantize(dtype=x.dtype))

    @property
    def path(self) -> str:
        """How a matmul with this weight runs."""
        if self.layout == "int4_cpu":
            return "fused int4 (aten._weight_int4pack_mm_for_cpu, bf16 activations)"
        return "dequantise + matmul"

    def extra_repr(self) -> str:
        return (f"{self.out_features}x{self.in_features}, bits={self.bits}, group_size={self.group_size}, "
                f"layout={self.layout}")


class QuantLinear(nn.Module):
    """Linear layer y = x W^T + b over a `QuantWeight`."""

    def __init__(self, qweight: QuantWeight, bias: torch.Tensor | None):
        super().__init__()
        self.qweight = qweight
        self.in_features, self.out_features = qweight.in_features, qweight.out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.qweight.matmul(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class QuantEmbedding(nn.Module):
    """Embedding lookup that dequantises only the rows looked up.

    embed_scale: a factor the replaced layer multiplied its rows by (Gemma's `*ScaledWordEmbedding`: sqrt(hidden),
    cast to the weight's dtype before the product, as there); None for a plain `nn.Embedding`.
    """

    def __init__(self, qweight: QuantWeight, padding_idx: int | None = None, embed_scale: torch.Tensor | None = None):
        super().__init__()
        self.qweight = qweight
        self.num_embeddings, self.embedding_dim = qweight.out_features, qweight.in_features
        self.padding_idx = padding_idx
        scale = None if embed_scale is None else torch.as_tensor(embed_scale).detach().clone()
        self.register_buffer("embed_scale", scale, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.qweight.dequantize(rows=ids.reshape(-1).to(self.qweight.packed.device))
        rows = rows.view(*ids.shape, self.embedding_dim)
        return rows if self.embed_scale is None else rows * self.embed_scale.to(rows.dtype)

    def extra_repr(self) -> str:
        scale = "" if self.embed_scale is None else f", embed_scale={float(self.embed_scale):g}"
        return f"{self.num_embeddings}, {self.embedding_dim}{scale}"
