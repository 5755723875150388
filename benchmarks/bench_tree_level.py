"""What a token-tree level costs a compiled draft: the compiled level (`CompiledStep.tree_level`) and the eager lean
level it replaced, at several widths, against the draft's compiled one-token step, on a warm cache of `--context`.

    python benchmarks/bench_tree_level.py --models smollm2-offgrid --dtypes bfloat16,float32 \\
        --draft gptq4-compiled --widths 1,2,4,8 --steps 15

A level's nodes sit one depth below the cached context and see it and themselves (the mask a first level has);
each call is cropped back untimed. Reported per width: milliseconds with their interval and the ratio to the
one-token step. `hfspec.decoding.priors.TREE_LEVEL_PRIOR` (a one-node level over the chain's step, compiled or
eager) and the per-node slope against `TREE_ROW_PRIOR` come from these rows.
"""

from __future__ import annotations

import os

import torch
from common import (
    Operator,
    load,
    model_dtypes,
    op_ms,
    parser,
    time_operators,
    time_ratio,
    verdict_cell,
    verdict_columns,
    write_results,
)

import hfspec
from hfspec.decoding.tree_forward import _lean_forward


def level_operator(draft, cache, context: int, width: int, compiled: bool) -> Operator:
    ids = torch.randint(0, draft.vocab, (1, width), generator=torch.Generator().manual_seed(width))
    positions = torch.full((width,), context)
    allowed = torch.zeros(width, context + width, dtype=torch.bool)
    allowed[:, :context] = True
    allowed[torch.arange(width), context + torch.arange(width)] = True
    level = draft.compiled_step.tree_level

    def call():
        if compiled:
            level.level(ids, positions, allowed, cache)
        else:
            _lean_forward(draft, cache, ids, positions[None], allowed)

    def reset():
        cache.length = context

    return Operator(call, reset)


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="smollm2-offgrid")
    p.add_argument("--dtypes", default="bfloat16,float32", help="dtypes for models other than micro")
    p.add_argument("--draft", default="gptq4-compiled", help="a -compiled lean draft spec")
    p.add_argument("--widths", default="1,2,4,8")
    p.add_argument("--context", type=int, default=100, help="cached tokens before the level")
    p.add_argument("--steps", type=int, default=15, help="interleaved rounds")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    if not args.draft.endswith("-compiled"):
        raise SystemExit(f"--draft: {args.draft!r}; allowed: a -compiled spec (the compiled level is its step's)")
    widths = [int(w) for w in args.widths.split(",")]
    if any(not 1 <= w <= 16 for w in widths):
        raise SystemExit(f"--widths: {args.widths!r}; allowed: integers from 1 to 16")
    torch.set_num_threads(args.threads)
    lines = [f"<!-- threads {args.threads}, draft {args.draft}, context {args.context}, {args.steps} interleaved "
             f"rounds; load average at start {os.getloadavg()[0]:.2f} -->",
             "| model | dtype | level | width | ms | interval | × one-token step | interval | verdict |",
             "|" + "---|" * 9]
    print("\n".join(lines), flush=True)
    rows = []
    for name, folder, dtype in model_dtypes(args):
        target, _ = load(folder, dtype)
        draft = hfspec.make_draft(target, args.draft)
        step = draft.compiled_step
        if step is None or step.tree_level.prepare(print) != "compiled":
            raise SystemExit(f"{args.draft}: no compiled tree level here ({step and step.tree_level.path})")
        cache = draft.hfspec_new_cache()
        with torch.no_grad():
            draft.logits(torch.randint(0, draft.vocab, (1, args.context)), None, None, cache, 1)
        ops = {"step": Operator(lambda step=step, cache=cache: step(torch.zeros(1, 1, dtype=torch.long), args.context,
                                                                    cache),
                                lambda cache=cache: setattr(cache, "length", args.context))}
        for w in widths:
            ops[f"compiled {w}"] = level_operator(draft, cache, args.context, w, True)
            ops[f"eager {w}"] = level_operator(draft, cache, args.context, w, False)
        timings = time_operators(ops, args.steps, baseline="step")
        verdict = verdict_columns(timings)
        step_ms = op_ms(timings, "step")
        lines.append(f"| {name} | {dtype} | one-token step | 1 | {step_ms.median:.2f} | {step_ms.span()} | 1 | | "
                     f"{verdict_cell(verdict)} |")
        for kind in ("compiled", "eager"):
            for w in widths:
                ms, ratio = op_ms(timings, f"{kind} {w}"), time_ratio(timings, f"{kind} {w}", "step")
                rows.append({"model": name, "dtype": dtype, "level": kind, "width": w, "ms": ms.median,
                             "ms_low": ms.low, "ms_high": ms.high, "step_ms": step_ms.median, "ratio": ratio.median,
                             "ratio_low": ratio.low, "ratio_high": ratio.high, **verdict})
                lines.append(f"| {name} | {dtype} | {kind} | {w} | {ms.median:.2f} | {ms.span()} | "
                             f"{ratio.median:.2f} | {ratio.span()} | {verdict_cell(verdict)} |")
        print("\n".join(lines[-(1 + 2 * len(widths)):]), flush=True)
        del target, draft
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
