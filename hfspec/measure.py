"""The one rule for "measured speed-up", used by the CLI's `run`, the dashboard, `sweep` and `compare`.

Speculative and plain decoding of the same fixed number of tokens are timed in alternating pairs (the order
flips every pair, so a drift in machine load falls on both sides); the speed-up is the ratio of the median
tokens/s. A single pair on a busy machine can be off by tens of percent, so fewer than `ROUGH_BELOW` pairs is
flagged `rough`, and the torch threads and the load average at the start say how busy the machine was.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hfspec.compat import old_names
from hfspec.stats import SpecStats

ROUGH_BELOW = 3  # pairs: a measurement from fewer is shown as rough

Timed = Callable[[int], SpecStats | None]  # run number (from 0) -> stats of one fixed-length run; None: stopped


@old_names
@dataclass
class Measurement:
    """Speculative against plain decoding of `new_tokens` tokens, `pairs` alternating pairs, medians."""

    new_tokens: int
    speculative_tokens_per_second: float
    plain_tokens_per_second: float
    pairs: int
    threads: int
    load_avg: float | None
    speedup_sd: float | None = None  # s.d. of the per-pair ratios (None under two pairs)
    speculative_runs: list[SpecStats] = field(default_factory=list, repr=False, compare=False)
    plain_runs: list[SpecStats] = field(default_factory=list, repr=False, compare=False)

    @property
    def measured_speedup(self) -> float:
        plain = self.plain_tokens_per_second
        return self.speculative_tokens_per_second / plain if plain else 0.0

    @property
    def predicted_speedup(self) -> float:
        """The cost model (`hfspec.costmodel`) fitted to the timed pairs: the speed-up they predict."""
        from hfspec.costmodel import from_pairs

        return from_pairs(self.speculative_runs, self.plain_runs).speedup if self.speculative_runs else 0.0

    @property
    def rough(self) -> bool:
        return self.pairs < ROUGH_BELOW

    def summary(self) -> dict:
        """The measurement's numbers as plain data (for exports)."""
        return {"measured_speedup": self.measured_speedup, "pairs": self.pairs, "rough": self.rough,
                "speculative_tokens_per_second": self.speculative_tokens_per_second,
                "plain_tokens_per_second": self.plain_tokens_per_second, "threads": self.threads,
                "load_avg": self.load_avg}


def predicted_speedup(stats: SpecStats, measurement: Measurement | None = None) -> float:
    """A run's predicted speed-up: the cost model fitted to the timed pairs of `measurement` when it has some
    (never the watched run, which a live display slows), else to the run itself (`SpecStats.predicted_speedup`)."""
    if measurement is not None and measurement.speculative_runs:
        return measurement.predicted_speedup
    return stats.predicted_speedup


def measure_speedup(speculative: Timed, plain: Timed, pairs: int = ROUGH_BELOW, budget_s: float | None = None,
                    on_pair: Callable[[int], None] | None = None) -> Measurement | None:
    """Time up to `pairs` (speculative, plain) pairs, alternating which runs first; no new pair starts once
    `budget_s` seconds have passed (one pair at least). `on_pair(i)` is called before pair i (from 0).
    None when the first pair was stopped; a later stop keeps the pairs finished so far."""
    load = _load_avg()
    threads = torch.get_num_threads()
    spec_runs: list[SpecStats] = []
    plain_runs: list[SpecStats] = []
    began = time.perf_counter()
    for i in range(pairs):
        if spec_runs and budget_s is not None and time.perf_counter() - began >= budget_s:
            break
        if on_pair is not None:
            on_pair(i)
        pair = _pair(speculative, plain, i)
        if pair is None:
            break
        spec_runs.append(pair[0])
        plain_runs.append(pair[1])
    if not spec_runs:
        return None
    ratios = [_rate(s) / _rate(p) if _rate(p) else 0.0 for s, p in zip(spec_runs, plain_runs, strict=True)]
    return Measurement(
        new_tokens=spec_runs[0].new_tokens,
        speculative_tokens_per_second=statistics.median(_rate(s) for s in spec_runs),
        plain_tokens_per_second=statistics.median(_rate(p) for p in plain_runs),
        pairs=len(spec_runs), threads=threads, load_avg=load,
        speedup_sd=statistics.stdev(ratios) if len(ratios) > 1 else None,
        speculative_runs=spec_runs, plain_runs=plain_runs,
    )


def _pair(speculative: Timed, plain: Timed, i: int) -> tuple[SpecStats, SpecStats] | None:
    got: dict[str, SpecStats] = {}
    for name, run in (("spec", speculative), ("plain", plain)) if i % 2 == 0 else (("plain", plain),
                                                                                     ("spec", speculative)):
        stats = run(i)
        if stats is None or stats.stopped or not stats.new_tokens:
            return None
        got[name] = stats
    return got["spec"], got["plain"]


def _rate(stats: SpecStats) -> float:
    return stats.new_tokens / stats.time_total if stats.time_total else 0.0


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None
