"""hfspec's own int4 kernel (`hfspec.kernels.int4_rows`): the same product as torch's int4 kernel over the same
packed codes, for every row count a draft call takes, checked against a dequantised product; a wrong layout is
caught; `$HFSPEC_INT4_KERNEL` is honoured and a bad value is refused by name."""

from __future__ import annotations

import pytest
import torch

from hfspec.errors import HfspecError
from hfspec.kernels import int4_rows
from hfspec.kernels.lean_layers import LeanLinear
from hfspec.quant import packing

needs_kernel = pytest.mark.skipif(int4_rows.function() is None, reason="hfspec's int4 kernel does not run here")


def _linear(n=200, k=192, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    return LeanLinear(w, b, 4, 32)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 6, 7, 12, 16, 33, int4_rows.MAX_ROWS])
def test_matches_the_dequantised_product_and_torchs_kernel(rows):
    lin = _linear()
    assert lin.int4
    x = torch.randn(rows, 192, generator=torch.Generator().manual_seed(rows))
    fn = int4_rows.function()
    got = int4_rows.matmul(fn, x, lin.packed, lin.scales_and_zeros, 200, 32, lin.bias)
    want = int4_rows.reference(x, lin.packed, lin.scales_and_zeros, 200, 32, lin.bias)
    assert got.shape == (rows, 200)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    # torch's kernel rounds x to bf16: the two agree to that rounding, and LeanLinear takes hfspec's
    aten = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), lin.packed, 32,
                                                      lin.scales_and_zeros)[:, :200].float() + lin.bias
    assert (got - aten).abs().max() <= 2e-2 * aten.abs().max()
    assert torch.equal(lin(x), got)


@needs_kernel
def test_a_wrong_row_order_is_caught():
    lin = _linear(bias=False)
    x = torch.randn(4, 192, generator=torch.Generator().manual_seed(1))
    fn = int4_rows.function()
    got = int4_rows.matmul(fn, x, lin.packed, lin.scales_and_zeros, 200, 32, None)
    # the same codes read as the other CPU layout (AVX-512's blocks of 64 rows, AVX2's of 32) give other weights:
    # the reference must differ
    other = 32 if packing.int4_block() == 64 else 64
    codes = packing.unpack_int4_cpu(lin.packed, 192, block=other).float()
    scale = lin.scales_and_zeros[..., 0].float().t().repeat_interleave(32, 1)
    offset = lin.scales_and_zeros[..., 1].float().t().repeat_interleave(32, 1)
    wrong = x @ ((codes - 8) * scale + offset)[:200].t()
    assert (got - wrong).abs().max() > 0.1 * wrong.abs().max()


@needs_kernel
def test_off_keeps_torchs_kernel(monkeypatch):
    lin = _linear(bias=False)
    x = torch.randn(3, 192, generator=torch.Generator().manual_seed(2))
    ours = lin(x)
    monkeypatch.setenv(int4_rows.MODE_ENV, "off")
    assert int4_rows.function() is None and "off" in int4_rows.status()
    theirs = lin(x)
    assert not torch.equal(ours, theirs)  # torch's rounds x to bf16
    assert (ours - theirs).abs().max() <= 2e-2 * theirs.abs().max()


@needs_kernel
def test_as_compiled_gives_eager_calls_torchs_kernel():
    """A compiled step runs torch's kernel; the eager step it is checked against must too (`as_compiled`): over a
    30-layer model the two kernels' logits differ by more than a miscompile check allows."""
    lin = _linear(bias=False)
    x = torch.randn(5, 192, generator=torch.Generator().manual_seed(3))
    aten = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), lin.packed, 32,
                                                      lin.scales_and_zeros)[:, :200].float()
    ours = lin(x)
    with int4_rows.as_compiled():
        assert int4_rows.held()
        inside = lin(x)
    assert not int4_rows.held()
    assert torch.equal(inside, aten) and not torch.equal(ours, aten)
    assert torch.equal(lin(x), ours)


def test_a_bad_mode_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(int4_rows.MODE_ENV, "fast")
    with pytest.raises(HfspecError, match=int4_rows.MODE_ENV):
        int4_rows.mode()


@needs_kernel
def test_another_threads_compile_does_not_switch_this_threads_kernel(monkeypatch):
    """`torch.compiler.is_compiling()` is one flag for the process: while another thread traces a compiled step it
    reads True here too. Eager products must keep hfspec's kernel then (it had switched them to torch's, so a
    concurrent session's native step failed its check and wrote other text); the control: inside a real trace,
    `tracing()` is True and the traced product is torch's kernel."""
    import torch.compiler

    lin = _linear(bias=False)
    x = torch.randn(3, 192, generator=torch.Generator().manual_seed(4))
    ours = int4_rows.matmul(int4_rows.function(), x, lin.packed, lin.scales_and_zeros, 200, 32, None)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)  # as while another thread compiles
    assert torch.compiler.is_compiling() and not int4_rows.tracing()
    assert torch.equal(lin(x), ours)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
    product = lin.matmul()  # as a compiled step holds it (built outside the trace)
    traced = torch.compile(lambda v: (product(v), int4_rows.tracing()), fullgraph=True)(x)
    assert traced[1] is True
    aten = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), lin.packed, 32,
                                                      lin.scales_and_zeros)[:, :200].float()
    assert torch.allclose(traced[0], aten, atol=1e-2 * aten.abs().max().item()) and not torch.equal(traced[0], ours)
