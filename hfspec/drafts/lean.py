"""A lean decode step for drafts built from the target's weights (Llama-style decoder families).

Only the target's numerics must match Hugging Face; the draft is a proposal, and the q it computes is used
both to sample and to accept, so any implementation keeps the output exact. This one does per layer what a
decoder layer does in the fewest operators: RMSNorm (`torch.rms_norm`), one fused QKV matmul, rotary from a
precomputed table, a preallocated KV cache whose rollback is a length, SDPA, one fused gate/up matmul.
Weights are RTN codes in groups (2-4 bits run the CPU int4 kernel; 5-8 bits are dequantised to bf16), or the
target's own float weights (bits=None).

Families (read from the HF modules, not from names): Llama, Mistral, Qwen2 (QKV bias), Qwen3 (q/k norm),
Gemma (1 + w norms, scaled embedding, GeLU), Gemma 2 / Gemma 3 text (sandwich norms, per-layer-type rotary,
final logit soft-capping), Phi-3 (fused projections, partial rotary), SmolLM. Not reproduced, because a
proposal may differ: Gemma 2's attention logit soft-capping (rarely active), and in batches with holes a
sliding window counted in slots rather than positions. `lean_reason(model)` says why a model cannot take this path.
"""

from __future__ import annotations

import inspect
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from hfspec.errors import HfspecError
from hfspec.kv_model import CachedModel
from hfspec.quant import groupwise, packing
from hfspec.quant.modules import FUSED_GROUP_SIZES

BUILD_PROGRESS_EVERY = 2.0  # seconds between "building the draft: layer i/N" messages
CACHE_CHUNK = 256  # the KV cache grows by this many slots at a time
COMPILED_FEED_MAX = 4  # a compiled draft runs feeds of up to this many tokens as one-token steps (a round's catch-up)
# elements: 5-8-bit matrices smaller than this stay fp32 (bf16 matmuls are slow on CPUs
# without bf16 units)
DENSE_BELOW = 1 << 18
# elements: at 2-4 bits a matrix this large or larger runs the int4 kernel. In a real decode the draft's step
# alternates with the target's and finds its weights out of cache, so bytes read decide (an rtn4 step reads about
# an eighth of the fp32 bytes); below 64 KB of fp32 a matrix stays in cache anyway and the kernel's casts cost
# more than the bytes they save (benchmarks/ measures both sides)
INT4_FROM = 1 << 14
_ACTS = {"silu": F.silu, "swish": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}
_PATH_INT4 = "int4 CPU kernel (aten._weight_int4pack_mm_for_cpu)"


# ------------------------------------------------------------------------------------------------ weights
class LeanLinear(nn.Module):
    """y = x W^T (+ b) for a weight [N, K] given as float (or as a list of float parts stacked along N, so a
    fused QKV / gate-up matrix is never concatenated in float): RTN at `bits` (None: kept as is).

    bits ≤ 4 with a kernel-friendly shape: codes in the int4 CPU kernel's layout (N padded to 64 with zero
    rows, sliced off after the matmul); otherwise a dense matrix (the dequantised codes in bf16, or the float
    weight itself, shared with the target when unquantised and unfused). Quantising runs a block of rows at a
    time, so building holds the result plus one block of scratch, whatever the matrix's size."""

    def __init__(self, w: torch.Tensor | list[torch.Tensor], bias: torch.Tensor | None, bits: int | None,
                 group_size: int, share: bool = False):
        super().__init__()
        parts = [w] if isinstance(w, torch.Tensor) else list(w)
        self.out_features, self.in_features = sum(p.shape[0] for p in parts), parts[0].shape[1]
        numel = self.out_features * self.in_features
        self.bits = bits
        self.int4 = (bits is not None and bits <= 4 and parts[0].device.type == "cpu"
                     and group_size in FUSED_GROUP_SIZES and self.in_features % group_size == 0
                     and numel >= INT4_FROM and packing.int4_cpu_kernel_ok())
        self.group_size = group_size
        with torch.no_grad():
            if self.int4:
                padded = -(-self.out_features // 64) * 64
                packed = torch.empty(padded, self.in_features // 2, dtype=torch.uint8)
                sz = torch.empty(self.in_features // group_size, padded, 2, dtype=torch.bfloat16)
                for start, end in _row_blocks(padded, self.in_features, 64):
                    q, scale, zero = groupwise.group_quantize(_rows(parts, start, end), bits, group_size)
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
                self.path = _PATH_INT4
            elif bits is not None:
                small = numel < DENSE_BELOW
                dense = torch.empty(self.out_features, self.in_features,
                                    dtype=torch.float32 if small else torch.bfloat16)
                for start, end in _row_blocks(self.out_features, self.in_features, 1):
                    q, scale, zero = groupwise.group_quantize(_rows(parts, start, end), bits, group_size)
                    dense[start:end] = groupwise.group_dequantize(q, scale, zero, group_size, dense.dtype)
                self.register_buffer("weight", dense)
                self.path = f"rtn{bits} dequantised to {'fp32 (small matrix)' if small else 'bf16'}"
            else:
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
            kernel = torch.ops.aten._weight_int4pack_mm_for_cpu
            bf16 = torch.bfloat16

            def int4(x):
                y = kernel(x.to(bf16), packed, group, sz)
                y = (y[:, :n] if padded != n else y).float()
                return y if bias is None else y + bias
            return int4
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
        return self.weight[ids].to(dtype)


def _row_blocks(rows: int, cols: int, multiple: int):
    """Row ranges of about groupwise.CHUNK_ELEMENTS values, each a multiple of `multiple` rows (but the last)."""
    step = max(multiple, groupwise.CHUNK_ELEMENTS // max(1, cols) // multiple * multiple)
    return ((start, min(rows, start + step)) for start in range(0, rows, step))


def _rows(parts: list[torch.Tensor], start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of the parts stacked along dim 0 (past the end: fewer rows), without stacking them all."""
    pieces, offset = [], 0
    for part in parts:
        n = part.shape[0]
        if offset < end and offset + n > start:
            pieces.append(part[max(0, start - offset):min(n, end - offset)])
        offset += n
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


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


def _decoder(model: nn.Module):
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm"):
        raise _Unsupported(f"{type(model).__name__} has no model.layers / embed_tokens / norm")
    return inner, layers


def lean_reason(model: nn.Module) -> str | None:
    """None when `model` can take the lean path; otherwise why not."""
    try:
        inner, layers = _decoder(model)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if _activation_name(config) not in _ACTS:
            raise _Unsupported(f"activation {_activation_name(config)!r}")
        if not hasattr(inner, "rotary_emb"):
            raise _Unsupported("no rotary embedding")
        if getattr(model.config, "rope_parameters", None) and any(
                isinstance(v, dict) and v.get("rope_type") == "dynamic" for v in [model.config.rope_parameters]):
            raise _Unsupported("dynamic rope scaling")
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            if hasattr(attn, "qkv_proj"):
                _linear_parts(attn.qkv_proj)
            else:
                for name in ("q_proj", "k_proj", "v_proj"):
                    _linear_parts(getattr(attn, name))
            _linear_parts(attn.o_proj)
            if hasattr(mlp, "gate_up_proj"):
                _linear_parts(mlp.gate_up_proj)
            else:
                _linear_parts(mlp.gate_proj)
                _linear_parts(mlp.up_proj)
            _linear_parts(mlp.down_proj)
            for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                         "post_feedforward_layernorm"):
                _norm_weight(getattr(layer, name, None), 1)
            for name in ("q_norm", "k_norm"):
                _norm_weight(getattr(attn, name, None), 1)
            if not hasattr(attn, "scaling"):
                raise _Unsupported("attention without a scaling attribute")
        _norm_weight(inner.norm, 1)
        if model.get_output_embeddings() is None:
            raise _Unsupported("no output embeddings")
        if any(p.device.type not in ("cpu",) for p in model.parameters()):
            raise _Unsupported("weights not all on the CPU")
        if type(inner.embed_tokens).forward is not nn.Embedding.forward:
            from hfspec.quant.swap import replaceable_layers

            replaceable_layers(model)  # a known subclass (Gemma's scaled embedding) passes, others are refused
        if getattr(inner.embed_tokens, "max_norm", None) is not None:
            raise _Unsupported("embedding with max_norm")
    except (_Unsupported, AttributeError, TypeError, OSError, HfspecError) as why:
        return str(why)
    return None


# ------------------------------------------------------------------------------------------------ cache
class LeanCache:
    """Preallocated keys/values per layer [B, H_kv, S, D]; rollback sets `length`; rows drop by indexing."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0
        self.shape = (layers, kv_heads, head_dim)
        self.dtype = dtype

    def reserve(self, batch: int, end: int) -> None:
        capacity = self.keys[0].shape[2] if self.keys else 0
        if self.keys and self.keys[0].shape[0] != batch:
            raise ValueError(f"lean cache: batch {batch} != cached batch {self.keys[0].shape[0]}")
        if end <= capacity:
            return
        layers, heads, dim = self.shape
        size = -(-end // CACHE_CHUNK) * CACHE_CHUNK
        grown = [torch.zeros(batch, heads, size, dim, dtype=self.dtype) for _ in range(2 * layers)]
        for i, old in enumerate(self.keys + self.values):
            grown[i][:, :, :capacity] = old
        self.keys, self.values = grown[:layers], grown[layers:]

    # the part of transformers' Cache API that hfspec.cache uses
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        self.length = self.length + max_length if max_length < 0 else min(self.length, max_length)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


# ------------------------------------------------------------------------------------------------ model
class LeanDecoder(nn.Module):
    """A decoder-only LM rebuilt from `target` for fast single-token steps. Takes HF-style keywords
    (input_ids, position_ids, attention_mask over all slots, cache, logits_to_keep) so the rest of hfspec
    drives it like any model; returns an object with `.logits` and `.cache`.

    Rotary runs as one complex multiply over the query and key heads together: the rows of W_q and W_k are
    permuted within each head so that HF's rotate-half pairs (i, i + D/2) sit side by side. Attention scores
    q·k do not change under the same permutation of both, so the model computes the same function."""

    def __init__(self, target: nn.Module, bits: int | None, group_size: int = 32, max_positions: int | None = None,
                 progress=None):
        super().__init__()
        why = lean_reason(target)
        if why is not None:
            raise ValueError(f"lean draft: {why}")
        inner, layers = _decoder(target)
        config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
        self.config = target.config
        self.hidden = config.hidden_size
        self.act = _ACTS[_activation_name(config)]
        head = target.get_output_embeddings()
        embed = inner.embed_tokens
        self.vocab = head.weight.shape[0]
        self.head = LeanLinear(head.weight, getattr(head, "bias", None), bits, group_size, share=True)
        # The input embedding is read one row per token, so its bytes cost no time: the draft looks rows up in
        # the target's own table (any dtype, cast to fp32) instead of holding a copy. A plain attribute, not a
        # buffer: the draft's `weight_bytes` count what it adds to the target, and the table stays the target's.
        self.embed_table = embed.weight.detach()
        self.target_dtype = embed.weight.dtype
        scale = getattr(embed, "embed_scale", None)  # Gemma: cast to the weights' dtype, as its forward does
        self.embed_scale = float(scale.to(embed.weight.dtype)) if scale is not None else None
        self.final_norm, self.eps = _norm_weight(inner.norm, self.hidden)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.blocks = nn.ModuleList(_built_blocks(layers, bits, group_size, progress))
        self.head_dim, self.kv_heads = self.blocks[0].head_dim, self.blocks[0].kv_heads
        self.max_positions = max_positions or getattr(config, "max_position_embeddings", 4096) or 4096
        self._rotary = inner.rotary_emb
        self._tables: dict = {}
        self._layer_types = [getattr(layer.self_attn, "layer_type", None) or _layer_type(config, i)
                             for i, layer in enumerate(layers)]
        self._block_windows = [block.window for block in self.blocks]
        self._windows = sorted(set(self._block_windows), key=str)
        self.rope_types = list(dict.fromkeys(self._layer_types))
        self._head_mm = self.head.matmul()
        self._steps = [block.step(self.act) for block in self.blocks]
        paths = sorted({lin.path for block in self.blocks for lin in block.linears()} | {self.head.path})
        self.hfspec_step_path = (f"lean decode step for a {_dtype_name(self.target_dtype)} target (fp32 activations "
                                 f"and logits; input embedding read from the target's table; {'; '.join(paths)})")
        self.compiled_step = None

    def compile_step(self, progress=None) -> str:
        """Compile the one-token step (`hfspec.drafts.compiled`); returns what runs: "compiled" or "eager (why)"."""
        from hfspec.drafts.compiled import CompiledStep

        step = CompiledStep(self, progress)
        self.compiled_step = step if step.path == "compiled" else None
        self.hfspec_step_path += f", one-token step {step.path}"
        return step.path

    def _table(self, layer_type, upto: int) -> torch.Tensor:
        """Complex rotary factors [P, R/2] for positions < P (P ≥ upto), per layer type."""
        table = self._tables.get(layer_type)
        if table is None or table.shape[0] < upto:
            size = max(upto, min(self.max_positions, 2048), 2 * (table.shape[0] if table is not None else 0))
            pos = torch.arange(size)[None]
            x = torch.zeros(1, dtype=torch.float32)
            params = inspect.signature(self._rotary.forward).parameters
            with torch.no_grad():
                cos, sin = (self._rotary(x, pos, layer_type) if "layer_type" in params else self._rotary(x, pos))
            half = cos.shape[-1] // 2
            table = torch.complex(cos[0, :, :half].float(), sin[0, :, :half].float())
            self._tables[layer_type] = table
        return table

    def hfspec_new_cache(self) -> LeanCache:
        return LeanCache(len(self.blocks), self.kv_heads, self.head_dim, torch.float32)

    def get_output_embeddings(self):
        return None

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache: LeanCache | None = None,
                past_key_values: LeanCache | None = None, logits_to_keep: int = 0, use_cache: bool = True,
                **_unused):
        cache = cache if cache is not None else past_key_values
        cache = cache if cache is not None else self.hfspec_new_cache()
        logits = self.logits(input_ids, position_ids, attention_mask, cache, logits_to_keep)
        return SimpleNamespace(logits=logits, cache=cache, past_key_values=cache)

    def hfspec_draft(self, vocab: int | None = None):
        """The decoding loop's `Draft`: this model's steps called directly (no module call, no keywords)."""
        from hfspec.drafts.base import ModelDraft

        return ModelDraft(LeanRunner(self), vocab)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
               cache: LeanCache, logits_to_keep: int = 0) -> torch.Tensor:
        """Run over `input_ids` after what `cache` holds; logits of the last `logits_to_keep` positions (0: all)."""
        batch, steps = input_ids.shape
        start = cache.length
        end = start + steps
        if (self.compiled_step is not None and steps <= COMPILED_FEED_MAX and batch == 1 and attention_mask is None
                and (position_ids is None or position_ids.view(-1).tolist() == list(range(start, end)))):
            keep = steps if logits_to_keep == 0 else min(logits_to_keep, steps)
            kept = [self.compiled_step(input_ids[:, i:i + 1], start + i, cache) for i in range(steps)][steps - keep:]
            return kept[0] if keep == 1 else torch.cat(kept, dim=1)
        cache.reserve(batch, end)
        if position_ids is None:
            position_ids = torch.arange(start, end)[None].expand(batch, -1)
        h = F.embedding(input_ids, self.embed_table).float()
        if self.embed_scale is not None:
            h = h * self.embed_scale
        masks = {}
        for window in self._windows:
            masks[window] = _attention_mask(start, end, steps, attention_mask, window)
        top = int(position_ids.max()) + 1 if steps > 1 or batch > 1 else int(position_ids) + 1
        rope = {}
        for step, layer_type, window, keys, values in zip(self._steps, self._layer_types, self._block_windows,
                                                          cache.keys, cache.values, strict=True):
            if layer_type not in rope:
                rope[layer_type] = self._table(layer_type, top)[position_ids][:, :, None]
            h = step(h, rope[layer_type], keys, values, start, end, masks[window])
        cache.length = end
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return self._logits_of(h)

    def one_token(self, input_ids: torch.Tensor, slot: torch.Tensor, tables: list[torch.Tensor],
                  keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """Logits [1, 1, V] of one token written at cache slot `slot` ([1] long, its position too: no holes),
        attending over every preallocated slot through a mask: the same shapes at every step, for
        `torch.compile`. `tables`: `rotary_tables(n)`, the complex rotary factors per entry of `rope_types`."""
        h = F.embedding(input_ids, self.embed_table).float()
        if self.embed_scale is not None:
            h = h * self.embed_scale
        index = torch.arange(keys[0].shape[2], device=slot.device)
        masks = {}
        for window in self._windows:
            seen = index <= slot
            if window is not None:
                seen = seen & (index > slot - window)
            masks[window] = seen[None, None, None, :]
        factors = {kind: table[slot][None, :, None] for kind, table in zip(self.rope_types, tables, strict=True)}
        for step, layer_type, window, k, v in zip(self._steps, self._layer_types, self._block_windows, keys, values,
                                                  strict=True):
            h = step(h, factors[layer_type], k, v, slot, None, masks[window])
        return self._logits_of(h)

    def rotary_tables(self, positions: int) -> list[torch.Tensor]:
        """Complex rotary factors [≥ positions, R/2] per entry of `rope_types`."""
        return [self._table(kind, positions) for kind in self.rope_types]

    def _logits_of(self, h: torch.Tensor) -> torch.Tensor:
        h = torch.rms_norm(h, (self.hidden,), self.final_norm, self.eps)
        logits = self._head_mm(h.reshape(-1, self.hidden)).view(*h.shape[:-1], -1)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class LeanRunner(CachedModel):
    """A `CachedModel` whose forward calls the lean decoder's steps directly (no module call, no keywords)."""

    def _run(self, tokens, positions, valid, start: int, end: int, keep: int, all_valid: bool) -> torch.Tensor:
        return self.model.logits(tokens[:, start:end], positions[:, start:end],
                                 None if all_valid else valid[:, :end], self.cache, keep)


def _built_blocks(layers, bits: int | None, group_size: int, progress) -> list[_Block]:
    """One `_Block` per decoder layer, saying how far it got every BUILD_PROGRESS_EVERY seconds (big targets
    take a while)."""
    say = progress or (lambda message: None)
    blocks, began, shown = [], time.perf_counter(), 0.0
    for i, layer in enumerate(layers):
        blocks.append(_Block(layer, bits, group_size))
        spent = time.perf_counter() - began
        if spent - shown >= BUILD_PROGRESS_EVERY or (i + 1 == len(layers) and shown):
            say(f"building the draft: layer {i + 1}/{len(layers)} ({spent:.0f} s)")
            shown = spent
    return blocks


def _attention_mask(start: int, end: int, steps: int, valid: torch.Tensor | None, window: int | None):
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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _layer_type(config, index: int):
    types = getattr(config, "layer_types", None)
    return types[index] if types else None


def _pair_rotary_rows(w: torch.Tensor | None, heads: int, head_dim: int, rot: int) -> torch.Tensor | None:
    """Reorder each head's first `rot` rows from (0..R/2-1, R/2..R-1) to interleaved (0, R/2, 1, R/2+1, ...)."""
    if w is None:
        return None
    half = rot // 2
    order = torch.arange(head_dim)
    order[:rot] = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    index = (torch.arange(heads)[:, None] * head_dim + order[None]).flatten()
    return w[index] if w.dim() >= 1 and w.shape[0] == heads * head_dim else w[order]


class _Block(nn.Module):
    """One decoder layer's weights; `step()` returns its forward as a function with the fewest operators."""

    def __init__(self, layer: nn.Module, bits: int | None, group_size: int):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
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
        if hasattr(attn, "qkv_proj"):
            w, b = _linear_parts(attn.qkv_proj)
            wq, wk, wv = w.split([nq * d, nkv * d, nkv * d])
            bq, bk, bv = (None, None, None) if b is None else b.split([nq * d, nkv * d, nkv * d])
        else:
            (wq, bq), (wk, bk), (wv, bv) = (_linear_parts(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj"))
        wq, bq = _pair_rotary_rows(wq, nq, d, self.rot), _pair_rotary_rows(bq, nq, d, self.rot)
        wk, bk = _pair_rotary_rows(wk, nkv, d, self.rot), _pair_rotary_rows(bk, nkv, d, self.rot)
        biases = [bq, bk, bv]
        b = None if all(x is None for x in biases) else torch.cat([
            x if x is not None else torch.zeros(n) for x, n in zip(biases, (nq * d, nkv * d, nkv * d), strict=True)])
        self.qkv = LeanLinear([wq, wk, wv], b, bits, group_size)
        self.o = LeanLinear(*_linear_parts(attn.o_proj), bits, group_size)
        if hasattr(mlp, "gate_up_proj"):
            w, b = _linear_parts(mlp.gate_up_proj)
        else:
            (wg, bg), (wu, bu) = _linear_parts(mlp.gate_proj), _linear_parts(mlp.up_proj)
            w, b = [wg, wu], (None if bg is None else torch.cat([bg, bu]))
        self.inter = sum(part.shape[0] for part in ([w] if isinstance(w, torch.Tensor) else w)) // 2
        self.gate_up = LeanLinear(w, b, bits, group_size)
        self.down = LeanLinear(*_linear_parts(mlp.down_proj), bits, group_size)
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
            q_norm, k_norm = _pair_rotary_rows(q_norm, 1, d, self.rot), _pair_rotary_rows(k_norm, 1, d, self.rot)
            self.qk_norm = torch.cat([q_norm.expand(nq, d), k_norm.expand(nkv, d)])

    def linears(self) -> list[LeanLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]

    def step(self, act):
        """This layer's forward h [B, T, hidden] -> h, as a closure over its weights."""
        qkv, o_proj, gate_up, down = (lin.matmul() for lin in self.linears())
        hidden, eps, d, nq, nkv, inter = self.hidden, self.eps, self.head_dim, self.heads, self.kv_heads, self.inter
        in_norm, attn_out_norm, mlp_in_norm, mlp_out_norm = (self.in_norm, self.attn_out_norm, self.mlp_in_norm,
                                                             self.mlp_out_norm)
        qk_norm, scaling, gqa, rot, nqk = self.qk_norm, self.scaling, nq != nkv, self.rot, nq + nkv
        rms, sdpa = torch.rms_norm, F.scaled_dot_product_attention

        def forward(h, freqs, keys, values, start, end, mask):
            batch, steps, _ = h.shape
            x = rms(h, (hidden,), in_norm, eps).view(-1, hidden)
            y = qkv(x).view(batch, steps, nqk + nkv, d)
            qk, v = y[:, :, :nqk], y[:, :, nqk:]
            if qk_norm is not None:
                qk = rms(qk, (d,), None, eps) * qk_norm
            if rot == d:
                qk = torch.view_as_real(torch.view_as_complex(qk.reshape(batch, steps, nqk, d // 2, 2)) * freqs)
                qk = qk.view(batch, steps, nqk, d)
            else:
                part = torch.view_as_complex(qk[..., :rot].reshape(batch, steps, nqk, rot // 2, 2)) * freqs
                qk = torch.cat([torch.view_as_real(part).view(batch, steps, nqk, rot), qk[..., rot:]], dim=-1)
            qk = qk.transpose(1, 2)
            if end is None:  # static shapes (the compiled one-token step): slot `start` is a tensor, attend masked
                keys.index_copy_(2, start, qk[:, nq:])
                values.index_copy_(2, start, v.transpose(1, 2))
                o = _attend_one(qk[:, :nq], keys, values, mask, scaling)
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


def _attend_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float):
    """Attention of one query per head q [B, H, 1, D] over cache slots [B, H_kv, S, D] where `mask` [.., S] holds,
    as plain reductions (which a compiler fuses; SDPA is an opaque call): query heads grouped by their KV head."""
    batch, heads, _, dim = q.shape
    kv_heads = keys.shape[1]
    q = q.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("bhgd,bhsd->bhgs", q, keys) * scale
    weights = torch.softmax(scores.masked_fill(~mask.view(1, 1, 1, -1), -float("inf")), dim=-1)
    return torch.einsum("bhgs,bhsd->bhgd", weights, values).reshape(batch, heads, 1, dim)
