"""What the dashboard shows, computed from results without Qt (tested directly): the measured figures with the
conditions they were taken under, the predicted speed-up from the timed measurement only, and one-line
descriptions of the settings that produced a result. The formulas themselves are the library's (`hfspec.decoding.stats`)."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, fields

from hfspec.compat import new_keys
from hfspec.decoding.costrecord import CostRecord
from hfspec.decoding.stats import SpecStats
from hfspec.measure import ROUGH_BELOW, has_prediction, machine_state

ROUGH_BELOW_PAIRS = ROUGH_BELOW  # the ruler's (hfspec.measure): no rule of the dashboard's own


@dataclass
class Conditions:
    """The machine while a figure was measured: torch's CPU threads and the 1-minute load average."""

    threads: int | None = None
    load_avg: float | None = None

    @classmethod
    def now(cls) -> Conditions:
        import torch

        return cls(torch.get_num_threads(), machine_state().load_avg)

    def text(self) -> str:
        threads = "? threads" if self.threads is None else f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        load = "" if self.load_avg is None else f" · load {self.load_avg:.2f}"
        return threads + load


@dataclass
class Measured:
    """A run's timed measurement: speculative decoding without the live display beside plain decoding of the
    same tokens. `stats`: the timed speculative run's statistics (the source of the prediction), when given."""

    speedup: float | None = None
    speculative_tps: float | None = None
    plain_tps: float | None = None
    plain_tokens: int | None = None
    pairs: int | None = None
    rough: bool = False
    conditions: Conditions | None = None
    stats: SpecStats | None = None
    predicted: float | None = None  # the measurement's own prediction (the cost model fitted to its timed pairs)
    low: float | None = None        # the ruler's interval of the median per-pair ratio
    high: float | None = None
    verdict: str = ""               # stable | rough | unstable | implausible ("" in files written before it)
    why: str = ""                   # its warnings and flags, one line
    disagreement: str = ""          # why the predicted speed-up lies outside the interval

    @property
    def predicted_speedup(self) -> float | None:
        """The predicted speed-up of the timed runs: the measurement's own, else its statistics'; None for a
        draft without forwards (prompt lookup: no step costs to price)."""
        if self.stats is not None and not has_prediction(self.stats):
            return None
        return self.predicted if self.predicted is not None else predicted_of(self.stats)

    @property
    def unreliable(self) -> str:
        """Why the measured figure is not to be relied on ("" when it is): the ruler's verdict."""
        if self.verdict in ("unstable", "implausible"):
            return self.verdict
        return "rough" if self.rough else ""

    @property
    def c_time(self) -> float | None:
        return number(self.stats.c_time) if self.stats is not None else None


def measured_of(result, fallback: Conditions | None = None) -> Measured | None:
    """The measurement of a RunResult (None when none was taken): `result.measurement` (hfspec.measure), else its
    baseline; conditions it does not carry come from `fallback`."""
    m = getattr(result, "measurement", None) or getattr(result, "baseline", None)
    if m is None:
        return None
    speedup = number(_first(m, "measured_speedup")) or number(getattr(result, "measured_speedup", None))
    pairs = _first(m, "pairs")
    rough = _first(m, "rough")
    threads, load = _first(m, "threads"), _first(m, "load_avg")
    conditions = Conditions(threads, load) if threads is not None else fallback
    return Measured(
        speedup=speedup,
        speculative_tps=number(_first(m, "speculative_tokens_per_second")),
        plain_tps=number(_first(m, "plain_tokens_per_second", "tokens_per_second")),
        plain_tokens=_first(m, "plain_new_tokens", "new_tokens"),
        pairs=pairs,
        rough=bool(rough) if rough is not None else (pairs is not None and pairs < ROUGH_BELOW_PAIRS),
        conditions=conditions,
        stats=_first(m, "stats", "speculative_stats") or pooled(getattr(m, "speculative_runs", None)),
        predicted=number(getattr(m, "predicted_speedup", None)),
        low=number(getattr(m, "low", None)), high=number(getattr(m, "high", None)),
        verdict=getattr(m, "verdict", "") or "", why=getattr(m, "why", "") or "",
        disagreement=getattr(m, "disagreement", "") or "",
    )


def pooled(runs) -> SpecStats | None:
    """Several timed runs' statistics as one (counts and times added up)."""
    runs = list(runs or [])
    return functools.reduce(SpecStats.merge, runs) if runs else None


def row_conditions(row, fallback: Conditions | None = None) -> Conditions | None:
    """The conditions a sweep / compare row was measured under (its own when it carries them)."""
    threads = getattr(row, "threads", None)
    return Conditions(threads, getattr(row, "load_avg", None)) if threads is not None else fallback


def row_pairs(row) -> int | None:
    """Timed pairs behind a sweep / compare row's measured speed-up (its repeats when it does not say)."""
    pairs = getattr(row, "pairs", None)
    return pairs if pairs is not None else getattr(row, "repeats", None)


def row_problem(row) -> str:
    """"rough", "unstable", "implausible" or "" for a sweep / compare row: the CLI's rule (hfspec.report)."""
    from hfspec.report import row_problem as problem

    return problem(dict(vars(row)) if not isinstance(row, dict) else row)


def row_is_rough(row) -> bool:
    """A sweep / compare row not to rely on: rough, unstable or implausible (the ruler's verdict)."""
    if getattr(row, "flags", "") or getattr(row, "stable", None) is False:
        return True
    rough = getattr(row, "rough", None)
    if rough is not None:
        return bool(rough)
    pairs = row_pairs(row)
    return pairs is not None and pairs < ROUGH_BELOW_PAIRS


def predicted_of(stats) -> float | None:
    """The predicted speed-up of a timed run's statistics; None where none exists (no round timed)."""
    if stats is None:
        return None
    return number(getattr(stats, "predicted_speedup", None))


def number(value) -> float | None:
    """A shown number, or None for a missing, zero or non-finite one (drawn as a gap, shown as "—")."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value != 0.0 else None


def gap(value) -> float:
    """A plotted value: NaN (a gap in a line drawn with connect="finite") where there is nothing to plot."""
    v = number(value)
    return math.nan if v is None else v


def exactness_line(target) -> str:
    """What "exact" means for this target (a model or its dtype) when it is not float32: one line from
    hfspec.audit.exactness; "" for float32."""
    from hfspec.audit.exactness import exactness_note

    return exactness_note(target)


def describe(settings) -> str:
    """A one-line description of the settings that produced a result."""
    if settings is None:
        return ""
    target = os.path.basename(str(settings.target).rstrip("/")) or str(settings.target)
    gamma = "γ auto" if settings.gamma == "auto" else f"γ {settings.gamma}"
    parts = [f"{target} + {settings.draft}", gamma, f"T {float(settings.temperature):g}"]
    if settings.top_k:
        parts.append(f"top-k {settings.top_k}")
    if float(settings.top_p) < 1.0:
        parts.append(f"top-p {float(settings.top_p):g}")
    tree, coupling = getattr(settings, "tree", 0), getattr(settings, "coupling", "rejection")
    parts += [f"tree {tree}"] if tree not in (0, 1) else []
    parts += [f"coupling {coupling}"] if coupling != "rejection" else []
    parts += [f"seed {settings.seed}", f"{settings.max_new_tokens} tokens"]
    if settings.dtype:
        parts.append(settings.dtype)
    parts += ["prepacked"] if getattr(settings, "prepack", False) else []
    return " · ".join(parts)


COMPARED = ("target", "draft", "gamma", "tree", "coupling", "temperature", "top_k", "top_p", "max_new_tokens", "seed",
            "prompt", "chat", "ignore_eos", "device", "dtype", "prepack")


# the form's own words for each compared setting (what the change banner names)
LABELS = {"target": "target", "draft": "draft", "gamma": "γ", "tree": "draft tree", "coupling": "coupling",
          "temperature": "temperature", "top_k": "top-k",
          "top_p": "top-p", "max_new_tokens": "max new tokens", "seed": "seed", "prompt": "prompt",
          "chat": "chat template", "ignore_eos": "ignore EOS", "device": "device", "dtype": "precision",
          "prepack": "prepack"}


def changed_fields(shown, form) -> list[str]:
    """The settings (of COMPARED) in which the form differs from the settings of the results on show, by the
    labels the form shows them under."""
    if shown is None or form is None:
        return []
    return [LABELS[name] for name in COMPARED if getattr(shown, name, None) != getattr(form, name, None)]


def stats_from_dict(data: dict | None) -> SpecStats | None:
    """SpecStats from its to_dict() (derived numbers are recomputed, not read)."""
    if not data:
        return None
    names = {f.name for f in fields(SpecStats)}
    kept = {k: v for k, v in data.items() if k in names}
    for name in ("costs", "plain_costs"):  # nested records come back as dicts: the cost model reads their fields
        if isinstance(kept.get(name), dict):
            kept[name] = CostRecord.from_dict(kept[name])
    return SpecStats(**kept)


def _first(obj, *names):
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def measured_to_dict(m: Measured | None) -> dict | None:
    if m is None:
        return None
    c = m.conditions or Conditions()
    return {"measured_speedup": m.speedup, "speculative_tokens_per_second": m.speculative_tps,
            "plain_tokens_per_second": m.plain_tps, "plain_new_tokens": m.plain_tokens, "pairs": m.pairs,
            "rough": m.rough, "threads": c.threads, "load_avg": c.load_avg,
            "predicted_speedup": m.predicted_speedup, "stats": m.stats.to_dict() if m.stats is not None else None,
            "measured_speedup_low": m.low, "measured_speedup_high": m.high, "verdict": m.verdict, "why": m.why,
            "disagreement": m.disagreement}


def measured_from_dict(d: dict | None) -> Measured | None:
    """A measurement as `measured_to_dict` wrote it (old keys read too: `hfspec.compat`)."""
    if not d:
        return None
    d = new_keys(d)
    return Measured(speedup=number(d.get("measured_speedup")), speculative_tps=number(d.get("speculative_tokens_per_second")),
                    plain_tps=number(d.get("plain_tokens_per_second")), plain_tokens=d.get("plain_new_tokens"),
                    pairs=d.get("pairs"), rough=bool(d.get("rough")),
                    conditions=Conditions(d.get("threads"), d.get("load_avg")) if d.get("threads") is not None else None,
                    stats=stats_from_dict(d.get("stats")), predicted=number(d.get("predicted_speedup")),
                    low=number(d.get("measured_speedup_low")), high=number(d.get("measured_speedup_high")),
                    verdict=d.get("verdict") or "", why=d.get("why") or "", disagreement=d.get("disagreement") or "")


@dataclass
class ShownRun:
    """A run as the Live tab shows it: from this session's RunResult or from a saved JSON export. `data` is its
    JSON-ready form (what File → Export writes and File → Open reads)."""

    settings: object
    stats: SpecStats              # the live run's statistics (α, tokens per pass, acceptance by position)
    pieces: list[tuple[str, str]]
    measured: Measured | None
    stop_reason: str              # for people: "EOS", "max tokens", ...
    data: dict
    source: str = ""              # "" for this session's run; the file it was opened from

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)

    @classmethod
    def from_result(cls, result, fallback: Conditions | None = None) -> ShownRun:
        measured = measured_of(result, fallback)
        data = result.to_dict() | {"pieces": [list(p) for p in result.pieces],
                                   "measurement": measured_to_dict(measured)}
        return cls(result.settings, result.stats, list(result.pieces), measured, result.stop_reason, data)

    @classmethod
    def from_dict(cls, data: dict, source: str = "") -> ShownRun:
        """From a saved run (the "run" section of an export); HfspecError naming what is missing."""
        from hfspec.errors import HfspecError
        from hfspec.session import RunSettings

        missing = [k for k in ("settings", "stats") if not isinstance(data.get(k), dict)]
        if missing:
            raise HfspecError(f"saved run: {', '.join(missing)} missing; allowed: a JSON file exported by the "
                              "dashboard (File → Export statistics)")
        stats = stats_from_dict(data["stats"])
        if data.get("pieces"):
            pieces = [(str(t), str(k)) for t, k in data["pieces"]]
        else:  # an export without per-token text: the text, uncoloured
            pieces = [(str(data.get("text", "")), "text")]
        from_summary = {"measured_speedup": (data.get("summary") or {}).get("measured_speedup")}
        measured = measured_from_dict(data.get("measurement") or (from_summary if from_summary["measured_speedup"]
                                                                  else None))
        reason = stats.stop_reason
        try:
            from hfspec.session import STOP_REASONS

            reason = STOP_REASONS.get(reason, reason)
        except ImportError:
            pass
        return cls(RunSettings.from_dict(data["settings"]), stats, pieces, measured, reason, data, source)
