"""The χ² side of `hfspec audit`: the test's cells, the statistic and its p-value, the control's power and draws.

`Cells` groups the joint law of the first two generated tokens into cells expected at least `MIN_EXPECTED`
times (the rest of a first token's row, every rare first token together, what stays below that pooled), tests
drawn pairs against it (`SamplingTest`) and predicts how often a draft-only sampler fails that test: the χ²
statistic of a law q against p over n draws is non-central χ² with λ = n Σ (q − p)² / p, taken in a normal
approximation. `draft_only_samples` draws that control. Which context and laws to test is `hfspec.audit.command`'s.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

MIN_EXPECTED = 5.0  # the usual χ² rule: every cell expected at least 5 times


@dataclass
class SamplingTest:
    """One χ² test: `control` tests must fail (p < threshold), the others pass (p ≥ threshold)."""

    name: str
    settings: dict
    context: list[int]
    samples: int
    cells: int
    statistic: float
    p_value: float
    threshold: float
    control: bool = False
    predicted_power: float | None = None  # the control's chance to fail at this sample size

    @property
    def passed(self) -> bool:
        return self.p_value < self.threshold if self.control else self.p_value >= self.threshold

    def line(self) -> str:
        want = f"must fail: p < {self.threshold:g}" if self.control else f"pass: p >= {self.threshold:g}"
        power = f", predicted power {self.predicted_power:.2f}" if self.predicted_power is not None else ""
        return (f"{'PASS' if self.passed else 'FAIL'}  {self.name}: chi2 {self.statistic:.1f} on {self.cells - 1} df, "
                f"p = {self.p_value:.3g} ({want}; {self.samples} samples{power})")




class Cells:
    """The χ² cells of the joint law of (t1, t2) and their probabilities under the plain law."""

    def __init__(self, p1: torch.Tensor, p2: dict[int, torch.Tensor], samples: int):
        self.samples = samples
        self.firsts = p2
        probs: dict = {}
        for t1, cond in p2.items():
            joint = p1[t1].double() * cond.double()
            big = (samples * joint >= MIN_EXPECTED).nonzero().flatten().tolist()
            for t2 in big:
                probs[(t1, t2)] = float(joint[t2])
            probs[(t1, None)] = max(0.0, float(p1[t1]) - sum(probs[(t1, t2)] for t2 in big))
        probs[None] = max(0.0, 1.0 - float(sum(float(p1[t]) for t in p2)))
        # pool every cell expected < 5 (and the pool into the smallest cell when it stays below 5)
        self.pooled = {key for key, p in probs.items() if samples * p < MIN_EXPECTED}
        self.probs = {key: p for key, p in probs.items() if key not in self.pooled}
        pool = sum(probs[key] for key in self.pooled)
        if pool > 0:
            if samples * pool >= MIN_EXPECTED or not self.probs:
                self.probs["pooled"] = pool
            else:
                smallest = min(self.probs, key=self.probs.get)
                self.probs[smallest] += pool
                self.pooled.add(smallest)
                self.probs["pooled"] = self.probs.pop(smallest)

    def key(self, t1: int, t2: int):
        if t1 not in self.firsts:
            key = None
        elif (t1, t2) in self.probs or (t1, t2) in self.pooled:
            key = (t1, t2)
        else:
            key = (t1, None)
        return "pooled" if key in self.pooled else key

    def test(self, drawn: list[tuple[int, int]], name: str, setting: dict, context: list[int], threshold: float,
             control: bool = False) -> SamplingTest:
        counts = Counter(self.key(t1, t2) for t1, t2 in drawn)
        n = len(drawn)
        keys = list(self.probs)
        impossible = sum(c for k, c in counts.items() if k not in self.probs)  # outcomes of probability 0
        statistic = sum((counts.get(k, 0) - n * self.probs[k]) ** 2 / (n * self.probs[k]) for k in keys)
        statistic = math.inf if impossible else statistic
        return SamplingTest(name, dict(setting), list(context), n, len(keys), statistic,
                            chi2_sf(statistic, len(keys) - 1), threshold, control)

    def power(self, q1: torch.Tensor, q2: dict[int, torch.Tensor], threshold: float) -> float:
        """P(a draft-only sampler fails the test) at this sample size: non-centrality λ = n Σ (q − p)² / p over
        the cells, the χ² statistic ~ non-central χ²(df, λ), in a normal approximation."""
        q2 = {t1: law for t1, law in q2.items() if t1 in self.firsts}
        q = dict.fromkeys(self.probs, 0.0)
        others = float(q1.sum()) - sum(float(q1[t1]) for t1 in self.firsts)
        masses = [(self.key(-1, -1), others)]
        for t1, cond in q2.items():
            joint = (float(q1[t1]) * cond.double()).tolist()
            masses += [(self.key(t1, t2), mass) for t2, mass in enumerate(joint) if mass]
        for key, mass in masses:
            if key in q:  # mass on an outcome the target cannot produce only makes the control fail sooner
                q[key] += mass
        df = len(self.probs) - 1
        lam = self.samples * sum((q[k] - p) ** 2 / p for k, p in self.probs.items())
        critical = chi2_isf(threshold, df)
        mean, sd = df + lam, math.sqrt(2 * (df + 2 * lam))
        return 0.5 * math.erfc((critical - mean) / (sd * math.sqrt(2)))




def draft_only_samples(q1: torch.Tensor, q2: dict[int, torch.Tensor], samples: int, seed: int) -> list[tuple[int, int]]:
    """The control: `samples` draws of (t1, t2) from the draft alone (t2 only where the test reads it)."""
    generator = torch.Generator().manual_seed(seed)
    firsts = torch.multinomial(q1.double(), samples, replacement=True, generator=generator).tolist()
    drawn = []
    for t1, count in Counter(firsts).items():
        if t1 in q2:
            seconds = torch.multinomial(q2[t1].double(), count, replacement=True, generator=generator).tolist()
        else:
            seconds = [-1] * count
        drawn += [(t1, t2) for t2 in seconds]
    return drawn


def chi2_sf(statistic: float, df: int) -> float:
    """P(χ²(df) ≥ statistic) (regularised upper incomplete gamma)."""
    if math.isinf(statistic):
        return 0.0
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def chi2_isf(p: float, df: int) -> float:
    """The statistic whose upper tail is p (bisection on chi2_sf)."""
    low, high = 0.0, max(1.0, df + 20.0 * math.sqrt(2 * max(df, 1)) + 100.0)
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_sf(mid, df) > p else (low, mid)
    return (low + high) / 2
