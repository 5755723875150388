"""The lean step's KV cache: keys and values preallocated per layer in chunks of `CACHE_CHUNK` slots, with the part
of transformers' Cache API that `hfspec.kernels.cache` uses."""

from __future__ import annotations

import torch

CACHE_CHUNK = 256  # the KV cache grows by this many slots at a time


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

    # the part of transformers' Cache API that hfspec.kernels.cache uses
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        self.length = self.length + max_length if max_length < 0 else min(self.length, max_length)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
