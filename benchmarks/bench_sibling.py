"""Sibling drafts: the HF forward of the smaller model vs hfspec's lean step of its float weights (what
`hfspec.generate` now runs for a sibling of a family the lean step reads), side by side.

    python benchmarks/bench_sibling.py                                  # micro/nano + the shape pairs below
    python benchmarks/bench_sibling.py --pairs micro-nano --repeats 5   # the embedded pair only

Per pair and dtype: one decode step on a warm cache of `--context` tokens for the target (1 token and γ + 1),
the sibling's HF forward and its lean step, timed by the benchmarks' one operator timer (`common.time_operators`:
interleaved rounds, the order rotating, two warm-up rounds not counted, outlier rounds re-measured; median ms),
c = sibling step / target step (median per-round ratio [interval]), and the speed-up the cost model's round
price predicts at the α given (E[tokens] / (verify + γ·c)). For the embedded micro/nano pair (real weights) also
end to end: `hfspec.generate` with the sibling's lean step and with its HF forward (`set_attr(sibling, LEAN_STEP, False)`, `hfspec.attrs`)
beside plain `generate`, timed by the ruler (`common.timed_rounds`: interleaved, a warm-up round not counted,
`--repeats` kept rounds, wall clock), median per-round speed-ups over plain [interval]. The last columns give the
rounds kept and the stability verdict of the steps and of the end-to-end runs.
Shape pairs use random weights of the real shapes (../shared/models/shapes.json, or bench_scale's built-in
copy): cost depends on shapes, not values, and α on random weights means nothing, so the α used is `--alpha`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from bench_scale import DEFAULT_SHAPES_FILE, load_shapes, random_model
from bench_steps import step_timer
from common import (
    Interval,
    op_ms,
    time_operators,
    time_ratio,
    timed_rounds,
    verdict_cell,
    verdict_columns,
    wall,
)

import hfspec
from hfspec.attrs import LEAN_STEP, set_attr
from hfspec.decoding.costmodel import expected_tokens
from hfspec.kernels.lean import lean_step_of

REPO = Path(__file__).resolve().parents[1]
PAIRS = {"micro-nano": None, "smollm2-360m/135m": ("smollm2-360m", "smollm2-135m"),
         "qwen2.5-1.5b/0.5b": ("qwen2.5-1.5b", "qwen2.5-0.5b")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default="micro-nano,smollm2-360m/135m", help=f"comma-separated: {', '.join(PAIRS)}")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.7, help="acceptance rate for the shape pairs' prediction")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3, help="end-to-end pairs of runs (micro/nano)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--shapes-file", default=str(DEFAULT_SHAPES_FILE))
    return p.parse_args(argv)


def predicted(alpha: float, gamma: int, verify: float, c: float) -> float:
    return expected_tokens(gamma, lambda j: alpha) / (verify + gamma * c)


def step_costs(args, target, sibling) -> dict:
    """Milliseconds per step (median) of the target (1 token: t1, γ + 1: tv), the sibling's HF forward (hf) and
    its lean step (lean); the ratios to t1 as intervals (`ratio`); the verdict (`verdict`)."""
    vocab = target.config.vocab_size
    ids = torch.randint(0, vocab, (1, args.context + args.gamma + 1), generator=torch.Generator().manual_seed(0))
    lean = lean_step_of(sibling)
    if lean is None:
        raise SystemExit(f"{type(sibling).__name__}: no lean step for this sibling")
    timers = {"t1": step_timer(target, ids, args.context, 1), "tv": step_timer(target, ids, args.context, args.gamma + 1),
              "hf": step_timer(sibling, ids, args.context, 1), "lean": step_timer(lean, ids, args.context, 1)}
    timings = time_operators(timers, args.steps, baseline="t1")
    out = {k: op_ms(timings, k).median for k in timers}
    out["ratio"] = {k: time_ratio(timings, k, "t1") for k in ("tv", "hf", "lean")}
    out["verdict"] = verdict_columns(timings)
    return out


def end_to_end(args, target, sibling, ids) -> dict:
    """{method: (median per-round speed-up over plain `generate` as an Interval, pooled stats)}, and the verdict."""
    n = 96
    kw = dict(max_new_tokens=n, min_new_tokens=n)

    def plain(r):  # timed_rounds seeds torch with 21 + r before it
        return target.generate(ids, do_sample=True, temperature=1.0, top_k=0, **kw)

    def ours(method):
        def run(r):
            set_attr(sibling, LEAN_STEP, method == "lean")
            return hfspec.generate(target, ids, draft=sibling, gamma=args.gamma, temperature=1.0, seed=21 + r, **kw)
        return run

    try:
        timings = timed_rounds({"plain": wall(plain, n), "lean": wall(ours("lean"), n), "hf": wall(ours("hf"), n)},
                               args.repeats, 21)
    finally:
        set_attr(sibling, LEAN_STEP, True)
    out = {}
    for m in ("lean", "hf"):
        stats = None
        for k in timings.kept:
            stats = k[m].out.stats if stats is None else stats.merge(k[m].out.stats)
        r = timings.ratio(m)
        out[m] = (Interval(r.median, r.low, r.high), stats)
    out["verdict"] = verdict_columns(timings)
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes, source = load_shapes(args.shapes_file)
    load = f"{os.getloadavg()[0]:.2f}"
    print(f"<!-- threads {args.threads}, context {args.context}, γ {args.gamma}, median of {args.steps} interleaved "
          f"steps after two warm-up rounds; ratios: median of per-round ratios [interval]; shapes from {source}; "
          f"load average at start {load} -->")
    print("| pair | dtype | target 1 token ms | verify / step | sibling HF forward ms | c (HF) | sibling lean ms "
          "| c (lean) | predicted × HF → lean (α) | steps verdict | end to end × HF → lean (α measured) "
          "| end-to-end verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pair in args.pairs.split(","):
        if pair not in PAIRS:
            raise SystemExit(f"--pairs: unknown {pair!r}; allowed: {', '.join(PAIRS)}")
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            ids, alpha, e2e, e2e_verdict = None, args.alpha, "–", "–"
            if PAIRS[pair] is None:
                from transformers import AutoModelForCausalLM, AutoTokenizer
                folder = REPO / "presets" / "models"
                target = AutoModelForCausalLM.from_pretrained(folder / "micro", dtype=dtype).eval()
                sibling = AutoModelForCausalLM.from_pretrained(folder / "nano", dtype=dtype).eval()
                ids = AutoTokenizer.from_pretrained(folder / "micro")("The attention", return_tensors="pt").input_ids
            else:
                big, small = PAIRS[pair]
                target, sibling = random_model(shapes[big], dtype), random_model(shapes[small], dtype)
            ms = step_costs(args, target, sibling)
            ratio = ms["ratio"]
            verify, c_hf, c_lean = ratio["tv"].median, ratio["hf"].median, ratio["lean"].median
            if ids is not None:
                runs = end_to_end(args, target, sibling, ids)
                s = runs["lean"][1]
                alpha = s.accepted / max(1, s.checked)
                e2e = f"{runs['hf'][0].cell()} → {runs['lean'][0].cell()} ({alpha:.2f})"
                e2e_verdict = verdict_cell(runs["verdict"])
            print(f"| {pair} | {dtype_name} | {ms['t1']:.1f} | {ratio['tv'].cell()} | {ms['hf']:.2f} "
                  f"| {ratio['hf'].cell()} | {ms['lean']:.2f} | {ratio['lean'].cell()} "
                  f"| {predicted(alpha, args.gamma, verify, c_hf):.2f} → "
                  f"{predicted(alpha, args.gamma, verify, c_lean):.2f} ({alpha:.2f}) | {verdict_cell(ms['verdict'])} "
                  f"| {e2e} | {e2e_verdict} |", flush=True)
            del target, sibling
    print(f"<!-- load average at the end {os.getloadavg()[0]:.2f} -->")


if __name__ == "__main__":
    sys.exit(main())
