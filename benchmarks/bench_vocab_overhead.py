"""Where a large vocabulary costs time outside model forwards: a tiny random Llama with a 262,144-token head
(Gemma-sized vocabulary; 32,768 for contrast), its rtn4 draft, hfspec against plain decoding.

    OMP_NUM_THREADS=1 python benchmarks/bench_vocab_overhead.py --vocabs 32768,262144 --temperatures 0,1 \
        --gamma 4 --max-new-tokens 64 --repeats 7 --threads 1 [--profile 262144]

The model is tiny (2 layers, hidden 64) on purpose: its forwards are cheap, so what hfspec does around them
(scoring, sampling, verification, bookkeeping) shows. Per generated token it reports the time in target
forwards, draft forwards and outside forwards (`SpecStats.time_target / time_draft / time_other`) for
`hfspec.generate` with the rtn4 draft and for `hfspec.plain_generate` (the same loop, one target pass per
token), plus the total of transformers' own `generate`. Every run produces exactly max_new_tokens
(`min_new_tokens`), T = 1 keeps the model's default generation config (top-k 50). Methods run interleaved, the
order rotating each repeat; the first repeat warms up and is not counted; medians over the rest.
`--profile V` prints cProfile's top functions (by own time) of hfspec runs at vocabulary V.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hfspec

METHODS = ("hfspec rtn4", "hfspec plain", "HF generate")


def tiny_llama(vocab: int, hidden: int, layers: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return LlamaForCausalLM(config).eval()


def run_once(method: str, target, draft, ids, n: int, temperature: float, gamma: int, seed: int) -> dict:
    """Milliseconds per generated token: target, draft, other, total (HF generate: total only)."""
    if method == "HF generate":
        sample = temperature > 0
        torch.manual_seed(seed)
        began = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=sample, **({"temperature": temperature} if sample else {}))
        took = time.perf_counter() - began
        new = out.shape[1] - ids.shape[1]
        return {"total": 1e3 * took / new, "new_tokens": new}
    kwargs = dict(temperature=temperature, max_new_tokens=n, min_new_tokens=n, seed=seed)
    out = (hfspec.generate(target, ids, draft=draft, gamma=gamma, **kwargs) if method == "hfspec rtn4"
           else hfspec.plain_generate(target, ids, **kwargs))
    s = out.stats
    per = 1e3 / s.new_tokens
    return {"target": s.time_target * per, "draft": s.time_draft * per, "other": s.time_other * per,
            "total": s.time_total * per, "new_tokens": s.new_tokens, "alpha": s.alpha,
            "tokens_per_pass": s.tokens_per_pass}


def measure(vocab: int, args) -> list[dict]:
    target = tiny_llama(vocab, args.hidden, args.layers)
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.randint(3, vocab, (1, 16), generator=torch.Generator().manual_seed(args.seed))
    rows = []
    for temperature in args.temperatures:
        runs = {m: [] for m in METHODS}
        for r in range(args.repeats + 1):
            order = METHODS[r % len(METHODS):] + METHODS[: r % len(METHODS)]
            for method in order:
                result = run_once(method, target, draft, ids, args.max_new_tokens, temperature, args.gamma,
                                  args.seed + r)
                if r:  # the first repeat warms up
                    runs[method].append(result)
        for method in METHODS:
            row = {"vocab": vocab, "T": temperature, "method": method}
            for key in runs[method][0]:
                row[key] = statistics.median(x[key] for x in runs[method])
            rows.append(row)
    if args.profile == vocab:
        profile(target, draft, ids, args)
    return rows


def profile(target, draft, ids, args) -> None:
    for temperature in args.temperatures:
        prof = cProfile.Profile()
        prof.enable()
        for r in range(3):
            hfspec.generate(target, ids, draft=draft, gamma=args.gamma, temperature=temperature,
                            max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, seed=r)
        prof.disable()
        print(f"\n# cProfile, hfspec rtn4, V={target.config.vocab_size}, T={temperature}, 3 runs, by own time")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def table(rows: list[dict]) -> str:
    head = ("| V | T | method | target ms/tok | draft ms/tok | outside forwards ms/tok | total ms/tok "
            "| outside share | α | tokens/pass |")
    lines = [head, "|---" * 10 + "|"]
    for row in rows:
        def ms(key, row=row):
            return f"{row[key]:.2f}" if key in row else "–"
        share = f"{row['other'] / row['total']:.0%}" if "other" in row else "–"
        alpha = f"{row['alpha']:.3f}" if row.get("alpha") else "–"
        tpp = f"{row['tokens_per_pass']:.2f}" if "tokens_per_pass" in row else "–"
        lines.append(f"| {row['vocab']:,} | {row['T']:g} | {row['method']} | {ms('target')} | {ms('draft')} "
                     f"| {ms('other')} | {ms('total')} | {share} | {alpha} | {tpp} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocabs", default="32768,262144")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", type=int, default=0, help="print a cProfile of hfspec runs at this vocabulary")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args()
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"γ={args.gamma}, {args.max_new_tokens} new tokens, {args.repeats} repeats (medians)")
    rows = [row for vocab in (int(v) for v in args.vocabs.split(",")) for row in measure(vocab, args)]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
