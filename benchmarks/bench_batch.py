"""Throughput of batched speculative decoding against plain batched `generate`.

    python benchmarks/bench_batch.py --models micro,smollm2 --batches 1,4,16 --draft rtn4 --gamma 4

Each batch holds different prompts (left-padded); both methods produce exactly max_new_tokens per row
(EOS suppressed) and are timed by the benchmarks' ruler (`common.timed_rounds`: interleaved rounds, the order
alternating, the first round a warm-up not counted, round r seeded with seed + r, outlier rounds re-measured),
each by the wall clock: tokens/s are medians over the kept rounds, "hfspec / plain" the median per-round ratio
with its interval, then the rounds kept and the stability verdict ("implausible: …" flags included).
"""

from __future__ import annotations

import torch
from common import interval_cell, load, model_folders, parser, ruler_columns, timed_rounds, verdict_cell, wall

import hfspec

PROMPTS = [
    "Once upon a time", "Return the number of", "The attention", "She looked at the", "This function",
    "In the morning", "The file is", "A little dog",
]


def batch(tokenizer, size: int):
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer([PROMPTS[i % len(PROMPTS)] for i in range(size)], return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def measure(target, draft, ids, mask, pad, args) -> dict:
    """Plain batched `generate` against `hfspec.generate`, timed by the ruler; α and tokens per pass pooled."""
    n, t = args.max_new_tokens, args.temperature
    sample = t > 0

    def plain(r):  # timed_rounds seeds torch with seed + r before it
        return target.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=sample,
                               pad_token_id=pad, **({"temperature": t} if sample else {}))

    def ours(r):
        return hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=args.gamma, temperature=t,
                               max_new_tokens=n, min_new_tokens=n, seed=args.seed + r, pad_token_id=pad)

    tokens = ids.shape[0] * n
    timings = timed_rounds({"plain": wall(plain, tokens), "hfspec": wall(ours, tokens)}, args.repeats, args.seed)
    stats = None
    for k in timings.kept:
        stats = k["hfspec"].out.stats if stats is None else stats.merge(k["hfspec"].out.stats)
    return {"alpha": stats.alpha, "tokens_per_pass": stats.tokens_per_pass, **ruler_columns(timings, "hfspec")}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | batch | plain tok/s | hfspec tok/s | hfspec / plain | interval | α | tokens per pass | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, folder in model_folders(args).items():
        target, tokenizer = load(folder)
        draft = hfspec.make_draft(target, args.draft)
        for size in (int(b) for b in args.batches.split(",")):
            ids, mask = batch(tokenizer, size)
            r = measure(target, draft, ids, mask, tokenizer.pad_token_id, args)
            print(f"| {name} | {size} | {r['plain_tok_s']:.1f} | {r['tok_s']:.1f} | {r['vs_plain']:.2f}× "
                  f"| {interval_cell(r)} | {r['alpha']:.3f} | {r['tokens_per_pass']:.2f} | {verdict_cell(r)} |",
                  flush=True)

if __name__ == "__main__":
    main()
