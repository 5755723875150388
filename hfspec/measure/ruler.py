"""The one ruler for every measured figure: `hfspec run`, `sweep`, `compare`, `bench`, the dashboard and the
benchmark scripts (benchmarks/common.py) time plain against speculative decoding here and nowhere else.

The rule (docs/measurement.md):
1. The methods run in interleaved rounds (two methods alternate which goes first, more rotate), so a drift in
   machine load falls on every side alike. `warmup` rounds run first and are not counted.
2. Per round the speed-up is the ratio of tokens/s (speculative over plain). The figure is the median of those
   ratios, with a distribution-free interval for the median from the order statistics of the ratios (about 95%;
   its real coverage is kept: with n < 6 pairs it is the range, covering 1 − 2·0.5ⁿ).
3. A round whose ratio or whose seconds per token on either side is far from the others (|modified z| >
   `OUTLIER_Z`, from the median absolute deviation of the logs) is an outlier: it is dropped and re-measured
   while the time budget allows (at most as many extra rounds as asked for).
4. The verdict: `stable` when at least `ROUGH_BELOW` pairs remain, no more than `MAX_OUTLIER_SHARE` of them were
   outliers and the interval is narrower than `STABLE_WIDTH` of the median. Otherwise a warning names the cause it
   can find: the load average against the cores (`os.getloadavg`), other processes that took CPU time while it
   timed (Linux /proc), a CPU frequency change (/sys cpufreq), else says none was found.
5. A figure its own passes cannot produce is flagged ("implausible: …"), never shown as a fact: a measured
   speed-up above `speedup_bound` (tokens per pass × plain's seconds per forward-second / (1 + γ̄·c_time): a round
   costs at least its verify pass plus its draft forwards) by more than `PLAUSIBLE_SLACK`, or a c_time above
   `C_TIME_MAX` for a draft with fewer bytes than the target.
6. The predicted speed-up (the cost model, `hfspec.decoding.costmodel`) is fitted to the same timed passes, for the same
   number of tokens per run; where it falls outside the interval, `disagreement` says which side differs and why.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hfspec.compat import old_names
from hfspec.decoding.costmodel import from_pairs
from hfspec.decoding.stats import SpecStats
from hfspec.measure.plausible import disagreement, has_prediction, implausible
from hfspec.measure.stability import (
    MachineState,
    _load_avg,
    machine_causes,
    machine_state,
    once_each,
    outliers,
    stratified_median,
    within_strata,
)

ROUGH_BELOW = 3  # pairs: a measurement from fewer is shown as rough
MAX_OUTLIER_SHARE = 0.2  # more outliers than this share of the rounds (after re-measuring): unstable
STABLE_WIDTH = 0.3  # interval width / median above which a figure is unstable

Timed = Callable[[int], SpecStats | None]  # run number (from 0) -> stats of one fixed-length run; None: stopped


@dataclass
class Sample:
    """One timed call: seconds, tokens made, and what it returned."""

    seconds: float
    tokens: int
    out: object = None

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Ratio:
    """One method's speed-up over the baseline across the kept rounds."""

    median: float
    low: float
    high: float
    coverage: float
    sd: float | None
    rates: list[float]           # the method's tokens/s per kept round
    baseline_rates: list[float]

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def baseline_tokens_per_second(self) -> float:
        return statistics.median(self.baseline_rates) if self.baseline_rates else 0.0

    @property
    def width(self) -> float:
        return (self.high - self.low) / self.median if self.median else math.inf


@dataclass
class Timings:
    """Interleaved rounds of several methods: all rounds taken, which were outliers, the verdict."""

    names: list[str]
    baseline: str
    rounds: list[dict[str, Sample]]
    outlier: list[bool]
    warmup: int = 0
    remeasured: int = 0
    threads: int = 1
    before: MachineState | None = None
    after: MachineState | None = None
    budget_s: float | None = None
    ran_out: bool = False       # the budget ended re-measuring with outliers left
    strata: list = field(default_factory=list)  # each round's stratum (its prompt), where rounds take several

    @property
    def kept(self) -> list[dict[str, Sample]]:
        return [r for r, bad in zip(self.rounds, self.outlier, strict=True) if not bad]

    @property
    def kept_strata(self) -> list | None:
        return [s for s, bad in zip(self.strata, self.outlier, strict=True) if not bad] if self.strata else None

    @property
    def pairs(self) -> int:
        return len(self.kept)

    @property
    def outliers(self) -> int:
        return sum(self.outlier)

    def ratio(self, name: str) -> Ratio:
        kept = self.kept
        rates = [r[name].rate for r in kept]
        base = [r[self.baseline].rate for r in kept]
        ratios = [a / b if b else 0.0 for a, b in zip(rates, base, strict=True)]
        if not ratios:
            return Ratio(0.0, 0.0, 0.0, 0.0, None, [], [])
        figure, low, high, coverage = stratified_median(ratios, self.kept_strata)
        return Ratio(figure, low, high, coverage,
                     statistics.stdev(ratios) if len(ratios) > 1 else None, rates, base)

    def verdict(self) -> tuple[bool, list[str]]:
        """(stable, warnings): unstable when rough, outlier-ridden or wide; warnings name what was seen and the
        machine's likely cause (also for a stable figure taken on a busy machine)."""
        problems = []
        n = len(self.rounds)
        if self.pairs < ROUGH_BELOW:
            problems.append(f"only {self.pairs} pair{'s' if self.pairs != 1 else ''} timed")
        if n and self.outliers / n > MAX_OUTLIER_SHARE:
            problems.append(f"{self.outliers} of {n} pairs were outliers"
                            + (" and the time budget ended re-measuring" if self.ran_out else ""))
        wide = [(name, self.ratio(name)) for name in self.names if name != self.baseline]
        for name, r in wide:
            if r.median and r.width > STABLE_WIDTH and self.pairs >= 2:
                label = "" if len(wide) == 1 else f" for {name}"
                problems.append(f"interval{label} {r.low:.2f}–{r.high:.2f}× is ±{r.width / 2:.0%} of the median")
        causes = machine_causes(self.before, self.after, self.threads)
        warnings = []
        if problems:
            why = "; ".join(causes) if causes else "no cause seen (load, other processes and CPU frequency were quiet)"
            warnings.append(f"unstable: {'; '.join(problems)} — {why}")
        elif causes:
            warnings.append(f"busy machine: {'; '.join(causes)} (the pairs agreed nonetheless)")
        warnings += [note for note in [once_each(self.kept_strata)] if note]  # each prompt timed once
        return not problems, warnings


def interleaved(runs: dict[str, Callable[[int], object]], baseline: str, rounds: int, warmup: int = 0,
                budget_s: float | None = None, on_round: Callable[[int], None] | None = None,
                remeasure: bool = True, machine: Callable[[], MachineState] | None = machine_state,
                strata: Callable[[int], object] | None = None) -> Timings | None:
    """Time `runs` ({name: fn(run number) -> SpecStats | Sample | anything}) in interleaved rounds: `warmup` rounds
    first (not counted), then up to `rounds` rounds, then a replacement round for each outlier while the budget
    and `rounds` extra rounds allow. A SpecStats is timed by its own clock (`time_total`, `new_tokens`), a Sample
    as given, anything else by the wall clock (one token). No new round starts once `budget_s` seconds have
    passed since the counted rounds began (one round at least). None when the first round was stopped (a fn
    returned None or stopped stats); a later stop keeps the rounds finished so far. `strata(run number)`: the
    round's stratum where rounds take several prompts in turn; outliers and the interval are then judged within
    strata and the figure is the geometric mean of the strata's medians (`stability.stratified_median`)."""
    names = list(runs)
    for i in range(warmup):
        if _round(runs, names, i) is None:
            return None
    before = machine() if machine else None
    timings = Timings(names, baseline, [], [], warmup=warmup, threads=torch.get_num_threads(), before=before,
                      budget_s=budget_s)
    began = time.perf_counter()

    def spent() -> bool:
        return budget_s is not None and time.perf_counter() - began >= budget_s

    def take(i: int) -> bool:
        if on_round is not None:
            on_round(i)
        got = _round(runs, names, i)
        if got is None:
            return False
        timings.rounds.append(got)
        if strata is not None:
            timings.strata.append(strata(i))
        return True

    i, stopped = 0, False
    while i < rounds and not (timings.rounds and spent()):
        if not take(i):
            stopped = True
            break
        i += 1
    if not timings.rounds:
        return None
    timings.outlier = _outliers(timings)
    extra = 0
    while remeasure and not stopped and timings.outliers and timings.pairs < rounds and extra < rounds:
        if spent():
            timings.ran_out = True
            break
        if not take(i):
            break
        i += 1
        extra += 1
        timings.outlier = _outliers(timings)
    timings.remeasured = extra
    timings.after = machine() if machine else None
    return timings


def _round(runs, names: list[str], i: int) -> dict[str, Sample] | None:
    order = names[i % len(names):] + names[:i % len(names)] if len(names) > 2 else \
        (names if i % 2 == 0 else names[::-1])
    got = {}
    for name in order:
        began = time.perf_counter()
        out = runs[name](i)
        wall = time.perf_counter() - began
        if out is None:
            return None
        if isinstance(out, Sample):
            sample = out
        elif isinstance(out, SpecStats):
            if out.stopped or not out.new_tokens:
                return None
            sample = Sample(out.time_total, out.new_tokens, out)
        else:
            sample = Sample(wall, 1, out)
        got[name] = sample
    return {name: got[name] for name in names}


def _outliers(t: Timings) -> list[bool]:
    flags = [False] * len(t.rounds)
    series = [[r[n].seconds / max(1, r[n].tokens) for r in t.rounds] for n in t.names]
    series += [[r[n].rate / r[t.baseline].rate if r[t.baseline].rate else 0.0 for r in t.rounds]
               for n in t.names if n != t.baseline]
    for values in series:  # judged within strata: a prompt that decodes faster is not an outlier
        flags = [a or b for a, b in zip(flags, outliers(within_strata(values, t.strata or None)), strict=True)]
    return flags


# ------------------------------------------------------------------------------------------------ speed-up
@old_names
@dataclass
class Measurement:
    """Speculative against plain decoding of `new_tokens` tokens per run over `pairs` kept interleaved pairs:
    the median per-pair ratio, its interval, the verdict and the flags."""

    new_tokens: int
    speculative_tokens_per_second: float
    plain_tokens_per_second: float
    pairs: int
    threads: int
    load_avg: float | None
    speedup_sd: float | None = None  # s.d. of the kept per-pair ratios (None under two pairs)
    speculative_runs: list[SpecStats] = field(default_factory=list, repr=False, compare=False)
    plain_runs: list[SpecStats] = field(default_factory=list, repr=False, compare=False)
    ratio: float | None = None       # median of the per-pair ratios (None: the ratio of the medians)
    low: float | None = None         # interval of the median ratio
    high: float | None = None
    coverage: float | None = None    # its coverage (≈ 0.95 from six pairs, 1 − 2·0.5ⁿ under)
    outliers: int = 0                # pairs dropped as outliers
    remeasured: int = 0              # pairs taken to replace them
    warmup: int = 0                  # pairs run first and not counted
    stable: bool | None = None       # None: no verdict (built by hand)
    warnings: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # "implausible: …"
    cores: int | None = None
    segment: str = ""                # how the timed runs relate to the run, e.g. "32-token segments of the run"

    @property
    def measured_speedup(self) -> float:
        if self.ratio is not None:
            return self.ratio
        plain = self.plain_tokens_per_second
        return self.speculative_tokens_per_second / plain if plain else 0.0

    @property
    def predicted_speedup(self) -> float:
        """The cost model fitted to the same timed pairs, for runs of their length: the speed-up they predict."""
        if not self.speculative_runs or not has_prediction(self.speculative_runs[0]):
            return 0.0
        return from_pairs(self.speculative_runs, self.plain_runs, new_tokens=self.tokens_per_row).speedup

    @property
    def tokens_per_row(self) -> float:
        rows = self.speculative_runs[0].batch_size if self.speculative_runs else 1
        return self.new_tokens / max(1, rows)

    @property
    def rough(self) -> bool:
        return self.pairs < ROUGH_BELOW

    @property
    def implausible(self) -> bool:
        return bool(self.flags)

    @property
    def reliable(self) -> bool:
        """Stable, not rough and not flagged: a figure to rely on."""
        return self.stable is not False and not self.rough and not self.flags

    @property
    def verdict(self) -> str:
        """One word: "implausible", "unstable", "rough" or "stable"."""
        if self.flags:
            return "implausible"
        if self.stable is False and not self.rough:
            return "unstable"
        return "rough" if self.rough else "stable"

    @property
    def why(self) -> str:
        """Everything that makes the figure unreliable, one line ("" when reliable)."""
        return "; ".join(self.flags + self.warnings)

    @property
    def disagreement(self) -> str:
        return disagreement(self)

    def summary(self) -> dict:
        """The measurement's numbers as plain data (for exports)."""
        return {"measured_speedup": self.measured_speedup, "measured_speedup_low": self.low,
                "measured_speedup_high": self.high, "interval_coverage": self.coverage, "pairs": self.pairs,
                "outliers": self.outliers, "remeasured": self.remeasured, "rough": self.rough,
                "stable": self.stable, "verdict": self.verdict, "warnings": "; ".join(self.warnings),
                "flags": "; ".join(self.flags), "speculative_tokens_per_second": self.speculative_tokens_per_second,
                "plain_tokens_per_second": self.plain_tokens_per_second, "threads": self.threads,
                "load_avg": self.load_avg, "cores": self.cores, "segment": self.segment}


def predicted_speedup(stats: SpecStats, measurement: Measurement | None = None) -> float:
    """A run's predicted speed-up: the cost model fitted to the timed pairs of `measurement` when it has some
    (never the watched run, which a live display slows), else to the run itself (`SpecStats.predicted_speedup`);
    0 (shown "—") for a draft without forwards (`has_prediction`)."""
    if not has_prediction(stats):
        return 0.0
    if measurement is not None and measurement.speculative_runs:
        return measurement.predicted_speedup
    return stats.predicted_speedup


def measure_speedup(speculative: Timed, plain: Timed, pairs: int = ROUGH_BELOW, budget_s: float | None = None,
                    on_pair: Callable[[int], None] | None = None, warmup: int = 0, remeasure: bool = True,
                    machine: Callable[[], MachineState] | None = machine_state,
                    segment: str = "") -> Measurement | None:
    """Time up to `pairs` (speculative, plain) pairs, alternating which runs first, after `warmup` uncounted
    pairs; outliers are re-measured while `budget_s` allows (`interleaved`). None when the first pair was
    stopped; a later stop keeps the pairs finished so far."""
    timings = interleaved({"spec": speculative, "plain": plain}, "plain", pairs, warmup=warmup, budget_s=budget_s,
                          on_round=on_pair, remeasure=remeasure, machine=machine)
    if timings is None:
        return None
    return from_timings(timings, segment)


def from_timings(timings: Timings, segment: str = "", name: str = "spec") -> Measurement:
    """The Measurement of one method against the baseline of interleaved timings."""
    kept = timings.kept
    r = timings.ratio(name)
    stable, warnings = timings.verdict()
    spec_runs = [k[name].out for k in kept if isinstance(k[name].out, SpecStats)]
    plain_runs = [k[timings.baseline].out for k in kept if isinstance(k[timings.baseline].out, SpecStats)]
    before = timings.before
    first = kept[0][name] if kept else None
    m = Measurement(  # new_tokens: the runs' length (a sample timed after its first round counts fewer tokens)
        new_tokens=0 if first is None else first.out.new_tokens if isinstance(first.out, SpecStats) else first.tokens,
        speculative_tokens_per_second=r.tokens_per_second, plain_tokens_per_second=r.baseline_tokens_per_second,
        pairs=len(kept), threads=timings.threads, load_avg=_max_load(timings), speedup_sd=r.sd,
        speculative_runs=spec_runs, plain_runs=plain_runs, ratio=r.median, low=r.low, high=r.high,
        coverage=r.coverage, outliers=timings.outliers, remeasured=timings.remeasured, warmup=timings.warmup,
        stable=stable, warnings=warnings, cores=before.cores if before else os.cpu_count(), segment=segment)
    if spec_runs and len(spec_runs) == len(plain_runs):
        m.flags = implausible(m.measured_speedup, _pool(spec_runs), _pool(plain_runs))
    return m


def _pool(runs: list[SpecStats]) -> SpecStats:
    return functools.reduce(SpecStats.merge, runs)


def _max_load(t: Timings) -> float | None:
    loads = [x.load_avg for x in (t.before, t.after) if x is not None and x.load_avg is not None]
    return max(loads) if loads else (_load_avg() if t.before is None else None)
