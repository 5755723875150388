"""A cost model of a decoding round, fitted to what a run measured, that predicts tokens/s.

The paper's estimate (Leviathan et al. 2023, Thm 3.8) E[tokens per pass] / (1 + γc) prices a round as γ draft
steps plus one target step. On a CPU a round also pays for

- the verify pass over γ + 1 positions, which costs more than a one-token step (t(n) = a + b·n, fitted),
- the time outside forwards (sampling, verification, bookkeeping): o(k) = o₀ + o₁·k per round,
- the prompt's prefill, once per run,

and plain decoding pays t(1) + o₀ per token. `hfspec.decoding.costrecord` measures those per round (`RoundMeter` fills
a `CostRecord` on the run's `SpecStats`); this module fits them (`CostModel`) and predicts

    speculative tokens/s = E[tokens per round] / E[seconds per round]      (both over the run's γ histogram)
    plain tokens/s       = 1 / (t(1) + o₀)

with the prefill added to both sides for the run's length. E[tokens per round] for k proposed tokens is
1 + Σᵢ₌₁..ₖ Πⱼ≤ᵢ αⱼ, with αⱼ the acceptance rate at draft position j given that j was reached (the run's
accepted/checked by position, shrunk toward the pooled α where few were checked); with one α for every position
it is the paper's (1 − α^(k+1)) / (1 − α). For the run's own histogram, the rounds that proposed k tokens say
how many were kept (shrunk toward that model where they are few): a draft that chooses its length, e.g. the
early exit, proposes long rounds where it is sure, which one rate per position would average away.

The one-token step t(1) is what a speculative run does not otherwise do after its prefill. It comes, in this
order, from a plain run timed beside the speculative one (`SpecStats.attach_baseline`: the session and the sweep
time one for the measured speed-up anyway), from the run's own one-position rounds (γ = 0 rounds) when it
had two or more, or from `ONE_TOKEN_TIMINGS` one-token target passes made after the run, outside its timed total,
pooled with its one-position rounds (`time_one_token_steps`; only a target's first few runs at a thread count and
context size pay for them, later ones reuse their mean). Without any of them the verify pass is taken to cost a step (`Prediction.source`
says so).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from hfspec.decoding.costrecord import (
    ONE_TOKEN_TIMINGS,
    CostRecord,
    RoundMeter,
    RoundSeconds,
    time_one_token_steps,
)

__all__ = [  # the measurement names (`hfspec.decoding.costrecord`) stay importable from here
    "MIN_ROUNDS", "ONE_TOKEN_TIMINGS", "SHRINK", "Acceptance", "CostModel", "CostRecord", "Prediction", "RoundMeter",
    "RoundSeconds", "best_gamma", "expected_tokens", "from_pairs", "predict", "predict_from", "speedup_at",
    "time_one_token_steps",
]

SHRINK = 4.0  # pseudo-counts pulling a position's acceptance rate toward the pooled α


# ----------------------------------------------------------------------------------------------- model
def expected_tokens(k: int, rates) -> float:
    """E[tokens per round] with k proposed tokens and conditional acceptance rates rates(j), j = 1..k:
    1 + Σᵢ Πⱼ≤ᵢ rates(j) (the accepted prefix plus the one token the target adds)."""
    total, reach = 1.0, 1.0
    for j in range(1, k + 1):
        reach *= rates(j)
        total += reach
    return total


@dataclass
class Acceptance:
    """Acceptance rate at each draft position given it was reached; `alpha` for positions never checked."""

    alpha: float
    by_position: list[float] = field(default_factory=list)

    def __call__(self, j: int) -> float:
        return self.by_position[j - 1] if 1 <= j <= len(self.by_position) else self.alpha

    @classmethod
    def from_counts(cls, accepted: list[int], checked: list[int], shrink: float = SHRINK) -> Acceptance:
        total = sum(checked)
        alpha = sum(accepted) / total if total else 0.0
        rates = [(a + shrink * alpha) / (c + shrink) for a, c in zip(accepted, checked, strict=False)]
        return cls(alpha, rates)

    def expected(self, k: int) -> float:
        return expected_tokens(k, self)


@dataclass
class CostModel:
    """Seconds of each part of a round; see the module docstring. `source` says where t(1) came from."""

    step: float                  # t(1): one-token target pass
    verify_a: float              # t(n) = verify_a + verify_b · n
    verify_b: float
    draft_a: float               # draft seconds per round = draft_a + draft_b · k (k > 0; 0 at k = 0 unless
    draft_b: float               #   a round may spend a forward and propose nothing, e.g. early exit)
    draft_zero: float            # draft seconds of a round that proposed nothing
    other_a: float               # seconds outside forwards per round = other_a + other_b · k
    other_b: float
    plain_other: float           # seconds outside forwards per plain round
    prefill_spec: float = 0.0    # seconds round 0 of the speculative run took beyond a normal round
    prefill_plain: float = 0.0   # seconds the plain run's first round takes beyond a plain step
    source: str = ""

    def verify(self, n: int) -> float:
        return self.verify_a + self.verify_b * n

    def draft(self, k: int) -> float:
        return self.draft_zero if k == 0 else self.draft_a + self.draft_b * k

    def other(self, k: int) -> float:
        return self.other_a + self.other_b * k

    def round_seconds(self, k: int) -> float:
        """A round in which the draft proposed k tokens (k = 0: a plain round of the speculative loop)."""
        return self.draft(k) + self.verify(k + 1) + self.other(k)

    @property
    def plain_token_seconds(self) -> float:
        return self.step + self.plain_other

    @classmethod
    def fit(cls, record: CostRecord, plain: CostRecord | None = None) -> CostModel:
        """Fit the model to a run's record; `plain`: the record of a plain run timed beside it."""
        widths = _populated([(n, s / r, r) for n, (r, s) in enumerate(zip(record.width_rounds, record.width_seconds,
                                                                           strict=False)) if r and n >= 1])
        step, step_weight, source = None, 0.0, ""
        plain_widths = plain.width_rounds if plain else []
        if plain is not None and len(plain_widths) > 1 and plain_widths[1]:
            step, step_weight = plain.width_seconds[1] / plain_widths[1], float(plain_widths[1])
            source = "plain run timed beside it"
            widths = [w for w in widths if w[0] != 1]
        elif record.steps:  # timed passes, pooled with the run's own one-position rounds if it had any
            has_ones = len(record.width_rounds) > 1 and record.width_rounds[1]
            rounds, seconds = (record.width_rounds[1], record.width_seconds[1]) if has_ones else (0, 0.0)
            step, step_weight = (seconds + record.step_seconds) / (rounds + record.steps), float(rounds + record.steps)
            widths = [w for w in widths if w[0] != 1]
            source = ("one-token passes timed after earlier runs of this target" if record.steps_reused
                      else "one-token passes timed after the run")
            source = f"the run's one-position rounds and {source}" if rounds else source
        elif any(n == 1 for n, _, _ in widths):
            source = "the run's one-position rounds"
        points = widths + ([(1, step, step_weight)] if step is not None else [])
        a, b = _line(points)
        if len({n for n, _, _ in points}) < 2:
            source = "verify assumed to cost one step (no one-token timing)" if points else "nothing measured"
        if step is None:
            step = a + b
        # draft: a line over the rounds that proposed something; what a round proposing nothing spent
        ks = _populated([(k, d / r, r) for k, (r, d) in enumerate(zip(record.gamma_rounds, record.gamma_draft_seconds,
                                                                      strict=False)) if r and k >= 1])
        da, db = _line(ks) if len({k for k, _, _ in ks}) > 1 else (0.0, _through_origin(ks))
        if da < 0:
            da, db = 0.0, _through_origin(ks)
        zero = record.gamma_draft_seconds[0] / record.gamma_rounds[0] if record.gamma_rounds[:1] and \
            record.gamma_rounds[0] else 0.0
        # outside forwards, o(k) = o₀ + o₁·k, in three measured parts: the draft's picks (per proposed token),
        # scoring and verifying the k + 1 target positions (a line over k + 1), the rest (a line over k). A line
        # needs two well-seen values: the plain run timed beside (k = 0) or rounds of different γ; else the
        # scoring is taken per position and the rest per round.
        rounds = record.gamma_rounds
        proposed = sum(k * r for k, r in enumerate(rounds))
        picks, scores = _padded(record.gamma_pick_seconds, rounds), _padded(record.gamma_score_seconds, rounds)
        per_pick = sum(picks) / proposed if proposed else 0.0
        score_points = _populated([(k + 1, s / r, r) for k, (r, s) in enumerate(zip(rounds, scores, strict=False)) if r])
        rest_points = _populated([(k, (o - p - s) / r, r) for k, (r, o, p, s) in enumerate(zip(
            rounds, record.gamma_other_seconds, picks, scores, strict=False)) if r])
        plain_other = None
        if plain is not None and plain.gamma_rounds[:1] and plain.gamma_rounds[0]:
            r0 = plain.gamma_rounds[0]
            plain_other = plain.gamma_other_seconds[0] / r0
            plain_score = _padded(plain.gamma_score_seconds, plain.gamma_rounds)[0] / r0
            score_points = [p for p in score_points if p[0] != 1] + [(1, plain_score, r0)]
            rest_points = [p for p in rest_points if p[0] != 0] + [(0, plain_other - plain_score, r0)]
        if len({n for n, _, _ in score_points}) > 1:
            sa, sb = _line(score_points)
        else:
            sa, sb = 0.0, _through_origin(score_points)
        ra, rb = _line(rest_points)
        oa, ob = max(0.0, sa + sb + ra), max(0.0, sb + rb) + per_pick
        if plain_other is None:
            plain_other = oa
        # prefill: what round 0 took beyond a normal round of its γ
        model = cls(step, a, b, da, db, zero, oa, ob, plain_other, source=source)
        if record.prefill_rounds:
            r = record.prefill_rounds
            k0 = record.prefill_gamma
            target_extra = record.prefill_target_seconds / r - model.verify(k0 + 1)
            model.prefill_spec = max(0.0, record.prefill_seconds / r - model.round_seconds(k0))
            model.prefill_plain = max(0.0, target_extra)
        if plain is not None and plain.prefill_rounds:
            r = plain.prefill_rounds
            model.prefill_plain = max(0.0, (plain.prefill_target_seconds + plain.prefill_other_seconds) / r
                                      - model.plain_token_seconds)
        return model


MIN_ROUNDS = 3  # a γ or width seen in fewer rounds (e.g. the last, clipped round) does not set a slope


def _populated(points: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """The points seen in at least MIN_ROUNDS rounds (all of them when none is)."""
    kept = [p for p in points if p[2] >= MIN_ROUNDS]
    return kept or points


def _line(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least-squares y = a + b·x over (x, y, weight); b ≥ 0; a flat line when x does not vary."""
    w = sum(p[2] for p in points)
    if not w:
        return 0.0, 0.0
    mx = sum(x * p for x, _, p in points) / w
    my = sum(y * p for _, y, p in points) / w
    sxx = sum(p * (x - mx) ** 2 for x, _, p in points)
    if sxx <= 0:
        return my, 0.0
    b = sum(p * (x - mx) * (y - my) for x, y, p in points) / sxx
    if b < 0:
        return my, 0.0
    return my - b * mx, b


def _padded(values: list[float], like: list) -> list[float]:
    return list(values) + [0.0] * (len(like) - len(values))


def _through_origin(points: list[tuple[float, float, float]]) -> float:
    num = sum(p * x * y for x, y, p in points)
    den = sum(p * x * x for x, _, p in points)
    return num / den if den else 0.0


# ------------------------------------------------------------------------------------------ prediction
@dataclass
class Prediction:
    """What the model predicts for a run of `new_tokens` tokens per row with the given γ histogram."""

    tokens_per_round: float
    seconds_per_round: float
    speculative_tokens_per_second: float
    plain_tokens_per_second: float
    speedup: float
    source: str
    model: CostModel

    def to_dict(self) -> dict:
        return asdict(self)


def predict_from(model: CostModel, acceptance: Acceptance, gamma_hist: dict[int, float], new_tokens: float,
                 rows: float = 1.0) -> Prediction:
    """Tokens/s of speculative (rounds proposing k tokens with weights `gamma_hist`) and plain decoding of
    `new_tokens` tokens per row, prefill included; `rows`: mean active rows (batch)."""
    weight = sum(gamma_hist.values())
    if not weight or model.plain_token_seconds <= 0:
        return Prediction(0.0, 0.0, 0.0, 0.0, 0.0, model.source or "nothing measured", model)
    tokens = sum(h * acceptance.expected(k) for k, h in gamma_hist.items()) / weight
    seconds = sum(h * model.round_seconds(k) for k, h in gamma_hist.items()) / weight
    n = max(1.0, float(new_tokens))
    spec_time = model.prefill_spec + n / tokens * seconds
    plain_time = model.prefill_plain + n * model.plain_token_seconds
    spec_tps, plain_tps = rows * n / spec_time, rows * n / plain_time
    return Prediction(tokens, seconds, spec_tps, plain_tps, spec_tps / plain_tps, model.source, model)


class _ByLength(Acceptance):
    """Expected tokens for k proposed tokens from the run's rounds that proposed k (a draft that chooses its own
    length, e.g. early exit, proposes long rounds where it is sure: one rate per position would mix them),
    shrunk toward the positional model where few rounds proposed k."""

    def __init__(self, base: Acceptance, record: CostRecord, shrink: float = SHRINK):
        super().__init__(base.alpha, base.by_position)
        self.base, self.record, self.shrink = base, record, shrink

    def expected(self, k: int) -> float:
        model = self.base.expected(k)
        rows = self.record.gamma_rows[k] if k < len(self.record.gamma_rows) else 0
        if not rows or k >= len(self.record.gamma_accepted):
            return model
        seen = 1 + self.record.gamma_accepted[k] / rows
        return (rows * seen + self.shrink * model) / (rows + self.shrink)


def predict(stats, plain=None, gamma=None, new_tokens: float | None = None) -> Prediction:
    """The prediction for a run's `SpecStats` (`plain`: a plain run's SpecStats timed beside it, else the one
    attached with `attach_baseline`). `gamma`: predict at this fixed γ (tokens from the positional acceptance
    rates) instead of the run's own γ histogram (tokens per round from the rounds of each length). `new_tokens`:
    tokens per row of the run predicted (default: the stats' own; pooled runs pass one run's length)."""
    plain_record = plain.costs if plain is not None else getattr(stats, "plain_costs", None)
    model = CostModel.fit(stats.costs, plain_record)
    acceptance = Acceptance.from_counts(stats.accepted_by_position, stats.checked_by_position)
    if gamma is not None:
        hist = {int(gamma): 1.0}
    else:
        acceptance = _ByLength(acceptance, stats.costs)
        hist = dict(Counter(stats.gamma_per_round))
    rows = stats.row_passes / stats.target_passes if stats.target_passes else 1.0
    per_row = new_tokens if new_tokens else stats.new_tokens / max(1, stats.batch_size)
    return predict_from(model, acceptance, hist, per_row or 128, rows)


def best_gamma(model: CostModel, acceptance: Acceptance, gamma_max: int) -> tuple[int, float]:
    """The γ in [0, γ_max] with the most predicted tokens/s (0: plain rounds), and that rate."""
    best = (0, 1.0 / model.plain_token_seconds if model.plain_token_seconds > 0 else 0.0)
    for g in range(1, gamma_max + 1):
        rate = acceptance.expected(g) / model.round_seconds(g) if model.round_seconds(g) > 0 else 0.0
        if rate > best[1] * (1 + 1e-9):
            best = (g, rate)
    return best


def speedup_at(model: CostModel, alpha: float, gamma: float, new_tokens: float) -> float:
    """The predicted speed-up at a fixed γ (any real γ ≥ 0, for curves) with one α for every position."""
    tokens = float(gamma + 1) if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    seconds = model.draft(gamma) + model.verify(gamma + 1) + model.other(gamma)
    n = max(1.0, float(new_tokens))
    if tokens <= 0 or seconds <= 0 or model.plain_token_seconds <= 0:
        return 0.0
    return (model.prefill_plain + n * model.plain_token_seconds) / (model.prefill_spec + n / tokens * seconds)


def from_pairs(speculative_runs: list, plain_runs: list, new_tokens: float | None = None) -> Prediction:
    """The prediction from timed (speculative, plain) pairs (`hfspec.measure`): both sides pooled, for runs of
    `new_tokens` tokens per row (default: the pooled count)."""
    spec, plain = speculative_runs[0], plain_runs[0]
    for s in speculative_runs[1:]:
        spec = spec.merge(s)
    for p in plain_runs[1:]:
        plain = plain.merge(p)
    return predict(spec, plain, new_tokens=new_tokens)
