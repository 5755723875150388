"""compressed-tensors' "pack-quantized" layout: RTN weights packed into int32 words, with the config that says so.

One Linear weight [N, K] becomes int4 or int8 codes packed 32/bits to an int32 word, one scale and (4 bits) one
integer zero point per group of `group_size` inputs; `quantization_config` describes it to transformers and the
serving engines ("W4A16" / "W8A16": activations left in float), and `load_export` reads such a folder back.

How close it is to hfspec's in-memory draft. hfspec's RTN (`hfspec.quant.groupwise`) keeps a float zero per
group (w ≈ q·scale + zero, zero = the group's minimum); compressed-tensors stores an integer zero point
(w ≈ (q − zp)·scale), which a float zero cannot be written as. `pack_linear` keeps hfspec's per-group scale and
rounds the zero to the nearest code, then rounds every weight again on that grid: each weight stays within half
a step of the float weight, the bound hfspec's own RTN has, but a weight may land on the neighbouring code of
hfspec's. Where 0 lies more than half a step outside a group's range (a group of weights all of one sign) the
integer grid must reach 0, so that group's step widens to cover [min(w, 0), max(w, 0)]; it counts them.
`rtn_dense` gives hfspec's own RTN values of a weight (the in-memory draft's; the export writes the embedding and LM head
with the target's own values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hfspec.errors import HfspecError
from hfspec.extras import extra_version, require_extra
from hfspec.quant import groupwise

EXPORT_BITS = (4, 8)  # the weight widths of compressed-tensors' W4A16 / W8A16 schemes that vLLM serves
EXPORT_GROUP_SIZES = (32, 64, 128)  # group sizes vLLM's grouped int4 / int8 kernels take
FORMAT = "pack-quantized"


@dataclass
class PackedLinear:
    tensors: dict
    groups: int
    widened: int
    max_error_steps: float


def symmetric_for(bits: int) -> bool:
    """Whether `bits`-wide weights are exported symmetric (no zero point).

    4 bits: asymmetric, as hfspec's RTN (vLLM runs int4 with zero points). 8 bits: symmetric, the int8 form the
    engines' W8A16 kernels take; at 8 bits the step is fine enough that centring costs little."""
    return bits == 8


def pack_linear(weight: torch.Tensor, bits: int, group_size: int, dtype: torch.dtype) -> PackedLinear:
    """One Linear weight [N, K] in compressed-tensors' pack-quantized layout.

    Returns weight_packed (int32), weight_scale [N, G] in `dtype`, weight_zero_point (int32, packed along N; only
    when asymmetric) and weight_shape, such that compressed-tensors' dequantisation (c − zp)·scale gives weights
    within half a step of `weight`. Asymmetric: the step is hfspec's scale (rounded up to `dtype`), the zero
    point hfspec's zero rounded to a code. Symmetric: step max|w| / (2^(bits−1) − 1), rounded up."""
    rows, cols = weight.shape
    if cols % group_size:
        raise HfspecError(f"draft: in_features {cols} is not a multiple of group size {group_size}; allowed: a "
                          f"group size dividing every Linear layer's input width")
    half = 2 ** (bits - 1)
    w = weight.detach().float().reshape(rows, cols // group_size, group_size)
    if symmetric_for(bits):
        scale = _round_up(w.abs().amax(dim=-1) / (half - 1), dtype)
        zp = torch.full_like(scale, float(half))
        wide = torch.zeros_like(scale, dtype=torch.bool)
    else:
        top = 2**bits - 1
        scale16, zero16 = groupwise.group_qparams(weight.detach(), bits, group_size)
        scale, zero = scale16.float(), zero16.float()
        lo = w.amin(dim=-1).clamp(max=0)
        hi = w.amax(dim=-1).clamp(min=0)
        # 0 must sit on an integer code: where hfspec's grid misses it by more than half a step, the step widens
        # to cover [min(w, 0), max(w, 0)]
        wide = (zero > 0.5 * scale) | (-zero > (top + 0.5) * scale)
        scale = _round_up(torch.where(wide, (hi - lo) / top, scale), dtype)
        zero = torch.where(wide, lo, zero)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        zp = (-zero / safe).round().clamp(0, top)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((w / safe[..., None]).round() + zp[..., None]).clamp(0, 2**bits - 1)
    restored = (codes - zp[..., None]) * scale[..., None]
    error = float(((restored - w).abs() / safe[..., None]).amax()) if w.numel() else 0.0
    tensors = {"weight_packed": pack_to_int32((codes.reshape(rows, cols) - half).to(torch.int8), bits),
               "weight_scale": scale.to(dtype).contiguous(),
               "weight_shape": torch.tensor([rows, cols], dtype=torch.int64)}
    if not symmetric_for(bits):
        tensors["weight_zero_point"] = pack_to_int32((zp - half).to(torch.int8), bits, packed_dim=0)
    return PackedLinear(tensors, int(scale.numel()), int(wide.sum()), error)


def pack_to_int32(values: torch.Tensor, bits: int, packed_dim: int = 1) -> torch.Tensor:
    """compressed-tensors' packing of signed `bits`-wide values [R, C] (4 or 8 bits): each stored as value +
    2^(bits-1), 32/bits of them per int32 word along `packed_dim`, the first in the lowest bits."""
    if bits not in EXPORT_BITS:
        raise ValueError(f"bits: got {bits}; allowed: {EXPORT_BITS}")
    u = values.to(torch.int64) + 2 ** (bits - 1)
    if packed_dim == 0:
        u = u.t()
    rows, cols = u.shape
    per = 32 // bits
    pad = -cols % per
    if pad:
        u = torch.cat([u, u.new_zeros(rows, pad)], dim=1)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    words = (u.view(rows, -1, per) << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return (words.t() if packed_dim == 0 else words).contiguous()


def rtn_dense(weight: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """hfspec's RTN values of a weight (codes, fp16 scale and zero), dequantised: what its draft computes with."""
    q, scale, zero = groupwise.group_quantize(weight.float(), bits, group_size)
    return groupwise.group_dequantize(q, scale, zero, group_size, torch.float32)


def quantization_config(bits: int, group_size: int, ignore: list[str]) -> dict:
    """The `quantization_config` of config.json for W{bits}A16 group-wise int weights."""
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric_for(bits), "strategy": "group", "group_size": group_size,
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
               "observer_kwargs": {}}
    config = {
        "quant_method": "compressed-tensors",
        "format": FORMAT,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                      "output_activations": None, "format": FORMAT}},
        "ignore": ignore,
        "kv_cache_scheme": None,
        "version": extra_version("export", "export", "writing a compressed-tensors checkpoint"),
    }
    if not symmetric_for(bits):
        # A transformers loading attribute: decompress while loading. Its other path (build the layers
        # compressed, decompress at the first forward) makes the zero points unpacked [N, G] with
        # compressed-tensors 0.20 and then refuses the packed ones every asymmetric checkpoint holds.
        # Engines read the scheme and ignore this key; on the CPU transformers ends up dense either way.
        config["dequantize"] = True
    return config


def load_export(folder, dtype=None) -> nn.Module:
    """Load an exported draft with transformers (needs compressed-tensors); HfspecError naming the extra."""
    require_extra("export", "export", "reading a compressed-tensors checkpoint")
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": dtype} if dtype is not None else {}
    return AutoModelForCausalLM.from_pretrained(str(folder), **kwargs).eval()


def _round_up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32) rounded up to the nearest value of `dtype`, returned as fp32 (a step never shrinks)."""
    y = x.to(dtype)
    low = y.float() < x
    return torch.where(low, torch.nextafter(y, torch.full_like(y, math.inf)), y).float()
