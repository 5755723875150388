"""The model side of the desktop dashboard, without Qt: settings, cached models, runs, sweeps, comparisons.

    from hfspec.session import RunSettings, Session
    session = Session()
    settings = RunSettings.from_preset("micro-rtn4", gamma=4, max_new_tokens=32)
    result = session.run(settings, on_live=print)          # RunResult: stats, coloured tokens, speed-ups
    sweep = session.sweep(settings, gammas=range(1, 9), drafts=["rtn4", "rtn3-g64"], repeats=3)
    rows = session.compare(settings, drafts=["rtn4", "rtn3-g64", "models/nano"])

Everything returns plain data (dataclasses, lists, floats). Sweeps and comparisons are `hfspec.sweep`, the CLI's
engine (repeats, fixed length, baselines measured beside each run). A run's baseline is plain decoding of
exactly the run's token count, measured right after it, never cached. Draft specs go through the one registry
(`hfspec.drafts.registry`). `should_stop()` is polled between loading steps, during loading (through the
progress callback) and once per target pass by the engine; a stop while loading raises :class:`Cancelled`, a
stop while generating ends the run cleanly (``stats.stopped``). Live displays get a :class:`LiveSnapshot` after
every target pass; :class:`LiveBuffer` is a thread-safe queue for them (the producer pushes, a GUI timer drains
at its own rate).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.measure import Measurement, measure_speedup
from hfspec.stats import SpecStats, estimated_speedup, expected_tokens_per_pass
from hfspec.sweep import SweepRow, plain_run
from hfspec.sweep import sweep as run_sweep
from hfspec.validate import GAMMA_MAX, check_gamma

ROLLING_WINDOW = 16  # target passes in the rolling acceptance rate
MEASURE_PAIRS = 3  # (speculative, plain) pairs timed after a run for its measured speed-up, medians compared
MEASURE_BUDGET_S = 10.0  # ... but no new pair starts once measuring has taken this long (one pair at least)
STOP_REASONS = {"eos": "EOS", "max_tokens": "max tokens", "stop_criteria": "stop string", "user": "user (Stop)",
                "mixed": "mixed"}

Progress = Callable[[str], None]
StopCheck = Callable[[], bool]
Step = Callable[[int, int], None]  # (point index from 1, number of points)


class Cancelled(Exception):  # noqa: N818 - it is an outcome, not an error
    """Raised when `should_stop` turns true while models are loading."""


# ---------------------------------------------------------------------------------------------- settings
@dataclass
class RunSettings:
    """What the dashboard runs. `preset` names where target/draft came from (informational once filled in);
    `target` is a folder, hub id or .gguf file; `draft` a spec string ("rtn4", "rtn3-g64", "bnb-int8") or a
    sibling folder / hub id; top_k 0 and top_p 1.0 mean off; temperature 0 is greedy."""

    target: str = ""
    draft: str = "rtn4"
    gamma: int | str = 4
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 1
    prompt: str = ""
    preset: str = ""
    chat: bool = False
    measure_baseline: bool = True
    ignore_eos: bool = False  # generate exactly max_new_tokens (EOS masked, as min_new_tokens does)
    device: str = ""  # "" : the session's default; cpu | cuda | cuda:N | mps | auto
    dtype: str = ""   # "" : the session's default; float32 | bfloat16 | float16 | auto

    @classmethod
    def from_preset(cls, name: str, **overrides) -> RunSettings:
        """Settings filled from a preset (name or .toml path), then `overrides`."""
        from hfspec.presets import load_preset

        return load_preset(name).settings(**overrides)

    def validated(self) -> RunSettings:
        """Self, after checking every field's type and range (HfspecError naming the field and what is allowed)."""
        from hfspec.errors import bad_value
        from hfspec.loading import parse_device, parse_dtype
        from hfspec.validate import check_sampling

        for name, what in (("target", "a model folder, a hub id (owner/name) or a .gguf file"),
                           ("draft", registry.allowed()),
                           ("prompt", "some text to continue")):
            value = getattr(self, name)
            if not isinstance(value, str) or not (value if name == "prompt" else value.strip()):
                raise bad_value(name, value, what)
        check_gamma(self.gamma)
        for name in ("temperature", "top_k", "top_p"):  # None is "off" for the API, not a settings value
            if getattr(self, name) is None:
                raise bad_value(name, None, {"temperature": "a number >= 0", "top_k": "an integer >= 0 (0 is off)",
                                             "top_p": "a number in (0, 1] (1 is off)"}[name])
        check_sampling(self.temperature, self.top_k, self.top_p)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad_value("max_new_tokens", self.max_new_tokens, "an integer >= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise bad_value("seed", self.seed, "an integer from 0 to 2**64 - 1")
        for name in ("chat", "measure_baseline", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise bad_value(name, getattr(self, name), "True or False")
        for name, parse in (("device", parse_device), ("dtype", parse_dtype)):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise bad_value(name, value, "a string (empty for the session's default)")
            if value:
                parse(value, role="settings")
        return self

    def sampling_kwargs(self) -> dict:
        """Keyword arguments of hfspec.plain_generate (and of hfspec.generate, with `gamma` added)."""
        return {
            "temperature": float(self.temperature),
            "top_k": int(self.top_k),  # 0 passed as 0: None would leave transformers' default top-k of 50
            "top_p": float(self.top_p),
            "max_new_tokens": int(self.max_new_tokens),
            "seed": int(self.seed),
        } | ({"min_new_tokens": int(self.max_new_tokens)} if self.ignore_eos else {})

    def generate_kwargs(self) -> dict:
        return {"gamma": self.gamma, **self.sampling_kwargs()}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunSettings:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def draft_spec(kind: str, bits: int = 4, group: int = 0, bnb_type: str = "nf4", source: str = "",
               **values) -> str:
    """The spec string for a draft kind and its form values (a thin wrapper over `registry.spec_of`); the
    positional form values are the built-in kinds' fields in order (group 0: the default group size)."""
    values = {"bits": bits, "group": group, "bnb_type": bnb_type, "source": source, **values}
    entry = next((k for k in registry.choices() if k.name == kind), None)
    if entry is not None:
        for f in entry.fields:
            if f.text and not str(values.get(f.name, "")).strip():
                raise HfspecError(f"draft {kind} {f.title}: empty; allowed: {entry.allowed}")
    return registry.spec_of(kind, values)


def split_draft_spec(spec: str) -> dict:
    """The inverse of :func:`draft_spec` (`registry.fields_of`): {"kind": name, field: value, ...}; a spec the
    registry cannot read (e.g. a folder that is gone) comes back as the model kind's source, for the form to
    show."""
    try:
        return registry.fields_of(spec.strip())
    except HfspecError:
        values = {f.name: f.default for kind in registry.choices() for f in kind.fields}
        return values | {"kind": registry.model_kind().name, "source": spec.strip()}


def context_length(source: str) -> int | None:
    """The positions a local model folder's config allows (max_position_embeddings, n_positions, ...); None
    when unknown (hub ids, .gguf files, folders without config.json)."""
    path = Path(str(source).strip()).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for cfg in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"):
            if isinstance(cfg.get(key), int) and cfg[key] > 0:
                return cfg[key]
    return None


def parse_list(text: str) -> list[str]:
    """Drafts (or 'target | draft' pairs) from a comma- or newline-separated list."""
    items = []
    for line in text.replace(",", "\n").splitlines():
        if line.strip():
            items.append(line.strip())
    return items


# --------------------------------------------------------------------------------------------- live data
@dataclass
class LiveSnapshot:
    """What a live view needs after one target pass (copied: safe to hand to another thread)."""

    round_index: int
    gamma: int
    accepted: int                 # draft tokens accepted this pass (row 0)
    checked: int                  # draft tokens checked this pass (all rows)
    committed: int                # tokens added this pass (all rows)
    alpha: float                  # cumulative acceptance rate
    rolling_alpha: float          # acceptance rate over the last ROLLING_WINDOW passes
    tokens_per_pass: float        # cumulative
    expected_tokens_per_pass: float  # (1 − α^(γ+1)) / (1 − α) with the cumulative α and mean γ
    estimated_speedup: float      # expected tokens per pass / (1 + γc)
    measured_speedup: float | None  # tokens/s now over the cached baseline's tokens/s
    c: float                      # draft bytes / target bytes
    c_time: float                 # measured draft forward time / target forward time
    elapsed: float
    new_tokens: int
    accepted_by_position: list[int]
    checked_by_position: list[int]
    pieces: list[tuple[str, str]]  # (text, kind) of this pass's tokens, row 0


class LiveBuffer:
    """A bounded, lock-protected queue of snapshots: the worker pushes every pass, the GUI drains at ~20 Hz."""

    def __init__(self, maxlen: int = 100_000):
        self._items: deque = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def push(self, item) -> None:
        with self._lock:
            self._items.append(item)

    def drain(self) -> list:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class IncrementalDecoder:
    """Turns generated ids into text pieces, one per token, decoding with the prompt as context (so spaces
    and multi-byte characters come out as the full decode shows them)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.text = self._decode(self.ids)

    def _decode(self, ids) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, ids: Iterable[int]) -> list[str]:
        pieces = []
        for token in ids:
            self.ids.append(int(token))
            text = self._decode(self.ids)
            common = len(self.text) if text.startswith(self.text) else _common_prefix(self.text, text)
            pieces.append(text[common:])
            self.text = text
        return pieces


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ------------------------------------------------------------------------------------------------ results
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
        """Speculative over plain tokens/s, both measured the same way right after the run (no live display)."""
        if self.measurement is not None:
            return self.measurement.measured_speedup or None
        if self.baseline is None or not self.baseline.tokens_per_second:
            return None
        speculative = self.baseline.speculative_tokens_per_second or self.stats.tokens_per_second
        return speculative / self.baseline.tokens_per_second

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
            "estimated_speedup": s.estimated_speedup,
            "ideal_speedup": s.ideal_speedup,
            "measured_speedup": self.measured_speedup,
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


SweepPoint = SweepRow  # the dashboard's name for one sweep row (hfspec.sweep's)


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
        """The formula over γ from the pooled α: tokens per pass, the estimate (c_time), the ideal (c_bytes)."""
        pooled = self.pooled(draft)
        alpha = pooled["alpha"]
        gs = list(gammas) if gammas is not None else list(range(1, max(self.gammas) + 1))
        return {
            "gamma": gs,
            "tokens_per_pass": [expected_tokens_per_pass(alpha, g) for g in gs],
            "estimated_speedup": [estimated_speedup(alpha, g, pooled["c_time"]) for g in gs],
            "ideal_speedup": [estimated_speedup(alpha, g, pooled["c_bytes"]) for g in gs],
        }

    def rows(self) -> list[dict]:
        return [p.to_dict() for p in self.points]


@dataclass
class CompareRow(SweepRow):
    """A sweep row at the settings' γ, with the entry as written and the target it ran on."""

    label: str = ""
    target: str = ""


# ------------------------------------------------------------------------------------------------ session
class Session:
    """Loads and caches models (targets, tokenizers, drafts); runs the engine. Baselines are measured anew for
    every run and every sweep point, beside it.

    One session is used from one thread at a time (the dashboard's worker thread)."""

    def __init__(self, dtype=None, device=None, max_targets: int = 2, max_drafts: int = 4):
        self.dtype = dtype
        self.device = device
        self.max_targets = max_targets
        self.max_drafts = max_drafts
        self._targets: dict[tuple, tuple] = {}
        self._drafts: dict[tuple, object] = {}

    # -------------------------------------------------------------- loading
    def load(self, settings: RunSettings, progress: Progress | None = None, should_stop: StopCheck | None = None):
        """(target, draft, tokenizer) for the settings, from the cache when already loaded."""
        where = {"dtype": settings.dtype or None, "device": settings.device or None}
        target, tokenizer = self.load_target(settings.target, progress, should_stop, **where)
        draft = self.load_draft(settings.target, settings.draft, progress, should_stop, **where)
        return target, draft, tokenizer

    def load_target(self, source: str, progress: Progress | None = None, should_stop: StopCheck | None = None,
                    dtype: str | None = None, device: str | None = None):
        key = self._target_key(source, dtype, device)
        if key not in self._targets:
            say = _guarded(progress, should_stop)
            from hfspec.loading import load_model, load_tokenizer

            say(f"loading target {source}…")
            model = load_model(source, dtype=key[1], device=key[2], progress=say, role="target")
            say("loading tokenizer…")
            tokenizer = load_tokenizer(source, role="target")
            while len(self._targets) >= self.max_targets:  # bounded memory; a target's drafts go with it
                gone = next(iter(self._targets))
                del self._targets[gone]
                self._drafts = {k: v for k, v in self._drafts.items() if k[0] != gone}
            self._targets[key] = (model, tokenizer)
        _check(should_stop)
        return self._targets[key]

    def load_draft(self, target_source: str, spec: str, progress: Progress | None = None,
                   should_stop: StopCheck | None = None, dtype: str | None = None, device: str | None = None):
        """The draft `spec` for the target (built once); kinds that take any option (siblings) get the target's
        tokenizer to check against and a progress callback."""
        target, tokenizer = self.load_target(target_source, progress, should_stop, dtype, device)
        key = (self._target_key(target_source, dtype, device), spec.strip())
        if key not in self._drafts:
            draft = build_draft(target, spec, tokenizer, _guarded(progress, should_stop))
            while len(self._drafts) >= self.max_drafts:
                self._drafts.pop(next(iter(self._drafts)))
            self._drafts[key] = draft
        _check(should_stop)
        return self._drafts[key]

    def _target_key(self, source: str, dtype: str | None, device: str | None) -> tuple:
        return (_norm(source), dtype or self.dtype, device or self.device)

    def encode(self, settings: RunSettings, tokenizer):
        return encode_prompt(settings, tokenizer)

    # -------------------------------------------------------------- running
    def run(self, settings: RunSettings, on_live: Callable[[LiveSnapshot], None] | None = None,
            should_stop: StopCheck | None = None, progress: Progress | None = None,
            before_measure: Callable[[], None] | None = None) -> RunResult:
        """One speculative run, then (when `settings.measure_baseline`) plain decoding of exactly as many
        tokens, measured right after it. `before_measure()` is called first: a display can finish drawing the run
        (on 2 cores a busy GUI thread slows what is being timed)."""
        import hfspec

        settings.validated()
        target, draft, tokenizer = self.load(settings, progress, should_stop)
        ids = self.encode(settings, tokenizer)
        decoder = IncrementalDecoder(tokenizer, ids[0].tolist())
        pieces: list[tuple[str, str]] = []
        series: list[dict] = []
        window: deque = deque(maxlen=ROLLING_WINDOW)
        last = {"checked": 0, "new": 0}
        start = time.perf_counter()

        def on_round(event) -> None:
            s = event.stats
            checked, committed = s.checked - last["checked"], s.new_tokens - last["new"]
            last.update(checked=s.checked, new=s.new_tokens)
            row0 = event.rows.index(0) if event.rows and 0 in event.rows else (0 if not event.rows else None)
            new = []
            if row0 is not None and row0 < len(event.new_tokens):
                new = list(zip(decoder.add(event.new_tokens[row0]), event.kinds[row0], strict=True))
                pieces.extend(new)
            accepted = sum(event.accepted)
            window.append((accepted, checked))
            win_checked = sum(k for _, k in window)
            snapshot = LiveSnapshot(
                round_index=event.round_index, gamma=int(event.gamma), accepted=accepted, checked=checked,
                committed=committed, alpha=s.alpha,
                rolling_alpha=sum(a for a, _ in window) / win_checked if win_checked else 0.0,
                tokens_per_pass=s.tokens_per_pass, expected_tokens_per_pass=s.expected_tokens_per_pass,
                estimated_speedup=s.estimated_speedup, measured_speedup=None, c=s.c_bytes, c_time=s.c_time,
                elapsed=time.perf_counter() - start, new_tokens=s.new_tokens,
                accepted_by_position=list(s.accepted_by_position),
                checked_by_position=list(s.checked_by_position), pieces=new)
            series.append(_series_row(snapshot))
            if on_live is not None:
                on_live(snapshot)

        out = hfspec.generate(target, ids, draft=draft, on_round=on_round, should_stop=should_stop,
                              **settings.generate_kwargs())
        prompt_text = tokenizer.decode(ids[0], skip_special_tokens=True)
        result = RunResult(settings=replace(settings), stats=out.stats, prompt_text=prompt_text, pieces=pieces,
                           series=series)
        if settings.measure_baseline and not out.stats.stopped and out.stats.new_tokens:
            if before_measure is not None:
                before_measure()
            result.measurement = self._measure(settings, target, draft, ids, out.stats.new_tokens, should_stop,
                                               progress)
            result.baseline = Baseline.of(result.measurement)
        return result

    def _measure(self, settings: RunSettings, target, draft, ids, n: int, should_stop,
                 progress) -> Measurement | None:
        """Speculative decoding without the live display against plain decoding of the same n tokens
        (`hfspec.measure.measure_speedup`): up to MEASURE_PAIRS alternating pairs within MEASURE_BUDGET_S."""
        import hfspec

        fixed = dict(settings.generate_kwargs(), max_new_tokens=n, min_new_tokens=n)

        def said(i: int) -> None:
            if progress:
                progress(f"measuring speed-up: pair {i + 1} of up to {MEASURE_PAIRS} "
                         f"(speculative and plain decoding of {n} tokens, no live display)…")

        def plain(i: int):
            base = self.baseline(settings, n, should_stop)
            return None if base is None else base.stats

        return measure_speedup(lambda i: hfspec.generate(target, ids, draft=draft, should_stop=should_stop,
                                                         **fixed).stats,
                               plain, pairs=MEASURE_PAIRS, budget_s=MEASURE_BUDGET_S, on_pair=said)

    def baseline(self, settings: RunSettings, new_tokens: int | None = None, should_stop: StopCheck | None = None,
                 progress: Progress | None = None) -> Baseline | None:
        """Plain decoding of exactly `new_tokens` tokens (default max_new_tokens) with the settings' prompt,
        seed and sampling, measured now (never cached: machine load drifts); None when stopped."""
        n = int(new_tokens or settings.max_new_tokens)
        target, tokenizer = self.load_target(settings.target, progress, should_stop, settings.dtype or None,
                                             settings.device or None)
        if progress:
            progress(f"baseline: plain decoding of {n} tokens…")
        sampling, seed = _sampling(settings)
        stats = plain_run(target, self.encode(settings, tokenizer), n, sampling, seed, should_stop)
        if stats.stopped or not stats.new_tokens:
            return None
        return Baseline(stats.new_tokens, stats.time_total, stats=stats)

    # -------------------------------------------------------------- sweep and compare (hfspec.sweep)
    def sweep(self, settings: RunSettings, gammas: Iterable[int], drafts: Iterable[str] | None = None,
              repeats: int = 1, on_point: Callable[[SweepRow], None] | None = None,
              should_stop: StopCheck | None = None, progress: Progress | None = None,
              on_step: Step | None = None) -> SweepResult:
        """Each draft × γ through `hfspec.sweep.sweep`: `repeats` fixed-length runs per point, each beside its
        own plain baseline; `on_step(i, n)` before point i of n, `on_point(row)` after it."""
        gammas = sorted({int(g) for g in gammas})
        if not gammas or gammas[0] < 1 or gammas[-1] > GAMMA_MAX:
            raise HfspecError(f"sweep gammas: got {gammas!r}; allowed: integers from 1 to {GAMMA_MAX}")
        settings.validated()
        specs = list(drafts) if drafts else [settings.draft]
        for spec in specs:
            registry.parse(spec)  # a bad spec fails before any model loads
        where = {"dtype": settings.dtype or None, "device": settings.device or None}
        target, tokenizer = self.load_target(settings.target, progress, should_stop, **where)
        models = {spec: self.load_draft(settings.target, spec, progress, should_stop, **where) for spec in specs}
        sampling, seed = _sampling(settings)
        result = SweepResult(settings=replace(settings), gammas=gammas, repeats=repeats)

        def started(index: int, total: int, label: str, gamma) -> None:
            if progress:
                progress(f"sweep: {label}, γ = {gamma} (point {index} / {total})…")
            if on_step:
                on_step(index, total)

        def finished(row: SweepRow) -> None:
            result.points.append(row)
            if on_point:
                on_point(row)

        run_sweep(target, models, gammas, self.encode(settings, tokenizer), sampling, seed=seed, repeats=repeats,
                  check_greedy=False, on_row=finished, should_stop=should_stop, on_start=started)
        result.stopped = len(result.points) < len(specs) * len(gammas)
        return result

    def compare(self, settings: RunSettings, drafts: Iterable[str], repeats: int = 1,
                on_row: Callable[[CompareRow], None] | None = None, should_stop: StopCheck | None = None,
                progress: Progress | None = None, on_step: Step | None = None) -> list[CompareRow]:
        """Each entry, a draft spec or a "target | draft" pair, at the settings' γ through the same engine."""
        settings.validated()
        entries = []
        for item in drafts:
            target, _, spec = item.rpartition("|")
            entries.append((item.strip(), target.strip() or settings.target, spec.strip()))
            registry.parse(spec.strip())
        rows: list[CompareRow] = []
        for index, (label, target_source, spec) in enumerate(entries, 1):
            if should_stop is not None and should_stop():
                break
            if progress:
                progress(f"compare: {label} (point {index} / {len(entries)})…")
            if on_step:
                on_step(index, len(entries))
            entry = replace(settings, target=target_source, draft=spec)
            target, draft, tokenizer = self.load(entry, progress, should_stop)
            sampling, seed = _sampling(entry)
            got = run_sweep(target, {spec: draft}, [settings.gamma], self.encode(entry, tokenizer), sampling,
                            seed=seed, repeats=repeats, check_greedy=False, should_stop=should_stop)
            if not got:
                break
            row = CompareRow(**got[0].to_dict(), label=label, target=target_source)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        return rows


def encode_prompt(settings: RunSettings, tokenizer):
    """Token ids [1, n] of the settings' prompt, chat-templated when `chat` is set and the tokenizer has one."""
    if settings.chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": settings.prompt}],
                                             add_generation_prompt=True, return_tensors="pt",
                                             return_dict=True)["input_ids"]
    return tokenizer(settings.prompt, return_tensors="pt").input_ids


def build_draft(target, spec: str, tokenizer, progress: Progress | None = None):
    """The draft `spec` for `target`: kinds that take any option (a model to load) get the target's tokenizer
    to check against; kinds that report while building get `progress`."""
    from hfspec import make_draft

    parsed = registry.parse(spec.strip())
    if progress is not None:
        progress(f"building draft {parsed.label}…")
    kind = registry.KINDS.get(parsed.kind)
    options = {"target_tokenizer": tokenizer} if kind and kind.options is None else {}
    if progress is not None and kind and (kind.options is None or "progress" in kind.options):
        options["progress"] = progress
    return make_draft(target, spec.strip(), **options)


def _sampling(settings: RunSettings) -> tuple[dict, int]:
    """The settings' sampling keywords without seed and min_new_tokens (the engine fixes lengths), and the seed."""
    sampling = settings.sampling_kwargs()
    sampling.pop("min_new_tokens", None)
    return sampling, sampling.pop("seed")


def _series_row(s: LiveSnapshot) -> dict:
    """One target pass of the live series, for exports."""
    return {"pass": s.round_index + 1, "gamma": s.gamma, "accepted": s.accepted, "checked": s.checked,
            "committed": s.committed, "alpha": s.alpha, "rolling_alpha": s.rolling_alpha,
            "tokens_per_pass": s.tokens_per_pass, "expected_tokens_per_pass": s.expected_tokens_per_pass,
            "estimated_speedup": s.estimated_speedup, "c_time": s.c_time, "elapsed": s.elapsed,
            "new_tokens": s.new_tokens}


def _norm(source: str) -> str:
    return str(source).strip()


def _check(should_stop: StopCheck | None) -> None:
    if should_stop is not None and should_stop():
        raise Cancelled("stopped while loading")


def _guarded(progress: Progress | None, should_stop: StopCheck | None) -> Progress:
    """A progress callable that also raises Cancelled when a stop was asked (loading has no other hook)."""

    def say(message: str) -> None:
        _check(should_stop)
        if progress is not None:
            progress(message)

    return say
