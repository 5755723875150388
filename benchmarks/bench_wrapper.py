"""The compiled draft step with and without inductor's C++ wrapper, side by side in one process.

    python benchmarks/bench_wrapper.py --models micro,smollm2 --dtypes float32,bfloat16 --temperatures 0,1 \\
        --repeats 3 --out benchmarks/results/wrapper

Per model and dtype: three drafts of the same target (rtn4 eager lean step, rtn4-compiled without the wrapper,
rtn4-compiled with it; `hfspec.kernels.compiled.CPP_WRAPPER` toggled around each build), then
- the draft's one-token step against the target's (c_time: the target's step and the three drafts' steps on a
  warm cache of 32 tokens timed by the benchmarks' one operator timer, `common.time_operators`, 30 interleaved
  rounds after two warm-up rounds; the median per-round ratio with its interval);
- per temperature, plain `generate` and `hfspec.generate` with each draft at γ "auto", timed by the ruler
  (`common.against_plain`: interleaved, a warm-up round not counted), 128 tokens: tokens per pass, tok/s, the
  ratio to plain `generate` with its interval, the pairs kept and the stability verdict.
First compiles go to HFSPEC_COMPILE_DIR (set a fresh folder to time them; the build seconds are reported).
"""

from __future__ import annotations

import os

import torch
from bench_steps import step_timer
from common import (
    Stopwatch,
    against_plain,
    interval_cell,
    load,
    model_dtypes,
    parser,
    prompt_ids,
    time_operators,
    time_ratio,
    verdict_cell,
    write_results,
)

import hfspec
from hfspec.kernels import compiled


def _build(target, wrapper: bool | None):
    """(draft, seconds): None builds the eager rtn4, True/False the compiled one with/without the wrapper."""
    watch = Stopwatch()  # a build, one-shot
    if wrapper is None:
        return hfspec.make_draft(target, "rtn4"), watch.seconds
    saved, compiled.CPP_WRAPPER = compiled.CPP_WRAPPER, wrapper
    try:
        draft = hfspec.make_draft(target, "rtn4-compiled")
    finally:
        compiled.CPP_WRAPPER = saved
    return draft, watch.seconds


def step_costs(target, drafts: dict) -> dict:
    """{key: c_time Interval}: each draft's one-token step over the target's, 30 interleaved rounds."""
    ids = torch.randint(0, target.config.vocab_size, (1, 33), generator=torch.Generator().manual_seed(0))
    timers = {"target": step_timer(target, ids, 32, 1)} | {w: step_timer(d, ids, 32, 1) for w, d in drafts.items()}
    timings = time_operators(timers, 30, baseline="target")
    return {w: time_ratio(timings, w, "target") for w in drafts}


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
             "| model | dtype | step | build s | c_time | T | α | tokens/pass | tok/s | vs plain generate | interval "
             "| verdict |", "|" + "---|" * 12]
    print("\n".join(lines), flush=True)
    rows = []
    watch = Stopwatch()  # the whole script, one-shot
    for name, folder, dtype in model_dtypes(args):
        target, tokenizer = load(folder, dtype)
        ids = prompt_ids(tokenizer, args.prompt)
        built = {w: _build(target, w) for w in names}
        drafts = {w: d for w, (d, _) in built.items()}
        costs = step_costs(target, drafts)
        for t in (float(x) for x in args.temperatures.split(",")):
            measured = against_plain(target, ids, {w: (d, "auto") for w, d in drafts.items()}, t, n,
                                     args.repeats, args.seed)
            for w in names:
                row = {"model": name, "dtype": dtype, "step": names[w], "build_s": built[w][1],
                       "c_time": costs[w].median, "c_time_low": costs[w].low, "c_time_high": costs[w].high,
                       "temperature": t, **measured[w]}
                rows.append(row)
                line = (f"| {name} | {dtype} | {row['step']} | {row['build_s']:.1f} | {row['c_time']:.3f} "
                        f"[{row['c_time_low']:.3f}–{row['c_time_high']:.3f}] | {t:g} "
                        f"| {row['alpha']:.3f} | {row['tokens_per_pass']:.2f} | {row['tok_s']:.1f} "
                        f"| {row['vs_plain']:.2f}× | {interval_cell(row)} | {verdict_cell(row)} |")
                lines.append(line)
                print(line, flush=True)
        del target, drafts, built
    tail = f"<!-- {watch.seconds:.0f} s; load average at the end {os.getloadavg()[0]:.2f} -->"
    lines.append(tail)
    print(tail)
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
