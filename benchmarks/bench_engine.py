"""Plain `generate`, HF assisted generation (same γ, constant schedule) and hfspec on the same pair.

    python benchmarks/bench_engine.py --models stories260K,smollm2 --draft rtn4 --gamma 4
    python benchmarks/bench_engine.py --models micro,smollm2 --draft rtn4,rtn4-compiled --dtypes float32,bfloat16

Reports tokens/s and ratios measured side by side in one process by the ruler (`hfspec.measure.benchmark.compare_methods`:
interleaved rounds, a warm-up round not counted, medians of per-round ratios with their interval, outliers
re-measured), the pairs kept and the stability verdict, and the share of hfspec's time spent outside model
forwards.
"""

from __future__ import annotations

import os

import torch
from common import load, model_folders, parser, prompt_ids, verdict_cell

import hfspec
from hfspec.measure.benchmark import compare_methods


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--draft", default="rtn4", help="one draft spec, or several separated by commas")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--dtypes", default="float32", help="comma-separated dtypes the target is loaded in")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"<!-- threads {args.threads}, {args.max_new_tokens} tokens, γ {args.gamma}, median of {args.repeats} "
          f"interleaved repeats, load average at start {os.getloadavg()[0]:.2f} -->")
    print("| model | dtype | draft | T | plain tok/s | HF assisted tok/s | hfspec tok/s | hfspec / plain | interval "
          "| hfspec / assisted | α | time outside forwards | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, folder), dtype in ((m, d) for m in model_folders(args).items() for d in args.dtypes.split(",")):
        target, tokenizer = load(folder, dtype)
        drafts = {spec: hfspec.make_draft(target, spec) for spec in args.draft.split(",")}
        ids = prompt_ids(tokenizer, args.prompt)
        for temperature, (spec, draft) in ((float(t), d) for t in args.temperatures.split(",") for d in drafts.items()):
            r = compare_methods(target, draft, ids, gamma=args.gamma, temperature=temperature,
                                max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed)
            tps = r["tokens_per_second"]
            low, high = r["speedup_interval"]["hfspec"]
            verdict = verdict_cell({"pairs": r["pairs"], "stable": r["stable"], "warnings": "; ".join(r["warnings"]),
                                    "flags": "; ".join(r["flags"])})
            print(f"| {name} | {dtype} | {spec} | {temperature:g} | {tps['plain generate']:.1f} | {tps['HF assisted']:.1f} "
                  f"| {tps['hfspec']:.1f} | {r['speedup_vs_plain']['hfspec']:.2f}× | {low:.2f}–{high:.2f} "
                  f"| {r['hfspec_vs_assisted']:.2f}× | {r['alpha']:.3f} | {r['hfspec_time_split']['other']:.1%} "
                  f"| {verdict} |", flush=True)
    print(f"<!-- load average at the end {os.getloadavg()[0]:.2f} -->")


if __name__ == "__main__":
    main()
