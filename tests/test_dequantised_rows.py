"""Many activation rows (a long prompt's prefill) through a packed lean linear: its weights dequantised to bf16 a
block of rows at a time (from `lean_layers.DEQUANTISED_FROM` rows) give the packed kernel's product, and a whole draft's
prefill of a long prompt gives the logits of the kernel path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hfspec.kernels import lean_layers
from hfspec.kernels.lean_layers import LeanLinear
from hfspec.quant import groupwise, int8
from hfspec.quant.packing import int4_cpu_kernel_ok, unpack_int4_cpu

needs_int4 = pytest.mark.skipif(not int4_cpu_kernel_ok(), reason="torch has no CPU int4 kernel with the known layout")


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@needs_int4
def test_int4_rows_are_the_kernels_weights_and_a_wrong_row_order_is_caught():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 96, generator=g)  # 200 rows: the packed weight is padded to 256
    lin = LeanLinear(w, None, 4, 32)
    assert lin.int4
    sz = lin.scales_and_zeros.float()  # [G, Npad, 2]: scale, zero + 8 · scale
    codes = unpack_int4_cpu(lin.packed, 96)[:200]
    want = groupwise.group_dequantize(codes, sz[:, :200, 0].t(), sz[:, :200, 1].t() - 8 * sz[:, :200, 0].t(), 32)
    for start, end in ((0, 200), (64, 128), (128, 200)):
        got = lean_layers._int4_rows(lin.packed, lin.scales_and_zeros, 32, start, end)
        assert got.dtype == torch.bfloat16 and got.shape == (end - start, 96)
        assert torch.allclose(got.float(), want[start:end], rtol=1e-2, atol=1e-2)
    # the kernel itself computes with these weights: its product over the identity reads them back
    eye = torch.eye(96, dtype=torch.bfloat16)
    read = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, lin.packed, 32, lin.scales_and_zeros).float().t()[:200]
    full = lean_layers._int4_rows(lin.packed, lin.scales_and_zeros, 32, 0, 200).float()
    assert _relative(full, read) < 1e-2
    # negative control: the low and high halves of a 64-row tile swapped are far from the kernel's weights
    swapped = torch.cat([full[32:64], full[:32], full[64:]])
    assert _relative(swapped, read) > 0.3


@pytest.mark.parametrize("storage", ["int4", "int8"])
def test_many_rows_take_the_dequantised_path_and_give_the_kernels_product(storage, monkeypatch):
    if storage == "int4" and not int4_cpu_kernel_ok():
        pytest.skip("torch has no CPU int4 kernel with the known layout")
    if storage == "int8" and int8.kernel_reason() is not None:
        pytest.skip(int8.kernel_reason())
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(200, 96, generator=g), torch.randn(200, generator=g)
    lin = LeanLinear(w, b, 4, 32) if storage == "int4" else LeanLinear(w, b, 8, int8.PER_CHANNEL)
    assert lin.int4 if storage == "int4" else lin.int8
    x = torch.randn(12, 96, generator=g)
    monkeypatch.setitem(lean_layers.DEQUANTISED_FROM, storage, 10**9)
    kernel = lin(x)
    calls = []
    real = lean_layers._dequantised
    monkeypatch.setattr(lean_layers, "_dequantised", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(groupwise, "CHUNK_ELEMENTS", 64 * 96)  # several blocks of rows (`lean_layers._row_blocks`)
    monkeypatch.setitem(lean_layers.DEQUANTISED_FROM, storage, 12)
    got = lin(x)
    assert len(calls) == 1 and got.dtype == torch.float32 and got.shape == (12, 200)
    assert _relative(got, kernel) < 1e-2  # the same grid, both in bf16 products
    assert _relative(got, F.linear(x, w, b)) < 0.2  # and still x W^T (+ b) to the grid's accuracy
    # negative control: the bias left out is caught by the same bound
    assert _relative(got - b, kernel) > 1e-2
    monkeypatch.setitem(lean_layers.DEQUANTISED_FROM, storage, 13)  # fewer rows than the threshold: the kernel
    lin(x)
    assert len(calls) == 1


@needs_int4
def test_a_long_prompts_prefill_gives_the_kernel_paths_logits(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    import hfspec

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    target = LlamaForCausalLM(config).eval()
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.randint(0, 128, (1, 300))
    monkeypatch.setitem(lean_layers.DEQUANTISED_FROM, "int4", 10**9)
    want = draft(ids).logits
    monkeypatch.setitem(lean_layers.DEQUANTISED_FROM, "int4", 256)
    got = draft(ids).logits
    assert got.shape == want.shape
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    assert agree > 0.97 and _relative(got, want) < 0.05
