"""Group-wise asymmetric round-to-nearest (RTN) on plain tensors.

A weight [N, K] is cut into groups of `group_size` along the input dimension K (the last group may be shorter).
Each group keeps an fp16 `scale` and an fp16 `zero` (the value of code 0):  w ~= q * scale + zero,
q in 0 .. 2**bits - 1. `zero` is rounded down and `scale` up to fp16, so the codes always cover the group's
range and the rounding error stays within half a step.

Large matrices are worked on a block of rows at a time (every step is per row, so the result is the same),
which bounds the float scratch to about `CHUNK_ELEMENTS` values instead of several copies of the matrix.
"""

from __future__ import annotations

import math

import torch

CHUNK_ELEMENTS = 1 << 20  # values per block of rows (4 MiB of fp32 scratch per temporary)


def n_groups(in_features: int, group_size: int) -> int:
    """Number of groups along K (the last one may be ragged)."""
    return math.ceil(in_features / group_size)


def _pad_groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N, K] -> [N, G, group_size], the ragged tail padded with the row's last value (min/max unchanged)."""
    rows, cols = w.shape
    pad = n_groups(cols, group_size) * group_size - cols
    if pad:
        w = torch.cat([w, w[:, -1:].expand(rows, pad)], dim=1)
    return w.reshape(rows, -1, group_size)


def _round_half(x: torch.Tensor, direction: float) -> torch.Tensor:
    """fp32 -> fp16, rounded towards -inf (direction < 0) or +inf (direction > 0)."""
    h = x.clamp(-65504, 65504).half()
    off = h.float() > x if direction < 0 else h.float() < x
    step = torch.full_like(h, direction * math.inf)
    return torch.where(off, torch.nextafter(h, step), h)


def group_qparams(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group (scale, zero) in fp16, each [N, G]."""
    return _qparams_of_groups(_pad_groups(w.detach().float(), group_size), bits)


def _qparams_of_groups(g: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    zero = _round_half(g.amin(dim=-1), -1.0)
    scale = _round_half((g.amax(dim=-1) - zero.float()) / (2**bits - 1), +1.0)
    return scale, zero


def _row_blocks(rows: int, cols: int):
    """Row ranges of about CHUNK_ELEMENTS values each."""
    step = max(1, CHUNK_ELEMENTS // max(1, cols))
    return ((start, min(rows, start + step)) for start in range(0, rows, step))


def group_quantize(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (codes uint8 [N, K], scale fp16 [N, G], zero fp16 [N, G])."""
    rows, cols = w.shape
    if w.numel() <= CHUNK_ELEMENTS:
        return _quantize_block(w, bits, group_size)
    q = torch.empty(rows, cols, dtype=torch.uint8, device=w.device)
    scale = torch.empty(rows, n_groups(cols, group_size), dtype=torch.float16, device=w.device)
    zero = torch.empty_like(scale)
    for start, end in _row_blocks(rows, cols):
        q[start:end], scale[start:end], zero[start:end] = _quantize_block(w[start:end], bits, group_size)
    return q, scale, zero


def _quantize_block(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    g = _pad_groups(w.detach().float(), group_size)  # may be `w` itself: only read
    scale, zero = _qparams_of_groups(g, bits)
    s = scale.float().unsqueeze(-1)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = (g - zero.float().unsqueeze(-1)).div_(safe).round_().clamp_(0, 2**bits - 1)
    return q.to(torch.uint8).reshape(rows, -1)[:, :cols].contiguous(), scale, zero


def group_dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes [R, K] with scale/zero [R, G] -> weights [R, K] in `dtype`."""
    rows, cols = q.shape
    if q.numel() <= CHUNK_ELEMENTS:
        return _dequantize_block(q, scale, zero, group_size, dtype)
    out = torch.empty(rows, cols, dtype=dtype, device=q.device)
    for start, end in _row_blocks(rows, cols):
        out[start:end] = _dequantize_block(q[start:end], scale[start:end], zero[start:end], group_size, dtype)
    return out


def _dequantize_block(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                      dtype: torch.dtype) -> torch.Tensor:
    rows, cols = q.shape
    g = _pad_groups(q, group_size).to(torch.float32)
    w = g * scale.float().unsqueeze(-1) + zero.float().unsqueeze(-1)
    return w.reshape(rows, -1)[:, :cols].to(dtype)
