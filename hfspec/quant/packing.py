"""Dense bit packing of integer codes, and the CPU int4 kernel's layout.

`rows` layout (any bits 2..8): each row's codes are taken 8 at a time and 8 codes of B bits fill exactly B bytes
(little-endian: code j sits at bit B*j). A row of K codes takes ceil(K / 8) * B bytes (exact when K % 8 == 0).

`int4_cpu` layout: what `torch.ops.aten._convert_weight_to_int4pack_for_cpu` produces for N % 64 == 0 (checked
against torch at run time by `int4_block`): blocks of B rows, [N/B, K, B/2] bytes, the low nibble holding row Bb + j
and the high nibble row Bb + B/2 + j, with B = 64 on an AVX-512 CPU and 32 on an AVX2 one (an AVX2 CPU had fallen
back to a bf16 copy of every 4-bit draft: four times the bytes). Same byte count as `rows` for 4 bits; lets
embedding rows be read from it.
"""

from __future__ import annotations

import functools
import math

import torch

_CHUNK_ROWS = 2048  # rows packed at a time (bounds the int64 scratch)


def packed_row_bytes(in_features: int, bits: int) -> int:
    """Bytes one packed row of `in_features` codes takes in the `rows` layout."""
    return math.ceil(in_features / 8) * bits


def pack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """codes uint8 [N, K] -> packed uint8 [N, ceil(K/8) * bits]."""
    rows, cols = q.shape
    pad = math.ceil(cols / 8) * 8 - cols
    out = torch.empty(rows, packed_row_bytes(cols, bits), dtype=torch.uint8, device=q.device)
    code_shift = torch.arange(8, device=q.device, dtype=torch.int64) * bits
    byte_shift = torch.arange(bits, device=q.device, dtype=torch.int64) * 8
    for start in range(0, rows, _CHUNK_ROWS):
        part = q[start:start + _CHUNK_ROWS].to(torch.int64)
        if pad:
            part = torch.nn.functional.pad(part, (0, pad))
        words = (part.view(part.shape[0], -1, 8) << code_shift).sum(dim=-1)  # disjoint bits: sum == or
        out[start:start + _CHUNK_ROWS] = ((words.unsqueeze(-1) >> byte_shift) & 0xFF).to(torch.uint8).flatten(1)
    return out


def unpack_rows(packed: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """packed uint8 [R, ceil(K/8) * bits] -> codes uint8 [R, K]."""
    rows = packed.shape[0]
    if bits == 8:
        return packed[:, :in_features]
    if bits == 4:
        codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).view(rows, -1)
        return codes[:, :in_features]
    byte_shift = torch.arange(bits, device=packed.device, dtype=torch.int64) * 8
    code_shift = torch.arange(8, device=packed.device, dtype=torch.int64) * bits
    words = (packed.view(rows, -1, bits).to(torch.int64) << byte_shift).sum(dim=-1)
    codes = (words.unsqueeze(-1) >> code_shift) & (2**bits - 1)
    return codes.view(rows, -1)[:, :in_features].to(torch.uint8)


def pack_int4_cpu(q: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """codes uint8 [N, K] (N % 64 == 0, K even) -> the CPU int4 kernel's packed weight [N, K/2] (`block`: rows per
    block of the layout, default this CPU's, `int4_block`)."""
    n, k = q.shape
    block = block or int4_block() or 64
    v = q.view(n // block, 2, block // 2, k)
    packed = v[:, 0] | (v[:, 1] << 4)  # [N/block, block/2, K]
    return packed.permute(0, 2, 1).contiguous().view(n, k // 2)


def unpack_int4_cpu(packed: torch.Tensor, in_features: int, rows: torch.Tensor | None = None,
                    block: int | None = None) -> torch.Tensor:
    """The CPU int4 kernel's packed weight -> codes uint8 [R, K] for `rows` (all rows when None)."""
    n = packed.shape[0]
    block = block or int4_block() or 64
    half = block // 2
    blocks = packed.view(n // block, in_features, half)
    if rows is None:
        rows = torch.arange(n, device=packed.device)
    j = rows % block
    picked = blocks[rows // block, :, j % half]  # [R, K]
    return (picked >> (4 * (j // half)).to(torch.uint8).unsqueeze(-1)) & 0x0F


@functools.lru_cache(maxsize=1)
def int4_block() -> int:
    """Rows per block of torch's CPU int4 layout on this CPU: 64 with AVX-512, 32 with AVX2 (found by packing a probe
    with `_convert_weight_to_int4pack_for_cpu`); 0 when torch has no such kernel or neither layout matches."""
    try:
        convert = torch.ops.aten._convert_weight_to_int4pack_for_cpu
        q = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
        reference = convert(q, 1)
    except (AttributeError, RuntimeError, NotImplementedError):
        return 0
    for block in (64, 32):
        if torch.equal(reference, pack_int4_cpu(q.to(torch.uint8), block)):
            return block
    return 0


@functools.lru_cache(maxsize=1)
def int4_cpu_kernel_ok() -> bool:
    """True when torch has the CPU int4 kernel and its packing equals `pack_int4_cpu` (checked once)."""
    try:
        matmul = torch.ops.aten._weight_int4pack_mm_for_cpu
        gen = torch.Generator().manual_seed(0)
        q = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=gen)
        if not int4_block():
            return False
        sz = torch.ones(2, 128, 2, dtype=torch.bfloat16)  # w = (q - 8) * 1 + 1
        y = matmul(torch.eye(64, dtype=torch.bfloat16), pack_int4_cpu(q.to(torch.uint8)), 32, sz)
        return torch.equal(y.float(), (q.float() - 7).t())
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
