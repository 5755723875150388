"""Benchmark quantised drafts: acceptance rate against bits, and cost / speed-up of an rtn4 draft.

(a) alpha against bits:  python benchmarks/bench_drafts.py alpha --model /work/shared/models/stories260K
(b) cost and speed-up:   python benchmarks/bench_drafts.py speed --model /tmp/smollm2
Prints markdown tables. In (b) plain and speculative decoding are timed by the benchmarks' ruler
(`common.timed_rounds`: --runs interleaved rounds, the order alternating, a warm-up round not counted, outlier
rounds re-measured), each by the wall clock: median seconds, the median per-round speed-up with its interval,
the rounds kept and the stability verdict.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interval_cell, ruler_columns, timed_rounds, verdict_cell, wall  # noqa: E402

import hfspec  # noqa: E402
from hfspec.drafts import make_draft, measure_cost  # noqa: E402
from hfspec.quant import summary  # noqa: E402


def load(path: str):
    from hfspec.io.loading import load_model, load_tokenizer

    return load_model(path, dtype="float32", device="cpu", progress=False), load_tokenizer(path)


def bench_alpha(args) -> None:
    target, tok = load(args.model)
    prompt = torch.tensor([[tok.bos_token_id if tok.bos_token_id is not None else 0]])
    print(f"\nalpha against bits: {args.model}, T={args.temperature}, gamma={args.gamma}, threads {args.threads}, "
          f">= {args.min_checked} checked tokens per draft\n")
    print("| draft | bytes vs target | checked | accepted | alpha | tokens / target pass |")
    print("|---|---|---|---|---|---|")
    for spec in args.specs:
        draft = make_draft(target, spec)
        checked = accepted = passes = new = 0
        seed = 0
        while checked < args.min_checked:
            seed += 1
            out = hfspec.generate(target, prompt, draft=draft, gamma=args.gamma, temperature=args.temperature,
                                  max_new_tokens=args.max_new_tokens, seed=seed)
            s = out.stats
            checked, accepted = checked + s.checked, accepted + s.accepted
            passes, new = passes + s.target_passes, new + s.new_tokens
        c_bytes = hfspec.drafts.weight_bytes(draft) / hfspec.drafts.weight_bytes(target)
        print(f"| {spec} | {c_bytes:.3f} | {checked} | {accepted} | {accepted / checked:.3f} | "
              f"{new / passes:.2f} |", flush=True)


def _timed(plain, spec, tokens: int, runs: int, seed: int = 1) -> dict:
    """Plain against speculative decoding (`plain(r)`, `spec(r)` → hfspec outputs) by the ruler: median seconds,
    the ruler's columns, and the last kept outputs."""
    timings = timed_rounds({"plain": wall(plain, tokens), "hfspec": wall(spec, tokens)}, runs, seed)
    last = timings.kept[-1]
    return {"plain_s": statistics.median(k["plain"].seconds for k in timings.kept),
            "spec_s": statistics.median(k["hfspec"].seconds for k in timings.kept),
            "plain": last["plain"].out, "spec": last["hfspec"].out, **ruler_columns(timings, "hfspec")}


def bench_speed(args) -> None:
    target, tok = load(args.model)
    prompt = tok(args.prompt, return_tensors="pt").input_ids
    draft = make_draft(target, args.spec)
    print(f"\ndraft {args.spec} layer paths: {summary(draft)}")
    cost = measure_cost(target, draft, prompt_len=args.prompt_len, repeats=args.repeats)
    print(f"\ncost: {args.model}, batch 1, fp32 target, warm KV cache of {args.prompt_len}, "
          f"median of {args.repeats}, torch threads {torch.get_num_threads()}\n")
    print("| draft | target ms/token | draft ms/token | c_time | c_bytes | target MB | draft MB |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.spec} | {cost.target_ms:.2f} | {cost.draft_ms:.2f} | {cost.c_time:.3f} | {cost.c_bytes:.3f} | "
          f"{cost.target_bytes / 1e6:.1f} | {cost.draft_bytes / 1e6:.1f} |", flush=True)
    print(f"\nwall clock: {args.max_new_tokens} new tokens, gamma={args.gamma}, median of {args.runs} interleaved "
          "runs after a warm-up\n")
    print("| mode | plain s | hfspec s | speed-up | interval | alpha | tokens / target pass | same text as plain "
          "| verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, temperature in (("greedy", 0.0), ("T=1", 1.0)):
        common = {"temperature": temperature, "max_new_tokens": args.max_new_tokens, "seed": 1,
                  "min_new_tokens": args.max_new_tokens}
        r = _timed(lambda _, c=common: hfspec.plain_generate(target, prompt, **c),
                   lambda _, c=common: hfspec.generate(target, prompt, draft=draft, gamma=args.gamma, **c),
                   args.max_new_tokens, args.runs)
        plain, spec = r["plain"], r["spec"]
        same = "yes" if torch.equal(plain.sequences, spec.sequences) else "no (sampled)"
        print(f"| {label} | {r['plain_s']:.2f} | {r['spec_s']:.2f} | {r['vs_plain']:.2f}x | {interval_cell(r)} "
              f"| {spec.stats.alpha:.3f} | {spec.stats.tokens_per_pass:.2f} | {same} | {verdict_cell(r)} |",
              flush=True)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a small shared CPU more threads oversubscribe)")
    sub = parser.add_subparsers(dest="bench", required=True)
    alpha = sub.add_parser("alpha", parents=[common], help="acceptance rate against bits")
    alpha.add_argument("--model", default="/work/shared/models/stories260K")
    alpha.add_argument("--specs", nargs="+", default=["rtn8", "rtn6", "rtn4", "rtn3", "rtn2"])
    alpha.add_argument("--gamma", type=int, default=4)
    alpha.add_argument("--temperature", type=float, default=1.0)
    alpha.add_argument("--min-checked", type=int, default=2000)
    alpha.add_argument("--max-new-tokens", type=int, default=256)
    speed = sub.add_parser("speed", parents=[common], help="c_time and wall-clock speed-up of one draft")
    speed.add_argument("--model", default="/tmp/smollm2")
    speed.add_argument("--spec", default="rtn4")
    speed.add_argument("--prompt", default="The capital of France is")
    speed.add_argument("--prompt-len", type=int, default=32)
    speed.add_argument("--repeats", type=int, default=20)
    speed.add_argument("--gamma", type=int, default=4)
    speed.add_argument("--max-new-tokens", type=int, default=64)
    speed.add_argument("--runs", type=int, default=3, help="interleaved (plain, hfspec) rounds after a warm-up")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    {"alpha": bench_alpha, "speed": bench_speed}[args.bench](args)


if __name__ == "__main__":
    main()
