"""Every matrix's inputs captured while the target writes its calibration text (`TextInputs`), so that no second
forward over that text is needed for the Hessians.

The target writes its calibration text with its KV cache, one position of every sequence per step: each
step's decoder passes already compute every matrix's input at that position, the same values a forward of the
whole text computes (to float rounding). Held until the Hessians are taken, they save that forward (at the
1.7B shape a layer took 29.7 s against 32.2 s; docs/drafts.md). Matrices fed the same tensor object (q/k/v,
gate/up) share one buffer.
The last sampled token is fed once more through the cache (`finish`) so the captured positions are exactly the
text's. Holding them costs memory (T × Σ K floats: 5.7 GB for the 1.7B shape's 64 × 65 tokens), so capturing
stops and frees what it holds at the first step if its buffers would exceed `budget`; the caller then takes the
Hessians with forwards as before.
"""

from __future__ import annotations

import torch
from torch import nn


class TextInputs:
    """Context manager: while it is open, the inputs of the named matrices of `model` are written into one fp32
    buffer [rows, K] per input (matrices fed the same tensor share one), up to `budget` bytes of buffers for `rows`
    positions in all. `complete` says every buffer holds exactly `rows` positions within the budget;
    `hessian(name)` then gives a matrix's Σ x xᵀ and frees its buffer once no other matrix needs it."""

    def __init__(self, model: nn.Module, names: list[str], rows: int, budget: int):
        self.model, self.names, self.rows, self.budget = model, list(names), rows, budget
        self.owner: dict[str, str] = {}  # each matrix's buffer, by the name of the first matrix fed that input
        self.buffers: dict[str, torch.Tensor] = {}
        self.filled: dict[str, int] = {}
        self.held = 0  # bytes of buffers
        self.over = False  # stopped: over the budget, or inputs not as the first step had them
        self.cache = None  # (keyword, the generation's KV cache), for `finish`
        self._last: list = [None, -1, None]  # the latest input tensor (held, so its memory is not reused), its version, buffer
        self._hooks: list = []
        self._grams: dict[str, torch.Tensor] = {}

    def __enter__(self) -> TextInputs:
        for name in self.names:
            self._hooks.append(self.model.get_submodule(name).register_forward_pre_hook(
                lambda mod, args, name=name: self._seen(name, args[0])))
        self._hooks.append(self.model.register_forward_pre_hook(self._call, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._last = [None, -1, None]
        self.cache = None

    def _call(self, module, args, kwargs) -> None:
        for key in ("cache", "past_key_values"):  # (the name generate passes it under: transformers 5 says "cache")
            if kwargs.get(key) is not None:
                self.cache = (key, kwargs[key])

    def _seen(self, name: str, x: torch.Tensor) -> None:
        if self.over:
            return
        shared = self._last[0] is x and self._last[1] == x._version
        if name not in self.owner:  # the first step: this matrix's buffer, or the one before it's
            self.owner[name] = self._last[2] if shared else name
            if not shared:
                self.buffers[name] = torch.empty(self.rows, x.shape[-1], dtype=torch.float32)
                self.filled[name] = 0
                self.held += self.rows * x.shape[-1] * 4
                if self.held > self.budget:
                    return self._stop()
        owner = self.owner[name]
        if shared != (owner != name) or (shared and self._last[2] != owner):
            return self._stop()  # fed otherwise than at the first step: not captured
        self._last[:] = [x, x._version, owner]
        if shared:
            return
        rows = x.reshape(-1, x.shape[-1])
        start = self.filled[owner]
        if start + rows.shape[0] > self.rows:
            return self._stop()
        self.buffers[owner][start:start + rows.shape[0]].copy_(rows)
        self.filled[owner] = start + rows.shape[0]

    def _stop(self) -> None:
        self.over = True
        self.buffers.clear()
        self._last = [None, -1, None]
        self.held = 0

    @torch.no_grad()
    def finish(self, ids: torch.Tensor) -> None:
        """Feed the text's last tokens once more through the generation's cache, so that the captured positions are
        all of `ids` (generation feeds every token but the last)."""
        if self.over or self.cache is None:
            self._stop()
            return
        key, cache = self.cache
        position = torch.full((ids.shape[0], 1), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
        self.model(ids[:, -1:], position_ids=position, use_cache=True, **{key: cache})
        self.cache = None

    @property
    def complete(self) -> bool:
        return (not self.over and set(self.owner) == set(self.names)
                and all(n == self.rows for n in self.filled.values()))

    def hessian(self, name: str) -> torch.Tensor:
        """Σ x xᵀ [K, K] fp64 of the named matrix's captured inputs (`gram` of their rows, in fp32); matrices fed the
        same input share one product. Once no matrix still to come needs a buffer, it is freed."""
        owner = self.owner.pop(name)
        if owner not in self._grams:
            self._grams[owner] = gram(self.buffers.pop(owner)).double()
        if owner in self.owner.values():
            return self._grams[owner].clone()
        return self._grams.pop(owner)


GRAM_PARTS = 8  # column blocks of xᵀx: only the blocks on and above the diagonal are multiplied


def gram(x: torch.Tensor) -> torch.Tensor:
    """xᵀx [K, K] for x [T, K], multiplying only the column blocks on and above the diagonal and mirroring the
    rest (the same values as x.t() @ x; at K = 8192 over 4096 rows 1.9 s instead of 3.3 s on two cores, at K = 1536
    over 8448 rows 207 ms instead of 279). Small K: one product (at K = 576 the blocks gain 10-20 %, 1 % of a
    calibration)."""
    k = x.shape[1]
    if k < 1024:
        return x.t() @ x
    out = torch.empty(k, k, dtype=x.dtype)
    step = -(-k // GRAM_PARTS)
    for i in range(0, k, step):
        j = min(k, i + step)
        out[i:j, i:] = x[:, i:j].t() @ x[:, i:]
        out[j:, i:j] = out[i:j, j:].t()
    return out
