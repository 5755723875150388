"""What runs, sweeps and comparisons return: plain data, exportable as dicts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hfspec.compat import RenamedKeys, old_names, renamed_keys
from hfspec.decoding.costmodel import CostModel, speedup_at
from hfspec.decoding.stats import SpecStats, expected_tokens_per_pass, paper_speedup
from hfspec.measure import verify_cost
from hfspec.measure.plausible import ideal_note
from hfspec.measure.ruler import Measurement, predicted_speedup
from hfspec.measure.sweep import SweepRow
from hfspec.settings import RunSettings

STOP_REASONS = {"eos": "EOS", "max_tokens": "max tokens", "stop_criteria": "stop string", "user": "user (Stop)",
                "mixed": "mixed"}


@dataclass
class Baseline:
    """Plain decoding of exactly the run's token count (same prompt, seed and sampling; EOS suppressed until
    then), measured right after the run: the measured speed-up's denominator. `speculative_time`: the same
    speculative decoding of the same tokens timed beside it without live callbacks (a live display slows the
    run it watches, and the plain run has none), the numerator; None when only the plain run was measured."""

    new_tokens: int
    time_total: float
    speculative_time: float | None = None
    pairs: int = 1  # (speculative, plain) pairs timed, alternating; the times are their medians
    stats: SpecStats | None = field(default=None, repr=False, compare=False)  # the plain run (one pair)

    @classmethod
    def of(cls, measured: Measurement | None) -> Baseline | None:
        """The baseline part of a speed-up measurement (median times of its pairs)."""
        if measured is None:
            return None
        n = measured.new_tokens
        return cls(n, n / measured.plain_tokens_per_second if measured.plain_tokens_per_second else 0.0,
                   n / measured.speculative_tokens_per_second if measured.speculative_tokens_per_second else None,
                   measured.pairs)

    @property
    def speculative_tokens_per_second(self) -> float | None:
        return self.new_tokens / self.speculative_time if self.speculative_time else None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total else 0.0


@old_names
@dataclass
class RunResult:
    settings: RunSettings
    stats: SpecStats
    prompt_text: str
    pieces: list[tuple[str, str]]          # (text, kind) per generated token, row 0
    baseline: Baseline | None = None
    series: list[dict] = field(default_factory=list)  # the live numbers, one dict per target pass
    measurement: Measurement | None = None  # the measured speed-up (`hfspec.measure`), when measured

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)

    @property
    def measured_speedup(self) -> float | None:
        """The measurement's figure (`hfspec.measure`, the one ruler); None when the run was not measured."""
        return (self.measurement.measured_speedup or None) if self.measurement is not None else None

    @property
    def predicted_speedup(self) -> float:
        """The cost model fitted to the timed measurement when there is one (never the live run, which a display
        slows), else to the run itself (`hfspec.measure.predicted_speedup`)."""
        return predicted_speedup(self.stats, self.measurement)

    @property
    def pairs(self) -> int:
        """(speculative, plain) pairs behind the measured speed-up (0: not measured)."""
        return self.measurement.pairs if self.measurement else 0

    @property
    def rough(self) -> bool:
        """The measured speed-up comes from fewer than `hfspec.measure.ROUGH_BELOW` pairs."""
        return self.measurement is not None and self.measurement.rough

    @property
    def threads(self) -> int | None:
        return self.measurement.threads if self.measurement else None

    @property
    def load_avg(self) -> float | None:
        return self.measurement.load_avg if self.measurement else None

    @property
    def stop_reason(self) -> str:
        """Why the run ended, for people: "EOS", "max tokens", "stop string", "user (Stop)" ("" unknown)."""
        return STOP_REASONS.get(self.stats.stop_reason, self.stats.stop_reason)

    @renamed_keys
    def summary(self) -> dict:
        """The numbers the dashboard shows (and exports)."""
        s, b = self.stats, self.baseline
        return {
            "draft": self.settings.draft,
            "gamma": s.mean_gamma,
            "alpha": s.alpha,
            "checked": s.checked,
            "tokens_per_pass": s.tokens_per_pass,
            "expected_tokens_per_pass": s.expected_tokens_per_pass,
            "c": s.c_bytes,
            "c_time": s.c_time,
            "predicted_speedup": self.predicted_speedup,
            "paper_speedup": s.paper_speedup,
            "ideal_speedup": s.ideal_speedup,
            "measured_speedup": self.measured_speedup,
            "advice": verify_cost.advice(s, b),  # a line recommending bf16 when the verify pass is the bottleneck
            "target_passes": s.target_passes,
            "new_tokens": s.new_tokens,
            "time_total": s.time_total,
            "tokens_per_second": s.tokens_per_second,
            "baseline_new_tokens": b.new_tokens if b else None,
            "baseline_time_total": b.time_total if b else None,
            "baseline_tokens_per_second": b.tokens_per_second if b else None,
            "speculative_tokens_per_second_measured": b.speculative_tokens_per_second if b else None,
            "measured_pairs": self.pairs,
            "measured_rough": self.rough,
            "measured_threads": self.threads,
            "measured_load_avg": self.load_avg,
            **{f"measured_{k}" if not k.startswith("measured_") else k: v
               for k, v in (self.measurement.summary() if self.measurement else {}).items()
               if k in ("measured_speedup_low", "measured_speedup_high", "interval_coverage", "outliers",
                        "remeasured", "stable", "verdict", "warnings", "flags", "cores", "segment")},
            "disagreement": self.measurement.disagreement if self.measurement else "",
            "ideal_note": ideal_note(s, self.measured_speedup),
            "stop_reason": s.stop_reason,
            "stopped": s.stopped,
        }

    def to_dict(self) -> dict:
        return {
            "settings": self.settings.to_dict(),
            "summary": self.summary(),
            "stats": self.stats.to_dict(),
            "prompt": self.prompt_text,
            "text": self.text,
            "token_kinds": [k for _, k in self.pieces],
            "series": self.series,
        }


SweepPoint = SweepRow  # the dashboard's name for one sweep row (hfspec.measure.sweep's)


@dataclass
class SweepResult:
    settings: RunSettings | None
    gammas: list[int]
    points: list[SweepRow] = field(default_factory=list)
    repeats: int = 1
    stopped: bool = False

    def drafts(self) -> list[str]:
        return list(dict.fromkeys(p.draft for p in self.points))

    def pooled(self, draft: str) -> dict:
        """α of one draft pooled over its γ points (Σ accepted / Σ checked), and its mean c_time and c_bytes."""
        pts = [p for p in self.points if p.draft == draft]
        if not pts:
            return {"alpha": 0.0, "c_time": 0.0, "c_bytes": 0.0}
        checked = sum(p.checked for p in pts)
        return {"alpha": sum(p.accepted for p in pts) / checked if checked else 0.0,
                "c_time": sum(p.c_time for p in pts) / len(pts), "c_bytes": pts[0].c_bytes}

    def curve(self, draft: str, gammas: Iterable[float] | None = None) -> dict[str, list[float]]:
        """Over γ from the pooled α: tokens per pass (the paper's formula), `predicted_speedup` (the cost models
        fitted at the draft's points, averaged), `paper_speedup` (c_time) and `ideal_speedup` (c_bytes)."""
        pooled = self.pooled(draft)
        alpha = pooled["alpha"]
        gs = list(gammas) if gammas is not None else list(range(1, max(self.gammas) + 1))
        pts = [p for p in self.points if p.draft == draft and p.cost_model]

        def predicted(g: float) -> float:
            values = [speedup_at(CostModel(**p.cost_model), alpha, g, p.new_tokens / max(1, p.repeats))
                      for p in pts]
            return sum(values) / len(values) if values else 0.0

        return RenamedKeys({
            "gamma": gs,
            "tokens_per_pass": [expected_tokens_per_pass(alpha, g) for g in gs],
            "predicted_speedup": [predicted(g) for g in gs],
            "paper_speedup": [paper_speedup(alpha, g, pooled["c_time"]) for g in gs],
            "ideal_speedup": [paper_speedup(alpha, g, pooled["c_bytes"]) for g in gs],
        })

    def rows(self) -> list[dict]:
        return [p.to_dict() for p in self.points]


@old_names
@dataclass
class CompareRow(SweepRow):
    """A sweep row at the settings' γ, with the entry as written and the target it ran on."""

    label: str = ""
    target: str = ""


