"""The RTN draft's LM head: quantised as is (`head_top=0`) against the default (a large head's top 32 logits
re-scored with the target's own head rows, a small head kept as the target's), same draft bits, same γ, same
prompt, beside plain `generate`.

    python benchmarks/bench_head.py --models micro,smollm2 --dtypes float32,bfloat16 --temperatures 0,1 \\
        --max-new-tokens 128 --repeats 3 --out benchmarks/results/head

Per model, dtype and temperature the methods run interleaved per repeat (repeat 0 a warm-up, not counted; each
repeat its own seed): plain `generate`, then the draft with each head setting at a fixed γ and at γ "auto".
Reported: α, tokens per target pass, draft milliseconds per forward, tokens/s and the ratio to plain `generate`
(medians over repeats, timed by the ruler through `common.against_plain`) with its interval, the pairs kept and
the stability verdict, and the fidelity (mean Σ min(p, q)) on the target's own greedy probe text. A markdown
table goes to stdout and, with --out, to OUT.md beside OUT.json.
"""

from __future__ import annotations

import os

import torch
from common import (
    Stopwatch,
    against_plain,
    interval_cell,
    load,
    model_dtypes,
    parser,
    prompt_ids,
    verdict_cell,
    write_results,
)

import hfspec
from hfspec.drafts.fidelity import fidelity, probe_ids


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2")
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes for models other than micro")
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", default="4,auto", help="γ values: integers and/or auto")
    p.add_argument("--heads", default="0,default",
                   help="head_top values to compare: integers, or default (the draft's own choice)")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    heads = [None if h == "default" else int(h) for h in args.heads.split(",")]
    gammas = [g if g == "auto" else int(g) for g in args.gamma.split(",")]
    lines = [f"<!-- threads {args.threads}, {args.max_new_tokens} tokens, draft {args.draft}, median of "
             f"{args.repeats} interleaved repeats after a warm-up; load average at start {os.getloadavg()[0]:.2f} -->",
             "| model | dtype | T | γ | head_top | fidelity | α | tokens/pass | draft ms/forward | tok/s | vs plain "
             "generate | interval | verdict |", "|" + "---|" * 13]
    print("\n".join(lines), flush=True)
    rows = []
    watch = Stopwatch()  # the whole script, one-shot
    n = args.max_new_tokens
    for name, folder, dtype in model_dtypes(args):
        target, tokenizer = load(folder, dtype)
        ids = prompt_ids(tokenizer, args.prompt)
        drafts = {h: hfspec.make_draft(target, args.draft, head_top=h) for h in heads}
        probe = probe_ids(target, 64)
        close = {h: fidelity(target, d, probe) for h, d in drafts.items()}
        for t in (float(x) for x in args.temperatures.split(",")):
            runs = {(g, h): (drafts[h], g) for g in gammas for h in heads}
            measured = against_plain(target, ids, runs, t, n, args.repeats, args.seed)
            for m in runs:
                row = {"model": name, "dtype": dtype, "temperature": t, "gamma": m[0], "head_top": m[1],
                       "fidelity": close[m[1]], **measured[m]}
                rows.append(row)
                line = (f"| {name} | {dtype} | {t:g} | {m[0]} | {'default' if m[1] is None else m[1]} | {row['fidelity']:.3f} | {row['alpha']:.3f} "
                        f"| {row['tokens_per_pass']:.2f} | {row['draft_ms_per_forward']:.2f} | {row['tok_s']:.1f} "
                        f"| {row['vs_plain']:.2f}× | {interval_cell(row)} | {verdict_cell(row)} |")
                lines.append(line)
                print(line, flush=True)
        del target, drafts
    tail = (f"<!-- {watch.seconds:.0f} s; load average at the end {os.getloadavg()[0]:.2f} -->")
    lines.append(tail)
    print(tail)
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
