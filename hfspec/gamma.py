"""How many tokens the draft proposes each round: a fixed γ, or chosen from live α and c.

The choice for a round is made before the target sees that round, so it cannot bias the output.
"""

from __future__ import annotations

from hfspec.costmodel import Acceptance, CostModel, CostRecord, best_gamma
from hfspec.stats import estimated_speedup, optimal_gamma
from hfspec.validate import AUTO_GAMMA_MAX


class FixedGamma:
    """The same γ every round."""

    def __init__(self, gamma: int):
        self.gamma = gamma
        self.label: int | str = gamma

    def next(self) -> int:
        return self.gamma

    def update(self, gamma: int, accepted: int, checked: int, draft_seconds: float, target_seconds: float) -> None:
        """Fixed: nothing to learn."""


class AdaptiveGamma:
    """Picks the γ with the most predicted tokens/s from a decayed estimate of α and the run's costs.

    With `costs` (the run's `CostRecord`, filled by the decoding loop) the rate is the cost model's
    (`hfspec.costmodel`): E[tokens | γ] / (draft(γ) + t(γ + 1) + o(γ)), with the verify line t(n) learnt as γ
    moves (and from plain rounds), so a verify pass that grows with its width pulls γ down. Without it, or
    before `MIN_MODEL_ROUNDS` rounds were measured, the paper's argmax_γ (1 − α^(γ+1)) / ((1 − α)(γc + 1)).

    α: accepted / checked over recent rounds (exponential decay, with a weak prior of α = 0.5).
    c: mean draft forward time / mean target forward time over recent rounds. `c_prior` (e.g. the bytes ratio)
    is used only until the first clean measurement (round 2; round 1 includes the prompt), which replaces it:
    a lean draft's time ratio can be far from its bytes ratio either way.
    When no γ ≥ 1 is expected to beat plain decoding (speed-up < 1, e.g. a draft that is not really cheaper),
    it decodes plainly (γ = 0) and probes with γ = 1 every `probe_every` rounds to keep α and c fresh.
    """

    MIN_MODEL_ROUNDS = 3

    def __init__(self, gamma_max: int = AUTO_GAMMA_MAX, c_prior: float = 0.2, decay: float = 0.95, start: int = 4,
                 probe_every: int = 8, costs: CostRecord | None = None):
        self.gamma_max = gamma_max
        self.costs = costs
        self.decay = decay
        self.probe_every = probe_every
        self.label = "auto"
        self._accepted, self._checked = 1.0, 2.0
        self._c = c_prior if c_prior > 0 else 0.2
        self._gamma = min(start, gamma_max)
        self._rounds = 0
        self._plain_rounds = 0
        self._c_measured = False

    @property
    def alpha(self) -> float:
        return self._accepted / self._checked

    @property
    def c(self) -> float:
        return self._c

    def next(self) -> int:
        return self._gamma

    def update(self, gamma: int, accepted: int, checked: int, draft_seconds: float, target_seconds: float) -> None:
        """Learn from one round (its γ, accepted/checked counts, per-forward times) and choose the next γ."""
        self._rounds += 1
        if gamma == 0:
            self._plain_rounds += 1
            self._gamma = 1 if self._plain_rounds >= self.probe_every else 0
            return
        self._plain_rounds = 0
        self._accepted = self.decay * self._accepted + accepted
        self._checked = self.decay * self._checked + checked
        if self._rounds > 1 and draft_seconds > 0 and target_seconds > 0:
            measured = draft_seconds / target_seconds
            self._c = 0.8 * self._c + 0.2 * measured if self._c_measured else measured
            self._c_measured = True
        alpha = min(self.alpha, 0.999)
        if self.costs is not None and self.costs.rounds >= self.MIN_MODEL_ROUNDS:
            model = CostModel.fit(self.costs)
            if model.plain_token_seconds > 0:
                self._gamma = best_gamma(model, Acceptance(alpha), self.gamma_max)[0]
                return
        best = optimal_gamma(alpha, self._c, self.gamma_max)
        self._gamma = best if estimated_speedup(alpha, best, self._c) > 1.0 else 0
