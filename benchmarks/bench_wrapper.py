"""The compiled draft step with and without inductor's C++ wrapper, side by side in one process.

    python benchmarks/bench_wrapper.py --models micro,smollm2 --dtypes float32,bfloat16 --temperatures 0,1 \\
        --repeats 3 --out benchmarks/results/wrapper

Per model and dtype: three drafts of the same target (rtn4 eager lean step, rtn4-compiled without the wrapper,
rtn4-compiled with it; `hfspec.drafts.compiled.CPP_WRAPPER` toggled around each build), then
- the draft's one-token step against the target's (c_time, `measure_cost`, the three interleaved, median of 5);
- per temperature, plain `generate` and `hfspec.generate` with each draft at γ "auto", interleaved per repeat
  (repeat 0 a warm-up, not counted), 128 tokens: tokens per pass, tok/s, the ratio to plain `generate`.
First compiles go to HFSPEC_COMPILE_DIR (set a fresh folder to time them; the build seconds are reported).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
from common import load, model_folders, parser, prompt_ids

import hfspec
from hfspec.drafts import compiled
from hfspec.drafts.cost import measure_cost


def _build(target, wrapper: bool | None):
    """(draft, seconds): None builds the eager rtn4, True/False the compiled one with/without the wrapper."""
    began = time.perf_counter()
    if wrapper is None:
        return hfspec.make_draft(target, "rtn4"), time.perf_counter() - began
    saved, compiled.CPP_WRAPPER = compiled.CPP_WRAPPER, wrapper
    try:
        draft = hfspec.make_draft(target, "rtn4-compiled")
    finally:
        compiled.CPP_WRAPPER = saved
    return draft, time.perf_counter() - began


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2")
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes for models other than micro")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n = args.max_new_tokens
    names = {None: "eager", False: "compiled", True: "compiled + C++ wrapper"}
    lines = [f"<!-- threads {args.threads}, {n} tokens, rtn4, γ auto, median of {args.repeats} interleaved repeats "
             f"after a warm-up; load average at start {os.getloadavg()[0]:.2f} -->",
             "| model | dtype | step | build s | c_time | T | α | tokens/pass | tok/s | vs plain generate |",
             "|" + "---|" * 10]
    print("\n".join(lines), flush=True)
    rows = []
    began_all = time.perf_counter()
    for name, folder in model_folders(args).items():
        for dtype in (["float32"] if name == "micro" else args.dtypes.split(",")):
            target, tokenizer = load(folder, dtype)
            ids = prompt_ids(tokenizer, args.prompt)
            built = {w: _build(target, w) for w in names}
            drafts = {w: d for w, (d, _) in built.items()}
            costs = {w: [] for w in names}
            for r in range(5):
                for w, d in drafts.items():
                    costs[w].append(measure_cost(target, d, repeats=30, seed=r).c_time)
            for t in (float(x) for x in args.temperatures.split(",")):
                sample = dict(do_sample=True, temperature=t, top_k=0, top_p=1.0) if t > 0 else dict(do_sample=False)
                seconds = {m: [] for m in ["plain", *names]}
                stats = {w: [] for w in names}
                for r in range(args.repeats + 1):
                    for m in seconds:
                        torch.manual_seed(args.seed + r)
                        began = time.perf_counter()
                        if m == "plain":
                            target.generate(ids, max_new_tokens=n, min_new_tokens=n, **sample)
                        else:
                            out = hfspec.generate(target, ids, draft=drafts[m], gamma="auto", temperature=t,
                                                  max_new_tokens=n, min_new_tokens=n, seed=args.seed + r)
                        took = time.perf_counter() - began
                        if r:
                            seconds[m].append(took)
                            if m != "plain":
                                stats[m].append(out.stats)
                plain = statistics.median(seconds["plain"])
                for w in names:
                    st = stats[w]
                    row = {"model": name, "dtype": dtype, "step": names[w], "build_s": built[w][1],
                           "c_time": statistics.median(costs[w]), "temperature": t,
                           "alpha": sum(s.accepted for s in st) / max(1, sum(s.checked for s in st)),
                           "tokens_per_pass": sum(s.new_tokens for s in st) / sum(s.target_passes for s in st),
                           "tok_s": n / statistics.median(seconds[w]), "plain_tok_s": n / plain,
                           "vs_plain": plain / statistics.median(seconds[w])}
                    rows.append(row)
                    line = (f"| {name} | {dtype} | {row['step']} | {row['build_s']:.1f} | {row['c_time']:.3f} | {t:g} "
                            f"| {row['alpha']:.3f} | {row['tokens_per_pass']:.2f} | {row['tok_s']:.1f} "
                            f"| {row['vs_plain']:.2f}× |")
                    lines.append(line)
                    print(line, flush=True)
            del target, drafts, built
    tail = f"<!-- {time.perf_counter() - began_all:.0f} s; load average at the end {os.getloadavg()[0]:.2f} -->"
    lines.append(tail)
    print(tail)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
