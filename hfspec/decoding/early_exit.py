"""Draft-side early exit: the draft stops proposing in a round once another token is not worth its cost.

transformers' assisted generation stops the assistant when the probability of its last token falls below
`assistant_confidence_threshold` (a fixed 0.4 by default, re-fitted from an ROC curve of past matches with a
fixed false-positive/false-negative weighting, `AssistedCandidateGenerator.update_candidate_strategy`); llama.cpp
stops drafting when the top token's probability is below `--draft-p-min` (a fixed constant). Here the threshold
comes from the run itself:

- a calibration g(m) = P(accepted | reached, draft confidence m), fitted online from the rounds' accept/reject
  history (binned by m, each bin shrunk toward the pooled α),
- the cost model (`hfspec.decoding.costmodel`) fitted to the run's rounds: a proposed position costs the verify slope and
  the per-position time outside forwards; another draft step costs the draft step as well; both are converted to
  tokens at the run's predicted rate R (tokens/s).

With ρ the probability that every token proposed so far is accepted, position j is proposed when
ρ · g(m_j) ≥ R · (verify slope + per-position overhead), and the draft goes on to j + 1 when
ρ · g(m_j) · α ≥ R · (draft step + verify slope + per-position overhead). (SpecDec++, Huang et al. 2024, stops on
the same kind of quantity, the predicted probability that some proposed token is rejected, with a trained head
and a fixed threshold.)

Exactness: what is proposed is decided from the draft's own state before each token is drawn. m_j is the largest
probability of the draft's distribution q_j (fixed before x_j is drawn), never x_j's own probability, so a kept
x_j is still distributed as q_j and the verification (which uses q_j) stays exact at any temperature; at
temperature 0 any proposal keeps the target's greedy text. Until `MIN_ROUNDS` rounds were measured the draft
proposes the full γ (chain).

Reproducibility: where it stops changes which random numbers a round draws, so a seeded run (`EarlyExit.freeze`)
prices tokens from a cost profile fixed before decoding (the bytes ratio in the paper's model) instead of the
run's timings: the seed alone fixes the text, as for γ "auto" (`hfspec.decoding.gamma`).
"""

from __future__ import annotations

import torch

from hfspec.decoding.costmodel import Acceptance, CostModel, CostRecord
from hfspec.decoding.gamma import DEFAULT_C, GammaPolicy
from hfspec.drafts.base import ModelDraft
from hfspec.errors import bad_value
from hfspec.validate import check_flag

BINS = 10
PRIOR = 2.0  # pseudo-counts of a confidence bin at the pooled α
MIN_ROUNDS = 3


class EarlyExit(GammaPolicy):
    """A γ policy wrapper: `inner` gives the round's cap γ; `decide` (called by the draft after each draft
    step) stops the round early; `observe` (called by the loop after verification) learns g(m)."""

    def __init__(self, inner: GammaPolicy, costs: CostRecord | None = None, calibration=None,
                 token_costs: tuple[float, float] | None = None):
        """calibration (m -> g) and token_costs ((propose, go on) in tokens) replace the fitted ones when given
        (tests; a policy carried over from an earlier run)."""
        self.inner = inner
        self.costs = costs if costs is not None else CostRecord()
        self.calibration = calibration
        self.token_costs = token_costs
        self.label = f"{inner.label}+exit"
        self.accepted = [0.0] * BINS
        self.checked = [0.0] * BINS
        self._confidence: list[list[float]] = []  # per proposed position, per row, this round
        self._costs = None  # (include cost, continue cost) in tokens, refreshed each round
        self._cap = 0  # this round's γ
        self.frozen_c: float | None = None  # `freeze`: the cost profile fixed before the run
        self.stopped_early = 0

    def freeze(self, c: float) -> None:
        """Decide from costs fixed before decoding, never from this run's timings (a seeded run: the text must
        depend on the seed alone, as for γ "auto", see `hfspec.decoding.gamma`). The paper's model with c (e.g. the bytes
        ratio): proposing a drafted position is free (one verify pass), another draft step costs c target
        steps, valued at the rate E[tokens | γ] / (1 + γc) tokens per target step."""
        self.frozen_c = c if c > 0 else DEFAULT_C

    # -------------------------------------------------------------- policy interface
    def next(self) -> int:
        self._confidence = []
        self._reach = None
        self._cap = self.inner.next()
        self._costs = self._token_costs()
        return self._cap

    def update(self, gamma: int, accepted: int, checked: int, draft_seconds: float, target_seconds: float) -> None:
        self.inner.update(gamma, accepted, checked, draft_seconds, target_seconds)

    def observe(self, accepted: list[int], checked: list[int]) -> None:
        """Per row of the round: draft tokens accepted and checked; position j was accepted iff j < accepted."""
        for j, per_row in enumerate(self._confidence):
            for row, m in enumerate(per_row):
                if row < len(checked) and j < checked[row]:
                    b = _bin(m)
                    self.checked[b] += 1
                    self.accepted[b] += int(j < accepted[row])

    # -------------------------------------------------------------- the draft's hook
    def decide(self, j: int, logits: torch.Tensor, x_j: torch.Tensor, q_j: torch.Tensor | None) -> tuple[bool, bool]:
        """After draft step j (from 0): (propose x_j, go on to step j + 1). Reads only the draft's distribution
        at j (q_j, or the logits at temperature 0), never the token x_j drawn from it (see the module doc)."""
        m = self.confidence(logits, x_j, q_j)
        if self._costs is None:
            self._confidence.append(m)
            return True, True
        include_cost, next_cost = self._costs
        reach = self._reach if self._reach is not None else [1.0] * len(m)
        g = [self.g(v) for v in m]
        gain = sum(r * x for r, x in zip(reach, g, strict=True)) / len(m)  # rows share the round: their mean
        if gain < include_cost:
            self.stopped_early += 1
            return False, False
        self._confidence.append(m)
        self._reach = [r * x for r, x in zip(reach, g, strict=True)]
        go_on = sum(self._reach) / len(m) * self.alpha >= next_cost
        if not go_on:
            self.stopped_early += 1
        return True, go_on

    def confidence(self, logits: torch.Tensor, x_j: torch.Tensor, q_j: torch.Tensor | None) -> list[float]:
        """Per row: the largest probability of the draft's distribution at this position."""
        probs = q_j if q_j is not None else torch.softmax(logits[:, -1].float(), dim=-1)
        return probs.max(dim=-1).values.tolist()

    # -------------------------------------------------------------- calibration and costs
    @property
    def alpha(self) -> float:
        total = sum(self.checked)
        return sum(self.accepted) / total if total else 0.5

    def g(self, m: float) -> float:
        """P(accepted | reached, confidence m), from the bin of m shrunk toward the pooled α."""
        if self.calibration is not None:
            return float(self.calibration(m))
        b = _bin(m)
        return (self.accepted[b] + PRIOR * self.alpha) / (self.checked[b] + PRIOR)

    def _token_costs(self) -> tuple[float, float] | None:
        """(cost of proposing one more position, cost of one more draft step and its position) in tokens per row
        at the run's predicted rate per row; None (propose the full γ) until enough rounds were measured."""
        if self.token_costs is not None:
            return self.token_costs
        if self.frozen_c is not None:
            if not sum(self.checked):
                return None
            gamma = max(1, self._cap)
            return 0.0, Acceptance(self.alpha).expected(gamma) / (1 + gamma * self.frozen_c) * self.frozen_c
        if self.costs.rounds < MIN_ROUNDS or not sum(self.checked):
            return None
        model = CostModel.fit(self.costs)
        hist = {k: r for k, r in enumerate(self.costs.gamma_rounds) if r}
        acceptance = Acceptance(self.alpha)
        seconds = sum(r * model.round_seconds(k) for k, r in hist.items())
        tokens = sum(r * acceptance.expected(k) for k, r in hist.items())
        if seconds <= 0 or tokens <= 0:
            return None
        rate = tokens / seconds
        position = model.verify_b + model.other_b
        return rate * position, rate * (position + model.draft_b)


def _bin(m: float) -> int:
    return min(BINS - 1, max(0, int(m * BINS)))


def check_early_exit(early_exit, draft) -> None:
    """A clear error for an `early_exit` that is not a bool, or a draft that cannot stop early."""
    check_flag("early_exit", early_exit)
    if early_exit and not isinstance(draft, ModelDraft):
        raise bad_value("early_exit", True, "False for this draft (only model drafts, e.g. rtn4, bnb-nf4 or a "
                        f"sibling, have a confidence to stop on; got {type(draft).__name__})")


def with_early_exit(policy: GammaPolicy, stats) -> EarlyExit:
    return EarlyExit(policy, costs=stats.costs)
