"""Shared set-up for benchmark scripts: models from ../shared/models or the embedded presets."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

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


def load(path: Path, dtype: str = "float32"):
    from hfspec.loading import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(path), dtype=dtype, progress=False), load_tokenizer(str(path))


def prompt_ids(tokenizer, text: str = "Once upon a time") -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


def timed_rounds(runs: dict, repeats: int, seed: int, warmup: int = 1, baseline: str = "plain"):
    """The one timing loop of the benchmarks: `hfspec.measure.interleaved` over `runs` ({name: fn()}, each making
    the same fixed number of tokens), rotating order per round, `warmup` rounds first and not counted, outliers
    re-measured; each call seeded with seed + round. Returns the `hfspec.measure.Timings`
    (`.ratio(name)`: median per-round ratio over `baseline`, interval, rates; `.verdict()`)."""
    from hfspec.measure import interleaved

    def seeded(fn):
        def run(r):
            torch.manual_seed(seed + r)
            return fn(r)
        return run

    return interleaved({name: seeded(fn) for name, fn in runs.items()}, baseline, repeats, warmup=warmup)


def ruler_columns(timings, name: str, baseline_stats=None) -> dict:
    """A result row's measurement columns by the ruler: the median ratio, its interval, pairs, verdict, flags."""
    from hfspec.measure import implausible
    from hfspec.stats import SpecStats

    r = timings.ratio(name)
    stable, warnings = timings.verdict()
    outs = [k[name].out for k in timings.kept]
    stats = [getattr(o, "stats", o) for o in outs if isinstance(getattr(o, "stats", o), SpecStats)]
    pooled = None
    for s in stats:
        pooled = s if pooled is None else pooled.merge(s)
    return {"vs_plain": r.median, "vs_plain_low": r.low, "vs_plain_high": r.high, "pairs": timings.pairs,
            "outliers": timings.outliers, "stable": stable, "warnings": "; ".join(warnings),
            "flags": "; ".join(implausible(r.median, pooled, baseline_stats)),
            "tok_s": r.tokens_per_second, "plain_tok_s": r.baseline_tokens_per_second}


def against_plain(target, ids: torch.Tensor, runs: dict, temperature: float, tokens: int, repeats: int,
                  seed: int) -> dict:
    """Plain `generate` and `hfspec.generate` with each of `runs` ({key: (draft, gamma)}), timed by the ruler
    (`timed_rounds`: interleaved, a warm-up round not counted, round r seeded with seed + r, outliers re-measured),
    each making exactly `tokens` tokens. Per key: alpha and tokens_per_pass (pooled over kept rounds),
    draft_ms_per_forward (median), tok_s and vs_plain (medians) with vs_plain_low/high, pairs, stable, warnings,
    flags, plain_tok_s."""
    import statistics

    import hfspec
    from hfspec.measure import Sample

    sample = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
              else dict(do_sample=False))

    def plain(r):
        target.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **sample)

    def speculative(key):
        draft, gamma = runs[key]

        def run(r):
            return hfspec.generate(target, ids, draft=draft, gamma=gamma, temperature=temperature,
                                   max_new_tokens=tokens, min_new_tokens=tokens, seed=seed + r)
        return run

    def wall(fn):  # both sides by the wall clock (plain HF generate has no stats of its own)
        def run(r):
            import time

            began = time.perf_counter()
            out = fn(r)
            return Sample(time.perf_counter() - began, tokens, out)
        return run

    timings = timed_rounds({"plain": wall(plain), **{key: wall(speculative(key)) for key in runs}}, repeats, seed)
    out = {}
    for key in runs:
        st = [k[key].out.stats for k in timings.kept]
        out[key] = {"alpha": sum(s.accepted for s in st) / max(1, sum(s.checked for s in st)),
                    "tokens_per_pass": sum(s.new_tokens for s in st) / sum(s.target_passes for s in st),
                    "draft_ms_per_forward": statistics.median(s.time_draft / max(1, s.draft_forwards)
                                                              for s in st) * 1e3,
                    **ruler_columns(timings, key)}
    return out


def machine_name() -> str:
    """A short CPU model string and the core count, for results file names: e.g. "xeon-8480-16c"."""
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
    return "-".join(words[:3] or ["cpu"]) + f"-{os.cpu_count() or 1}c"


def write_results(out: str | None, lines: list[str], rows: list[dict]) -> None:
    """With --out OUT: the markdown table `lines` to OUT.md and `rows` to OUT.json."""
    import json

    if not out:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
