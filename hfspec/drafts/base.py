"""The one interface the decoding loop talks to: a `Draft` proposes tokens and owns its own state.

    x, q = draft.propose(slots, gamma, pick, decide)   # appends x to the slots; q [B, k, V] (None when greedy)
    draft.rollback(length); draft.keep_rows(rows)
    draft.attach(target_runner)                        # optional (`AttachesToTarget`): the target's runner

A model-backed draft (`ModelDraft`) feeds the slots it has not seen through a runner with a KV cache (the HF
forward via `CachedModel`, or a lean step of its own) and lets the loop's `pick` turn logits into tokens and
q. Plain decoding is `NoDraft`, which proposes nothing. A new kind of draft implements these three methods;
`attach` is optional: a draft that shares the target's weights and cache (layer skipping, early exit) keeps the
target's runner there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from hfspec.attrs import DRAFT_HOOK, hook
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.lean import LeanDecoder, LeanRunner, lean_step_of
from hfspec.kernels.slots import Slots
from hfspec.validate import vocab_size

# pick(logits [B, 1, V'], x_so_far [B, j]) -> (x_j [B], q_j [B, V] or None when greedy)
Pick = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
# decide(j, logits [B, 1, V'], x_j [B], q_j [B, V] or None) -> (propose x_j, go on to j + 1): an early exit
# (`hfspec.decoding.early_exit.EarlyExit.decide`); it reads q_j or the logits, never x_j
Decide = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor | None], tuple[bool, bool]]


@runtime_checkable
class Draft(Protocol):
    """What the decoding loop needs from a draft. Times are seconds spent in the draft's forwards."""

    seconds: float
    forwards: int
    positions_fed: int

    def propose(self, slots: Slots, gamma: int, pick: Pick, decide: Decide | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to `gamma` tokens x [B, k] (k ≤ γ) appended to `slots`, and their distributions q [B, k, V]. `decide`,
        when given, is asked after each draft step whether to propose that token and whether to go on; a draft
        that cannot stop early (no confidence to stop on) may ignore it."""

    def rollback(self, length: int) -> None:
        """Forget slots at and beyond `length`."""

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows."""


@runtime_checkable
class AttachesToTarget(Protocol):
    """A `Draft` that also wants the target's runner (optional): a draft sharing the target's weights and cache."""

    def attach(self, target_runner) -> None:
        """Given the target's runner (`feed`/`rollback`/`keep_rows`, see `hfspec.kernels.kv_model.CachedModel`)
        before the first round."""


def attach_draft(draft: Draft, target_runner) -> None:
    """Give `draft` the target's runner when it wants it (`AttachesToTarget`)."""
    if isinstance(draft, AttachesToTarget):
        draft.attach(target_runner)


class NoDraft:
    """Plain decoding: proposes nothing, so each target pass gives one token."""

    seconds, forwards, positions_fed = 0.0, 0, 0

    def propose(self, slots: Slots, gamma: int, pick: Pick, decide: Decide | None = None):
        return slots.tokens.new_empty((slots.tokens.shape[0], 0)), None

    def rollback(self, length: int) -> None:
        pass

    def keep_rows(self, rows: torch.Tensor) -> None:
        pass


class ModelDraft:
    """A draft model behind a runner with a KV cache: one forward per proposed token.

    vocab: the draft's usable vocabulary width (rows beyond it, e.g. padding, are never proposed).
    """

    def __init__(self, runner, vocab: int | None = None, rows: int | None = None):
        self.runner = runner
        self.vocab = vocab
        self.rows = rows  # the draft's embedding rows, when the target may write ids beyond them

    @property
    def seconds(self) -> float:
        return self.runner.seconds

    @property
    def forwards(self) -> int:
        return self.runner.forwards

    @property
    def positions_fed(self) -> int:
        return self.runner.positions_fed

    def propose(self, slots: Slots, gamma: int, pick: Pick, decide: Decide | None = None):
        """`decide`: an early exit (`hfspec.decoding.early_exit`), or None (propose γ tokens)."""
        start = slots.size
        xs, qs = [], []
        for j in range(gamma):
            tokens = slots.tokens if self.rows is None else slots.tokens.clamp_max(self.rows - 1)
            logits = self.runner.feed(tokens, slots.positions, slots.valid, start + j, 1, slots.all_valid)
            if self.vocab is not None and self.vocab < logits.shape[-1]:
                logits = logits.clone()
                logits[..., self.vocab:] = -float("inf")
            x_j, q_j = pick(logits, slots.tokens[:, start:])
            propose, go_on = decide(j, logits, x_j, q_j) if decide is not None else (True, True)
            if not propose:
                break
            xs.append(x_j)
            if q_j is not None:
                qs.append(q_j)
            slots.append(x_j[:, None])
            if not go_on:
                break
        x = torch.stack(xs, dim=1) if xs else slots.tokens.new_empty((slots.tokens.shape[0], 0))
        return x, (torch.stack(qs, dim=1) if qs else None)

    def rollback(self, length: int) -> None:
        self.runner.rollback(length)

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.runner.keep_rows(rows)


def as_draft(model, vocab: int | None = None) -> Draft:
    """The `Draft` for a draft model: its own (`model.hfspec_draft(vocab)`, `hfspec.attrs.DRAFT_HOOK`) when it has
    one, a lean decoder's own steps called directly (no module call, no keywords), else the lean step of its float
    weights when its family allows (`hfspec.kernels.lean.lean_step_of`), else the HF forward with a KV cache. None
    gives plain decoding."""
    if model is None:
        return NoDraft()
    own = hook(model, DRAFT_HOOK)
    if own is not None:
        return own(vocab)
    if isinstance(model, LeanDecoder):
        return ModelDraft(LeanRunner(model), vocab)
    # A padded target can write ids the draft has no row for: the draft reads a stand-in (its last row), which
    # changes only what it proposes, never what is accepted.
    rows = vocab_size(model) if vocab is not None else None
    lean = lean_step_of(model)  # a sibling of a family the lean step reads runs that step, not the HF forward
    return ModelDraft(LeanRunner(lean) if lean is not None else CachedModel(model), vocab, rows)
