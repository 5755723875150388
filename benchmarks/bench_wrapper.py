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

import os
import statistics
import time

import torch
from common import against_plain, load, model_folders, parser, prompt_ids, write_results

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
                measured = against_plain(target, ids, {w: (d, "auto") for w, d in drafts.items()}, t, n,
                                         args.repeats, args.seed)
                for w in names:
                    row = {"model": name, "dtype": dtype, "step": names[w], "build_s": built[w][1],
                           "c_time": statistics.median(costs[w]), "temperature": t, **measured[w]}
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
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
