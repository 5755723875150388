"""Shared set-up for benchmark scripts: models from ../shared/models or the embedded presets, and the one ruler.

Every timing in benchmarks/bench_*.py goes through here (tests/test_benchmarks_harness.py checks that no script
reads a clock itself): whole decodes compared with each other through `timed_rounds` / `against_plain`
(hfspec.measure.interleaved), single operators (a forward step, one F.linear) through `time_operators` (the same
interleaved rounds, medians with intervals and the same stability verdict), and one-shot durations that compare
nothing (a build, a whole script) through `Stopwatch`. torch is imported lazily: bench_scale's parent process
stays free of it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "models"
PAIRS = {
    "micro": ROOT / "presets" / "models" / "micro",
    "stories260K": SHARED / "stories260K",
    "smollm2": Path.home() / ".cache" / "hfspec-models" / "smollm2-135m-instruct",  # get-smollm2.sh's default
    # SmolLM2 moved off the rtn4 grid by benchmarks/offgrid.py (seed 0): the honest target
    "smollm2-offgrid": Path.home() / ".cache" / "hfspec-models" / "smollm2-135m-instruct-offgrid",
}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--models", default="micro,stories260K,smollm2",
                   help="comma-separated: micro, stories260K, smollm2 (SmolLM2-135M from get-smollm2.sh), or folders")
    p.add_argument("--smollm2", default=str(PAIRS["smollm2"]), help="folder made by ../shared/models/get-smollm2.sh")
    p.add_argument("--smollm2-offgrid", default=str(PAIRS["smollm2-offgrid"]),
                   help="that folder moved off the grid by benchmarks/offgrid.py")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    return p


def model_folders(args) -> dict[str, Path]:
    PAIRS["smollm2"] = Path(args.smollm2)
    PAIRS["smollm2-offgrid"] = Path(args.smollm2_offgrid)
    out = {}
    for name in args.models.split(","):
        path = PAIRS.get(name, Path(name))
        if (path / "config.json").exists():
            out[name] = path
        else:
            print(f"# skipping {name}: {path} not found")
    return out


def model_dtypes(args):
    """(name, folder, dtype) for each model of `--models` that is found and each dtype of `--dtypes` (micro, trained
    in fp32: float32 only)."""
    for name, folder in model_folders(args).items():
        for dtype in (["float32"] if name == "micro" else args.dtypes.split(",")):
            yield name, folder, dtype


def load(path: Path, dtype: str = "float32"):
    """(model, tokenizer); a dtype written `float32+prepack` is fp32 with `hfspec.kernels.fast_linear.prepack`
    (oneDNN's blocked copy of every linear weight); `float32+rows` is plain fp32 (the caller routes its linears
    through `hfspec.kernels.verify_linear.installed`)."""
    import torch

    from hfspec.io.loading import load_model, load_tokenizer
    from hfspec.kernels import fast_linear

    torch.manual_seed(0)
    model = load_model(str(path), dtype=dtype.split("+")[0], progress=False)
    if dtype.endswith("+prepack"):
        fast_linear.prepack(model)
    return model, load_tokenizer(str(path))


def prompt_ids(tokenizer, text: str = "Once upon a time"):
    return tokenizer(text, return_tensors="pt").input_ids


def timed_rounds(runs: dict, repeats: int, seed: int, warmup: int = 1, baseline: str = "plain", strata=None):
    """The one timing loop of the benchmarks: `hfspec.measure.interleaved` over `runs` ({name: fn()}, each making
    the same fixed number of tokens), rotating order per round, `warmup` rounds first and not counted, outliers
    re-measured; each call seeded with seed + round; `strata(round)`: the round's prompt where rounds take several in
    turn (outliers and intervals judged within prompts). Returns the `hfspec.measure.Timings`
    (`.ratio(name)`: median per-round ratio over `baseline`, interval, rates; `.verdict()`)."""
    import torch

    from hfspec.measure import interleaved

    def seeded(fn):
        def run(r):
            torch.manual_seed(seed + r)
            return fn(r)
        return run

    return interleaved({name: seeded(fn) for name, fn in runs.items()}, baseline, repeats, warmup=warmup,
                       strata=strata)


def ruler_columns(timings, name: str, baseline_stats=None) -> dict:
    """A result row's measurement columns by the ruler: the median ratio, its interval, pairs, verdict, flags."""
    from hfspec.decoding.stats import SpecStats
    from hfspec.measure import implausible

    r = timings.ratio(name)
    stable, warnings = timings.verdict()
    outs = [k[name].out for k in timings.kept]
    stats = [getattr(o, "stats", o) for o in outs if isinstance(getattr(o, "stats", o), SpecStats)]
    pooled = None
    for s in stats:
        pooled = s if pooled is None else pooled.merge(s)
    by_prompt = {}
    if timings.kept_strata and len(set(timings.kept_strata)) > 1:
        from hfspec.measure.stability import strata_medians

        ratios = [a / b if b else 0.0 for a, b in zip(r.rates, r.baseline_rates, strict=True)]
        by_prompt = {"vs_plain_by_prompt": [m for _, m in sorted(strata_medians(ratios, timings.kept_strata).items())]}
    return {**by_prompt, "vs_plain": r.median, "vs_plain_low": r.low, "vs_plain_high": r.high, "pairs": timings.pairs,
            "outliers": timings.outliers, "stable": stable, "warnings": "; ".join(warnings),
            "flags": "; ".join(implausible(r.median, pooled, baseline_stats)),
            "tok_s": r.tokens_per_second, "plain_tok_s": r.baseline_tokens_per_second}


def against_plain(target, ids, runs: dict, temperature: float, tokens: int, repeats: int,
                  seed: int) -> dict:
    """Plain `generate` and `hfspec.generate` with each of `runs` ({key: (draft, gamma)} or (draft, gamma, more
    keywords for hfspec.generate, e.g. {"tree": "auto"})), timed by the ruler
    (`timed_rounds`: interleaved, a warm-up round not counted, round r seeded with seed + r, outliers re-measured),
    each making exactly `tokens` tokens. Per key: alpha and tokens_per_pass (pooled over kept rounds),
    draft_ms_per_forward (median), tok_s and vs_plain (medians) with vs_plain_low/high, pairs, stable, warnings,
    flags, plain_tok_s, round_rates (tokens/s of each kept round: `paired` compares two keys round by round).
    `ids`: one prompt, or a list of prompts that the rounds take in turn (round r: prompt r mod their number, the
    same for every method of the round, so per-round ratios compare like with like)."""
    import statistics

    import hfspec

    sample = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
              else dict(do_sample=False))

    import torch

    from hfspec.kernels import lean_target, verify_linear

    prompts = ids if isinstance(ids, list) else [ids]

    def plain(r):
        target.generate(prompts[r % len(prompts)], max_new_tokens=tokens, min_new_tokens=tokens, **sample)

    def plain_rows(r):  # plain decoding with every linear of 1-32 rows through the few-row kernel
        with verify_linear.installed(target, one_row=True):
            plain(r)

    lean = lean_target.built(target)[0] if lean_target.takes(target) else None

    def plain_lean(r):  # plain decoding, one token a pass, through the lean target (its native step where it runs)
        decoder = lean
        generator = torch.Generator().manual_seed(seed + r)
        cache = decoder.hfspec_new_cache()
        with torch.no_grad():
            logits = decoder.logits(prompts[r % len(prompts)], None, None, cache, 1)
            for _ in range(tokens - 1):
                last = logits[:, -1].float()
                token = (torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=generator)
                         if temperature > 0 else last.argmax(-1, keepdim=True))
                logits = decoder.logits(token, None, None, cache, 1)

    # where a speculative decode's verify passes take the few-row kernel, plain decoding through that kernel too:
    # the kernel also speeds up one-row products on some CPUs, and "vs plain+kernel" is speculation's own share;
    # where they take the lean target, plain decoding through it too ("vs plain+lean": the same, for those passes)
    also = {"plain+kernel": wall(plain_rows, tokens)} if verify_linear.active_for(target) else {}
    if lean is not None:
        also["plain+lean"] = wall(plain_lean, tokens)

    def speculative(key):
        draft, gamma, *more = runs[key]
        kwargs = dict(more[0]) if more else {}
        env = kwargs.pop("env", {})  # environment for this method's runs alone (e.g. HFSPEC_COST_PROFILE=off)

        def run(r):
            saved = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
            try:
                return hfspec.generate(target, prompts[r % len(prompts)], draft=draft, gamma=gamma,
                                       temperature=temperature, max_new_tokens=tokens, min_new_tokens=tokens,
                                       seed=seed + r, **kwargs)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
        return run

    # both sides by the wall clock (plain HF generate has no stats of its own)
    timings = timed_rounds({"plain": wall(plain, tokens), **also,
                            **{key: wall(speculative(key), tokens) for key in runs}},
                           repeats, seed, strata=(lambda r: r % len(prompts)) if len(prompts) > 1 else None)
    out = {}
    for key in runs:
        st = [k[key].out.stats for k in timings.kept]
        out[key] = {"alpha": sum(s.accepted for s in st) / max(1, sum(s.checked for s in st)),
                    "tokens_per_pass": sum(s.new_tokens for s in st) / sum(s.target_passes for s in st),
                    "draft_ms_per_forward": statistics.median(s.time_draft / max(1, s.draft_forwards)
                                                              for s in st) * 1e3,
                    "round_rates": [k[key].rate for k in timings.kept],  # tokens/s per kept round, for pairing
                    "round_strata": timings.kept_strata,  # each kept round's prompt (None: one prompt)
                    "plain_round_rates": [k["plain"].rate for k in timings.kept],
                    **ruler_columns(timings, key)}
        for base, name in (("plain+kernel", "kernel"), ("plain+lean", "lean")):
            if base in also:  # speculation's own share: over plain decoding through the same path, round by round
                share = paired(out[key], {"round_rates": [k[base].rate for k in timings.kept]})
                out[key].update({f"vs_plain_{name}": share.median, f"vs_plain_{name}_low": share.low,
                                 f"vs_plain_{name}_high": share.high,
                                 f"plain_{name}_tok_s": statistics.median(k[base].rate for k in timings.kept)})
    return out


def paired(a: dict, b: dict) -> Interval:
    """Two `against_plain` results of one call, a over b: the per-round ratio of their tokens/s (both ran in every
    round, so the machine's drift between rounds cancels), median and interval; over several prompts, judged within
    prompts (`hfspec.measure.stability.stratified_median`)."""
    from hfspec.measure.stability import stratified_median

    pairs = [(x / y, s) for x, y, s in zip(a["round_rates"], b["round_rates"], a.get("round_strata") or
                                            [None] * len(a["round_rates"]), strict=True) if y > 0]
    if not pairs:
        return Interval.of([])
    figure, low, high, _ = stratified_median([v for v, _ in pairs], [s for _, s in pairs])
    return Interval(figure, low, high)


# ------------------------------------------------------------------------------------------------ clocks
def wall(fn: Callable[[int], object], tokens: int | Callable[[object], int] = 1) -> Callable[[int], object]:
    """`fn(round)` for `timed_rounds`, timed by the wall clock: an `hfspec.measure.Sample` of `tokens` tokens (a
    number, or a function of what fn returned) holding fn's result. What both sides of a comparison use when one
    side (transformers' `generate`) has no stats of its own."""
    from hfspec.measure import Sample

    def run(r: int):
        began = time.perf_counter()
        out = fn(r)
        took = time.perf_counter() - began
        return Sample(took, tokens(out) if callable(tokens) else tokens, out)
    return run


def own_clock(fn: Callable[[int], object]) -> Callable[[int], object]:
    """`fn(round)` returning an hfspec output (`.stats`, `.sequences`), for `timed_rounds`, timed by its own clock
    (`stats.time_total` over `stats.new_tokens`, as `hfspec sweep` times) and holding the output."""
    from hfspec.measure import Sample

    def run(r: int):
        out = fn(r)
        return Sample(out.stats.time_total, out.stats.new_tokens, out)
    return run


class Stopwatch:
    """A one-shot duration that compares nothing (building a draft, a whole script): `Stopwatch().seconds`.
    Comparisons never use it: decodes go through `timed_rounds`, operators through `time_operators`."""

    def __init__(self) -> None:
        self.began = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.began


def once(fn: Callable[[], object]) -> tuple[float, object]:
    """(seconds, result) of one call of fn: a one-shot duration (see `Stopwatch`)."""
    watch = Stopwatch()
    out = fn()
    return watch.seconds, out


class Operator:
    """One operator call for `time_operators`: `fn()` is timed, then `reset()` runs untimed (e.g. a KV cache
    cropped back). Its result is not kept."""

    def __init__(self, fn: Callable[[], object], reset: Callable[[], object] | None = None) -> None:
        self.fn, self.reset = fn, reset

    def __call__(self, r: int = 0):
        from hfspec.measure import Sample

        began = time.perf_counter()
        self.fn()
        took = time.perf_counter() - began
        if self.reset is not None:
            self.reset()
        return Sample(took, 1)


def time_operators(ops: dict, repeats: int, baseline: str | None = None, warmup: int = 2,
                   budget_s: float | None = None):
    """The one timer of single operators (a forward step, one F.linear call): `hfspec.measure.interleaved` over
    `ops` ({name: Operator or fn()}), the order rotating per round, `warmup` rounds first and not counted, a round
    whose seconds for any operator (or ratio to `baseline`, default the first) is far from the others re-measured.
    Returns `hfspec.measure.Timings` whose `ratio(name)` is the per-round ratio of seconds over the baseline's
    (what `time_ratio` gives); read it with `op_ms`, `time_ratio` and `verdict_columns` (the same stability verdict
    as every decode comparison, its intervals read as time ratios)."""
    import dataclasses

    from hfspec.measure import interleaved

    runs = {name: op if isinstance(op, Operator) else Operator(op) for name, op in ops.items()}
    timings = interleaved(runs, baseline if baseline is not None else next(iter(runs)), repeats, warmup=warmup,
                          budget_s=budget_s)
    return _operator_timings(**{f.name: getattr(timings, f.name) for f in dataclasses.fields(timings)})


def _operator_timings(**fields):
    """`hfspec.measure.Timings` whose `ratio(name)` is a ratio of seconds over the baseline's (c = draft step /
    target step) rather than of rates, so that the verdict's intervals read as the tables' ratios do."""
    import statistics

    from hfspec.measure import Ratio, Timings, median_interval

    class OperatorTimings(Timings):
        def ratio(self, name: str) -> Ratio:
            kept = self.kept
            ratios = [k[name].seconds / k[self.baseline].seconds for k in kept if k[self.baseline].seconds > 0]
            if not ratios:
                return Ratio(0.0, 0.0, 0.0, 0.0, None, [], [])
            low, high, coverage = median_interval(ratios)
            return Ratio(statistics.median(ratios), low, high, coverage,
                         statistics.stdev(ratios) if len(ratios) > 1 else None, [k[name].rate for k in kept],
                         [k[self.baseline].rate for k in kept])

    return OperatorTimings(**fields)


class Interval(tuple):
    """(median, low, high): a median over the kept rounds and its order-statistics interval (about 95%; the range
    under six rounds), `hfspec.measure.median_interval`."""

    def __new__(cls, median: float, low: float, high: float):
        return super().__new__(cls, (median, low, high))

    median = property(lambda self: self[0])
    low = property(lambda self: self[1])
    high = property(lambda self: self[2])

    @classmethod
    def of(cls, values) -> Interval:
        import statistics

        from hfspec.measure import median_interval

        values = list(values)
        if not values:
            return cls(float("nan"), float("nan"), float("nan"))
        low, high, _ = median_interval(values)
        return cls(statistics.median(values), low, high)

    def cell(self, fmt: str = ".2f", unit: str = "") -> str:
        """"1.23× [1.10–1.40]"."""
        return f"{self.median:{fmt}}{unit} [{self.low:{fmt}}–{self.high:{fmt}}]"

    def span(self, fmt: str = ".2f") -> str:
        """"1.10–1.40"."""
        return f"{self.low:{fmt}}–{self.high:{fmt}}"


def op_ms(timings, name: str) -> Interval:
    """An operator's milliseconds per call over the kept rounds: median and interval."""
    return Interval.of(k[name].seconds / max(1, k[name].tokens) * 1e3 for k in timings.kept)


def time_ratio(timings, name: str, over: str) -> Interval:
    """The per-round ratio of seconds, name over `over` (c = draft step / target step), over the kept rounds."""
    return Interval.of(k[name].seconds / k[over].seconds for k in timings.kept if k[over].seconds > 0)


def rate_ratio(timings, name: str, over: str) -> Interval:
    """The per-round ratio of tokens/s, name over `over` (a speed-up), over the kept rounds: for two methods
    neither of which is the baseline (`Timings.ratio` gives it against the baseline)."""
    return Interval.of(k[name].rate / k[over].rate for k in timings.kept if k[over].rate > 0)


def verdict_columns(timings) -> dict:
    """The ruler's verdict of interleaved timings as result columns: pairs (kept rounds), outliers, stable,
    warnings."""
    stable, warnings = timings.verdict()
    return {"pairs": timings.pairs, "outliers": timings.outliers, "stable": stable, "warnings": "; ".join(warnings)}


def verdict_cell(row: dict) -> str:
    """A table cell for a row's verdict (`ruler_columns` / `verdict_columns`): "implausible: …", "unstable (n
    pairs): why" or "stable (n pairs)" (with a busy machine named)."""
    pairs = f"{row.get('pairs', 0)} pair{'s' if row.get('pairs', 0) != 1 else ''}"
    if row.get("flags"):
        return row["flags"]
    if row.get("stable") is False:
        return f"unstable ({pairs}): " + row.get("warnings", "").removeprefix("unstable: ")
    return f"stable ({pairs})" + (f"; {row['warnings']}" if row.get("warnings") else "")


def interval_cell(row: dict, key: str = "vs_plain", fmt: str = ".2f") -> str:
    """"low–high" of `row[key + '_low']` and `row[key + '_high']` ("–" when absent)."""
    low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
    return "–" if low is None or high is None else f"{low:{fmt}}–{high:{fmt}}"


def machine_name() -> str:
    """A short CPU model string, the vector ISA where it is not AVX-512 (a VM's "AMD EPYC" may be either), and the
    core count, for results file names: e.g. "xeon-8480-16c", "epyc-avx2-2c"."""
    import os
    import platform
    import re

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1]
                    break
    except OSError:
        pass
    model = re.sub(r"\((R|TM|tm|r)\)|CPU|Processor|@.*|\d+-Core", " ", model)
    words = [w.lower() for w in re.findall(r"[A-Za-z0-9]+", model) if w.lower() not in ("intel", "amd", "core")]
    import torch

    isa = torch.backends.cpu.get_cpu_capability().lower()
    words = (words[:3] or ["cpu"]) + ([isa.replace(" ", "")] if isa and not isa.startswith("avx512") else [])
    return "-".join(words) + f"-{os.cpu_count() or 1}c"


def write_results(out: str | None, lines: list[str], rows: list[dict]) -> None:
    """With --out OUT: the markdown table `lines` to OUT.md and `rows` to OUT.json."""
    import json

    if not out:
        return
    path = Path(out)
    if path.suffix in (".md", ".json"):  # OUT given with one of the two suffixes: the other beside it
        path = path.with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    # the suffixes are appended, not swapped: a name with a dot of its own (`...-1.7b`) keeps its tail
    path.with_name(path.name + ".md").write_text("\n".join(lines) + "\n")
    path.with_name(path.name + ".json").write_text(json.dumps(rows, indent=1) + "\n")
