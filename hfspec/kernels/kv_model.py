"""A model together with its KV cache: feed only what it has not seen, roll back on rejection.

Positions are "slots" shared by both models. A slot can be a hole (a rejected draft token of some row in a
batch): holes stay in the cache but are masked out, and position ids skip them.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import torch

from hfspec.kernels import cache as kv


@runtime_checkable
class Runner(Protocol):
    """A model behind its KV cache, as the decoding loop drives it (`CachedModel` is the HF forward's; a
    self-draft may bring its own). `cached`: slots the cache holds; the counters add up every `feed`."""

    cached: int
    seconds: float
    forwards: int
    positions_fed: int

    def feed(self, tokens, positions, valid, end: int, keep: int, all_valid: bool) -> torch.Tensor:
        """Run over slots [cached, end); return logits [B, keep, V] of the last `keep` slots."""

    def rollback(self, length: int) -> None:
        """Forget slots at and beyond `length`."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows from the cache."""


class CachedModel:
    """Owns one model's cache; `feed` runs the model over slots [cached, end)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = kv.new_cache(model)
        self.cached = 0
        self.forwards = 0
        self.positions_fed = 0
        self.seconds = 0.0
        self.device = _input_device(model)
        self._cache_kw = kv.cache_kwarg(model)
        self._has_positions = kv.accepts(model, "position_ids")
        self._has_keep = kv.accepts(model, "logits_to_keep")
        self._sync = self.device.type == "cuda"

    def feed(self, tokens, positions, valid, end: int, keep: int, all_valid: bool) -> torch.Tensor:
        """Run over slots [cached, end); return logits [B, keep, V] of the last `keep` slots."""
        start = self.cached
        began = time.perf_counter()
        logits = self._run(tokens, positions, valid, start, end, keep, all_valid)
        if self._sync:
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - began
        self.cached = end
        self.forwards += 1
        self.positions_fed += (end - start) * tokens.shape[0]
        return logits

    def _run(self, tokens, positions, valid, start: int, end: int, keep: int, all_valid: bool) -> torch.Tensor:
        """One HF forward over slots [start, end) with the cache; keeps the cache it returns."""
        kwargs = {
            "input_ids": tokens[:, start:end].to(self.device),
            self._cache_kw: self.cache,
            "use_cache": True,
            "attention_mask": None if all_valid else valid[:, :end].long().to(self.device),
        }
        if self._has_positions:
            kwargs["position_ids"] = positions[:, start:end].to(self.device)
        if self._has_keep:
            kwargs["logits_to_keep"] = keep
        outputs = self.model(**kwargs)
        self.cache = kv.cache_of(outputs)
        return outputs.logits[:, -keep:]

    def masked_forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
        """One HF forward over `ids` [1, T] at `positions` [1, T] on top of the cache, with a 4-D attention `mask`
        [1, 1, T, cached + T] in the form the model takes (a tree's); keeps the cache it returns and gives logits
        [1, keep, V] of the last `keep` rows. Timing and slot bookkeeping stay with the caller (trees)."""
        kwargs = {"input_ids": ids.to(self.device), self._cache_kw: self.cache, "use_cache": True,
                  "attention_mask": mask.to(self.device), "position_ids": positions.to(self.device)}
        if self._has_keep:
            kwargs["logits_to_keep"] = keep
        outputs = self.model(**kwargs)
        self.cache = kv.cache_of(outputs)
        if self._sync:
            torch.cuda.synchronize(self.device)
        return outputs.logits[:, -keep:]

    def rollback(self, length: int) -> None:
        """Forget slots at and beyond `length`."""
        if self.cached > length:
            kv.crop_to(self.cache, length)
            self.cached = length

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows from the cache."""
        kv.select_rows(self.cache, rows.to(self.device))


def _input_device(model: torch.nn.Module) -> torch.device:
    try:
        weight = model.get_input_embeddings().weight
        if weight.device.type != "meta":
            return weight.device
    except (AttributeError, NotImplementedError):
        pass
    return getattr(model, "device", torch.device("cpu"))

