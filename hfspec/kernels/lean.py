"""A lean decode step for drafts built from the target's weights (Llama-style decoder families).

Only the target's numerics must match Hugging Face; the draft is a proposal, and the q it computes is used
both to sample and to accept, so any implementation keeps the output exact. This one does per layer what a
decoder layer does in the fewest operators: RMSNorm (`torch.rms_norm`), one fused QKV matmul, rotary from a
precomputed table, a preallocated KV cache whose rollback is a length, SDPA, one fused gate/up matmul.
Weights are RTN codes in groups (2-4 bits run the CPU int4 kernel; 5-8 bits are dequantised to bf16), codes
given by a calibrated draft in the same format (`codes`), per-channel int8 run by the CPU int8 kernel (group size
`hfspec.quant.int8.PER_CHANNEL`; `formats` gives chosen layers or the head such a format of their own), or the
target's own float weights (bits=None; `shared`, the lean target's: not even fused, `hfspec.kernels.lean_target`).

Families (read from the HF modules, not from names): Llama, Mistral, Qwen2 (QKV bias), Qwen3 (q/k norm),
Gemma (1 + w norms, scaled embedding, GeLU), Gemma 2 / Gemma 3 text (sandwich norms, per-layer-type rotary,
final logit soft-capping), Phi-3 (fused projections, partial rotary), SmolLM. Not reproduced, because a
proposal may differ: Gemma 2's attention logit soft-capping (rarely active), and in batches with holes a
sliding window counted in slots rather than positions. `lean_reason(model)` says why a model cannot take this path.
"""

from __future__ import annotations

import inspect
import time
import weakref
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from hfspec.attrs import LEAN_STEP, STEP_PATH, get_attr, set_attr
from hfspec.dtypes import dtype_str
from hfspec.errors import HfspecError
from hfspec.kernels import native_step
from hfspec.kernels.compiled import COMPILED_FEED_MAX, PAIR, CompiledStep
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.lean_attention import attention_mask as _attention_mask
from hfspec.kernels.lean_cache import LeanCache
from hfspec.kernels.lean_layers import (
    _ACTS,
    LeanLinear,
    _activation_name,
    _Block,
    _layer_type,
    _linear_parts,
    _norm_weight,
    _Unsupported,
)
from hfspec.kernels.shared_linear import SharedLinear
from hfspec.quant.swap import replaceable_layers

BUILD_PROGRESS_EVERY = 2.0  # seconds between "building the draft: layer i/N" messages
HEAD_TOP = 32  # a quantised head's top logits re-scored with the target's own head rows (`LeanDecoder.head_top`)
HEAD_TOP_MAX = 1024
HEAD_FLOAT_BELOW = 1 << 20  # a quantised draft runs a head of fewer weights as the target's own (default head_top)


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
            replaceable_layers(model)  # a known subclass (Gemma's scaled embedding) passes, others are refused
        if getattr(inner.embed_tokens, "max_norm", None) is not None:
            raise _Unsupported("embedding with max_norm")
    except (_Unsupported, AttributeError, TypeError, OSError, HfspecError) as why:
        return str(why)
    return None


# ------------------------------------------------------------------------------------------------ model
class LeanDecoder(nn.Module):
    """A decoder-only LM rebuilt from `target` for fast single-token steps. Takes HF-style keywords
    (input_ids, position_ids, attention_mask over all slots, cache, logits_to_keep) so the rest of hfspec
    drives it like any model; returns an object with `.logits` and `.cache`.

    Rotary runs as one rotation of pairs over the query and key heads together: the rows of W_q and W_k are
    permuted within each head so that HF's rotate-half pairs (i, i + D/2) sit side by side. Attention scores
    q·k do not change under the same permutation of both, so the model computes the same function.

    head_top (quantised drafts; default `HEAD_TOP`, 0 turns it off): the `head_top` largest logits of the
    quantised LM head are computed again from the target's own head rows, in fp32. A 4-bit head is where a
    quantised copy loses most of its agreement with the target on real checkpoints (a tied 49k × 576 table is a
    fifth of SmolLM2-135M), and the probability mass sits in a few dozen tokens: re-scoring them brings the
    draft's distribution close to a float head's at the cost of a top-k and K rows of the head read, no memory
    (the rows are the target's tensor). The draft's q is still one deterministic function of the context, used
    both to draw and to accept, so exactness does not depend on it. By default a head of fewer than
    `HEAD_FLOAT_BELOW` weights (the embedded micro model's) is not quantised at all: the target's own head, shared,
    costs no more time than its int4 codes there and gives the target's logits."""

    def __init__(self, target: nn.Module, bits: int | None, group_size: int = 32, max_positions: int | None = None,
                 progress=None, head_top: int | None = None, codes: dict | None = None,
                 formats: dict | None = None, shared: bool = False):
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
        small = head_top is None and head.weight.numel() < HEAD_FLOAT_BELOW
        coded = codes or {}  # id(float weight) -> its `Coded` (a calibrated draft's): used instead of RTN
        # formats: "head" or a layer index -> (bits, group_size) of that unit, instead of (bits, group_size)
        formats = formats or {}
        head_bits, head_group = formats.get("head", (bits, group_size))
        self.head = SharedLinear([(head.weight, getattr(head, "bias", None))]) if shared else LeanLinear(
            head.weight if small else coded.get(id(head.weight), head.weight), getattr(head, "bias", None),
            None if small else head_bits, head_group, share=True)
        self.head_top = 0 if bits is None or small else min(HEAD_TOP if head_top is None else int(head_top),
                                                             self.vocab)
        # Plain attributes, not buffers: the target's own head, read K rows per position when re-scoring.
        self.head_rows = head.weight.detach()
        self.head_bias = None if getattr(head, "bias", None) is None else head.bias.detach().float()
        # The input embedding is read one row per token, so its bytes cost no time: the draft looks rows up in
        # the target's own table (any dtype, cast to fp32) instead of holding a copy. A plain attribute, not a
        # buffer: the draft's `weight_bytes` count what it adds to the target, and the table stays the target's.
        self.embed_table = embed.weight.detach()
        self.target_dtype = embed.weight.dtype
        scale = getattr(embed, "embed_scale", None)  # Gemma: cast to the weights' dtype, as its forward does
        self.embed_scale = float(scale.to(embed.weight.dtype)) if scale is not None else None
        self.final_norm, self.eps = _norm_weight(inner.norm, self.hidden)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.blocks = nn.ModuleList(_built_blocks(layers, bits, group_size, progress, coded, formats, shared))
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
        rescored = (f"; the head's top {self.head_top} logits re-scored with the target's head rows"
                    if self.head_top else "; the target's own head (small)" if small and bits is not None else "")
        set_attr(self, STEP_PATH, f"lean decode step for a {dtype_str(self.target_dtype)} target (fp32 "
                 f"activations and logits; input embedding read from the target's table; {'; '.join(paths)}{rescored})")
        self.compiled_step = None

    def compile_step(self, progress=None) -> str:
        """Compile the one-token step (`hfspec.kernels.compiled`); returns what runs: "compiled" or "eager (why)"."""
        step = CompiledStep(self, progress)
        self.compiled_step = step if step.path == "compiled" else None
        set_attr(self, STEP_PATH, get_attr(self, STEP_PATH) + f", one-token step {step.path}"
                 + (" (C++ wrapper)" if step.wrapper else ""))
        return step.path

    def _table(self, layer_type, upto: int) -> torch.Tensor:
        """Rotary factors [P, R/2, 2] (cos, sin) for positions < P (P ≥ upto), per layer type. Real, not complex:
        inductor generates no code for complex operators (it calls eager kernels for them, one per layer)."""
        table = self._tables.get(layer_type)
        if table is None or table.shape[0] < upto:
            size = max(upto, min(self.max_positions, 2048), 2 * (table.shape[0] if table is not None else 0))
            pos = torch.arange(size)[None]
            x = torch.zeros(1, dtype=torch.float32)
            params = inspect.signature(self._rotary.forward).parameters
            with torch.no_grad():
                cos, sin = (self._rotary(x, pos, layer_type) if "layer_type" in params else self._rotary(x, pos))
            half = cos.shape[-1] // 2
            table = torch.stack([cos[0, :, :half].float(), sin[0, :, :half].float()], dim=-1)
            self._tables[layer_type] = table
        return table

    def hfspec_new_cache(self) -> LeanCache:  # the `NEW_CACHE_HOOK` (hfspec.attrs)
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

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
               cache: LeanCache, logits_to_keep: int = 0, native: bool = True) -> torch.Tensor:
        """Run over `input_ids` after what `cache` holds; logits of the last `logits_to_keep` positions (0: all).
        native=False: the eager lean step, neither the native C step (`hfspec.kernels.native_step`) nor the compiled
        one: what the native step is checked against."""
        batch, steps = input_ids.shape
        start = cache.length
        end = start + steps
        if (native and batch == 1 and attention_mask is None and (step := native_step.of(self)) is not None
                and step.takes(steps) and (position_ids is None or position_ids.view(-1).tolist() == list(range(start, end)))):
            h = step(input_ids, start, cache)
            return self._logits_of(h[:, -logits_to_keep:] if logits_to_keep else h)
        if (native and self.compiled_step is not None and steps <= COMPILED_FEED_MAX and batch == 1 and attention_mask is None
                and (position_ids is None or position_ids.view(-1).tolist() == list(range(start, end)))):
            keep = steps if logits_to_keep == 0 else min(logits_to_keep, steps)
            if steps == PAIR and keep == 1 and self.compiled_step.fn_pair is not None:
                return self.compiled_step.pair(input_ids, start, cache)
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
        """`tokens` of one token at cache slot `slot` ([1] long): the same shapes at every step, for `torch.compile`.
        `tables`: `rotary_tables(n)`, the rotary factors (cos, sin) per entry of `rope_types`."""
        return self.tokens(input_ids, slot, tables, keys, values)

    def tokens(self, input_ids: torch.Tensor, slots: torch.Tensor, tables: list[torch.Tensor],
               keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """Logits [1, 1, V] of the last of T tokens (input_ids [1, T]) written at consecutive cache slots `slots`
        ([T] long, their positions too), attending through a mask over every preallocated slot (`one_token`'s
        shapes for T = 1). With T = 2, a compiled draft's catch-up feed (its last proposal and the target's bonus
        token after a round that kept every proposal) in one call: a draft step reads all of the draft's weights
        whatever its rows, so two rows cost about what one does (`hfspec.kernels.compiled`)."""
        h = F.embedding(input_ids, self.embed_table).float()
        if self.embed_scale is not None:
            h = h * self.embed_scale
        index = torch.arange(keys[0].shape[2], device=slots.device)[None, :]
        masks = {}
        for window in self._windows:
            seen = index <= slots[:, None]
            if window is not None:
                seen = seen & (index > slots[:, None] - window)
            masks[window] = seen[None, None]
        factors = {kind: table[slots][None, :, None] for kind, table in zip(self.rope_types, tables, strict=True)}
        for step, layer_type, window, k, v in zip(self._steps, self._layer_types, self._block_windows, keys, values,
                                                  strict=True):
            h = step(h, factors[layer_type], k, v, slots, None, masks[window])
        return self._logits_of(h[:, -1:])

    def level(self, input_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, seen: torch.Tensor,
              tables: list[torch.Tensor], keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """Logits [1, W, V] of a token tree's level: W nodes (input_ids [1, W]) written at cache slots `slots` [W], at
        rotary positions `positions` [W], node i seeing the slots row i of `seen` [W, S] marks (S: every cache slot;
        full attention: trees refuse sliding windows). Compiled: `hfspec.kernels.compiled_tree`."""
        h = F.embedding(input_ids, self.embed_table).float()
        if self.embed_scale is not None:
            h = h * self.embed_scale
        mask = seen[None, None]
        factors = {kind: table[positions][None, :, None] for kind, table in zip(self.rope_types, tables, strict=True)}
        for step, layer_type, k, v in zip(self._steps, self._layer_types, keys, values, strict=True):
            h = step(h, factors[layer_type], k, v, slots, None, mask)
        return self._logits_of(h)

    def rotary_tables(self, positions: int) -> list[torch.Tensor]:
        """Rotary factors [≥ positions, R/2, 2] (cos, sin) per entry of `rope_types`."""
        return [self._table(kind, positions) for kind in self.rope_types]

    def _logits_of(self, h: torch.Tensor) -> torch.Tensor:
        h = torch.rms_norm(h, (self.hidden,), self.final_norm, self.eps)
        x = h.reshape(-1, self.hidden)
        logits = self._head_mm(x)
        if self.head_top:
            logits = self._rescored(x, logits)
        logits = logits.view(*h.shape[:-1], -1)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _rescored(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [N, V] with each row's `head_top` largest replaced by x · (the target's head row) in fp32."""
        top = logits.topk(self.head_top, dim=-1).indices  # [N, K]
        exact = torch.bmm(self.head_rows[top].float(), x.unsqueeze(-1)).squeeze(-1)
        if self.head_bias is not None:
            exact = exact + self.head_bias[top]
        return logits.scatter(-1, top, exact)


class LeanRunner(CachedModel):
    """A `CachedModel` whose forward calls the lean decoder's steps directly (no module call, no keywords)."""

    def _run(self, tokens, positions, valid, start: int, end: int, keep: int, all_valid: bool) -> torch.Tensor:
        return self.model.logits(tokens[:, start:end], positions[:, start:end],
                                 None if all_valid else valid[:, :end], self.cache, keep)


_LEAN_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # HF draft model -> (weights key, LeanDecoder)


def lean_step_of(model: nn.Module) -> LeanDecoder | None:
    """The lean step of an HF draft model's own float weights (a smaller sibling of the target), or None where
    it cannot run one: another family (`lean_reason`), weights that are not plain CPU `nn.Linear`s (bitsandbytes,
    swapped quantised modules, accelerate offload), or `set_attr(model, LEAN_STEP, False)` (opt out, `hfspec.attrs`).

    Built once per model and rebuilt when its parameters change (storage or in-place version). A sibling runs a
    third to a half of the HF forward's operators per token (`benchmarks/bench_sibling.py`); the price is memory:
    the fused QKV and gate/up matrices are copies (the rest, embedding and head included, share the model's
    tensors), about two thirds of the sibling's layer weights again."""
    if get_attr(model, LEAN_STEP, True) is False or not isinstance(model, nn.Module):
        return None
    params = list(model.parameters())
    if not params or any(p.device.type != "cpu" for p in params):  # meta (offloaded) and accelerator weights
        return None
    key = tuple((p.data_ptr(), p._version) for p in params)
    try:
        known = _LEAN_STEPS.get(model)
    except TypeError:  # not weak-referenceable
        return None
    if known is not None and known[0] == key:  # the answer for these weights, a lean step or None
        return known[1]
    lean = None
    if lean_reason(model) is None:  # reads every layer's modules (and its norms' source): once per weights
        try:
            lean = LeanDecoder(model, bits=None)
        except (ValueError, _Unsupported):
            lean = None
    _LEAN_STEPS[model] = (key, lean)
    return lean


def _built_blocks(layers, bits: int | None, group_size: int, progress, codes: dict,
                  formats: dict | None = None, shared: bool = False) -> list[_Block]:
    """One `_Block` per decoder layer, saying how far it got every BUILD_PROGRESS_EVERY seconds (big targets
    take a while)."""
    say = progress or (lambda message: None)
    blocks, began, shown = [], time.perf_counter(), 0.0
    for i, layer in enumerate(layers):
        blocks.append(_Block(layer, *(formats or {}).get(i, (bits, group_size)), codes, shared))
        spent = time.perf_counter() - began
        if spent - shown >= BUILD_PROGRESS_EVERY or (i + 1 == len(layers) and shown):
            say(f"building the draft: layer {i + 1}/{len(layers)} ({spent:.0f} s)")
            shown = spent
    return blocks
