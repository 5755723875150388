"""Weight-only int8 with one scale per output row (symmetric, codes -127..127), run by the CPU kernel
`torch.ops.aten._weight_int8pack_mm(x bf16 [M, K], codes int8 [N, K], scales bf16 [N]) -> bf16 [M, N]`.

A different grid from `rtnB-gN` (asymmetric, a scale and zero per group of N): one byte a weight plus two bytes
a row, and a single matmul per linear where grouped 8-bit codes would need one per group or a dequantised copy
(which is how `rtn8` runs: a bf16 matrix, two bytes a weight, through oneDNN's bf16 GEMM, slow at one row).

The kernel takes bf16 (or fp16) activations: with fp32 ones it runs a reference loop several times slower than
fp32 `F.linear` (torch 2.13 CPU), so `matmul` casts x to bf16 and the result back to fp32, as the int4 path does.
It needs K % 16 == 0 (`K_MULTIPLE`; other K give wrong numbers silently).
"""

from __future__ import annotations

import functools

import torch

PER_CHANNEL = 0  # the group size that means "one scale per output row" to `LeanLinear`
CODE_MAX = 127  # symmetric codes -127..127 (-128 unused, so the grid is symmetric around 0)
PATH = "int8 per-channel CPU kernel (aten._weight_int8pack_mm)"
# the kernel reads K in blocks of 16: at other K (torch 2.13 CPU) it returns garbage, not an error, so `LeanLinear`
# keeps such a matrix's dequantised codes in fp32 instead
K_MULTIPLE = 16


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> (codes int8 [N, K], scale fp32 [N]) with w ≈ codes * scale[:, None]; an all-zero row gets
    scale 1 (codes 0)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / CODE_MAX, torch.ones_like(amax))
    codes = torch.round(w / scale[:, None]).clamp_(-CODE_MAX, CODE_MAX).to(torch.int8)
    return codes, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes int8 [R, K], scale [R] -> float [R, K]."""
    return (codes.float() * scale.float()[:, None]).to(dtype)


def matmul_fn(codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
    """A function x [M, K] fp32 -> fp32 [M, N] = x (codes * scales)^T (+ bias), one kernel call."""
    kernel = torch.ops.aten._weight_int8pack_mm
    bf16 = torch.bfloat16

    def int8(x):
        y = kernel(x.to(bf16), codes, scales).float()
        return y if bias is None else y + bias
    return int8


@functools.cache
def kernel_reason() -> str | None:
    """None when this torch's CPU `_weight_int8pack_mm` takes bf16 activations and computes x W^T on a probe;
    otherwise why not."""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return f"torch {torch.__version__} has no aten._weight_int8pack_mm"
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(24, 4 * K_MULTIPLE, generator=g)
        x = torch.randn(3, 4 * K_MULTIPLE, generator=g)
        codes, scale = quantize_rows(w)
        got = op(x.to(torch.bfloat16), codes, scale.to(torch.bfloat16)).float()
        want = x.to(torch.bfloat16).float() @ dequantize(codes, scale.to(torch.bfloat16)).t()
        if not torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max())):
            return "aten._weight_int8pack_mm computed a wrong product on a probe"
    except (RuntimeError, NotImplementedError) as error:
        return f"aten._weight_int8pack_mm failed on a bf16 probe: {str(error).splitlines()[0]}"
    return None
