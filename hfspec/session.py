"""The model side of the desktop dashboard, without Qt: settings, cached models, runs, baselines, sweeps.

    from hfspec.session import RunSettings, Session
    session = Session()
    settings = RunSettings.from_preset("micro-rtn4", gamma=4, max_new_tokens=32)
    result = session.run(settings, on_live=print)          # RunResult: stats, coloured tokens, speed-ups
    sweep = session.sweep(settings, gammas=range(1, 9), drafts=["rtn4", "rtn3-g64"])
    rows = session.compare(settings, drafts=["rtn4", "rtn3-g64", "models/nano"])

Everything returns plain data (dataclasses, lists, floats). `should_stop()` is polled between loading steps,
during loading (through the progress callback) and once per target pass by the engine; a stop while loading
raises :class:`Cancelled`, a stop while generating ends the run cleanly (``stats.stopped``).
Live displays get a :class:`LiveSnapshot` after every target pass; :class:`LiveBuffer` is a thread-safe
queue for them (the producer pushes, a GUI timer drains at its own rate).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

from hfspec.errors import HfspecError
from hfspec.stats import SpecStats, estimated_speedup, expected_tokens_per_pass
from hfspec.validate import check_gamma

GAMMA_MAX = 16
ROLLING_WINDOW = 16  # target passes in the rolling acceptance rate
BNB_TYPES = ("nf4", "fp4", "int8")

Progress = Callable[[str], None]
StopCheck = Callable[[], bool]


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

    @classmethod
    def from_preset(cls, name: str, **overrides) -> RunSettings:
        """Settings filled from a preset (name or .toml path), then `overrides`."""
        from hfspec.presets import load_preset

        p = load_preset(name)
        values = dict(target=p.target, draft=p.draft, gamma=p.gamma, temperature=float(p.temperature),
                      top_k=int(p.top_k), top_p=float(p.top_p), max_new_tokens=int(p.max_new_tokens),
                      seed=int(p.seed), prompt=p.prompt, preset=p.name, chat=bool(p.chat))
        values.update(overrides)
        return cls(**values)

    def validated(self) -> RunSettings:
        """Self, after checking every field (HfspecError naming the field and what is allowed)."""
        if not str(self.target).strip():
            raise HfspecError("target: empty; allowed: a model folder, a hub id (owner/name) or a .gguf file")
        if not str(self.draft).strip():
            raise HfspecError("draft: empty; allowed: rtnB[-gN], bnb-nf4|fp4|int8, or a sibling folder / hub id")
        check_gamma(self.gamma)
        if self.temperature < 0:
            raise HfspecError(f"temperature: got {self.temperature!r}; allowed: >= 0 (0 is greedy)")
        if self.top_k < 0:
            raise HfspecError(f"top_k: got {self.top_k!r}; allowed: an integer >= 0 (0 is off)")
        if not 0 < self.top_p <= 1:
            raise HfspecError(f"top_p: got {self.top_p!r}; allowed: a number in (0, 1] (1 is off)")
        if self.max_new_tokens < 1:
            raise HfspecError(f"max_new_tokens: got {self.max_new_tokens!r}; allowed: an integer >= 1")
        if self.seed < 0:
            raise HfspecError(f"seed: got {self.seed!r}; allowed: an integer >= 0")
        if not self.prompt:
            raise HfspecError("prompt: empty; allowed: some text to continue")
        return self

    def sampling_kwargs(self) -> dict:
        """Keyword arguments of hfspec.plain_generate (and of hfspec.generate, with `gamma` added)."""
        return {
            "temperature": float(self.temperature),
            "top_k": int(self.top_k) or None,
            "top_p": None if self.top_p >= 1.0 else float(self.top_p),
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


def draft_spec(kind: str, bits: int = 4, group: int = 0, bnb_type: str = "nf4", source: str = "") -> str:
    """The draft spec string for a choice in the dashboard: kind "rtn" -> "rtn4" / "rtn3-g64" (group 0 is
    the default group size), "bnb" -> "bnb-nf4" | "bnb-fp4" | "bnb-int8", "sibling" -> the folder / hub id."""
    if kind == "rtn":
        if not 2 <= int(bits) <= 8:
            raise HfspecError(f"draft bits: got {bits!r}; allowed: 2..8")
        if group and not 8 <= int(group) <= 8192:
            raise HfspecError(f"draft group: got {group!r}; allowed: 0 (default, 32) or 8..8192")
        return f"rtn{int(bits)}" + (f"-g{int(group)}" if group else "")
    if kind == "bnb":
        if bnb_type not in BNB_TYPES:
            raise HfspecError(f"draft bitsandbytes type: got {bnb_type!r}; allowed: {', '.join(BNB_TYPES)}")
        return f"bnb-{bnb_type}"
    if kind == "sibling":
        if not source.strip():
            raise HfspecError("draft sibling: empty; allowed: a model folder or a hub id with the same tokenizer")
        return source.strip()
    raise HfspecError(f"draft kind: got {kind!r}; allowed: rtn, bnb, sibling")


def split_draft_spec(spec: str) -> dict:
    """The inverse of :func:`draft_spec`: {"kind", "bits", "group", "bnb_type", "source"}."""
    import re

    low = spec.strip().lower()
    out = {"kind": "sibling", "bits": 4, "group": 0, "bnb_type": "nf4", "source": spec.strip()}
    m = re.fullmatch(r"rtn(\d+)(?:-g(\d+))?", low)
    if m:
        out.update(kind="rtn", bits=int(m.group(1)), group=int(m.group(2) or 0), source="")
    elif low.startswith("bnb-") and low[4:] in BNB_TYPES:
        out.update(kind="bnb", bnb_type=low[4:], source="")
    return out


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
    """A plain (target-only) run of the same length: the measured speed-up's denominator."""

    new_tokens: int
    time_total: float

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

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)

    @property
    def measured_speedup(self) -> float | None:
        if self.baseline is None or not self.baseline.tokens_per_second:
            return None
        return self.stats.tokens_per_second / self.baseline.tokens_per_second

    def summary(self) -> dict:
        """The numbers the dashboard shows (and exports)."""
        s = self.stats
        return {
            "draft": self.settings.draft,
            "gamma": s.mean_gamma,
            "alpha": s.alpha,
            "tokens_per_pass": s.tokens_per_pass,
            "expected_tokens_per_pass": s.expected_tokens_per_pass,
            "c": s.c_bytes,
            "estimated_speedup": s.estimated_speedup,
            "measured_speedup": self.measured_speedup,
            "target_passes": s.target_passes,
            "new_tokens": s.new_tokens,
            "time_total": s.time_total,
            "tokens_per_second": s.tokens_per_second,
            "baseline_tokens_per_second": self.baseline.tokens_per_second if self.baseline else None,
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
        }


@dataclass
class SweepPoint:
    draft: str
    gamma: int
    alpha: float
    tokens_per_pass: float
    expected_tokens_per_pass: float
    c: float
    estimated_speedup: float
    measured_speedup: float | None
    target_passes: int
    new_tokens: int


@dataclass
class SweepResult:
    settings: RunSettings
    gammas: list[int]
    points: list[SweepPoint] = field(default_factory=list)
    stopped: bool = False

    def drafts(self) -> list[str]:
        return list(dict.fromkeys(p.draft for p in self.points))

    def pooled(self, draft: str) -> tuple[float, float]:
        """(α, c) of one draft pooled over its γ points (α weighted by checked tokens ≈ passes × γ)."""
        pts = [p for p in self.points if p.draft == draft]
        if not pts:
            return 0.0, 0.0
        weight = [p.target_passes * p.gamma for p in pts]
        total = sum(weight)
        alpha = sum(p.alpha * w for p, w in zip(pts, weight, strict=True)) / total if total else 0.0
        return alpha, pts[0].c

    def curve(self, draft: str, gammas: Iterable[int] | None = None) -> dict[str, list[float]]:
        """The formula's tokens per pass and estimated speed-up over γ, from the pooled α and c."""
        alpha, c = self.pooled(draft)
        gs = list(gammas) if gammas is not None else list(range(1, max(self.gammas) + 1))
        return {
            "gamma": gs,
            "tokens_per_pass": [expected_tokens_per_pass(alpha, g) for g in gs],
            "estimated_speedup": [estimated_speedup(alpha, g, c) for g in gs],
        }

    def rows(self) -> list[dict]:
        return [asdict(p) for p in self.points]


@dataclass
class CompareRow:
    label: str
    target: str
    draft: str
    alpha: float
    tokens_per_pass: float
    c: float
    estimated_speedup: float
    measured_speedup: float | None
    tokens_per_second: float
    new_tokens: int


# ------------------------------------------------------------------------------------------------ session
class Session:
    """Loads and caches models (targets, tokenizers, drafts) and plain baselines; runs the engine.

    One session is used from one thread at a time (the dashboard's worker thread)."""

    def __init__(self, dtype=None, device=None, max_targets: int = 2, max_drafts: int = 4):
        self.dtype = dtype
        self.device = device
        self.max_targets = max_targets
        self.max_drafts = max_drafts
        self._targets: dict[str, tuple] = {}
        self._drafts: dict[tuple[str, str], object] = {}
        self._baselines: dict[tuple, Baseline] = {}

    # -------------------------------------------------------------- loading
    def load(self, settings: RunSettings, progress: Progress | None = None, should_stop: StopCheck | None = None):
        """(target, draft, tokenizer) for the settings, from the cache when already loaded."""
        target, tokenizer = self.load_target(settings.target, progress, should_stop)
        draft = self.load_draft(settings.target, settings.draft, progress, should_stop)
        return target, draft, tokenizer

    def load_target(self, source: str, progress: Progress | None = None, should_stop: StopCheck | None = None):
        key = _norm(source)
        if key not in self._targets:
            say = _guarded(progress, should_stop)
            from hfspec.loading import load_model, load_tokenizer

            say(f"loading target {source}…")
            model = load_model(source, dtype=self.dtype, device=self.device, progress=say, role="target")
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
                   should_stop: StopCheck | None = None):
        target, tokenizer = self.load_target(target_source, progress, should_stop)
        key = (_norm(target_source), spec.strip())
        if key not in self._drafts:
            from hfspec import make_draft
            from hfspec.drafts import parse_draft_spec

            say = _guarded(progress, should_stop)
            parsed = parse_draft_spec(spec.strip())
            say(f"building draft {parsed.label}…")
            if parsed.kind in ("rtn", "bnb"):
                draft = make_draft(target, spec.strip())
            else:
                draft = make_draft(target, spec.strip(), target_tokenizer=tokenizer, progress=say)
            while len(self._drafts) >= self.max_drafts:
                self._drafts.pop(next(iter(self._drafts)))
            self._drafts[key] = draft
        _check(should_stop)
        return self._drafts[key]

    def encode(self, settings: RunSettings, tokenizer):
        if settings.chat and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template([{"role": "user", "content": settings.prompt}],
                                                 add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)["input_ids"]
        return tokenizer(settings.prompt, return_tensors="pt").input_ids

    # -------------------------------------------------------------- running
    def run(self, settings: RunSettings, on_live: Callable[[LiveSnapshot], None] | None = None,
            should_stop: StopCheck | None = None, progress: Progress | None = None) -> RunResult:
        """One speculative run, then (when `settings.measure_baseline`) a plain baseline of the same length."""
        import hfspec

        settings.validated()
        target, draft, tokenizer = self.load(settings, progress, should_stop)
        ids = self.encode(settings, tokenizer)
        baseline = self._baselines.get(self._baseline_key(settings, settings.max_new_tokens))
        decoder = IncrementalDecoder(tokenizer, ids[0].tolist())
        pieces: list[tuple[str, str]] = []
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
            elapsed = time.perf_counter() - start
            measured = None
            if baseline is not None and baseline.tokens_per_second and elapsed > 0:
                measured = (s.new_tokens / elapsed) / baseline.tokens_per_second
            if on_live is not None:
                on_live(LiveSnapshot(
                    round_index=event.round_index, gamma=int(event.gamma), accepted=accepted, checked=checked,
                    committed=committed, alpha=s.alpha,
                    rolling_alpha=sum(a for a, _ in window) / win_checked if win_checked else 0.0,
                    tokens_per_pass=s.tokens_per_pass, expected_tokens_per_pass=s.expected_tokens_per_pass,
                    estimated_speedup=s.estimated_speedup, measured_speedup=measured, c=s.c_bytes,
                    c_time=s.c_time, elapsed=elapsed, new_tokens=s.new_tokens,
                    accepted_by_position=list(s.accepted_by_position),
                    checked_by_position=list(s.checked_by_position), pieces=new))

        out = hfspec.generate(target, ids, draft=draft, on_round=on_round, should_stop=should_stop,
                              **settings.generate_kwargs())
        prompt_text = tokenizer.decode(ids[0], skip_special_tokens=True)
        result = RunResult(settings=replace(settings), stats=out.stats, prompt_text=prompt_text, pieces=pieces)
        if settings.measure_baseline and not out.stats.stopped and out.stats.new_tokens:
            result.baseline = self.baseline(settings, out.stats.new_tokens, should_stop, progress)
        return result

    def baseline(self, settings: RunSettings, new_tokens: int | None = None, should_stop: StopCheck | None = None,
                 progress: Progress | None = None) -> Baseline | None:
        """A plain run of `new_tokens` tokens (default max_new_tokens) with the same sampling; cached."""
        import hfspec

        n = int(new_tokens or settings.max_new_tokens)
        key = self._baseline_key(settings, n)
        if key not in self._baselines:
            target, tokenizer = self.load_target(settings.target, progress, should_stop)
            if progress:
                progress(f"baseline: plain decoding of {n} tokens…")
            ids = self.encode(settings, tokenizer)
            kwargs = settings.sampling_kwargs() | {"max_new_tokens": n}
            if settings.ignore_eos:
                kwargs["min_new_tokens"] = n
            out = hfspec.plain_generate(target, ids, should_stop=should_stop, **kwargs)
            if out.stats.stopped or not out.stats.new_tokens:
                return None
            self._baselines[key] = Baseline(out.stats.new_tokens, out.stats.time_total)
        return self._baselines[key]

    def cached_baseline(self, settings: RunSettings, new_tokens: int | None = None) -> Baseline | None:
        return self._baselines.get(self._baseline_key(settings, int(new_tokens or settings.max_new_tokens)))

    @staticmethod
    def _baseline_key(settings: RunSettings, n: int) -> tuple:
        s = settings
        return (_norm(s.target), s.prompt, s.chat, float(s.temperature), int(s.top_k), float(s.top_p), int(s.seed), n,
                bool(s.ignore_eos))

    # -------------------------------------------------------------- sweep and compare
    def sweep(self, settings: RunSettings, gammas: Iterable[int], drafts: Iterable[str] | None = None,
              on_point: Callable[[SweepPoint], None] | None = None, should_stop: StopCheck | None = None,
              progress: Progress | None = None) -> SweepResult:
        """Tokens per pass and estimated (and measured) speed-up for each draft × γ."""
        gammas = sorted({int(g) for g in gammas})
        if not gammas or gammas[0] < 1 or gammas[-1] > 64:
            raise HfspecError(f"sweep gammas: got {gammas!r}; allowed: integers from 1 to 64")
        drafts = list(drafts) if drafts else [settings.draft]
        result = SweepResult(settings=replace(settings), gammas=gammas)
        for spec in drafts:
            for g in gammas:
                if should_stop is not None and should_stop():
                    result.stopped = True
                    return result
                if progress:
                    progress(f"sweep: {spec}, γ = {g}…")
                run = self.run(replace(settings, draft=spec, gamma=g), should_stop=should_stop, progress=progress)
                s = run.stats
                if s.stopped:
                    result.stopped = True
                    return result
                point = SweepPoint(draft=spec, gamma=g, alpha=s.alpha, tokens_per_pass=s.tokens_per_pass,
                                   expected_tokens_per_pass=expected_tokens_per_pass(s.alpha, g), c=s.c_bytes,
                                   estimated_speedup=estimated_speedup(s.alpha, g, s.c_bytes),
                                   measured_speedup=run.measured_speedup, target_passes=s.target_passes,
                                   new_tokens=s.new_tokens)
                result.points.append(point)
                if on_point is not None:
                    on_point(point)
        return result

    def compare(self, settings: RunSettings, drafts: Iterable[str],
                on_row: Callable[[CompareRow], None] | None = None, should_stop: StopCheck | None = None,
                progress: Progress | None = None) -> list[CompareRow]:
        """Each entry, a draft spec or a "target | draft" pair, run on the same prompt and settings."""
        rows: list[CompareRow] = []
        for item in drafts:
            if should_stop is not None and should_stop():
                break
            target, _, spec = item.rpartition("|")
            target, spec = (target.strip() or settings.target), spec.strip()
            if progress:
                progress(f"compare: {item}…")
            run = self.run(replace(settings, target=target, draft=spec), should_stop=should_stop, progress=progress)
            if run.stats.stopped:
                break
            s = run.stats
            row = CompareRow(label=item.strip(), target=target, draft=spec, alpha=s.alpha,
                             tokens_per_pass=s.tokens_per_pass, c=s.c_bytes, estimated_speedup=s.estimated_speedup,
                             measured_speedup=run.measured_speedup, tokens_per_second=s.tokens_per_second,
                             new_tokens=s.new_tokens)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        return rows


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
