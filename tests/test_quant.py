"""Tensor-level RTN: error bounds, packed sizes, packing round trips, the fused CPU int4 kernel."""

import math

import pytest
import torch

from hfspec.quant import group_dequantize, group_quantize, pack_rows, packed_row_bytes, unpack_rows
from hfspec.quant.modules import QuantWeight, fused_int4_reason
from hfspec.quant.packing import int4_cpu_kernel_ok, pack_int4_cpu, unpack_int4_cpu


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("cols,group", [(64, 32), (172, 32), (40, 16), (100, 64)])
def test_error_within_half_step(bits, cols, group):
    w = torch.randn(24, cols, generator=torch.Generator().manual_seed(bits)) * 3 + 0.5
    q, scale, zero = group_quantize(w, bits, group)
    assert q.dtype == torch.uint8 and int(q.max()) <= 2**bits - 1
    assert scale.dtype == zero.dtype == torch.float16 and scale.shape == (24, math.ceil(cols / group))
    step = scale.float().repeat_interleave(group, dim=1)[:, :cols]
    err = (group_dequantize(q, scale, zero, group) - w).abs()
    assert (err <= step / 2 + 1e-5).all()


def test_constant_group_is_exact_enough():
    w = torch.full((2, 32), 0.1234)
    q, scale, zero = group_quantize(w, 4, 32)
    assert (group_dequantize(q, scale, zero, 32) - w).abs().max() < 1e-3


@pytest.mark.parametrize("bits", [3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_blocks_give_the_same_codes_and_weights(monkeypatch, bits, dtype):
    """Large matrices are quantised a block of rows at a time (bounded scratch); the result must not change."""
    from hfspec.quant import groupwise

    w = (torch.randn(97, 100, generator=torch.Generator().manual_seed(bits)) * 2).to(dtype)
    whole = group_quantize(w, bits, 32)
    dense = group_dequantize(*whole, 32, torch.bfloat16)
    monkeypatch.setattr(groupwise, "CHUNK_ELEMENTS", 700)  # 7 rows per block, a ragged last block
    blocks = group_quantize(w, bits, 32)
    for a, b in zip(whole, blocks, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(group_dequantize(*blocks, 32, torch.bfloat16), dense)


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("cols", [64, 172, 5])
def test_pack_round_trip_and_exact_bytes(bits, cols):
    q = torch.randint(0, 2**bits, (7, cols), dtype=torch.uint8)
    packed = pack_rows(q, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (7, math.ceil(cols / 8) * bits) == (7, packed_row_bytes(cols, bits))
    if cols % 8 == 0:
        assert packed.numel() == 7 * cols * bits // 8  # exactly B bits per code
    assert torch.equal(unpack_rows(packed, bits, cols), q)
    rows = torch.tensor([6, 0, 3])
    assert torch.equal(unpack_rows(packed[rows], bits, cols), q[rows])


@pytest.mark.parametrize("block", [64, 32, None])  # AVX-512's layout, AVX2's, this CPU's
def test_int4_cpu_layout_round_trip(block):
    q = torch.randint(0, 16, (128, 96), dtype=torch.uint8)
    packed = pack_int4_cpu(q, block)
    assert packed.shape == (128, 48)
    assert torch.equal(unpack_int4_cpu(packed, 96, block=block), q)
    rows = torch.tensor([127, 0, 33, 64, 17])
    assert torch.equal(unpack_int4_cpu(packed, 96, rows, block=block), q[rows])
    if block:  # the two layouts differ: reading one as the other is wrong (the control)
        assert not torch.equal(unpack_int4_cpu(packed, 96, block=96 - block), q)


def test_the_int4_layout_is_torchs_on_this_cpu():
    from hfspec.quant.packing import int4_block

    block = int4_block()
    if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
        assert block == 0
        return
    q = torch.randint(0, 16, (128, 64), dtype=torch.int32)
    assert block in (64, 32) and int4_cpu_kernel_ok()
    assert torch.equal(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), pack_int4_cpu(q.to(torch.uint8)))


@pytest.mark.skipif(not int4_cpu_kernel_ok(), reason="torch has no CPU int4 kernel with the known layout")
def test_fused_int4_equals_dequantised_reference():
    w = torch.randn(128, 96, generator=torch.Generator().manual_seed(0))
    fused = QuantWeight.from_float(w, 4, 32, fused=True)
    plain = QuantWeight.from_float(w, 4, 32, fused=False)
    assert fused.packed.numel() == plain.packed.numel()  # same packed bytes, kernel order
    assert torch.equal(fused.codes(), plain.codes())
    ref_w = fused.dequantize()  # from what the fused layer holds
    assert (ref_w - plain.dequantize()).abs().max() < 0.02  # bf16 vs fp16 scales
    x = torch.randn(3, 96)
    ref = x.bfloat16().float() @ ref_w.t()
    got = fused.matmul(x)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() <= 0.02 * ref.abs().max()
    assert (plain.matmul(x) - x @ plain.dequantize().t()).abs().max() < 1e-4


def test_fused_reasons():
    assert fused_int4_reason(4, 32, 128, 96, "cpu") in (None, "torch has no matching CPU int4 kernel")
    assert "K=172" in fused_int4_reason(4, 32, 128, 172, "cpu")
    assert "N=32" in fused_int4_reason(4, 32, 32, 64, "cpu")
    assert fused_int4_reason(3, 32, 128, 64, "cpu") == "3-bit"
    assert "group size" in fused_int4_reason(4, 16, 128, 64, "cpu")
