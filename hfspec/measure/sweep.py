"""The one engine behind γ sweeps and draft comparisons (CLI `sweep` / `compare`, the dashboard's tabs).

Each point runs `repeats` seeded pairs through `hfspec.measure.measure_speedup` (the one rule the CLI's `run`
and the dashboard use too): the speculative run and, next to it, plain decoding (the same loop with one token
per target pass) on the same prompt, seed and sampling. Both make exactly `max_new_tokens` tokens (EOS is
suppressed with `min_new_tokens` in both), so every ratio compares equal lengths. The baseline of a pair is
measured right beside its run (the order alternates between pairs), never cached: machine load drifts.

A row pools its kept pairs for the draft's statistics (α = Σ accepted / Σ checked, tokens per pass = Σ tokens /
Σ passes); tokens/s are medians and the measured speed-up is the median per-pair ratio with its interval
(`measured_speedup_low`/`_high`), outliers re-measured, a verdict (`stable`, `verdict`, `warnings`) and flags for
figures its passes cannot produce (`flags`, `speedup_bound`); a draft's first γ runs one uncounted warm-up pair. `*_sd` is the sample standard
deviation over repeats (None for one repeat), for error bars. `predicted_speedup` is the cost model
(`hfspec.decoding.costmodel`) fitted to the point's pairs; `paper_speedup` is the paper's formula with the measured c_time
and `ideal_speedup` with the weight-bound c_bytes (old names: `hfspec.compat`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, TypedDict

import torch

from hfspec.api import generate, plain_generate
from hfspec.compat import old_names, renamed_keys
from hfspec.decoding.costmodel import predict
from hfspec.decoding.stats import SpecStats
from hfspec.drafts.fidelity import fidelity
from hfspec.errors import HfspecError
from hfspec.measure.plausible import has_prediction, speedup_bound
from hfspec.measure.ruler import ROUGH_BELOW, Measurement, measure_speedup
from hfspec.validate import check_count, check_gammas

if TYPE_CHECKING:
    from typing_extensions import Unpack

FIELDS = [
    "draft", "gamma", "repeats", "alpha", "alpha_sd", "checked", "accepted", "target_passes", "new_tokens",
    "tokens_per_pass", "tokens_per_pass_sd", "expected_tokens_per_pass", "c_bytes", "c_time", "predicted_speedup",
    "predicted_speedup_sd", "ideal_speedup", "tokens_per_second", "baseline_tokens_per_second",
    "baseline_new_tokens", "measured_speedup", "measured_speedup_sd", "greedy_identical", "fidelity", "threads",
    "load_avg", "paper_speedup", "predicted_tokens_per_second", "measured_speedup_low", "measured_speedup_high",
    "interval_coverage", "pairs", "outliers", "remeasured", "stable", "verdict", "flags", "warnings", "cores",
    "speedup_bound", "disagreement",
]

Stop = Callable[[], bool] | None


@old_names
@dataclass
class SweepRow:
    """One (draft, γ) point, pooled over its repeats."""

    draft: str
    gamma: int | str
    repeats: int
    alpha: float
    alpha_sd: float | None
    checked: int
    accepted: int
    target_passes: int
    new_tokens: int
    tokens_per_pass: float
    tokens_per_pass_sd: float | None
    expected_tokens_per_pass: float
    c_bytes: float
    c_time: float
    predicted_speedup: float          # the cost model fitted to the point's (speculative, plain) pairs
    predicted_speedup_sd: float | None
    ideal_speedup: float              # the paper's formula with c_bytes (SpecStats.ideal_speedup)
    tokens_per_second: float
    baseline_tokens_per_second: float
    baseline_new_tokens: int          # tokens of the plain runs (equal to new_tokens)
    measured_speedup: float
    measured_speedup_sd: float | None
    greedy_identical: int | None = None
    fidelity: float | None = None     # mean Σ min(p, q) over the prompt's positions, when available
    threads: int | None = None        # torch threads while measuring
    load_avg: float | None = None     # the 1-minute load average when measuring started
    paper_speedup: float | None = None  # the paper's formula with c_time (no verify width, no overhead)
    predicted_tokens_per_second: float | None = None  # the cost model's speculative tokens/s
    cost_model: dict | None = None    # the fitted `hfspec.decoding.costmodel.CostModel`, for curves over γ
    # the ruler's verdict (`hfspec.measure`): interval of the median per-pair ratio, outliers, stability, flags
    measured_speedup_low: float | None = None
    measured_speedup_high: float | None = None
    interval_coverage: float | None = None
    pairs: int | None = None          # kept pairs (outliers dropped)
    outliers: int = 0
    remeasured: int = 0
    stable: bool | None = None
    verdict: str = ""                 # stable | rough | unstable | implausible
    flags: str = ""                   # "implausible: …" ("; "-joined)
    warnings: str = ""                # "unstable: … — cause" / "busy machine: …"
    cores: int | None = None
    speedup_bound: float | None = None  # the most its passes allow (`hfspec.measure.speedup_bound`)
    disagreement: str = ""            # why the predicted speed-up lies outside the interval

    @property
    def rough(self) -> bool:
        return (self.pairs if self.pairs is not None else self.repeats) < ROUGH_BELOW

    @property
    def reliable(self) -> bool:
        """Not rough, not unstable, not flagged (rows written before the ruler: by their pairs only)."""
        return not self.rough and not self.flags and self.stable is not False

    @renamed_keys
    def to_dict(self) -> dict:
        return asdict(self)


def parse_gammas(text: str) -> list[int | str]:
    """"1-8", "1,2,4", "2-6,auto" -> γ values; a clear error otherwise."""
    values: list[int | str] = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if part == "auto":
                values.append("auto")
            elif "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                values.extend(range(lo, hi + 1))
            else:
                values.append(int(part))
        except ValueError:
            raise HfspecError(f"gammas: got {text!r}; allowed: ranges and lists like 1-8 or 1,2,4,auto") from None
    check_gammas(values)
    return values


def plain_run(target, input_ids, n_tokens: int, sampling: dict, seed: int | None,
              should_stop: Stop = None) -> SpecStats:
    """Plain decoding of exactly `n_tokens` tokens (EOS suppressed until then): a speed-up's denominator."""
    kwargs = dict(sampling, max_new_tokens=int(n_tokens), min_new_tokens=int(n_tokens))
    return plain_generate(target, input_ids, seed=seed, should_stop=should_stop, **kwargs).stats


def draft_fidelity(target, draft, input_ids) -> float | None:
    """`hfspec.drafts.fidelity` (mean Σ min(p, q)) where it exists and applies to this draft, else None."""
    if not isinstance(draft, torch.nn.Module):
        return None
    try:
        return float(fidelity(target, draft, input_ids))
    except HfspecError:
        return None


@dataclass(frozen=True)
class Plan:
    """What every point of a sweep shares: the prompt, the sampling keywords, the first seed, the pairs per point,
    the speculative runs' own options (`speculative_options`: tree, early exit, as `hfspec run` gives them), the
    target's own greedy output when a temperature-0 run checks token identity, and the stop check."""

    input_ids: torch.Tensor
    sampling: dict
    seed: int = 1
    repeats: int = 1
    options: dict = field(default_factory=dict)
    greedy_reference: torch.Tensor | None = None
    should_stop: Stop = None


def measure_point(target, draft, label: str, gamma, plan: Plan, warmup: int = 0) -> SweepRow | None:
    """`plan.repeats` (speculative run, plain run) pairs at one γ (`measure_speedup`: outliers re-measured, up to
    `repeats` more pairs), after `warmup` uncounted pairs; None when stopped."""
    ids, sampling, seed, stop = plan.input_ids, plan.sampling, plan.seed, plan.should_stop
    n = sampling["max_new_tokens"]
    fixed = dict(sampling, min_new_tokens=n, **plan.options)

    def speculative(r: int) -> SpecStats:
        return generate(target, ids, draft=draft, gamma=gamma, seed=seed + r, should_stop=stop, **fixed).stats

    measured = measure_speedup(speculative, lambda r: plain_run(target, ids, n, sampling, seed + r, stop),
                               pairs=plan.repeats, warmup=warmup)
    if measured is None or (stop is not None and stop()):
        return None
    identical = None
    if plan.greedy_reference is not None:
        greedy = dict(fixed, temperature=0, top_k=None, top_p=None)
        out = generate(target, ids, draft=draft, gamma=gamma, should_stop=stop, **greedy)
        identical = int(torch.equal(out.sequences, plan.greedy_reference))
    return _row(label, gamma, measured, identical)


def speculative_options(settings) -> dict:
    """A `RunSettings`' options of the speculative run beyond γ and sampling (tree, early exit), as its
    `generate_kwargs` give them to `hfspec run`: a sweep or comparison of the same settings times the same thing."""
    return {k: v for k, v in settings.generate_kwargs().items() if k in ("tree", "early_exit")}


def _row(label: str, gamma, measured: Measurement, identical) -> SweepRow:
    runs = measured.speculative_runs
    pooled, base = _pool(runs), _pool(measured.plain_runs)
    per_run = measured.tokens_per_row
    prediction = predict(pooled, base, new_tokens=per_run)
    per_pair = [predict(s, p).speedup for s, p in zip(runs, measured.plain_runs, strict=True)]
    return SweepRow(
        draft=label, gamma=gamma, repeats=len(runs), alpha=pooled.alpha, alpha_sd=_sd([s.alpha for s in runs]),
        checked=pooled.checked, accepted=pooled.accepted, target_passes=pooled.target_passes,
        new_tokens=pooled.new_tokens, tokens_per_pass=pooled.tokens_per_pass,
        tokens_per_pass_sd=_sd([s.tokens_per_pass for s in runs]),
        expected_tokens_per_pass=pooled.expected_tokens_per_pass, c_bytes=pooled.c_bytes,
        c_time=pooled.c_time, predicted_speedup=prediction.speedup if has_prediction(pooled) else 0.0,
        predicted_speedup_sd=_sd(per_pair) if has_prediction(pooled) else None,
        ideal_speedup=pooled.ideal_speedup,
        tokens_per_second=measured.speculative_tokens_per_second,
        baseline_tokens_per_second=measured.plain_tokens_per_second, baseline_new_tokens=base.new_tokens,
        measured_speedup=measured.measured_speedup, measured_speedup_sd=measured.speedup_sd,
        greedy_identical=identical, threads=measured.threads, load_avg=measured.load_avg,
        paper_speedup=pooled.paper_speedup, predicted_tokens_per_second=prediction.speculative_tokens_per_second,
        cost_model=asdict(prediction.model), measured_speedup_low=measured.low,
        measured_speedup_high=measured.high, interval_coverage=measured.coverage, pairs=measured.pairs,
        outliers=measured.outliers, remeasured=measured.remeasured, stable=measured.stable,
        verdict=measured.verdict, flags="; ".join(measured.flags), warnings="; ".join(measured.warnings),
        cores=measured.cores, speedup_bound=speedup_bound(pooled, base), disagreement=measured.disagreement,
    )


def _pool(runs: list[SpecStats]) -> SpecStats:
    pooled = runs[0]
    for s in runs[1:]:
        pooled = pooled.merge(s)
    return pooled


def _sd(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


class SweepHooks(TypedDict, total=False):
    """The callbacks of `sweep`, each optional: `on_start(index, total, label, gamma)` before each point (index
    from 1), `on_row(row)` after it, `should_stop()` polled; when it turns true the points finished so far are
    returned."""

    on_start: Callable[[int, int, str, object], None] | None
    on_row: Callable[[SweepRow], None] | None
    should_stop: Stop


def sweep(target, drafts: dict, gammas: list, input_ids, sampling: dict, seed: int = 1, repeats: int = 1,
          check_greedy: bool = True, options: dict | None = None, **hooks: Unpack[SweepHooks]) -> list[SweepRow]:
    """Every draft (label -> draft) at every γ; `sampling`: temperature, top_k, top_p, max_new_tokens; `options`:
    the speculative runs' own (`speculative_options`); `hooks`: `SweepHooks`."""
    unknown = set(hooks) - set(SweepHooks.__annotations__)
    if unknown:
        raise TypeError(f"sweep() got unexpected keyword arguments {sorted(unknown)}")
    check_count("repeats", repeats, 1)
    on_start, on_row, should_stop = hooks.get("on_start"), hooks.get("on_row"), hooks.get("should_stop")
    sampling = {k: v for k, v in sampling.items() if k not in ("seed", "min_new_tokens")}
    reference = None
    if check_greedy:
        n = sampling["max_new_tokens"]
        reference = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                    max_new_tokens=n, min_new_tokens=n)
    plan = Plan(input_ids, sampling, seed, repeats, options or {}, reference, should_stop)
    rows, total, index = [], len(drafts) * len(gammas), 0
    for label, draft in drafts.items():
        fidelity = draft_fidelity(target, draft, input_ids)
        for k, gamma in enumerate(gammas):
            index += 1
            if should_stop is not None and should_stop():
                return rows
            if on_start is not None:
                on_start(index, total, label, gamma)
            row = measure_point(target, draft, label, gamma, plan, warmup=1 if k == 0 else 0)  # a draft's first pair warms it up
            if row is None:
                return rows
            row.fidelity = fidelity
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
