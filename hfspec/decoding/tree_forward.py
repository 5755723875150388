"""Token trees in one forward: the 4-D attention mask of a tree on top of a cache, the target's pass over every
node (`feed_token_tree`), a draft level through the HF forward or the lean step, and the cache cut back to the
accepted path (`keep_cached`). Used by `hfspec.decoding.trees`."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from hfspec.kernels import cache as kv
from hfspec.kernels import native_step
from hfspec.kernels.compiled_tree import LEVEL_MAX
from hfspec.kernels.lean import LeanRunner
from hfspec.kernels.lean_cache import LeanCache


def _ancestors(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: row k marks node k and its ancestors (parents[k] < k; −1 for the root's children)."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for k, parent in enumerate(parents):
        if parent >= 0:
            anc[k] = anc[parent]
        anc[k, k] = True
    return anc


def tree_mask(prefix: int, fresh: int, anc: torch.Tensor) -> torch.Tensor:
    """Allowed [fresh + N, prefix + fresh + N]: `fresh` ordinary causal slots after `prefix` cached ones, then N
    tree nodes that see every slot before them and their ancestors (`anc`, `_ancestors`)."""
    n = anc.shape[0]
    base = prefix + fresh
    rows = torch.cat([torch.arange(prefix, base), torch.full((n,), base - 1)])
    allowed = torch.arange(base + n)[None, :] <= rows[:, None]
    allowed[:, base:] = False
    allowed[fresh:, base:] = anc
    return allowed


def _additive(allowed: torch.Tensor, model) -> torch.Tensor:
    dtype = getattr(model, "dtype", torch.float32)
    dtype = dtype if dtype.is_floating_point else torch.float32
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def feed_token_tree(runner, tokens: torch.Tensor, positions: torch.Tensor, start: int, node_tokens: list[int],
                    parents: list[int], depths: list[int]) -> torch.Tensor:
    """One forward of `runner` (a `CachedModel`) over the slots [cached, start) it has not seen and the tree's N
    nodes (node k at position positions[start − 1] + depths[k], seeing the slots before `start` and its
    ancestors). Returns logits [1, 1 + N, V]: slot start − 1 (the root), then one per node."""
    began = time.perf_counter()
    cached, n = runner.cached, len(node_tokens)
    base = positions[0, start - 1]
    ids = torch.cat([tokens[0, cached:start], tokens.new_tensor(node_tokens)])
    pos = torch.cat([positions[0, cached:start], base + torch.tensor(depths, dtype=positions.dtype)])
    allowed = tree_mask(cached, start - cached, _ancestors(parents))
    keep = 1 + n
    logits = forward_level(runner, ids, pos, allowed, keep)
    runner.seconds += time.perf_counter() - began
    runner.cached = start + n
    runner.forwards += 1
    runner.positions_fed += start - cached + n
    return logits


def forward_level(runner, ids: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor, keep: int) -> torch.Tensor:
    """Logits [1, keep, V] of the last `keep` rows; the lean step or the HF forward with a 4-D mask."""
    if isinstance(runner, LeanRunner):
        native = native_step.of(runner.model)
        if native is not None and native.takes(len(ids)):  # the whole level in one C call
            cache = runner.cache
            with torch.no_grad():
                h = native(ids[None], cache.length, cache, pos, allowed)
                return runner.model._logits_of(h[:, -keep:])
        step = runner.model.compiled_step
        if step is not None and step.tree_level.fn is not None and len(ids) <= LEVEL_MAX:
            return step.tree_level.level(ids[None], pos, allowed, runner.cache)[:, -keep:]
        return _lean_forward(runner.model, runner.cache, ids[None], pos[None], allowed)[:, -keep:]
    return runner.masked_forward(ids[None], pos[None], _additive(allowed, runner.model), keep)


@torch.no_grad()
def _lean_forward(decoder, cache, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The lean decoder (`hfspec.kernels.lean.LeanDecoder`) over ids [1, T] at explicit positions with a boolean
    mask [T, cache.length + T] over its cache slots: a whole tree level in one call."""
    start = cache.length
    end = start + ids.shape[1]
    cache.reserve(1, end)
    h = F.embedding(ids, decoder.embed_table).float()
    if decoder.embed_scale is not None:
        h = h * decoder.embed_scale
    mask = allowed[None, None]
    top = int(positions.max()) + 1
    rope = {}
    for step, layer_type, keys, values in zip(decoder._steps, decoder._layer_types, cache.keys, cache.values,
                                              strict=True):
        if layer_type not in rope:
            rope[layer_type] = decoder._table(layer_type, top)[positions][:, :, None]
        h = step(h, rope[layer_type], keys, values, start, end, mask)
    cache.length = end
    return decoder._logits_of(h)


def keep_cached(runner, positions: list[int]) -> None:
    """Keep only the cached slots `positions` (increasing) of a runner, moved to the front; `cached` follows."""
    cache = runner.cache
    if isinstance(cache, LeanCache):
        same = 0
        while same < len(positions) and positions[same] == same:
            same += 1
        if same < len(positions):
            src = torch.tensor(positions[same:])
            for t in cache.keys + cache.values:
                t[:, :, same:len(positions)] = t.index_select(2, src)
        cache.length = len(positions)
    else:
        kv.keep_positions(cache, positions)
    runner.cached = len(positions)
