"""Where a large vocabulary costs time outside model forwards: a tiny random Llama with a 262,144-token head
(Gemma-sized vocabulary; 32,768 for contrast), its rtn4 draft, hfspec against plain decoding.

    OMP_NUM_THREADS=1 python benchmarks/bench_vocab_overhead.py --vocabs 32768,262144 --temperatures 0,1 \
        --gamma 4 --max-new-tokens 64 --repeats 7 --threads 1 [--profile 262144]

The model is tiny (2 layers, hidden 64) on purpose: its forwards are cheap, so what hfspec does around them
(scoring, sampling, verification, bookkeeping) shows. Per generated token it reports the time in target
forwards, draft forwards and outside forwards (`SpecStats.time_target / time_draft / time_other`) for
`hfspec.generate` with the rtn4 draft and for `hfspec.plain_generate` (the same loop, one target pass per
token), plus the total of transformers' own `generate`. Every run produces exactly max_new_tokens
(`min_new_tokens`), T = 1 keeps the model's default generation config (top-k 50). The methods are timed by the
benchmarks' ruler (`common.timed_rounds`: interleaved rounds, the order rotating, the first round a warm-up not
counted, outlier rounds re-measured), each call by the wall clock; medians over the kept rounds. "total" is the
wall clock per token; the split and the outside share (of hfspec's own clock) come from `SpecStats`; "vs HF
generate" is the median per-round tokens/s ratio to transformers' `generate` with its interval, then the rounds
kept and the stability verdict.
`--profile V` prints cProfile's top functions (by own time) of hfspec runs at vocabulary V.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interval_cell, ruler_columns, timed_rounds, verdict_cell, wall  # noqa: E402

import hfspec  # noqa: E402

METHODS = ("hfspec rtn4", "hfspec plain", "HF generate")


def tiny_llama(vocab: int, hidden: int, layers: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return LlamaForCausalLM(config).eval()


def run_once(method: str, target, draft, ids, n: int, temperature: float, gamma: int, seed: int):
    """One run: transformers' output (HF generate) or hfspec's (with `.stats`)."""
    if method == "HF generate":
        sample = temperature > 0
        torch.manual_seed(seed)
        return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=sample, **({"temperature": temperature} if sample else {}))
    kwargs = dict(temperature=temperature, max_new_tokens=n, min_new_tokens=n, seed=seed)
    return (hfspec.generate(target, ids, draft=draft, gamma=gamma, **kwargs) if method == "hfspec rtn4"
            else hfspec.plain_generate(target, ids, **kwargs))


def per_token(method: str, sample) -> dict:
    """Milliseconds per generated token of one timed run: total (wall clock), and target, draft, other (hfspec)."""
    out = sample.out
    if method == "HF generate":
        return {"total": 1e3 * sample.seconds / sample.tokens, "new_tokens": sample.tokens}
    s = out.stats
    per = 1e3 / s.new_tokens
    return {"target": s.time_target * per, "draft": s.time_draft * per, "other": s.time_other * per,
            "total": 1e3 * sample.seconds / sample.tokens, "outside_share": s.time_other / s.time_total,
            "new_tokens": s.new_tokens, "alpha": s.alpha,
            "tokens_per_pass": s.tokens_per_pass}


def measure(vocab: int, args) -> list[dict]:
    target = tiny_llama(vocab, args.hidden, args.layers)
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.randint(3, vocab, (1, 16), generator=torch.Generator().manual_seed(args.seed))
    rows = []
    n = args.max_new_tokens
    for temperature in args.temperatures:
        def method_run(method, temperature=temperature):
            return lambda r: run_once(method, target, draft, ids, n, temperature, args.gamma, args.seed + r)

        def made(out):
            seqs = out.sequences if hasattr(out, "sequences") else out
            return seqs.shape[1] - ids.shape[1]

        timings = timed_rounds({m: wall(method_run(m), made) for m in METHODS}, args.repeats, args.seed,
                               baseline="HF generate")
        for method in METHODS:
            runs = [per_token(method, k[method]) for k in timings.kept]
            row = {"vocab": vocab, "T": temperature, "method": method}
            for key in runs[0]:
                row[key] = statistics.median(x[key] for x in runs)
            ruler = ruler_columns(timings, method)
            row.update(vs_hf_generate=ruler["vs_plain"], vs_hf_generate_low=ruler["vs_plain_low"],
                       vs_hf_generate_high=ruler["vs_plain_high"],
                       **{k: ruler[k] for k in ("pairs", "outliers", "stable", "warnings", "flags")})
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
            "| outside share | α | tokens/pass | vs HF generate | interval | verdict |")
    lines = [head, "|---" * 13 + "|"]
    for row in rows:
        def ms(key, row=row):
            return f"{row[key]:.2f}" if key in row else "–"
        share = f"{row['outside_share']:.0%}" if "outside_share" in row else "–"
        alpha = f"{row['alpha']:.3f}" if row.get("alpha") else "–"
        tpp = f"{row['tokens_per_pass']:.2f}" if "tokens_per_pass" in row else "–"
        lines.append(f"| {row['vocab']:,} | {row['T']:g} | {row['method']} | {ms('target')} | {ms('draft')} "
                     f"| {ms('other')} | {ms('total')} | {share} | {alpha} | {tpp} | {row['vs_hf_generate']:.2f}× "
                     f"| {interval_cell(row, 'vs_hf_generate')} | {verdict_cell(row)} |")
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
          f"γ={args.gamma}, {args.max_new_tokens} new tokens, {args.repeats} interleaved rounds after a warm-up (medians)")
    rows = [row for vocab in (int(v) for v in args.vocabs.split(",")) for row in measure(vocab, args)]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
