"""Is a draft's step bound by the bytes it reads? Each draft's one-token step, timed where decoding meets it.

    python benchmarks/bench_draft_memory.py --models smollm2-offgrid --dtypes bfloat16 \\
        --drafts gptq4-compiled,int8-compiled --out benchmarks/results/draft-memory

Per model, dtype and draft, on a warm KV cache of `--context` tokens (cropped back after each call, untimed):

- **after a pass**: one draft step right after a target pass over `--width` positions (untimed), as a round's first
  draft step follows the verify pass that ended the round before;
- **back to back**: `--burst` draft steps in a row, per step, as a round's later steps run (the first of them
  after whatever the interleaving ran before it);
- the draft's bytes (`hfspec.drafts.weight_bytes`) over each time: the rate at which the step reads them.

Timed by the benchmarks' one operator timer (`common.time_operators`: interleaved rounds, the order rotating, two
warm-up rounds not counted, outlier rounds re-measured), medians with their interval [low–high]. Where a step is
bound by its bytes, a draft of twice the bytes takes about twice as long whatever its kernel, both columns read
about the same rate, and a faster kernel for its products changes little (docs/trees.md says where that was found).
"""

from __future__ import annotations

import torch
from bench_steps import step_timer
from common import (
    Operator,
    load,
    model_dtypes,
    op_ms,
    parser,
    time_operators,
    verdict_cell,
    verdict_columns,
    write_results,
)

import hfspec
from hfspec.drafts import weight_bytes


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="smollm2-offgrid")
    p.add_argument("--dtypes", default="bfloat16", help="target dtypes (micro: float32 only)")
    p.add_argument("--drafts", default="gptq4-compiled,int8-compiled", help="comma-separated draft specs")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=5, help="positions of the target pass before a cold draft step")
    p.add_argument("--burst", type=int, default=8, help="draft steps in a row for the back-to-back figure")
    p.add_argument("--steps", type=int, default=20, help="interleaved rounds per model and dtype")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    specs = args.drafts.split(",")
    lines = [f"threads {args.threads}, context {args.context}, a target pass of {args.width} positions before each "
             f"'after a pass' step, {args.burst} steps a burst, median of {args.steps} interleaved rounds (ms) "
             "[interval]; GB/s: the draft's bytes over the step's median time", "",
             "| model | dtype | draft | MB | after a pass, ms | GB/s | back to back, ms a step | GB/s | target step, ms "
             "| target pass, ms |", "|" + "---|" * 10]
    print("\n".join(lines), flush=True)
    rows = []
    for name, folder, dtype in model_dtypes(args):
        target, _ = load(folder, dtype)
        ids = torch.randint(0, target.config.vocab_size, (1, args.context + args.width),
                            generator=torch.Generator().manual_seed(0))
        evict = step_timer(target, ids, args.context, args.width)  # its own cache: a target pass, cropped back
        timers = {"target": step_timer(target, ids, args.context, 1),
                  "pass": step_timer(target, ids, args.context, args.width)}
        drafts = {spec: hfspec.make_draft(target, spec) for spec in specs}
        for spec, draft in drafts.items():
            one = step_timer(draft, ids, args.context, 1)

            def cold(one=one, evict=evict):
                one.reset()
                evict()  # untimed (a target pass, its cache cropped back): the caches hold the target's weights

            def burst(one=one):
                for _ in range(args.burst):
                    one.fn()
                    one.reset()

            timers[f"{spec} cold"] = Operator(one.fn, cold)
            timers[f"{spec} hot"] = Operator(burst)
        timings = time_operators(timers, args.steps, baseline="target")
        verdict = verdict_cell(verdict_columns(timings))
        target_ms, pass_ms = op_ms(timings, "target"), op_ms(timings, "pass")
        for spec, draft in drafts.items():
            size = weight_bytes(draft)
            cold_ms, hot = op_ms(timings, f"{spec} cold"), op_ms(timings, f"{spec} hot")
            hot_ms = hot.median / args.burst
            row = {"model": name, "dtype": dtype, "draft": spec, "bytes": size, "cold_ms": cold_ms.median,
                   "cold_low": cold_ms.low, "cold_high": cold_ms.high, "hot_ms": hot_ms,
                   "hot_low": hot.low / args.burst, "hot_high": hot.high / args.burst,
                   "target_ms": target_ms.median, "pass_ms": pass_ms.median, **verdict_columns(timings)}
            rows.append(row)
            line = (f"| {name} | {dtype} | {spec} | {size / 1e6:.1f} | {cold_ms.median:.2f} [{cold_ms.low:.2f}–"
                    f"{cold_ms.high:.2f}] | {size / cold_ms.median / 1e6:.1f} | {hot_ms:.2f} "
                    f"[{row['hot_low']:.2f}–{row['hot_high']:.2f}] | {size / hot_ms / 1e6:.1f} "
                    f"| {target_ms.median:.2f} | {pass_ms.median:.2f} |")
            lines.append(line)
            print(line, flush=True)
        note = f"<!-- {name} {dtype}: {verdict} -->"
        lines.append(note)
        print(note, flush=True)
        del target, drafts
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
