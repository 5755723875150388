"""A compiled draft's two-token catch-up as one compiled call (`CompiledStep.pair`) against two one-token steps:
the same draft, γ and prompts, beside plain `generate`.

    python benchmarks/bench_pair.py --models smollm2-offgrid --dtypes bfloat16,float32 --temperatures 0,1 \\
        --draft gptq4-compiled --gamma 4 --repeats 6 --out benchmarks/results/pair

After a round that kept all γ proposals the draft has not seen its own last token nor the target's bonus token: the
next round starts by feeding both. A draft step reads all of the draft's weights whatever its rows (on the 2-core
VMs it is bound by them: `bench_draft_memory.py`), so feeding both in one call saves about a step in those rounds.
Per model, dtype and temperature: plain `generate`, the draft with the pair step ("pair") and the same draft with
it switched off ("steps"), interleaved per round over the four prompts in turn (the ruler, `common.against_plain`),
each with its tokens per pass, draft milliseconds per forward and the ratio to plain with its interval, and "pair"
over "steps" round by round (`common.paired`).
"""

from __future__ import annotations

import os

import torch
from common import (
    against_plain,
    interval_cell,
    load,
    model_dtypes,
    paired,
    parser,
    prompt_ids,
    verdict_cell,
    write_results,
)

import hfspec

PROMPTS = ("Once upon a time", "The capital of France is", "def fibonacci(n):",
           "In a small village by the sea, there lived")


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="smollm2-offgrid", repeats=6, max_new_tokens=128)
    p.add_argument("--dtypes", default="bfloat16,float32", help="dtypes for models other than micro")
    p.add_argument("--draft", default="gptq4-compiled", help="a -compiled lean draft spec")
    p.add_argument("--gamma", default="4", help="an integer or auto")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    if not args.draft.endswith("-compiled"):
        raise SystemExit(f"--draft: {args.draft!r}; allowed: a -compiled spec (the pair step is the compiled step's)")
    torch.set_num_threads(args.threads)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    lines = [f"<!-- threads {args.threads}, {args.max_new_tokens} tokens, draft {args.draft}, γ {gamma}, the four "
             f"prompts in turn, {args.repeats} interleaved rounds after a warm-up; load average at start "
             f"{os.getloadavg()[0]:.2f} -->",
             "| model | dtype | T | catch-up | α | tokens/pass | draft ms/forward | tok/s | vs plain generate | interval "
             "| pair over steps | verdict |", "|" + "---|" * 12]
    print("\n".join(lines), flush=True)
    rows = []
    for name, folder, dtype in model_dtypes(args):
        target, tokenizer = load(folder, dtype)
        ids = [prompt_ids(tokenizer, text) for text in PROMPTS]
        pair, steps = hfspec.make_draft(target, args.draft), hfspec.make_draft(target, args.draft)
        if pair.compiled_step is None or pair.compiled_step.fn_pair is None:
            raise SystemExit(f"{args.draft} on {name} {dtype}: no compiled pair step "
                             f"({hfspec.drafts.describe(pair)['step']})")
        steps.compiled_step.fn_pair = None  # the same compiled draft, feeding pairs as two one-token steps
        for t in (float(x) for x in args.temperatures.split(",")):
            measured = against_plain(target, ids, {"pair": (pair, gamma), "steps": (steps, gamma)}, t,
                                     args.max_new_tokens, args.repeats, args.seed)
            gain = paired(measured["pair"], measured["steps"])
            for key in ("pair", "steps"):
                row = {"model": name, "dtype": dtype, "temperature": t, "catch_up": key, **measured[key],
                       **({"pair_over_steps": gain.median, "pair_over_steps_low": gain.low,
                           "pair_over_steps_high": gain.high} if key == "pair" else {})}
                rows.append(row)
                over = f"{gain.median:.3f}× ({gain.low:.3f}–{gain.high:.3f})" if key == "pair" else "—"
                line = (f"| {name} | {dtype} | {t:g} | {key} | {row['alpha']:.3f} | {row['tokens_per_pass']:.2f} "
                        f"| {row['draft_ms_per_forward']:.2f} | {row['tok_s']:.1f} | {row['vs_plain']:.2f}× "
                        f"| {interval_cell(row)} | {over} | {verdict_cell(row)} |")
                lines.append(line)
                print(line, flush=True)
        del target, pair, steps
    tail = f"<!-- load average at the end {os.getloadavg()[0]:.2f} -->"
    lines.append(tail)
    print(tail)
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
