"""The slot layout both models share: token, position and validity per slot, for the rows still running.

A batch's rows accept different numbers of draft tokens per round. The round's new token of every row goes to
the same slot (after the longest accepted run); slots a row did not accept become holes: masked out of
attention, skipped by position ids, never re-fed. A batch of one never has holes.
"""

from __future__ import annotations

import torch


class Slots:
    """tokens [B, S], positions [B, S], valid [B, S]; `all_valid` when there is no hole anywhere."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        self.tokens = input_ids
        self.valid = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).bool()
        self.positions = (self.valid.long().cumsum(-1) - 1).clamp_min(0)
        self.all_valid = bool(self.valid.all())

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def append(self, tokens: torch.Tensor) -> None:
        """Add k valid slots per row (draft tokens), tokens [B, k]."""
        k = tokens.shape[1]
        if not k:
            return
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.valid = torch.cat([self.valid, torch.ones_like(tokens, dtype=torch.bool)], dim=1)
        step = torch.arange(1, k + 1, device=tokens.device)
        self.positions = torch.cat([self.positions, self.positions[:, -1:] + step], dim=1)

    def settle(self, start: int, x: torch.Tensor, n: torch.Tensor, token: torch.Tensor) -> None:
        """After a round from slot `start`: keep drafts x[:, :max n] (holes past each row's n), then `token`."""
        m = int(n.max()) if n.numel() else 0
        if self.tokens.shape[0] == 1:  # no holes possible: cheap path
            self.tokens = torch.cat([self.tokens[:, :start + m], token[:, None]], dim=1)
            self.valid = torch.cat([self.valid[:, :start + m], torch.ones_like(token[:, None], dtype=torch.bool)], dim=1)
            self.positions = torch.cat([self.positions[:, :start + m], self.positions[:, start + m - 1:start + m] + 1],
                                       dim=1)
            return
        kept = torch.arange(m, device=n.device)[None, :] < n[:, None]
        base = self.positions[:, start - 1 : start]
        self.tokens = torch.cat([self.tokens[:, :start], x[:, :m], token[:, None]], dim=1)
        self.valid = torch.cat([self.valid[:, :start], kept, torch.ones_like(token[:, None], dtype=torch.bool)], dim=1)
        new_positions = torch.cat([base + kept.long().cumsum(-1), base + n[:, None] + 1], dim=1)
        self.positions = torch.cat([self.positions[:, :start], new_positions], dim=1)
        self.all_valid = self.all_valid and bool(kept.all())

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.tokens, self.valid, self.positions = self.tokens[rows], self.valid[rows], self.positions[rows]
        self.all_valid = bool(self.valid.all())
