"""Is a timing trustworthy: what the machine was doing while it was taken (load, other processes, CPU frequency),
a distribution-free interval for a median, and outliers on a log scale. Pure functions; `hfspec.measure.ruler`
applies them to interleaved rounds."""

from __future__ import annotations

import collections
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

OUTLIER_Z = 3.5  # |modified z-score| (0.6745·(x − median)/MAD of the logs) above which a round is an outlier
# the MAD's floor on the log scale: the run-to-run jitter of a quiet 2-core VM (~3 %), so that out of a few
# agreeing rounds only one ≳ 16 % off the median (3.5 · 0.03 / 0.6745) is an outlier, not every 5 % wobble
MAD_FLOOR = 0.03
LEVEL = 0.95  # the interval's aimed coverage
BUSY_SHARE = 0.5  # another process using this share of a core while timing is named
FREQ_CHANGE = 0.1  # a mean CPU frequency change beyond this share is named


# ------------------------------------------------------------------------------------------------ the machine
@dataclass
class MachineState:
    """What the machine was doing: cores, 1-minute load average, mean CPU frequency (MHz, where /sys has it) and
    the CPU seconds of every other process (Linux /proc), at `at` (time.monotonic)."""

    cores: int
    load_avg: float | None = None
    freq_mhz: float | None = None
    cpu_seconds: dict[int, tuple[str, float]] | None = None
    at: float = 0.0


def machine_state() -> MachineState:
    """The machine now (cheap: a few hundred small files on Linux, nothing elsewhere)."""
    return MachineState(os.cpu_count() or 1, _load_avg(), _freq_mhz(), _cpu_seconds(), time.monotonic())


def machine_causes(before: MachineState | None, after: MachineState | None, threads: int) -> list[str]:
    """Why timings may be noisy, named from two readings around a measurement: load beyond our own threads,
    other busy processes, a CPU frequency change. Empty when none of these is seen."""
    if before is None:
        return []
    after = after or before
    causes = []
    loads = [x.load_avg for x in (before, after) if x.load_avg is not None]
    if loads:
        load, cores = max(loads), before.cores
        others = load - min(threads, cores)
        if load > cores or others >= 0.5 * cores:
            causes.append(f"load {load:.1f} on {cores} core{'s' if cores != 1 else ''} (about {max(0.0, others):.1f} "
                          f"beyond this process's {threads} thread{'s' if threads != 1 else ''})")
    span = after.at - before.at
    if before.cpu_seconds and after.cpu_seconds and span > 0:
        busy = []
        for pid, (name, seconds) in after.cpu_seconds.items():
            share = (seconds - before.cpu_seconds.get(pid, (name, seconds))[1]) / span
            if share >= BUSY_SHARE:
                busy.append((share, f"{name} (pid {pid}, {share:.0%} of a core)"))
        if busy:
            causes.append("other busy processes: " + ", ".join(text for _, text in sorted(busy, reverse=True)[:3]))
    if before.freq_mhz and after.freq_mhz and abs(after.freq_mhz / before.freq_mhz - 1) > FREQ_CHANGE:
        causes.append(f"CPU frequency changed from {before.freq_mhz:.0f} to {after.freq_mhz:.0f} MHz")
    return causes


# ------------------------------------------------------------------------------------------------ statistics
def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """A distribution-free interval for the median from order statistics: (low, high, coverage). With fewer than
    six values no pair of order statistics reaches 95%, so it is the range (coverage 1 − 2·0.5ⁿ)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0.0
    if n == 1:
        return xs[0], xs[0], 0.0
    cdf = [0.0]
    for k in range(n + 1):
        cdf.append(cdf[-1] + math.comb(n, k) / 2 ** n)
    # P(X_(k) <= median <= X_(n-k+1)) = 1 − 2·P(Bin(n, ½) <= k − 1)
    best = 1
    for k in range(1, n // 2 + 1):
        if 1 - 2 * cdf[k] >= level:
            best = k
    return xs[best - 1], xs[n - best], 1 - 2 * cdf[best]


def outliers(values: Sequence[float], z: float = OUTLIER_Z) -> list[bool]:
    """MAD-based outliers of positive values, on a log scale (a 10× slow run and a 10× fast one are alike):
    |0.6745·(log x − median)/MAD| > z. The MAD is floored at `MAD_FLOOR` (a quiet machine's jitter) so that a few
    nearly equal values do not make every small difference an outlier. Under three values nothing is an outlier (there is no majority to judge by)."""
    if len(values) < 3:
        return [False] * len(values)
    logs = [math.log(v) if v > 0 else -math.inf for v in values]
    finite = [x for x in logs if math.isfinite(x)]
    if not finite:
        return [False] * len(values)
    mid = statistics.median(finite)
    mad = max(statistics.median(abs(x - mid) for x in finite), MAD_FLOOR)
    return [not math.isfinite(x) or abs(0.6745 * (x - mid) / mad) > z for x in logs]


def within_strata(values: Sequence[float], strata: Sequence | None) -> list[float]:
    """Each positive value over its stratum's median (the rounds of one prompt, when the rounds take several in
    turn): what is left of it once the strata's own levels are taken out, on a log scale widened by √(n/(n − 1))
    for a stratum of n values (a value pulls its own stratum's median towards it). A stratum of one value says
    nothing of the noise: 1.0. No strata, or one: each value over the median of all."""
    if not values:
        return []
    keys = list(strata) if strata is not None else [0] * len(values)
    groups: dict = {}
    for key, v in zip(keys, values, strict=True):
        groups.setdefault(key, []).append(math.log(v) if v > 0 else -math.inf)
    centre = {key: statistics.median(logs) for key, logs in groups.items()}
    widen = {key: math.sqrt(len(logs) / (len(logs) - 1)) if len(logs) > 1 else 0.0 for key, logs in groups.items()}
    if len(groups) == 1:
        widen = dict.fromkeys(groups, 1.0)  # the plain median of all: nothing to correct
    out = []
    for key, v in zip(keys, values, strict=True):
        if v <= 0 or not math.isfinite(centre[key]):
            out.append(v if v > 0 else 0.0)
            continue
        out.append(math.exp((math.log(v) - centre[key]) * widen[key]))
    return out


def stratified_median(values: Sequence[float], strata: Sequence | None,
                      level: float = LEVEL) -> tuple[float, float, float, float]:
    """(figure, low, high, coverage) of positive per-round values taken over fixed strata (the prompts): the
    figure is the geometric mean of the strata's medians (every prompt counts alike, however many rounds it got),
    the interval the noise around it (`median_interval` of `within_strata`), not the strata's own spread, which is
    not uncertainty when the strata are fixed. With no strata, or one, exactly `median_interval` of the values.
    Where no stratum has two values (each prompt timed once) nothing separates the noise from the strata's levels:
    the interval is then `median_interval` of the values themselves (widened to hold the figure), which counts the
    strata's spread as uncertainty, wider than the noise, never narrower; before, it was the figure alone
    (4.32–4.32×, 8 prompts timed once, 7 December 2026)."""
    keys = list(strata) if strata is not None else []
    if len(set(keys)) <= 1:
        low, high, coverage = median_interval(values, level)
        return (statistics.median(values) if values else math.nan), low, high, coverage
    medians = list(strata_medians(values, keys).values())
    if any(m <= 0 for m in medians):
        figure = statistics.median(values)
    else:
        figure = math.exp(sum(math.log(m) for m in medians) / len(medians))
    sizes = collections.Counter(keys)
    informative = [f for f, key in zip(within_strata(values, keys), keys, strict=True) if sizes[key] > 1]
    if not informative:
        low, high, coverage = median_interval(values, level)
        return figure, min(low, figure), max(high, figure), coverage
    low, high, coverage = median_interval(informative, level)
    return figure, figure * low, figure * high, coverage


def once_each(strata) -> str:
    """The warning for rounds over several strata (prompts) each timed once ("" otherwise): `stratified_median`'s
    interval is then the strata's spread, not the noise."""
    if not strata or len(set(strata)) < 2 or max(collections.Counter(strata).values()) > 1:
        return ""
    return (f"each of the {len(set(strata))} prompts was timed once, so the interval is their spread, wider than the "
            "rounds' noise (time each prompt twice or more to measure that)")


def strata_medians(values: Sequence[float], strata: Sequence) -> dict:
    """{stratum: the median of its values}, in first-seen order."""
    groups: dict = {}
    for key, v in zip(strata, values, strict=True):
        groups.setdefault(key, []).append(v)
    return {key: statistics.median(vs) for key, vs in groups.items()}


def _load_avg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def _freq_mhz() -> float | None:
    values = []
    try:
        for entry in os.scandir("/sys/devices/system/cpu"):
            if entry.name.startswith("cpu") and entry.name[3:].isdigit():
                try:
                    with open(os.path.join(entry.path, "cpufreq", "scaling_cur_freq")) as fh:
                        values.append(int(fh.read()) / 1000)
                except (OSError, ValueError):
                    continue
    except OSError:
        return None
    return sum(values) / len(values) if values else None


def _cpu_seconds() -> dict[int, tuple[str, float]] | None:
    """utime + stime of every other process, from /proc (None where there is none)."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    me = os.getpid()
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                text = fh.read()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        rest = text[text.rfind(")") + 2:].split()
        try:
            out[pid] = (name, (int(rest[11]) + int(rest[12])) / tick)
        except (IndexError, ValueError):
            continue
    return out
