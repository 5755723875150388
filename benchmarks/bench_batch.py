"""Throughput of batched speculative decoding against plain batched `generate`.

    python benchmarks/bench_batch.py --models micro,smollm2 --batches 1,4,16 --draft rtn4 --gamma 4

Each batch holds different prompts (left-padded); both methods produce exactly max_new_tokens per row
(EOS suppressed) and are timed side by side, interleaved per repeat.
"""

from __future__ import annotations

import time

import torch
from common import load, model_folders, parser

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


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | batch | plain tok/s | hfspec tok/s | hfspec / plain | α | tokens per pass |")
    print("|---|---|---|---|---|---|---|")
    for name, folder in model_folders(args).items():
        target, tokenizer = load(folder)
        draft = hfspec.make_draft(target, args.draft)
        n = args.max_new_tokens
        sample = args.temperature > 0
        for size in (int(b) for b in args.batches.split(",")):
            ids, mask = batch(tokenizer, size)
            pad = tokenizer.pad_token_id
            times = {"plain": 0.0, "hfspec": 0.0}
            stats = None
            for r in range(args.repeats + 1):  # the first round warms up and is not counted
                torch.manual_seed(args.seed + r)
                began = time.perf_counter()
                target.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=sample,
                                pad_token_id=pad, **({"temperature": args.temperature} if sample else {}))
                plain = time.perf_counter() - began
                began = time.perf_counter()
                out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=args.gamma,
                                      temperature=args.temperature, max_new_tokens=n, min_new_tokens=n,
                                      seed=args.seed + r, pad_token_id=pad)
                ours = time.perf_counter() - began
                if r:
                    times["plain"] += plain
                    times["hfspec"] += ours
                    stats = out.stats if stats is None else stats.merge(out.stats)
            tokens = size * n * args.repeats
            tp, ts = tokens / times["plain"], tokens / times["hfspec"]
            print(f"| {name} | {size} | {tp:.1f} | {ts:.1f} | {ts / tp:.2f}× | {stats.alpha:.3f} | "
                  f"{stats.tokens_per_pass:.2f} |", flush=True)


if __name__ == "__main__":
    main()
