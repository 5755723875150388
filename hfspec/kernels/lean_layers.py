"""The layers of the lean draft step: weights as RTN codes or float (`LeanLinear`) and one decoder layer as a
closure with the fewest operators (`_Block`), read from the Hugging Face modules of Llama-style families.

`hfspec.kernels.lean` assembles them into a decoder with its own KV cache; see its docstring for the families.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch import nn

from hfspec.kernels import int4_rows
from hfspec.kernels.lean_attention import attend_many, attend_one, rotate
from hfspec.kernels.shared_linear import SharedLinear, pair_columns, pair_rotary_rows
from hfspec.quant import groupwise, int8, packing
from hfspec.quant.calibrate import Coded
from hfspec.quant.modules import FUSED_GROUP_SIZES

# elements: 5-8-bit matrices smaller than this stay fp32 (bf16 matmuls are slow on CPUs without bf16 units)
DENSE_BELOW = 1 << 18
# elements: at 2-4 bits a matrix this large or larger runs the int4 kernel. In a real decode the draft's step
# alternates with the target's and finds its weights out of cache, so bytes read decide (an rtn4 step reads an eighth
# of the fp32 bytes); below 64 KB of fp32 a matrix stays in cache and the kernel's casts cost more than they save
INT4_FROM = 1 << 14
# activation rows: from this many a packed int4 / int8 matrix is multiplied as bf16, dequantised a block of its
# rows at a time, by oneDNN's GEMM (`_dequantised`). The packed kernels cost nearly a row's worth per row: a long
# prompt's prefill through them cost more than the target's own (SmolLM2-135M fp32, 1024 rows: rtn4 1.08-1.25x,
# int8 1.16-1.27x). Dequantising costs a fixed ~4 ns a weight on the 2-core EPYC VM, so it pays from about 500 rows
# at int4 (prefill time over the kernel path's, two runs: 1.06-1.19x at 256 rows, 0.88-0.99x at 512, 0.70-0.76x
# at 1024) and 100 at int8 (1.25-1.34x at 64, 0.78-0.79x at 128, 0.64-0.71x at 1024; bench_prefill_rows.py, 3 Dec)
DEQUANTISED_FROM = {"int4": 512, "int8": 128}
_ACTS = {"silu": F.silu, "swish": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}
_PATH_INT4 = "int4 CPU kernel (aten._weight_int4pack_mm_for_cpu)"


# ------------------------------------------------------------------------------------------------ weights
class LeanLinear(nn.Module):
    """y = x W^T (+ b) for a weight [N, K] given as float (or as a list of float parts stacked along N, so a
    fused QKV / gate-up matrix is never concatenated in float): RTN at `bits` (None: kept as is); or given as
    `Coded` parts (a calibrated draft's codes at `bits`), stored as they are.

    bits ≤ 4 with a kernel-friendly shape: codes in the int4 CPU kernel's layout (N padded to 64 with zero
    rows, sliced off after the matmul); bits 8 with group_size `int8.PER_CHANNEL` (0): symmetric int8 codes with
    one scale per row, run by the CPU int8 kernel (`hfspec.quant.int8`); otherwise a dense matrix (the dequantised
    codes in bf16, or the float weight itself, shared with the target when unquantised and unfused). Quantising
    runs a block of rows at a time, so building holds the result plus one block of scratch, whatever the matrix's
    size."""

    def __init__(self, w: torch.Tensor | Coded | list, bias: torch.Tensor | None, bits: int | None,
                 group_size: int, share: bool = False):
        super().__init__()
        parts = [w] if isinstance(w, torch.Tensor | Coded) else list(w)
        self.out_features, self.in_features = sum(p.shape[0] for p in parts), parts[0].shape[1]
        numel = self.out_features * self.in_features
        self.bits = bits
        self.int4 = (bits is not None and bits <= 4 and parts[0].device.type == "cpu"
                     and group_size in FUSED_GROUP_SIZES and self.in_features % group_size == 0
                     and numel >= INT4_FROM and packing.int4_cpu_kernel_ok())
        self.group_size = group_size
        per_channel = bits == 8 and group_size == int8.PER_CHANNEL
        self.int8 = per_channel and self.in_features % int8.K_MULTIPLE == 0
        with torch.no_grad():
            if per_channel:
                if any(isinstance(p, Coded) for p in parts):
                    raise ValueError("lean linear: per-channel int8 takes float weights, not codes")
                codes = torch.empty(self.out_features, self.in_features, dtype=torch.int8)
                scales = torch.empty(self.out_features, dtype=torch.bfloat16)
                for start, end in _row_blocks(self.out_features, self.in_features, 1):
                    codes[start:end], scale = int8.quantize_rows(_rows(parts, start, end))
                    scales[start:end] = scale
                if self.int8:
                    self.register_buffer("codes", codes)
                    self.register_buffer("scales", scales)
                    self.path = int8.PATH
                else:  # a K the kernel cannot take: the same grid, dequantised to fp32
                    self.register_buffer("weight", int8.dequantize(codes, scales))
                    self.path = f"int8 per-channel dequantised to fp32 (K % {int8.K_MULTIPLE} != 0)"
            elif self.int4:
                padded = -(-self.out_features // 64) * 64
                packed = torch.empty(padded, self.in_features // 2, dtype=torch.uint8)
                sz = torch.empty(self.in_features // group_size, padded, 2, dtype=torch.bfloat16)
                for start, end in _row_blocks(padded, self.in_features, 64):
                    q, scale, zero = _quantized_rows(parts, start, end, bits, group_size)
                    pad = end - start - q.shape[0]  # the last block: zero rows up to a multiple of 64
                    if pad:
                        q = torch.cat([q, q.new_zeros(pad, self.in_features)])
                        scale = torch.cat([scale, scale.new_zeros(pad, scale.shape[1])])
                        zero = torch.cat([zero, zero.new_zeros(pad, zero.shape[1])])
                    packed[start:end] = packing.pack_int4_cpu(q)
                    sz[:, start:end] = torch.stack([scale.float(), zero.float() + 8 * scale.float()], dim=-1
                                                   ).transpose(0, 1).to(torch.bfloat16)
                self.register_buffer("packed", packed)
                self.register_buffer("scales_and_zeros", sz)
                self.path = _PATH_INT4 if int4_rows.function() is None else int4_rows.PATH
            elif bits is not None:
                small = numel < DENSE_BELOW
                dense = torch.empty(self.out_features, self.in_features,
                                    dtype=torch.float32 if small else torch.bfloat16)
                for start, end in _row_blocks(self.out_features, self.in_features, 1):
                    q, scale, zero = _quantized_rows(parts, start, end, bits, group_size)
                    dense[start:end] = groupwise.group_dequantize(q, scale, zero, group_size, dense.dtype)
                self.register_buffer("weight", dense)
                self.path = f"rtn{bits} dequantised to {'fp32 (small matrix)' if small else 'bf16'}"
            else:
                if any(isinstance(p, Coded) for p in parts):
                    raise ValueError("lean linear: codes given for a float (bits=None) weight")
                weight = parts[0].detach() if share and len(parts) == 1 else torch.cat([p.detach() for p in parts])
                self.register_buffer("weight", weight)
                self.path = f"{weight.dtype} float"
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul()(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)

    def matmul(self):
        """A function x [M, K] fp32 -> [M, N] fp32 with the fewest operators for this storage."""
        bias, n = self.bias, self.out_features
        if self.int4:
            packed, group, sz, padded = self.packed, self.group_size, self.scales_and_zeros, self.packed.shape[0]
            kernel, ours, compiling, held = (torch.ops.aten._weight_int4pack_mm_for_cpu, int4_rows.function(),
                                             int4_rows.tracing, int4_rows.held)

            def int4(x):
                if x.shape[0] >= DEQUANTISED_FROM["int4"]:
                    return _dequantised(x, n, 64, functools.partial(_int4_rows, packed, sz, group), bias)
                if ours is not None and x.shape[0] <= int4_rows.MAX_ROWS and not compiling() and not held():
                    return int4_rows.matmul(ours, x, packed, sz, n, group, bias)
                y = kernel(x.to(torch.bfloat16), packed, group, sz)
                y = (y[:, :n] if padded != n else y).float()
                return y if bias is None else y + bias
            return int4
        if self.int8:
            codes, scales, packed_int8 = self.codes, self.scales, int8.matmul_fn(self.codes, self.scales, bias)

            def int8_rows(x):
                if x.shape[0] >= DEQUANTISED_FROM["int8"]:
                    return _dequantised(x, n, 1, functools.partial(_int8_rows, codes, scales), bias)
                return packed_int8(x)
            return int8_rows
        weight = self.weight
        if weight.dtype == torch.float32:
            return lambda x: F.linear(x, weight, bias)
        return lambda x: (F.linear(x.to(weight.dtype), weight).float() + (0 if bias is None else bias))

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows of W (an embedding lookup through the same storage)."""
        if self.int4:
            codes = packing.unpack_int4_cpu(self.packed, self.in_features, ids)
            sz = self.scales_and_zeros[:, ids].float()  # [G, R, 2]
            scale, zero = sz[..., 0].t(), sz[..., 1].t() - 8 * sz[..., 0].t()
            return groupwise.group_dequantize(codes, scale, zero, self.group_size, dtype)
        if self.int8:
            return int8.dequantize(self.codes[ids], self.scales[ids], dtype)
        return self.weight[ids].to(dtype)


def _dequantised(x: torch.Tensor, n: int, multiple: int, weight_rows, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] W^T [M, N] fp32 (+ bias) in bf16 GEMMs over blocks of W's rows (`_row_blocks`: about a million
    weights, 2 MiB of bf16, at a time), `weight_rows(start, end)` giving rows [start, end) of W in bf16 (blocks a
    multiple of `multiple` rows)."""
    xb = x.to(torch.bfloat16)
    y = torch.empty(x.shape[0], n, dtype=torch.float32, device=x.device)
    for start, end in _row_blocks(n, x.shape[1], multiple):
        y[:, start:end] = F.linear(xb, weight_rows(start, end))
    return y if bias is None else y + bias


def _int4_rows(packed: torch.Tensor, sz: torch.Tensor, group_size: int, start: int, end: int) -> torch.Tensor:
    """Rows [start, end) (start a multiple of 64) of the int4 kernel's weight as bf16, computed as the kernel
    computes it: (code − 8) · scale + (zero + 8 · scale), both bf16 (`LeanLinear`'s `scales_and_zeros`)."""
    k = packed.shape[1] * 2
    block = packing.int4_block() or 64  # 64 rows a block with AVX-512, 32 with AVX2 (both divide `start`)
    # [T, K, B/2]: rows t·B + r (low nibble), + B/2 (high)
    tiles = packed.view(-1, k, block // 2)[start // block:-(-end // block)]
    codes = torch.stack([tiles & 0x0F, tiles >> 4], 1).transpose(2, 3).reshape(-1, k)[:end - start]
    part = sz[:, start:end].float()  # [G, R, 2]
    scale, offset = part[..., 0].t()[..., None], part[..., 1].t()[..., None]  # [R, G, 1]
    w = (codes.view(end - start, -1, group_size).float() - 8).mul_(scale).add_(offset)
    return w.view(end - start, k).to(torch.bfloat16)


def _int8_rows(codes: torch.Tensor, scales: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of a per-channel int8 weight as bf16."""
    return int8.dequantize(codes[start:end], scales[start:end], torch.bfloat16)


def _row_blocks(rows: int, cols: int, multiple: int):
    """Row ranges of about groupwise.CHUNK_ELEMENTS values, each a multiple of `multiple` rows (but the last)."""
    step = max(multiple, groupwise.CHUNK_ELEMENTS // max(1, cols) // multiple * multiple)
    return ((start, min(rows, start + step)) for start in range(0, rows, step))


def _quantized_rows(parts: list, start: int, end: int, bits: int, group_size: int):
    """(codes, scale, zero) of rows [start, end) of the parts stacked along dim 0: RTN of float parts, or the
    given codes of `Coded` parts (a calibrated draft's, which must be at `bits` / `group_size`)."""
    if not any(isinstance(p, Coded) for p in parts):
        return groupwise.group_quantize(_rows(parts, start, end), bits, group_size)
    if not all(isinstance(p, Coded) for p in parts):
        raise ValueError("lean linear: a fused matrix mixes codes and float parts")
    coded = _rows(parts, start, end)
    if int(coded.q.max()) >= 2**bits or coded.scale.shape[1] != -(-coded.q.shape[1] // group_size):
        raise ValueError(f"lean linear: codes are not {bits}-bit in groups of {group_size}")
    return coded.q, coded.scale, coded.zero


def _rows(parts: list, start: int, end: int):
    """Rows [start, end) of the parts stacked along dim 0 (past the end: fewer rows), without stacking them all."""
    pieces, offset = [], 0
    for part in parts:
        n = part.shape[0]
        if offset < end and offset + n > start:
            pieces.append(part[max(0, start - offset):min(n, end - offset)])
        offset += n
    if len(pieces) == 1:
        return pieces[0]
    return Coded.cat(pieces) if isinstance(pieces[0], Coded) else torch.cat(pieces)


# ------------------------------------------------------------------------------------------------ reading
def _linear_parts(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(module, nn.Linear) or type(module).forward is not nn.Linear.forward:
        raise _Unsupported(f"{type(module).__name__} is not a plain nn.Linear")
    return module.weight, module.bias


class _Unsupported(Exception):
    pass


def _norm_weight(norm: nn.Module | None, hidden: int) -> tuple[torch.Tensor | None, float]:
    """Effective RMSNorm weight (Gemma's (1 + w) folded in) and eps; (None, 0) when there is no norm."""
    if norm is None:
        return None, 0.0
    name = type(norm).__name__
    if "RMSNorm" not in name:
        raise _Unsupported(f"norm {name} is not an RMSNorm")
    weight = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6
    if weight is None:
        return torch.ones(hidden), float(eps)
    source = inspect.getsource(type(norm).forward)
    if "1.0 + self.weight" in source or "1 + self.weight" in source:
        return (1.0 + weight.detach().float()), float(eps)
    if "self.weight" not in source:
        raise _Unsupported(f"norm {name}: unknown formula")
    return weight.detach().float().clone(), float(eps)


def _activation_name(config) -> str | None:
    """The MLP activation's name (Gemma configs call it hidden_activation)."""
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)



def _layer_type(config, index: int):
    types = getattr(config, "layer_types", None)
    return types[index] if types else None


class _Block(nn.Module):
    """One decoder layer's weights; `step()` returns its forward as a function with the fewest operators."""

    def __init__(self, layer: nn.Module, bits: int | None, group_size: int, codes: dict | None = None,
                 shared: bool = False):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        coded = codes or {}

        def parts(module):  # a calibrated draft's codes stand in for the float weight they quantise
            w, b = _linear_parts(module)
            return coded.get(id(w), w), b

        config = attn.config
        self.head_dim = getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.scaling = float(attn.scaling)
        self.window = getattr(attn, "sliding_window", None)
        if self.window is None and not hasattr(attn, "sliding_window") and "Mistral" in type(attn).__name__:
            self.window = getattr(config, "sliding_window", None)
        self.hidden = hidden = config.hidden_size
        d, nq, nkv = self.head_dim, self.heads, self.kv_heads
        rope = config.rope_parameters if isinstance(getattr(config, "rope_parameters", None), dict) else {}
        self.rot = int(d * rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
        # shared (the lean target): the target's own tensors, unfused and unpermuted (`hfspec.kernels.shared_linear`)
        self.order = pair_columns(nq, nkv, d, self.rot) if shared else None

        def linear(w, b):  # one matrix, or parts stacked along N: fused in a draft's copy, kept apart when shared
            if shared:
                return SharedLinear(list(zip(w, b or [None] * len(w), strict=True)) if isinstance(w, list)
                                    else [(w, b)])
            return LeanLinear(w, torch.cat(b) if isinstance(b, list) else b, bits, group_size)

        if not shared:
            self.qkv = LeanLinear(*self._paired_qkv(parts, attn), bits, group_size)
        elif hasattr(attn, "qkv_proj"):
            self.qkv = linear(*parts(attn.qkv_proj))
        else:
            ws, bs = zip(*(parts(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")), strict=True)
            self.qkv = linear(list(ws), list(bs))
        self.o = linear(*parts(attn.o_proj))
        if hasattr(mlp, "gate_up_proj"):
            w, b = parts(mlp.gate_up_proj)
        else:
            (wg, bg), (wu, bu) = parts(mlp.gate_proj), parts(mlp.up_proj)
            w, b = [wg, wu], (None if bg is None else [bg, bu])
        self.inter = sum(part.shape[0] for part in ([w] if isinstance(w, torch.Tensor | Coded) else w)) // 2
        self.gate_up = linear(w, b)
        self.down = linear(*parts(mlp.down_proj))
        self.in_norm, self.eps = _norm_weight(layer.input_layernorm, hidden)
        post_attn, _ = _norm_weight(getattr(layer, "post_attention_layernorm", None), hidden)
        pre_ff, _ = _norm_weight(getattr(layer, "pre_feedforward_layernorm", None), hidden)
        sandwich = pre_ff is not None
        # Gemma 2/3: post_attention_layernorm normalises the attention output, pre_feedforward the MLP input.
        self.attn_out_norm = post_attn if sandwich else None
        self.mlp_in_norm = pre_ff if sandwich else post_attn
        self.mlp_out_norm, _ = _norm_weight(getattr(layer, "post_feedforward_layernorm", None), hidden)
        q_norm, _ = _norm_weight(getattr(attn, "q_norm", None), d)
        k_norm, _ = _norm_weight(getattr(attn, "k_norm", None), d)
        self.qk_norm = None
        if q_norm is not None:  # one weight per head row [nq + nkv, D], permuted like the rows of W_q, W_k
            q_norm, k_norm = pair_rotary_rows(q_norm, 1, d, self.rot), pair_rotary_rows(k_norm, 1, d, self.rot)
            self.qk_norm = torch.cat([q_norm.expand(nq, d), k_norm.expand(nkv, d)])

    def _paired_qkv(self, parts, attn) -> tuple[list, torch.Tensor | None]:
        """Q, K, V weights (rows of W_q, W_k permuted for the rotary of pairs) and their fused bias."""
        nq, nkv, d, rot = self.heads, self.kv_heads, self.head_dim, self.rot
        if hasattr(attn, "qkv_proj"):
            w, b = parts(attn.qkv_proj)
            wq, wk, wv = w.split([nq * d, nkv * d, nkv * d])
            bq, bk, bv = (None, None, None) if b is None else b.split([nq * d, nkv * d, nkv * d])
        else:
            (wq, bq), (wk, bk), (wv, bv) = (parts(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj"))
        wq, bq = pair_rotary_rows(wq, nq, d, rot), pair_rotary_rows(bq, nq, d, rot)
        wk, bk = pair_rotary_rows(wk, nkv, d, rot), pair_rotary_rows(bk, nkv, d, rot)
        biases = [bq, bk, bv]
        b = None if all(x is None for x in biases) else torch.cat([
            x if x is not None else torch.zeros(n) for x, n in zip(biases, (nq * d, nkv * d, nkv * d), strict=True)])
        return [wq, wk, wv], b

    def linears(self) -> list[LeanLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def step(self, act):
        """This layer's forward h [B, T, hidden] -> h, as a closure over its weights."""
        qkv, o_proj, gate_up, down = (lin.matmul() for lin in self.linears())
        hidden, eps, d, nq, nkv, inter = self.hidden, self.eps, self.head_dim, self.heads, self.kv_heads, self.inter
        in_norm, attn_out_norm, mlp_in_norm, mlp_out_norm = (self.in_norm, self.attn_out_norm, self.mlp_in_norm,
                                                             self.mlp_out_norm)
        qk_norm, scaling, gqa, rot, nqk = self.qk_norm, self.scaling, nq != nkv, self.rot, nq + nkv
        order = self.order
        rms, sdpa = torch.rms_norm, F.scaled_dot_product_attention

        def forward(h, freqs, keys, values, start, end, mask):
            batch, steps, _ = h.shape
            x = rms(h, (hidden,), in_norm, eps).view(-1, hidden)
            y = qkv(x) if order is None else qkv(x).index_select(-1, order)
            y = y.view(batch, steps, nqk + nkv, d)
            qk, v = y[:, :, :nqk], y[:, :, nqk:]
            if qk_norm is not None:
                qk = rms(qk, (d,), None, eps) * qk_norm
            if rot == d:
                qk = rotate(qk.reshape(batch, steps, nqk, d // 2, 2), freqs).view(batch, steps, nqk, d)
            else:
                part = rotate(qk[..., :rot].reshape(batch, steps, nqk, rot // 2, 2), freqs)
                qk = torch.cat([part.view(batch, steps, nqk, rot), qk[..., rot:]], dim=-1)
            qk = qk.transpose(1, 2)
            if end is None:  # static shapes (the compiled one-token step): slot `start` is a tensor, attend masked
                keys.index_copy_(2, start, qk[:, nq:])
                values.index_copy_(2, start, v.transpose(1, 2))
                attend = attend_one if steps == 1 else attend_many
                o = attend(qk[:, :nq], keys, values, mask, scaling)
            else:
                keys[:, :, start:end] = qk[:, nq:]
                values[:, :, start:end] = v.transpose(1, 2)
                o = sdpa(qk[:, :nq], keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=scaling,
                         enable_gqa=gqa)
            o = o_proj(o.transpose(1, 2).reshape(-1, nq * d)).view(batch, steps, hidden)
            if attn_out_norm is not None:
                o = rms(o, (hidden,), attn_out_norm, eps)
            h = h + o
            x = rms(h, (hidden,), mlp_in_norm, eps).view(-1, hidden)
            gate, up = gate_up(x).split([inter, inter], dim=-1)
            m = down(act(gate) * up).view(batch, steps, hidden)
            if mlp_out_norm is not None:
                m = rms(m, (hidden,), mlp_out_norm, eps)
            return h + m

        return forward
