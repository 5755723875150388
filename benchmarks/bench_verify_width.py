"""What a wider target pass costs: one forward over w positions on a warm cache, against a one-token step, per
dtype. This is the slope token trees pay per verify position (`hfspec.decoding.priors.VERIFY_SLOPE_PRIOR` holds the
seeded runs' prior from it) and the reason a chain's verify pass decides fp32's speed-up on a CPU.

    python benchmarks/bench_verify_width.py --models smollm2-offgrid --dtypes float32,bfloat16 --widths 1,2,5,8,16,24,32

Steps are timed by the benchmarks' one operator timer (`common.time_operators`: interleaved, the order rotating,
warm-up rounds not counted, outliers re-measured). Reported per width: median ms, the median per-round ratio to
the one-token step with its interval, and the slope (ratio − 1) / (w − 1): the marginal cost of one more position
in one-token steps. A dtype written `float32+prepack` is fp32 with `hfspec.kernels.fast_linear.prepack` (oneDNN's
blocked copy of every linear weight for calls of two rows or more; the one-token step is unchanged), and
`float32+rows` is fp32 with its linears routed through the few-row kernel (`hfspec.kernels.verify_linear`, as a
speculative decode runs them; one-row calls keep F.linear). `float32+lean` times the lean target
(`hfspec.kernels.lean_target`: the target's own weights through hfspec's lean decoder, its linears through the
few-row kernel; 1-16 positions through the native C step, `hfspec.kernels.native_step`) at every width, over the
HF forward's one-token step (plain decoding's), in the same rounds, beside the same lean passes with the native step
off (`HFSPEC_NATIVE_STEP=off`, rows "float32+lean, no native step").
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from bench_steps import step_timer
from common import (
    load,
    model_folders,
    op_ms,
    parser,
    time_operators,
    time_ratio,
    verdict_cell,
    verdict_columns,
    write_results,
)

from hfspec.kernels import lean_target, native_step, verify_linear


def native_off(operator):
    """`operator` run with `$HFSPEC_NATIVE_STEP=off` (read at each call)."""
    inner = operator.fn

    def run():
        before = os.environ.get(native_step.MODE_ENV)
        os.environ[native_step.MODE_ENV] = "off"
        try:
            inner()
        finally:
            if before is None:
                os.environ.pop(native_step.MODE_ENV)
            else:
                os.environ[native_step.MODE_ENV] = before

    operator.fn = run
    return operator


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(models="smollm2-offgrid")
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated; float32+prepack: fp32 prepacked; float32+rows, bfloat16+rows: the few-row kernel; "
                   "float32+lean: the lean target")
    p.add_argument("--widths", default="1,2,5,8,16,24,32")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    widths = sorted({1, *(int(w) for w in args.widths.split(","))})
    lines = [f"threads {args.threads}, context {args.context}, {args.steps} interleaved rounds", "",
             "| model | dtype | positions | ms | vs one token | slope / position | verdict |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rows = []
    for name, folder in model_folders(args).items():
        for dtype in args.dtypes.split(","):
            target, _ = load(folder, dtype)
            ids = torch.randint(0, target.config.vocab_size, (1, args.context + max(widths)),
                                generator=torch.Generator().manual_seed(0))
            timers = {f"w{w}": step_timer(target, ids, args.context, w) for w in widths}
            lean = "l" if dtype.endswith("+lean") else "w"  # the lean rows' timer names: l1, l2, ...
            if lean == "l":
                decoder, why = lean_target.built(target)
                if decoder is None:
                    raise SystemExit(f"{dtype}: {why}")
                timers = {"w1": timers["w1"]} | {f"l{w}": step_timer(decoder, ids, args.context, w) for w in widths} | {
                    f"n{w}": native_off(step_timer(decoder, ids, args.context, w)) for w in widths}
            with verify_linear.installed(target) if dtype.endswith("+rows") else nullcontext() as routed:
                if dtype.endswith("+rows") and not routed:
                    raise SystemExit(f"{dtype}: {verify_linear.status()}")
                timings = time_operators(timers, args.steps, baseline="w1")
            verdict = verdict_cell(verdict_columns(timings))
            for kind in [lean] + (["n"] if lean == "l" else []):
                for w in widths:
                    ratio = time_ratio(timings, f"{kind}{w}", "w1") if w > 1 or kind != "w" else None
                    slope = (ratio.median - 1) / (w - 1) if ratio and w > 1 else None
                    label = dtype + (", no native step" if kind == "n" else "")
                    row = {"model": name, "dtype": label, "positions": w, "ms": op_ms(timings, f"{kind}{w}").median,
                           "ratio": ratio.median if ratio else 1.0, "ratio_low": ratio.low if ratio else 1.0,
                           "ratio_high": ratio.high if ratio else 1.0, "slope": slope}
                    rows.append(row)
                    line = (f"| {name} | {label} | {w} | {row['ms']:.2f} | {ratio.cell() if ratio else '1'} | "
                            f"{'' if slope is None else f'{slope:.3f}'} | {verdict} |")
                    lines.append(line)
                    print(line, flush=True)
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
