"""The model side of the desktop dashboard, without Qt: settings, cached models, runs, sweeps, comparisons.

    from hfspec.session import RunSettings, Session
    session = Session()
    settings = RunSettings.from_preset("micro-rtn4", gamma=4, max_new_tokens=32)
    result = session.run(settings, on_live=print)          # RunResult: stats, coloured tokens, speed-ups
    sweep = session.sweep(settings, gammas=range(1, 9), drafts=["rtn4", "rtn3-g64"], repeats=3)
    rows = session.compare(settings, drafts=["rtn4", "rtn3-g64", "models/nano"])

Everything returns plain data (dataclasses, lists, floats). Sweeps and comparisons are `hfspec.measure.sweep`, the CLI's
engine (repeats, fixed length, baselines measured beside each run). A run's baseline is plain decoding of
exactly the run's token count, measured right after it, never cached. Draft specs go through the one registry
(`hfspec.drafts.registry`). `should_stop()` is polled between loading steps, during loading (through the
progress callback) and once per target pass by the engine; a stop while loading raises :class:`Cancelled`, a
stop while generating ends the run cleanly (``stats.stopped``). Live displays get a :class:`LiveSnapshot` after
every target pass; :class:`LiveBuffer` is a thread-safe queue for them (the producer pushes, a GUI timer drains
at its own rate).
"""


from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import torch

from hfspec.api import generate
from hfspec.drafts import registry
from hfspec.dtypes import dtype_str
from hfspec.errors import HfspecError
from hfspec.io import memory
from hfspec.io.loading import load_model, load_tokenizer, parse_dtype
from hfspec.kernels import fast_linear, verify_linear
from hfspec.kernels.compiled_tree import prepare_tree_level
from hfspec.live import ROLLING_WINDOW, IncrementalDecoder, LiveBuffer, LiveRecorder, LiveSnapshot
from hfspec.measure.results import STOP_REASONS, Baseline, CompareRow, RunResult, SweepPoint, SweepResult
from hfspec.measure.ruler import Measurement, Sample, measure_speedup
from hfspec.measure.sweep import SweepRow, plain_run, speculative_options
from hfspec.measure.sweep import sweep as run_sweep
from hfspec.settings import (
    RunSettings,
    build_draft,
    context_length,
    draft_spec,
    encode_prompt,
    parse_list,
    split_draft_spec,
)
from hfspec.validate import GAMMA_MAX, check_flag, check_gammas

__all__ = [
    "GAMMA_MAX", "MEASURE_BUDGET_S", "MEASURE_PAIRS", "MEASURE_SEGMENT", "ROLLING_WINDOW", "STOP_REASONS", "Baseline", "Cancelled",
    "CompareRow", "IncrementalDecoder", "LiveBuffer", "LiveSnapshot", "RunResult", "RunSettings", "Session",
    "SweepPoint", "SweepResult", "SweepRow", "build_draft", "context_length", "draft_spec", "encode_prompt",
    "parse_list", "split_draft_spec",
]

# A run's measured speed-up (`hfspec.measure`): speculative and plain decoding of MEASURE_SEGMENT-token segments
# of the run's own text (each starts at the prompt plus the run's first 0, S, 2S, … tokens, cycling), in up to
# MEASURE_PAIRS alternating pairs within MEASURE_BUDGET_S; outliers re-measured in what is left. Short segments
# give a 135M target at 128 tokens several pairs (one pair of the whole run took the whole budget); a run of at
# most 1.5 segments is timed whole. The run itself warmed both models (no warm-up pair is counted or run). A
# segment is timed from the end of its first round (`_decoding`): the prefill of its context, which the run decoding
# on never paid, is not counted, nor are the tokens that round gave (a speculative prefill round also drafts and
# verifies: it gave about γ α + 1 tokens where plain decoding's gave one). Counted, the prefill had put
# SmolLM2-135M's run at 1.39-1.68x where whole runs (`hfspec sweep`) measured 2.15x: at the segment from token 96
# the speculative side's prefill (target 0.28 s, the draft's int4 kernel over ~100 rows 0.24 s) was 30 % of its
# 1.7 s, the plain side's 0.22 s of 2.55 s. Its tokens counted, the run read 6-40 % above the sweep at T = 0
# (3 December, three repeats: 2.13-2.58x against 1.81-2.01x).
MEASURE_SEGMENT = 32
MEASURE_PAIRS = 9
MEASURE_BUDGET_S = 15.0

# What `prepack` (RunSettings.prepack, `--prepack`) needs: hfspec.kernels.fast_linear packs fp32 CPU linears only
PREPACK_ALLOWED = "a float32 target on the CPU (bf16's multi-row matmul already costs about one row)"

Progress = Callable[[str], None]
StopCheck = Callable[[], bool]
Step = Callable[[int, int], None]  # (point index from 1, number of points)


class Cancelled(Exception):  # noqa: N818 - it is an outcome, not an error
    """Raised when `should_stop` turns true while models are loading."""


def _decoding(stats):
    """A segment's stats as a `Sample` timed from the end of its first round: its own clock less that round (the
    prefill of its context, the target's and the draft's, with a speculative run's first draft and verify), its
    tokens less the ones that round committed; a stopped run (None or stopped stats), or one whose first round gave
    all its tokens, as it is."""
    if stats is None or getattr(stats, "stopped", False) or stats.new_tokens <= stats.costs.prefill_tokens:
        return stats
    return Sample(max(stats.time_total - stats.costs.prefill_seconds, 1e-9),
                  stats.new_tokens - stats.costs.prefill_tokens, stats)


class Session:
    """Loads and caches models (targets, tokenizers, drafts); runs the engine. Baselines are measured anew for
    every run and every sweep point, beside it.

    `dtype`, `device` and `prepack` are the defaults of runs whose settings leave them out ("" / False): a
    prepacked target (`hfspec.kernels.fast_linear.prepack`: fp32 on the CPU only) is cached apart from the
    unpacked one, so a run gets exactly what it asked for.

    One session is used from one thread at a time (the dashboard's worker thread)."""

    def __init__(self, dtype=None, device=None, max_targets: int = 2, max_drafts: int = 4, *, prepack: bool = False):
        check_flag("prepack", prepack)
        self.dtype = dtype
        self.device = device
        self.prepack = prepack
        self.max_targets = max_targets
        self.max_drafts = max_drafts
        self._targets: dict[tuple, tuple] = {}
        self._drafts: dict[tuple, object] = {}

    # -------------------------------------------------------------- loading
    def load(self, settings: RunSettings, progress: Progress | None = None, should_stop: StopCheck | None = None):
        """(target, draft, tokenizer) for the settings, from the cache when already loaded."""
        where = _where(settings)
        target, tokenizer = self.load_target(settings.target, progress, should_stop, **where)
        draft = self.load_draft(settings.target, settings.draft, progress, should_stop, **where)
        return target, draft, tokenizer

    def load_target(self, source: str, progress: Progress | None = None, should_stop: StopCheck | None = None,
                    dtype: str | None = None, device: str | None = None, prepack: bool | None = None):
        """(target, tokenizer), from the cache when already loaded. None (and "") for dtype, device and prepack:
        the session's default. A prepacked target is refused (HfspecError naming prepack) unless it loads as
        float32 on the CPU and this torch has oneDNN's prepacked linear."""
        key = self._target_key(source, dtype, device, prepack)
        if key not in self._targets:
            say = _guarded(progress, should_stop)
            if key[3]:
                _check_prepack_request(key[1])
            say(f"loading target {source}…")
            model = load_model(source, dtype=key[1], device=key[2], progress=say, role="target")
            if key[3]:
                say(_prepack(model))
            verify = verify_linear.describe_for(model)  # (builds the few-row kernel the first time on a machine)
            if verify:
                say(verify)
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
                   should_stop: StopCheck | None = None, dtype: str | None = None, device: str | None = None,
                   prepack: bool | None = None):
        """The draft `spec` for the target (built once); kinds that take any option (siblings) get the target's
        tokenizer to check against and a progress callback."""
        target, tokenizer = self.load_target(target_source, progress, should_stop, dtype, device, prepack)
        key = (self._target_key(target_source, dtype, device, prepack), spec.strip())
        if key not in self._drafts:
            draft = build_draft(target, spec, tokenizer, _guarded(progress, should_stop))
            while len(self._drafts) >= self.max_drafts:
                self._drafts.pop(next(iter(self._drafts)))
            self._drafts[key] = draft
        _check(should_stop)
        return self._drafts[key]

    def _target_key(self, source: str, dtype: str | None, device: str | None, prepack: bool | None = None) -> tuple:
        """(source, dtype, device, prepacked): a prepacked target and an unpacked one are different entries."""
        return (_norm(source), dtype or self.dtype, device or self.device,
                bool(self.prepack if prepack is None else prepack))

    def encode(self, settings: RunSettings, tokenizer):
        return encode_prompt(settings, tokenizer)

    # -------------------------------------------------------------- running
    def run(self, settings: RunSettings, on_live: Callable[[LiveSnapshot], None] | None = None,
            should_stop: StopCheck | None = None, progress: Progress | None = None,
            before_measure: Callable[[], None] | None = None) -> RunResult:
        """One speculative run, then (when `settings.measure_baseline`) plain decoding of exactly as many
        tokens, measured right after it. `before_measure()` is called first: a display can finish drawing the run
        (a busy GUI thread takes cores from what is being timed)."""
        settings.validated()
        target, draft, tokenizer = self.load(settings, progress, should_stop)
        ids = self.encode(settings, tokenizer)
        if settings.tree == "auto":  # a compiled draft's tree level compiles here, with progress, not inside the run
            prepare_tree_level(draft, _guarded(progress, should_stop))
        live = LiveRecorder(IncrementalDecoder(tokenizer, ids[0].tolist()), on_live)
        out = generate(target, ids, draft=draft, on_round=live, should_stop=should_stop,
                              **settings.generate_kwargs())
        prompt_text = tokenizer.decode(ids[0], skip_special_tokens=True)
        result = RunResult(settings=replace(settings), stats=out.stats, prompt_text=prompt_text, pieces=live.pieces,
                           series=live.series)
        if settings.measure_baseline and not out.stats.stopped and out.stats.new_tokens:
            if before_measure is not None:
                before_measure()
            result.measurement = self._measure(settings, target, draft, ids, out.sequences, out.stats.new_tokens,
                                               should_stop, progress)
            result.baseline = Baseline.of(result.measurement)
        return result

    def _measure(self, settings: RunSettings, target, draft, ids, sequences, n: int, should_stop,
                 progress) -> Measurement | None:
        """Speculative decoding without the live display against plain decoding (`hfspec.measure`): segments of
        MEASURE_SEGMENT tokens of the run's text, up to MEASURE_PAIRS alternating pairs within MEASURE_BUDGET_S."""
        whole = n <= MEASURE_SEGMENT * 3 // 2 or ids.shape[0] != 1
        seg = n if whole else MEASURE_SEGMENT
        starts = [0] if whole else list(range(0, n - seg + 1, seg))
        sampling, seed = _sampling(settings)
        fixed = dict(settings.generate_kwargs(), max_new_tokens=seg, min_new_tokens=seg)
        fixed.pop("seed", None)

        def context(i: int):
            k = starts[i % len(starts)]
            return ids if k == 0 else sequences[:, :ids.shape[1] + k]

        def said(i: int) -> None:
            if progress:
                progress(f"measuring speed-up: pair {i + 1} (speculative and plain decoding of {seg} tokens, no live "
                         f"display; up to {MEASURE_PAIRS} pairs in {MEASURE_BUDGET_S:g} s)…")

        timed = (lambda stats: stats) if whole else _decoding

        def speculative(i: int):
            return timed(generate(target, context(i), draft=draft, should_stop=should_stop, seed=seed + i,
                                  **fixed).stats)

        def plain(i: int):
            return timed(plain_run(target, context(i), seg, sampling, seed + i, should_stop))

        what = (f"whole run of {n} tokens" if whole else
                f"{seg}-token segments of the run's text (starting at its tokens {', '.join(map(str, starts))}; each "
                "timed after its first round: the prefill of its context, which the run never paid again, and the "
                "tokens that round gave, not counted)")
        return measure_speedup(speculative, plain, pairs=MEASURE_PAIRS, budget_s=MEASURE_BUDGET_S, on_pair=said,
                               segment=what)

    def baseline(self, settings: RunSettings, new_tokens: int | None = None, should_stop: StopCheck | None = None,
                 progress: Progress | None = None) -> Baseline | None:
        """Plain decoding of exactly `new_tokens` tokens (default max_new_tokens) with the settings' prompt,
        seed and sampling, measured now (never cached: machine load drifts); None when stopped."""
        n = int(new_tokens or settings.max_new_tokens)
        target, tokenizer = self.load_target(settings.target, progress, should_stop, **_where(settings))
        if progress:
            progress(f"baseline: plain decoding of {n} tokens…")
        sampling, seed = _sampling(settings)
        stats = plain_run(target, self.encode(settings, tokenizer), n, sampling, seed, should_stop)
        if stats.stopped or not stats.new_tokens:
            return None
        return Baseline(stats.new_tokens, stats.time_total, stats=stats)

    # -------------------------------------------------------------- sweep and compare (hfspec.measure.sweep)
    def sweep(self, settings: RunSettings, gammas: Iterable[int], drafts: Iterable[str] | None = None,
              repeats: int = 1, on_point: Callable[[SweepRow], None] | None = None,
              should_stop: StopCheck | None = None, progress: Progress | None = None,
              on_step: Step | None = None) -> SweepResult:
        """Each draft × γ through `hfspec.measure.sweep.sweep`: `repeats` fixed-length runs per point, each beside its
        own plain baseline; `on_step(i, n)` before point i of n, `on_point(row)` after it."""
        gammas = sorted({int(g) for g in gammas})
        check_gammas(gammas, "sweep gammas", auto=False)
        settings.validated()
        specs = list(drafts) if drafts else [settings.draft]
        for spec in specs:
            registry.parse(spec)  # a bad spec fails before any model loads
        where = _where(settings)
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
                  check_greedy=False, on_row=finished, should_stop=should_stop, on_start=started,
                  options=speculative_options(settings))
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
                            seed=seed, repeats=repeats, check_greedy=False, should_stop=should_stop,
                            options=speculative_options(entry))
            if not got:
                break
            row = CompareRow(**got[0].to_dict(), label=label, target=target_source)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        return rows


def _where(settings: RunSettings) -> dict:
    """How the settings' target is loaded: dtype, device and prepack, None where the session's default applies."""
    return {"dtype": settings.dtype or None, "device": settings.device or None, "prepack": settings.prepack or None}


def _check_prepack_request(dtype) -> None:
    """Refuse prepacking before anything loads when it cannot work: no oneDNN prepacked linear in this torch, or
    a dtype asked for that is not float32 (the loaded target's own dtype and device are checked after loading)."""
    if not fast_linear.available():
        raise HfspecError(f"prepack: this torch ({torch.__version__}) has no oneDNN prepacked linear; allowed: "
                          "prepack off (False) with this torch")
    asked = parse_dtype(dtype, role="target")
    if isinstance(asked, torch.dtype) and asked != torch.float32:
        raise HfspecError(f"prepack: got a {str(asked).removeprefix('torch.')} target; allowed: {PREPACK_ALLOWED}")


def _prepack(model) -> str:
    """Prepack the loaded target's linear weights (`hfspec.kernels.fast_linear.prepack`), after checking that it is
    float32 on the CPU; returns the progress line saying how many bytes that added."""
    kinds = sorted({(dtype_str(p.dtype), p.device.type) for p in model.parameters()
                    if p.is_floating_point()})
    if kinds != [("float32", "cpu")]:
        got = " and ".join(f"{dtype} on {device}" for dtype, device in kinds) or "no floating-point weights"
        raise HfspecError(f"prepack: got a target of {got}; allowed: {PREPACK_ALLOWED}")
    needed, free = fast_linear.unpacked_bytes(model), memory.available_bytes()
    if free is not None and needed + memory.OVERHEAD_BYTES > free:
        raise HfspecError(f"prepack: the oneDNN copy of the target's linear weights needs {memory.gib(needed)} more "
                          f"memory but {memory.gib(free)} is available; nothing was prepacked; allowed: prepack off, "
                          "or more free memory")
    added = fast_linear.prepack(model)
    return (f"prepacked the target's linear weights for oneDNN: {added / 2**20:.1f} MiB added (a second fp32 copy "
            "of each)")


def _sampling(settings: RunSettings) -> tuple[dict, int]:
    """The settings' sampling keywords without seed and min_new_tokens (the engine fixes lengths), and the seed."""
    sampling = settings.sampling_kwargs()
    sampling.pop("min_new_tokens", None)
    return sampling, sampling.pop("seed")


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

