"""γ sweeps and draft comparisons: measured numbers beside the paper's formulas, as plain rows.

Each point pools `repeats` seeded runs of exactly `max_new_tokens` tokens (EOS is suppressed with
`min_new_tokens`, identically for target and draft, so every point measures the same length). The measured
wall-clock speed-up divides hfspec's tokens/s by plain decoding's tokens/s (the same loop with one token per
target pass, same prompt, seeds and length), both timed in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import hfspec
from hfspec.stats import SpecStats, estimated_speedup, expected_tokens_per_pass

FIELDS = [
    "draft", "gamma", "repeats", "alpha", "checked", "accepted", "target_passes", "new_tokens", "tokens_per_pass",
    "expected_tokens_per_pass", "c_bytes", "c_time", "estimated_speedup", "estimated_speedup_c_time",
    "tokens_per_second", "baseline_tokens_per_second", "measured_speedup", "greedy_identical",
]


@dataclass
class SweepRow:
    """One (draft, γ) point."""

    draft: str
    gamma: int | str
    repeats: int
    alpha: float
    checked: int
    accepted: int
    target_passes: int
    new_tokens: int
    tokens_per_pass: float
    expected_tokens_per_pass: float
    c_bytes: float
    c_time: float
    estimated_speedup: float
    estimated_speedup_c_time: float
    tokens_per_second: float
    baseline_tokens_per_second: float
    measured_speedup: float
    greedy_identical: int | None

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
            raise hfspec.HfspecError(f"gammas: got {text!r}; allowed: ranges and lists like 1-8 or 1,2,4,auto") from None
    for g in values:
        if g != "auto" and not 1 <= g <= 64:
            raise hfspec.HfspecError(f"gammas: {g} is out of range; allowed: 1..64 or auto")
    return values


class Baselines:
    """Plain-decoding runs per seed, measured once and reused across drafts and γ."""

    def __init__(self, target, input_ids, sampling: dict):
        self.target, self.input_ids, self.sampling = target, input_ids, sampling
        self._runs: dict[int, SpecStats] = {}
        self._greedy: torch.Tensor | None = None

    def stats(self, seed: int) -> SpecStats:
        if seed not in self._runs:
            self._runs[seed] = hfspec.plain_generate(self.target, self.input_ids, seed=seed, **self.sampling).stats
        return self._runs[seed]

    def greedy(self) -> torch.Tensor:
        """The target's own greedy continuation (transformers' `generate`)."""
        if self._greedy is None:
            n = self.sampling["max_new_tokens"]
            self._greedy = self.target.generate(self.input_ids, attention_mask=torch.ones_like(self.input_ids),
                                                do_sample=False, max_new_tokens=n,
                                                min_new_tokens=self.sampling.get("min_new_tokens"))
        return self._greedy


def measure_point(target, draft, label: str, gamma, input_ids, sampling: dict, seed: int, repeats: int,
                  baselines: Baselines, check_greedy: bool = True) -> SweepRow:
    """Pool `repeats` runs at one γ; compare with the baselines; optionally check greedy identity."""
    pooled, base = None, None
    for r in range(repeats):
        stats = hfspec.generate(target, input_ids, draft=draft, gamma=gamma, seed=seed + r, **sampling).stats
        pooled = stats if pooled is None else pooled.merge(stats)
        plain = baselines.stats(seed + r)
        base = plain if base is None else base.merge(plain)
    identical = None
    if check_greedy:
        greedy_kwargs = dict(sampling, temperature=0, top_k=None, top_p=None)
        out = hfspec.generate(target, input_ids, draft=draft, gamma=gamma, **greedy_kwargs)
        identical = int(torch.equal(out.sequences, baselines.greedy()))
    g = round(pooled.mean_gamma) if gamma == "auto" else gamma
    alpha = pooled.alpha
    return SweepRow(
        draft=label, gamma=gamma, repeats=repeats, alpha=alpha, checked=pooled.checked, accepted=pooled.accepted,
        target_passes=pooled.target_passes, new_tokens=pooled.new_tokens, tokens_per_pass=pooled.tokens_per_pass,
        expected_tokens_per_pass=expected_tokens_per_pass(alpha, g), c_bytes=pooled.c_bytes, c_time=pooled.c_time,
        estimated_speedup=estimated_speedup(alpha, g, pooled.c_bytes),
        estimated_speedup_c_time=estimated_speedup(alpha, g, pooled.c_time),
        tokens_per_second=pooled.tokens_per_second, baseline_tokens_per_second=base.tokens_per_second,
        measured_speedup=pooled.tokens_per_second / base.tokens_per_second if base.tokens_per_second else 0.0,
        greedy_identical=identical,
    )


def sweep(target, drafts: dict, gammas: list, input_ids, sampling: dict, seed: int = 1, repeats: int = 1,
          check_greedy: bool = True, on_row: Callable[[SweepRow], None] | None = None) -> list[SweepRow]:
    """Every draft (label -> model) at every γ. `sampling`: temperature, top_k, top_p, max_new_tokens."""
    sampling = dict(sampling, min_new_tokens=sampling["max_new_tokens"])
    baselines = Baselines(target, input_ids, sampling)
    rows = []
    for label, draft in drafts.items():
        for gamma in gammas:
            row = measure_point(target, draft, label, gamma, input_ids, sampling, seed, repeats, baselines,
                                check_greedy)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows
