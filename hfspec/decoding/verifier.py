"""The round's extension point: a `Verifier` proposes and verifies one round, reading the run through `RoundState`.

    proposal, verdict = job.verifier.propose_and_verify(run)   # the loop then commits and settles

Three verifiers come with hfspec: the chain (`hfspec.decoding.chain.Chain`, the default: the draft proposes up to
γ tokens, one target pass keeps a prefix and one more), sibling leaves (`hfspec.decoding.siblings.Tree`) and token
trees (`hfspec.decoding.trees.DynamicTree`). Whatever shape a round takes, it comes back as a chain's `Proposal`
(x: the path the target saw, from slot `start`) and `Verdict` (how many of x were kept, and one more token), with
both caches already holding what a chain would leave, so the loop's commit and settle are the same for all.

`RoundState` is everything a verifier may read or drive of the run (`hfspec.decoding.loop.Run` implements it):
the token rules, the models' runners, the slots, the round's timer and the statistics; never the loop's own
bookkeeping.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from hfspec.decoding.costrecord import RoundMeter
from hfspec.decoding.coupling import GumbelNoise
from hfspec.decoding.round import Proposal, Verdict
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.stats import SpecStats
from hfspec.drafts.base import Decide, Draft
from hfspec.kernels.kv_model import Runner
from hfspec.kernels.slots import Slots


@runtime_checkable
class RoundState(Protocol):
    """The run as a verifier sees it, at the start of a round.

    scorer: logits to p and q with `generate`'s processing; generator: the run's random numbers (None: unseeded);
    noise: the Gumbel noise when coupling="gumbel" at T > 0, else None; slots: the shared slot layout (the target's
    and the draft's tokens); target: the target's runner; draft: the `Draft`; stats: the run's `SpecStats` (a
    verifier adds its own counts, e.g. `tree_leaves`); meter: the round's timer (`scoring()`/`scored()` around the
    target's verification, `timed(pick)`, `add_pick(seconds)` for per-token bookkeeping); active: the batch rows
    still running, in slot order; device and token_dtype: of the prompt."""

    scorer: Scorer
    generator: torch.Generator | None
    noise: GumbelNoise | None
    slots: Slots
    target: Runner
    draft: Draft
    stats: SpecStats
    meter: RoundMeter
    active: list[int]
    device: torch.device
    token_dtype: torch.dtype
    decide: Decide | None  # the γ policy's early exit for the draft, or None

    def gamma(self) -> int:
        """The γ policy's choice for this round, capped so no row is offered more than it may still take."""

    def room(self) -> int:
        """The most tokens any active row may still take (its length budget)."""

    def history(self, row: int) -> torch.Tensor:
        """Batch row `row`'s prompt and new tokens so far, [length]."""

    def offsets(self) -> list[int]:
        """Per active row, how many new tokens it has (the position of its next token)."""

    def new_tokens(self) -> int:
        """New tokens committed so far, over all rows."""


@runtime_checkable
class Verifier(Protocol):
    """How one round proposes and verifies (module doc). Per-run state: build one per `decode`. Optional:
    `lean_target = True` where its target passes go only through `Runner.feed` or `tree_forward`, so that the
    lean target (`hfspec.kernels.lean_target`) may score them; absent, the HF forward does."""

    def check(self, target: torch.nn.Module, run: RoundState) -> None:
        """Refuse, naming the setting, a target or draft this verifier cannot serve (before any model runs)."""

    def propose_and_verify(self, run: RoundState) -> tuple[Proposal, Verdict]:
        """One round: the draft's proposal, appended to `run.slots`, and the target's verdict on it."""
