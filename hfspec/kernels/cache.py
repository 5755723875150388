"""The one place that talks to Hugging Face's KV-cache API.

Its names and semantics moved between transformers releases (`past_key_values` became `cache`;
`crop` took a length to keep, now only a negative count to remove). Everything else in hfspec calls these.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache

from hfspec.attrs import NEW_CACHE_HOOK, hook


@functools.cache
def _forward_params(model_cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_cls.forward).parameters)


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the keyword that passes a cache into `model.forward`."""
    params = _forward_params(type(model))
    return "cache" if "cache" in params else "past_key_values"


def accepts(model: torch.nn.Module, name: str) -> bool:
    """Whether `model.forward` takes the keyword `name`."""
    params = _forward_params(type(model))
    return name in params


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty cache for `model`: its own when it brings one (`NEW_CACHE_HOOK`, `hfspec.attrs`), else HF's dynamic
    cache."""
    own = hook(model, NEW_CACHE_HOOK)
    if own is not None:
        return own()
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        cache = DynamicCache()
    # Sliding-window layers (Gemma 2/3, Mistral) drop old states once full unless told to keep them until a
    # crop: rollback needs them.
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def cache_of(outputs) -> DynamicCache:
    """The cache a forward pass returned."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else outputs.past_key_values


def seq_length(cache) -> int:
    """Number of positions held in the cache."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_to(cache, length: int) -> None:
    """Drop cached positions beyond `length` (in place).

    A negative argument to `crop` removes that many positions in every transformers release (older ones read a
    positive argument as the length to keep, 5.x refuses it), so only the negative form is used.
    """
    current = seq_length(cache)
    if length < current:
        cache.crop(-(current - length))


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows `rows` (in place)."""
    cache.batch_select_indices(rows)


def keep_positions(cache, positions: list[int]) -> None:
    """Keep only the cached positions `positions` (increasing), moved to the front in that order, in every
    layer (in place). Tree speculation keeps the accepted path: a prefix plus one leaf scored after it.
    Layers must hold every position (no sliding-window storage)."""
    same = 0
    while same < len(positions) and positions[same] == same:
        same += 1
    for layer in cache.layers:
        if same < len(positions):
            src = torch.tensor(positions[same:], device=layer.keys.device)
            layer.keys[:, :, same:len(positions)] = layer.keys.index_select(2, src)
            layer.values[:, :, same:len(positions)] = layer.values.index_select(2, src)
    crop_to(cache, len(positions))


def has_sliding_layers(model: torch.nn.Module) -> bool:
    """Whether the model's cache keeps only a window of positions in some layer (Gemma 2/3, Mistral, ...)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    types = getattr(config, "layer_types", None) or []
    return any("sliding" in t or "chunked" in t for t in types) or bool(getattr(config, "sliding_window", None)
                                                                           and getattr(config, "use_sliding_window", True))
