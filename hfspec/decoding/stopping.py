"""When a row stops: EOS, length and any other stopping criterion, checked after every committed token.

A round may commit several tokens at once; checking each one in order is what makes the output equal to
plain `generate`: nothing after EOS, never more than `max_new_tokens`.
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria


class Stopper:
    """Fast paths for EOS and length; other criteria are called on the row's sequence."""

    def __init__(self, criteria: StoppingCriteriaList | None, eos_token_id=None, max_length: int | None = None):
        self.max_length = max_length
        self.eos: set[int] = set(eos_id_list(eos_token_id))
        self.others = []
        for criterion in criteria or []:
            if isinstance(criterion, MaxLengthCriteria):
                limit = criterion.max_length
                self.max_length = limit if self.max_length is None else min(self.max_length, limit)
            elif isinstance(criterion, EosTokenCriteria):
                self.eos.update(eos_id_list(criterion.eos_token_id))
            else:
                self.others.append(criterion)

    def budget(self, length: int) -> int:
        """How many more tokens a row of `length` tokens may take."""
        return 1 << 30 if self.max_length is None else max(0, self.max_length - length)

    def commit(self, length: int, tokens: list[int], history=None) -> tuple[int, bool, str]:
        """How many of `tokens` to keep after a row of `length` tokens, whether the row is done, and why
        ("eos" | "max_tokens" | "stop_criteria"; "" while it runs).

        `history()` returns the row's tokens as a 1-D tensor; only criteria other than EOS/length need it.
        """
        room = self.budget(length)
        row = history() if self.others else None
        for i, token in enumerate(tokens):
            if i + 1 > room:
                return i, True, "max_tokens"
            if token in self.eos:
                return i + 1, True, "eos"
            if self.others:
                seq = torch.cat([row, row.new_tensor(tokens[: i + 1])]).unsqueeze(0)
                if any(bool(c(seq, None).all()) for c in self.others):
                    return i + 1, True, "stop_criteria"
            if i + 1 == room:
                return i + 1, True, "max_tokens"
        return len(tokens), False, ""


def eos_id_list(ids) -> list[int]:
    """Token ids given as None, an int, a list or a tensor (e.g. `eos_token_id`), as a list of ints."""
    if ids is None:
        return []
    if isinstance(ids, torch.Tensor):
        return [int(i) for i in ids.flatten().tolist()]
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]
