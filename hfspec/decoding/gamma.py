"""How many tokens the draft proposes each round: a fixed γ, or γ = "auto", chosen from α and the costs.

The choice for a round is made before the target sees that round, so it cannot bias the output. At T > 0 it
still picks *which* text a seed gives (a round of γ tokens draws its own random numbers), so what γ = "auto" may
read is ruled by whether the text must be reproducible:

- **Frozen** (`timed=False`; `hfspec.generate` uses it whenever a seed is given): decisions read only this
  run's acceptance counts (a function of the tokens, so of the seed) and a cost profile fixed before decoding:
  `c_prior` (the draft's bytes over the target's, a property of the weights) or a `profile` cost model the
  caller fitted beforehand, e.g. from an earlier run's record. Never a timing of this run: the same seed gives
  the same text run after run, on a quiet or a busy machine.
- **Live** (`timed=True`; runs without a seed, whose text is not reproducible anyway): the costs are measured
  as the run goes, by robust statistics over the last `WINDOW` rounds: c is the median draft/target time ratio
  of those rounds, and the cost model (`hfspec.decoding.costmodel`) is fitted to them less their outliers (a part of a
  round costing more than `OUTLIER` × the window's median for that part). A few slow passes (another process,
  a page fault, a collector pause) then move γ little, and γ 0 (plain decoding) needs `MIN_CLEAN` clean
  measurements saying that no γ ≥ 1 pays.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Protocol, runtime_checkable

from hfspec.decoding.costmodel import SHRINK, Acceptance, CostModel, CostRecord, best_gamma
from hfspec.decoding.stats import optimal_gamma, paper_speedup
from hfspec.drafts.base import Decide
from hfspec.errors import bad_value
from hfspec.validate import AUTO_GAMMA_MAX

DEFAULT_C = 0.2  # c when nothing better is known (e.g. a draft with no weights, like prompt lookup)
WINDOW = 24  # rounds whose timings the live policy reads
OUTLIER = 3.0  # a round's part costing over this × the window's median for that part is left out of the model
MIN_CLEAN = 4  # clean live measurements before the live policy may decode plainly (γ 0)
RUN_EVIDENCE = 16  # drafted tokens checked in this run before a low α alone may stop drafting (γ 0)
THIN_ALPHA = 0.7  # the α γ 0 is judged at until then: a draft that cannot pay even at this α stops at once
DEPTH_EVIDENCE = 4.0  # decayed rows that checked a draft position before its own rate prices deeper positions
# A draft's measured fidelity (`hfspec.drafts.fidelity`: Σ min(p, q) on the target's own text, the expected
# acceptance at T = 1), when known, is the α estimate's prior, worth this many checked tokens; else α 0.5 worth 2.
# With the weak prior one rejected first token took the estimate to 0.33 and γ to 1, and at γ 1 it recovered one
# token a round: a seeded T = 1 run of gptq4-compiled on SmolLM2 off the grid (α 0.84) drafted γ 1 for its first
# 12 rounds (3 December 2026).
ALPHA_PRIOR_TOKENS = 8.0


@runtime_checkable
class GammaPolicy(Protocol):
    """How many tokens the draft proposes each round (`DecodeJob.policy`). `next()` gives the round's γ before the
    draft runs; `update` hears the round's γ, accepted and checked counts and per-forward seconds (draft step,
    target pass) after verification; `label` is what `SpecStats.gamma` shows (4, "auto", "auto+exit").

    Optional, with defaults for a class that subclasses this protocol: `observe` (per row, accepted and checked
    counts: an early exit's calibration) and `decide` (a `hfspec.drafts.base.Decide` the draft asks after each
    step, or None to propose γ tokens). A policy that cannot bias the output decides only from what the rounds
    before this one showed (module doc)."""

    label: int | str
    decide: Decide | None = None

    def next(self) -> int:
        """This round's γ (the loop caps it by the length budget)."""

    def update(self, gamma: int, accepted: int, checked: int, draft_seconds: float, target_seconds: float) -> None:
        """Learn from the round just verified."""

    def observe(self, accepted: list[int], checked: list[int]) -> None:
        """Per row of the round just committed: draft tokens accepted and checked."""


class FixedGamma(GammaPolicy):
    """The same γ every round."""

    def __init__(self, gamma: int):
        self.gamma = gamma
        self.label: int | str = gamma

    def next(self) -> int:
        return self.gamma

    def update(self, gamma: int, accepted: int, checked: int, draft_seconds: float, target_seconds: float) -> None:
        """Fixed: nothing to learn."""


class AdaptiveGamma(GammaPolicy):
    """Picks the γ with the most predicted tokens/s from a decayed estimate of α and the costs (module doc: which
    costs, frozen or live).

    With a cost model (live: fitted to the window of the run's `costs` once `MIN_MODEL_ROUNDS` rounds were
    measured; frozen: `profile`) the rate is the model's E[tokens | γ] / (draft(γ) + t(γ + 1) + o(γ)), so a
    verify pass that grows with its width pulls γ down. Without one, the paper's argmax_γ
    (1 − α^(γ+1)) / ((1 − α)(γc + 1)).

    α: accepted / checked over recent rounds (exponential decay), starting from `alpha_prior` (the draft's
    measured fidelity, worth `ALPHA_PRIOR_TOKENS` checked tokens) or, unknown, a weak prior of α = 0.5.
    c: frozen, `c_prior`; live, the median draft/target forward-time ratio over the last `WINDOW` clean rounds
    (round 1 includes the prompt, so round 2 gives the first), the prior only until the first one: a lean
    draft's time ratio can be far from its bytes ratio either way.
    When no γ ≥ 1 is expected to beat plain decoding (e.g. a draft that is not really cheaper), it decodes
    plainly (γ = 0) and probes with γ = 1 every `probe_every` rounds to keep α (and, live, c) fresh. A dip in
    the recent α alone never stops drafting: before `RUN_EVIDENCE` checked tokens in this run, γ 0 is judged at
    α ≥ `THIN_ALPHA` (so only a draft too dear to pay at any fair α stops at once), and after them the run's whole
    α must say that no γ pays too. Greedy acceptance comes in bursts; on
    SmolLM2 off the grid (gptq4-compiled, fp32, seeded) one rejected first round had sent a run whose α was 0.84
    to plain decoding for 8 of its 37 rounds, and a dip after 12 good rounds a token-tree run for 24 of 50.
    """

    MIN_MODEL_ROUNDS = 3

    def __init__(self, gamma_max: int = AUTO_GAMMA_MAX, c_prior: float = DEFAULT_C, decay: float = 0.95,
                 start: int = 4, probe_every: int = 8, costs: CostRecord | None = None, timed: bool = True,
                 profile: CostModel | None = None, window: int = WINDOW, alpha_prior: float | None = None):
        self.gamma_max = gamma_max
        self.timed = timed
        self.costs = costs if timed else None  # frozen: the run's record is never read
        self.profile = profile if profile is not None and profile.plain_token_seconds > 0 else None
        self.decay = decay
        self.probe_every = probe_every
        self.label = "auto"
        if alpha_prior is not None and not 0.0 < alpha_prior <= 1.0:  # (also NaN)
            raise bad_value("alpha_prior", alpha_prior, "a number in (0, 1] (a draft's measured fidelity) or None")
        self._accepted, self._checked = ((alpha_prior * ALPHA_PRIOR_TOKENS, ALPHA_PRIOR_TOKENS)
                                         if alpha_prior is not None else (1.0, 2.0))
        self._run_accepted, self._run_checked = 0, 0  # the whole run's counts, not decayed
        # per draft position j (index j - 1): decayed counts of rows that checked it and that accepted it
        self._depth_checked: list[float] = []
        self._depth_accepted: list[float] = []
        self._prior = c_prior if c_prior > 0 else DEFAULT_C
        self._ratios: deque[float] = deque(maxlen=window)
        self._window = _Window(window) if self.costs is not None else None
        self._gamma = min(start, gamma_max)
        self._rounds = 0
        self._plain_rounds = 0

    @property
    def alpha(self) -> float:
        return self._accepted / self._checked

    @property
    def c(self) -> float:
        return median(self._ratios) if self._ratios else self._prior

    def next(self) -> int:
        return self._gamma

    def update(self, gamma: int, accepted: int, checked: int, draft_seconds: float, target_seconds: float) -> None:
        """Learn from one round (its γ, accepted/checked counts, per-forward times) and choose the next γ. Frozen,
        the times are ignored."""
        self._rounds += 1
        if self.timed:
            if gamma > 0 and self._rounds > 1 and draft_seconds > 0 and target_seconds > 0:
                self._ratios.append(draft_seconds / target_seconds)
            if self._window is not None:
                self._window.take(self.costs)
        if gamma == 0:
            self._plain_rounds += 1
            self._gamma = 1 if self._plain_rounds >= self.probe_every else 0
            return
        self._plain_rounds = 0
        self._run_accepted, self._run_checked = self._run_accepted + accepted, self._run_checked + checked
        self._accepted = self.decay * self._accepted + accepted
        self._checked = self.decay * self._checked + checked
        self._gamma = self._choose(min(self.alpha, 0.999))

    def observe(self, accepted: list[int], checked: list[int]) -> None:
        """Per row of the round just committed: which draft positions were checked and accepted, for the
        acceptance by position (`acceptance`). Rounds that drafted nothing add nothing."""
        if not any(checked):
            return
        depth = max(max(checked), len(self._depth_checked))
        grow = depth - len(self._depth_checked)
        self._depth_checked = [self.decay * x for x in self._depth_checked] + [0.0] * grow
        self._depth_accepted = [self.decay * x for x in self._depth_accepted] + [0.0] * grow
        for a, c in zip(accepted, checked, strict=True):
            for j in range(c):
                self._depth_checked[j] += 1.0
            for j in range(a):
                self._depth_accepted[j] += 1.0

    def acceptance(self, alpha: float) -> Acceptance:
        """Acceptance at each draft position given it was reached, from this run's rounds: a position's decayed
        counts pulled toward α by `SHRINK` pseudo-tokens; positions past the deepest one checked `DEPTH_EVIDENCE`
        times take that one's rate. Acceptance comes in runs (a draft that got the first tokens of a round right
        tends to get the next ones right too: on SmolLM2 off the grid, gptq4-compiled, bf16 greedy, γ 7 made 5.77
        tokens a pass where one α of 0.90 for every position predicts 5.33), so one α for every position priced
        long rounds too low and γ auto drafted 4 tokens a pass where a fixed γ 7 was 12 % faster (5 December)."""
        rates, deep = [], 0  # deep: the deepest position checked DEPTH_EVIDENCE times (1-based; 0: none)
        for j, (a, c) in enumerate(zip(self._depth_accepted, self._depth_checked, strict=True), start=1):
            rates.append(min((a + SHRINK * alpha) / (c + SHRINK), 0.999))
            if c >= DEPTH_EVIDENCE:
                deep = j
        return Acceptance(rates[deep - 1] if deep else alpha, rates[:deep])

    def _choose(self, alpha: float) -> int:
        best = self._best(alpha, by_position=True)
        if best == 0 and self._run_checked < RUN_EVIDENCE:  # a few rejections are no evidence yet
            best = self._best(max(alpha, THIN_ALPHA))
        elif best == 0:  # a recent dip: does the whole run say drafts pay?
            best = self._best(min(self._run_accepted / self._run_checked, 0.999))
        return best

    def _best(self, alpha: float, by_position: bool = False) -> int:
        """The γ with the most predicted tokens/s at acceptance α (by position from this run's rounds where
        `by_position`: α is then the run's own recent estimate, not a fallback's)."""
        model, clean = self._model()
        if model is not None:
            acceptance = self.acceptance(alpha) if by_position else Acceptance(alpha)
            best = best_gamma(model, acceptance, self.gamma_max)[0]
        else:
            best = optimal_gamma(alpha, self.c, self.gamma_max)
            if paper_speedup(alpha, best, self.c) <= 1.0:
                best = 0
            clean = len(self._ratios)
        if best == 0 and self.timed and clean < MIN_CLEAN:  # too little evidence to stop drafting
            best = optimal_gamma(alpha, self.c, self.gamma_max)
        return best

    def _model(self) -> tuple[CostModel | None, int]:
        """The cost model to decide with and the clean rounds behind it (None: use the formula)."""
        if not self.timed:
            return self.profile, 0
        if self._window is None:
            return None, 0
        record = self._window.record()
        if record.rounds < self.MIN_MODEL_ROUNDS:
            return None, 0
        model = CostModel.fit(record)
        return (model, record.rounds) if model.plain_token_seconds > 0 else (None, 0)


@dataclass
class _Part:
    """Rounds of one kind (k draft tokens, or target width n) taken from a CostRecord since the last look: how
    many and their mean seconds per round."""

    index: int
    rounds: int
    seconds: tuple[float, ...]


class _Window:
    """The last rounds of a run's `CostRecord`, taken apart again by diffing it at each look, so the live policy
    fits its cost model to recent rounds without their outliers."""

    def __init__(self, size: int):
        self.by_k: deque[_Part] = deque(maxlen=size)  # seconds: draft, other, pick, score
        self.by_width: deque[_Part] = deque(maxlen=size)  # seconds: target
        self._seen: dict[str, list] = {}

    def take(self, record: CostRecord) -> None:
        now = {name: list(getattr(record, name)) for name in _LISTS}
        for k, rounds in _grown(now["gamma_rounds"], self._seen.get("gamma_rounds", [])):
            parts = [_grown_at(now[name], self._seen.get(name, []), k) / rounds for name in _K_SECONDS]
            self.by_k.append(_Part(k, rounds, tuple(parts)))
        for n, rounds in _grown(now["width_rounds"], self._seen.get("width_rounds", [])):
            seconds = _grown_at(now["width_seconds"], self._seen.get("width_seconds", []), n) / rounds
            self.by_width.append(_Part(n, rounds, (seconds,)))
        self._seen = now

    def record(self) -> CostRecord:
        """A CostRecord of the window's rounds, less those with a part over `OUTLIER` × the window's median for
        that part: a draft step, the time outside forwards, the target pass (the last two scaled by how much wider
        the round was than the window's median one, so a legitimately wide round is not taken for a slow one)."""
        out = CostRecord()
        steps = [p.seconds[0] / p.index for p in self.by_k if p.index]
        others, mid_k = [p.seconds[1] for p in self.by_k], _median([p.index for p in self.by_k])
        for p in self.by_k:
            slow_draft = p.index and _outlier(p.seconds[0] / p.index, steps)
            if not slow_draft and not _outlier(p.seconds[1], others, (p.index + 1) / (mid_k + 1)):
                _put(out.gamma_rounds, p.index, p.rounds)
                for name, value in zip(_K_SECONDS, p.seconds, strict=True):
                    _put(getattr(out, name), p.index, value * p.rounds)
        targets, mid_n = [p.seconds[0] for p in self.by_width], _median([p.index for p in self.by_width])
        for p in self.by_width:
            if not _outlier(p.seconds[0], targets, p.index / mid_n if mid_n else 1.0):
                _put(out.width_rounds, p.index, p.rounds)
                _put(out.width_seconds, p.index, p.seconds[0] * p.rounds)
        return out


_K_SECONDS = ("gamma_draft_seconds", "gamma_other_seconds", "gamma_pick_seconds", "gamma_score_seconds")
_LISTS = ("gamma_rounds", "width_rounds", "width_seconds", *_K_SECONDS)


def _grown(now: list[int], before: list[int]) -> list[tuple[int, int]]:
    return [(i, n - (before[i] if i < len(before) else 0)) for i, n in enumerate(now)
            if n > (before[i] if i < len(before) else 0)]


def _grown_at(now: list[float], before: list[float], i: int) -> float:
    return (now[i] if i < len(now) else 0.0) - (before[i] if i < len(before) else 0.0)


def _outlier(value: float, values: list[float], scale: float = 1.0) -> bool:
    """Over `OUTLIER` × the median of `values` (× `scale` where that is over 1)."""
    reference = _median(values) * max(1.0, scale)
    return reference > 0 and value > OUTLIER * reference


def _median(values: list[float]) -> float:
    return median(values) if values else 0.0


def _put(values: list, index: int, amount) -> None:
    if len(values) <= index:
        values.extend([0] * (index + 1 - len(values)))
    values[index] += amount
