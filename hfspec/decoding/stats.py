"""Statistics of a speculative run, as data, and the paper's formulas (Leviathan et al. 2023, §3).

Four speed-ups, one name each (old names: `hfspec.compat`):

* `paper_speedup`: the paper's closed-form formula from α, γ and a cost ratio c; it prices a round as γ draft steps
  plus one target step and nothing else. `paper_speedup(α, γ, c)` here, `SpecStats.paper_speedup` with c = c_time.
* `predicted_speedup`: the cost model's prediction (`hfspec.decoding.costmodel`: verify width, time outside forwards and the
  prefill priced from the run's measured step costs and its tokens per pass).
* `measured_speedup`: speculative over plain tokens/s, timed (`hfspec.measure`, `RunResult`, sweep rows).
* `ideal_speedup`: the paper's formula with c = c_bytes, the weight-bound figure (`SpecStats.ideal_speedup`).
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from hfspec.compat import (  # noqa: F401 - estimated_speedup, speedup_ignoring_verify_and_overhead: deprecated
    estimated_speedup,
    old_names,
    renamed_keys,
    speedup_ignoring_verify_and_overhead,
)
from hfspec.decoding.costmodel import CostRecord, Prediction, predict
from hfspec.decoding.round import RoundTree
from hfspec.validate import AUTO_GAMMA_MAX


def expected_tokens_per_pass(alpha: float, gamma: int | Iterable[int]) -> float:
    """E[tokens per target pass] = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, Eq. 1). `gamma` may be the γ of
    each pass (a run whose γ varied): then the mean over the passes (a pass that proposed nothing yields one
    token; no passes: 0). The one implementation of the formula (the CLI, sweeps and the dashboard call it)."""
    if not isinstance(gamma, numbers.Real):
        hist = Counter(int(g) for g in gamma)
        total = sum(hist.values())
        return sum(r * expected_tokens_per_pass(alpha, g) for g, r in hist.items()) / total if total else 0.0
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def paper_speedup(alpha: float, gamma: int | Iterable[int], c: float) -> float:
    """The paper's speed-up (1 − α^(γ+1)) / ((1 − α)(1 + γc)) (Leviathan et al. 2023, Thm 3.8): its closed form
    from α, γ and the cost ratio c, pricing a round as γ draft steps plus one target step. It leaves out that the
    verify pass over γ + 1 positions costs more than a step, the time outside forwards and the prefill (the cost
    model's `predicted_speedup` prices them). `gamma` may be the γ of each pass: then Σ E[tokens | γ] / Σ (1 + γc)
    over the passes (no passes: 0)."""
    if not isinstance(gamma, numbers.Real):
        hist = Counter(int(g) for g in gamma)
        cost = sum(r * (1 + g * c) for g, r in hist.items())
        return sum(r * expected_tokens_per_pass(alpha, g) for g, r in hist.items()) / cost if cost else 0.0
    return expected_tokens_per_pass(alpha, gamma) / (1 + gamma * c)


def optimal_gamma(alpha: float, c: float, gamma_max: int = AUTO_GAMMA_MAX) -> int:
    """The γ in [1, γ_max] with the largest `paper_speedup` (found numerically, as the paper does)."""
    return max(range(1, gamma_max + 1), key=lambda g: (paper_speedup(alpha, g, c), -g))


@old_names
@dataclass
class SpecStats:
    """Counts and timings of one run. Proposed tokens after a rejection are discarded unchecked."""

    gamma: int | str = 0
    batch_size: int = 1
    target_passes: int = 0
    row_passes: int = 0
    draft_forwards: int = 0
    proposed: int = 0
    checked: int = 0
    accepted: int = 0
    new_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    checked_by_position: list[int] = field(default_factory=list)
    accepted_length_hist: list[int] = field(default_factory=list)
    gamma_per_round: list[int] = field(default_factory=list)
    new_tokens_per_row: list[int] = field(default_factory=list)
    accepted_per_row: list[int] = field(default_factory=list)
    checked_per_row: list[int] = field(default_factory=list)
    positions_fed_target: int = 0
    positions_fed_draft: int = 0
    tree_leaves: int = 0  # tree speculation: sibling leaves the target scored, and siblings it kept
    tree_kept: int = 0
    tree_rounds: int = 0  # token trees: rounds grown as a tree, and (tree "auto") rounds run as the plain chain
    chain_rounds: int = 0
    time_draft: float = 0.0
    time_target: float = 0.0
    time_total: float = 0.0
    draft_bytes: int = 0
    target_bytes: int = 0
    target_dtype: str = ""  # the target's parameter dtype ("float32", "bfloat16", ...), "" unknown
    # the least a verify pass can cost in the target's plain one-token steps on the path its linears took: 1 with
    # F.linear (a pass is no cheaper than a step); below 1 through the few-row kernel, which reads the weights
    # faster than plain decoding's product (`hfspec.decoding.priors.verify_floor`); read by the plausibility check
    verify_floor: float = 1.0
    # the saved cost profile a seeded γ "auto" priced its rounds with (its file name under $HFSPEC_PROFILE_DIR,
    # `hfspec.decoding.profile`); "" where it used the priors, or γ was not "auto" with a seed
    cost_profile: str = ""
    # what scored the target's passes: the lean decoder over its own weights, or "HF forward (why not the lean one)"
    # (`hfspec.kernels.lean_target`)
    target_path: str = ""
    stopped: bool = False
    stop_reasons: list[str] = field(default_factory=list)  # per row: eos | max_tokens | stop_criteria | user
    costs: CostRecord = field(default_factory=CostRecord)  # per-round seconds, for the cost model
    plain_costs: CostRecord | None = None  # a plain run's, timed beside this one (`attach_baseline`)

    def attach_baseline(self, plain: SpecStats) -> SpecStats:
        """Use a plain run timed beside this one for the cost model's one-token step and plain overhead."""
        self.plain_costs = plain.costs if self.plain_costs is None else self.plain_costs.merge(plain.costs)
        return self

    def record_round(
        self, gamma: int, accepted: list[int], checked: list[int], committed: list[int], rows: list[int]
    ) -> None:
        """Add one target pass: for each running row (its index in `rows`), draft tokens accepted and checked,
        and tokens committed."""
        self.target_passes += 1
        self.row_passes += len(accepted)
        self.gamma_per_round.append(gamma)
        if not self.new_tokens_per_row:
            self.new_tokens_per_row = [0] * self.batch_size
            self.accepted_per_row = [0] * self.batch_size
            self.checked_per_row = [0] * self.batch_size
        _grow(self.accepted_by_position, gamma)
        _grow(self.checked_by_position, gamma)
        _grow(self.accepted_length_hist, gamma + 1)
        for row, n, k, m in zip(rows, accepted, checked, committed, strict=True):
            self.proposed += gamma
            self.checked += k
            self.accepted += n
            self.new_tokens += m
            self.new_tokens_per_row[row] += m
            self.accepted_per_row[row] += n
            self.checked_per_row[row] += k
            self.accepted_length_hist[n] += 1
            for i in range(k):
                self.checked_by_position[i] += 1
                self.accepted_by_position[i] += int(i < n)

    @property
    def alpha(self) -> float:
        """Acceptance rate α = accepted / checked."""
        return self.accepted / self.checked if self.checked else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per target pass, per active row, bonus included."""
        return self.new_tokens / self.row_passes if self.row_passes else 0.0

    @property
    def mean_gamma(self) -> float:
        g = self.gamma_per_round
        return sum(g) / len(g) if g else 0.0

    @property
    def c_bytes(self) -> float:
        """Cost coefficient from weights: draft bytes / target bytes."""
        return self.draft_bytes / self.target_bytes if self.target_bytes else 0.0

    @property
    def c_time(self) -> float:
        """Cost coefficient measured: mean draft forward time / mean target forward time."""
        if not (self.draft_forwards and self.target_passes and self.time_target):
            return 0.0
        return (self.time_draft / self.draft_forwards) / (self.time_target / self.target_passes)

    @property
    def expected_tokens_per_pass(self) -> float:
        """The paper's (1 − α^(γ+1)) / (1 − α) averaged over the rounds' γ (one α for every position)."""
        return expected_tokens_per_pass(self.alpha, self.gamma_per_round)

    @property
    def prediction(self) -> Prediction:
        """The cost model's prediction for this run (`hfspec.decoding.costmodel.predict`)."""
        return predict(self)

    @property
    def predicted_speedup(self) -> float:
        """The cost model's prediction of speculative over plain tokens/s, fitted to this run's measured step
        costs (verify width, time outside forwards, prefill; the one-token step from an attached plain run, the
        run's own one-position rounds or timing passes after it) at its tokens per pass; 0 before a round was
        measured."""
        return self.prediction.speedup if self.target_passes else 0.0

    @property
    def paper_speedup(self) -> float:
        """`paper_speedup(α, γ of each round, c_time)`: the paper's formula with the measured c = c_time, ignoring
        the verify width, the time outside forwards and the prefill; 0 before a draft forward was timed."""
        c = self.c_time
        return paper_speedup(self.alpha, self.gamma_per_round, c) if c > 0 else 0.0

    @property
    def ideal_speedup(self) -> float:
        """`paper_speedup(α, γ of each round, c_bytes)`: the paper's formula with c = draft weight bytes / target
        weight bytes, i.e. the speed-up of a machine on which a forward costs only reading its weights, a verify
        over γ + 1 positions costs one step and nothing happens outside forwards.

        It is not an upper bound, and it can be below `measured_speedup`: c_bytes counts every byte the draft
        holds, while a step's time need not scale with its bytes. Where the draft's step costs a smaller share of
        the target's step than its bytes do (c_time < c_bytes: micro's fp32 target with the compiled rtn4 draft
        measured c_time 0.16–0.22 at γ 3–8 against c_bytes 0.26, benchmarks/results/sweep_micro.csv), or where plain
        decoding pays per-token overhead that speculative rounds share, the measured figure can exceed it."""
        return paper_speedup(self.alpha, self.gamma_per_round, self.c_bytes)

    @property
    def predicted_tokens_per_second(self) -> float:
        return self.prediction.speculative_tokens_per_second if self.target_passes else 0.0

    @property
    def predicted_plain_tokens_per_second(self) -> float:
        return self.prediction.plain_tokens_per_second if self.target_passes else 0.0

    @property
    def stop_reason(self) -> str:
        """Why decoding ended: the rows' common reason, "mixed", or "" while running."""
        reasons = set(self.stop_reasons) - {""}
        return "" if not reasons else (reasons.pop() if len(reasons) == 1 else "mixed")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total else 0.0

    @property
    def time_other(self) -> float:
        """Time outside model forwards (sampling, bookkeeping)."""
        return max(0.0, self.time_total - self.time_draft - self.time_target)

    def merge(self, other: SpecStats) -> SpecStats:
        """Pool two runs (e.g. repeats with different seeds): counts and times add up."""
        out = SpecStats(gamma=self.gamma if self.gamma == other.gamma else "mixed", batch_size=self.batch_size)
        for name in ("target_passes", "row_passes", "draft_forwards", "proposed", "checked", "accepted",
                     "new_tokens", "positions_fed_target", "positions_fed_draft", "time_draft", "time_target",
                     "time_total", "tree_leaves", "tree_kept", "tree_rounds", "chain_rounds"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        for name in ("accepted_by_position", "checked_by_position", "accepted_length_hist"):
            a, b = getattr(self, name), getattr(other, name)
            setattr(out, name, [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)),
                                                      strict=True)])
        out.gamma_per_round = self.gamma_per_round + other.gamma_per_round
        out.draft_bytes, out.target_bytes = other.draft_bytes, other.target_bytes
        out.target_dtype = other.target_dtype or self.target_dtype
        out.verify_floor = min(self.verify_floor, other.verify_floor)
        out.cost_profile = self.cost_profile if self.cost_profile == other.cost_profile else "mixed"
        out.target_path = self.target_path if self.target_path == other.target_path else "mixed"
        out.stopped = self.stopped or other.stopped
        out.stop_reasons = self.stop_reasons + other.stop_reasons
        out.costs = self.costs.merge(other.costs)
        plains = [p for p in (self.plain_costs, other.plain_costs) if p is not None]
        out.plain_costs = plains[0].merge(plains[1]) if len(plains) == 2 else (plains[0] if plains else None)
        return out

    @renamed_keys
    def to_dict(self) -> dict:
        """All counts plus the derived numbers, JSON-ready."""
        out = asdict(self)
        for name in ("alpha", "tokens_per_pass", "mean_gamma", "c_bytes", "c_time", "expected_tokens_per_pass",
                     "predicted_speedup", "paper_speedup", "ideal_speedup", "predicted_tokens_per_second",
                     "predicted_plain_tokens_per_second", "stop_reason", "tokens_per_second", "time_other"):
            out[name] = getattr(self, name)
        out["estimate_source"] = self.prediction.source if self.target_passes else ""
        return out


def _grow(values: list[int], size: int) -> None:
    values.extend([0] * (size - len(values)))


@dataclass
class RoundEvent:
    """What one target pass produced, for live displays."""

    round_index: int
    gamma: int
    accepted: list[int]
    new_tokens: list[list[int]]
    kinds: list[list[str]]
    stats: SpecStats
    rows: list[int] = field(default_factory=list)
    tree: RoundTree | None = None  # a token tree's round: the tree it grew (`hfspec.decoding.trees`)
