"""The 8-bit drafts' one-token step against the target's: rtn4, rtn8 (a dequantised bf16 copy) and int8 (one scale
per output row, the CPU int8 kernel), per model and target dtype.

    python benchmarks/bench_int8.py --models smollm2-offgrid --dtypes float32,bfloat16 --drafts rtn4,rtn8,int8 \\
        --steps 30 --out benchmarks/results/int8

Per model and dtype: each draft's one-token step and the target's on a warm KV cache of `--context` tokens
(cropped back after each call, untimed), timed by the benchmarks' one operator timer (`common.time_operators`:
interleaved rounds, the order rotating, two warm-up rounds not counted, outlier rounds re-measured): median
milliseconds, c = draft step / target step as the median of per-round ratios with its interval [low–high], and
after each model and dtype the rounds kept and the stability verdict. Then each draft's fidelity (mean Σ min(p, q) of the next-token
distributions, `hfspec.drafts.fidelity`) over the prompt and the target's greedy continuation of it, timing-free,
and the draft's bytes (`hfspec.drafts.weight_bytes`). `-compiled` drafts in --drafts are built once (inductor's
artefacts are kept in HFSPEC_COMPILE_DIR).
"""

from __future__ import annotations

import os

import torch
from bench_steps import step_timer
from common import (
    load,
    model_dtypes,
    op_ms,
    parser,
    prompt_ids,
    time_operators,
    time_ratio,
    verdict_cell,
    verdict_columns,
    write_results,
)

import hfspec
from hfspec.drafts import fidelity, weight_bytes


def probe(target, tokenizer, text: str, tokens: int) -> torch.Tensor:
    """The prompt and the target's greedy continuation of `tokens` tokens: the positions fidelity is taken over."""
    ids = prompt_ids(tokenizer, text)
    return hfspec.plain_generate(target, ids, temperature=0, max_new_tokens=tokens).sequences[:, :ids.shape[1] + tokens]


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2-offgrid")
    p.add_argument("--dtypes", default="float32,bfloat16", help="target dtypes for models other than micro")
    p.add_argument("--drafts", default="rtn4,rtn8,int8", help="comma-separated draft specs")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=30, help="interleaved rounds per model and dtype")
    p.add_argument("--fidelity-tokens", type=int, default=48)
    p.add_argument("--prompt", default="Once upon a time, in a small village by the sea,")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    specs = args.drafts.split(",")
    lines = [f"<!-- threads {args.threads}, context {args.context}, {args.steps} interleaved rounds; load average at "
             f"start {os.getloadavg()[0]:.2f} -->",
             "| model | dtype | draft | target ms | draft ms | c (draft / target step) | fidelity | draft MB "
             "| step path |", "|" + "---|" * 9]
    print("\n".join(lines), flush=True)
    rows = []
    for name, folder, dtype in model_dtypes(args):
        target, tokenizer = load(folder, dtype)
        drafts = {spec: hfspec.make_draft(target, spec) for spec in specs}
        vocab = target.config.vocab_size
        ids = torch.randint(0, vocab, (1, args.context + 1), generator=torch.Generator().manual_seed(0))
        timers = {"target": step_timer(target, ids, args.context, 1)}
        timers |= {spec: step_timer(d, ids, args.context, 1) for spec, d in drafts.items()}
        timings = time_operators(timers, args.steps, baseline="target")
        verdict = verdict_cell(verdict_columns(timings))
        seen = probe(target, tokenizer, args.prompt, args.fidelity_tokens)
        target_ms = op_ms(timings, "target")
        for spec, draft in drafts.items():
            c = time_ratio(timings, spec, "target")
            row = {"model": name, "dtype": dtype, "draft": spec, "target_ms": target_ms.median,
                   "draft_ms": op_ms(timings, spec).median, "c_time": c.median, "c_time_low": c.low,
                   "c_time_high": c.high, "fidelity": fidelity(target, draft, seen),
                   "draft_bytes": weight_bytes(draft), "path": hfspec.drafts.describe(draft)["step"],
                   **verdict_columns(timings)}
            rows.append(row)
            line = (f"| {name} | {dtype} | {spec} | {row['target_ms']:.2f} | {row['draft_ms']:.2f} | {c.cell('.3f')} "
                    f"| {row['fidelity']:.4f} | {row['draft_bytes'] / 1e6:.1f} | {row['path']} |")
            lines.append(line)
            print(line, flush=True)
        note = f"<!-- {name} {dtype}: {verdict} -->"  # one verdict for the rounds that timed every draft
        lines.append(note)
        print(note, flush=True)
        del target, drafts
    tail = f"<!-- load average at the end {os.getloadavg()[0]:.2f} -->"
    lines.append(tail)
    print(tail)
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
