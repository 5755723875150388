"""The lean step's attention and rotary as plain arithmetic, which inductor fuses (SDPA and complex operators are
opaque calls to it): rotary as a real rotation of pairs, attention over every preallocated cache slot through a
mask, for one new token (`attend_one`, the compiled one-token step) or a few (`attend_many`, the compiled pair
step). Used by `hfspec.kernels.lean_layers`.
"""

from __future__ import annotations

import torch


def rotate(pairs: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Pairs [..., P, 2] (x, y) rotated by [..., P, 2] (cos, sin): (x + iy)(cos + i sin) in real arithmetic."""
    x, y = pairs[..., 0], pairs[..., 1]
    cos, sin = factors[..., 0], factors[..., 1]
    return torch.stack([x * cos - y * sin, x * sin + y * cos], dim=-1)


def attend_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float):
    """Attention of one query per head q [B, H, 1, D] over cache slots [B, H_kv, S, D] where `mask` [.., S] holds,
    as plain reductions (which a compiler fuses; SDPA is an opaque call): query heads grouped by their KV head.
    Written as broadcast products summed, not `einsum`, which inductor turns into two batched-matmul calls a
    layer; with the rotary in real arithmetic (`rotate`) the compiled gptq4 step of SmolLM2-135M went from 9.05
    to 8.97 ms (fp32) and 9.66 to 9.23 ms (bf16) on a 2-core Intel Xeon (`benchmarks/bench_int8.py`)."""
    batch, heads, _, dim = q.shape
    kv_heads = keys.shape[1]
    q = q.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = (q.unsqueeze(3) * keys.unsqueeze(2)).sum(-1) * scale
    weights = torch.softmax(scores.masked_fill(~mask.view(1, 1, 1, -1), -float("inf")), dim=-1)
    return (weights.unsqueeze(-1) * values.unsqueeze(2)).sum(3).reshape(batch, heads, 1, dim)


def attend_many(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float):
    """`attend_one` for T queries per head q [B, H, T, D] (T new tokens at once), `mask` [1, 1, T, S]."""
    batch, heads, steps, dim = q.shape
    kv_heads = keys.shape[1]
    q = q.reshape(batch, kv_heads, heads // kv_heads, steps, dim)
    scores = (q.unsqueeze(4) * keys[:, :, None, None]).sum(-1) * scale  # [B, H_kv, G, T, S]
    weights = torch.softmax(scores.masked_fill(~mask.view(1, 1, 1, steps, -1), -float("inf")), dim=-1)
    return (weights.unsqueeze(-1) * values[:, :, None, None]).sum(4).reshape(batch, heads, steps, dim)


def attention_mask(start: int, end: int, steps: int, valid: torch.Tensor | None, window: int | None):
    """Boolean mask [B|1, 1, T, S] over cache slots (None when every query may see every slot): causal, holes
    masked, and for sliding-window layers keys within `window` slots (positions equal slots in a batch of one;
    in a batch with holes the window is a little wider, which a proposal may be)."""
    sliding = window is not None and end > window
    if steps == 1 and valid is None and not sliding:
        return None
    query = start + torch.arange(steps)[:, None]
    slot = torch.arange(end)[None, :]
    mask = slot <= query
    if sliding:
        mask = mask & (slot > query - window)
    mask = mask[None, None]
    return mask if valid is None else mask & valid[:, None, None, :end].bool()


