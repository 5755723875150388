"""A round's costs inside decoding, by γ: what the seeded γ "auto" priors (`hfspec.decoding.priors`) should say.

    python benchmarks/bench_round_costs.py --models smollm2-offgrid --dtypes float32,bfloat16 --temperatures 0,1

For each target and dtype: plain decoding (`hfspec.plain_generate`) and a fixed-γ chain at each of `--gammas`, every
prompt, `--repeats` times, all timed by hfspec's own per-round clocks (`SpecStats.costs`, no clock read here); the
cost model (`hfspec.decoding.costmodel.CostModel.fit`) is fitted to the pooled rounds, with the plain runs giving the
one-token step. Printed in one-token target steps: the draft's seconds per round as intercept + slope · proposed
tokens (the intercept is `DRAFT_ROUND_PRIOR` · c, the slope c = `DRAFT_STEP_PRIOR` · the bytes ratio), the time
outside forwards, then per γ the tokens per pass, tokens/s and each part of a round, and the prior the seeded policy
would decide with for comparison. Not an interleaved speed comparison: `bench_results.py` is that.
"""

from __future__ import annotations

import common
import torch


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(models="smollm2-offgrid", repeats=2)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--temperatures", default="0")
    p.add_argument("--draft", default="gptq4-compiled")
    p.add_argument("--gammas", default="2,3,4,5,6,7")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeat for several)")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts = args.prompt or ["Once upon a time", "The capital of France is", "def fibonacci(n):",
                              "In a small village by the sea, there lived"]
    lines, rows = [], []
    for name, folder in common.model_folders(args).items():
        for dtype in args.dtypes.split(","):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                row = measure(folder, dtype, temperature, args, prompts)
                rows.append({"target": name, **row})
                lines += render(name, row)
                print("\n".join(render(name, row)), flush=True)
    common.write_results(args.out, lines, rows)


def measure(folder, dtype: str, temperature: float, args, prompts: list[str]) -> dict:
    import hfspec
    from hfspec.api import _Prices
    from hfspec.decoding.costmodel import CostModel
    from hfspec.decoding.priors import prior_model

    target, tok = common.load(folder, dtype)
    draft = hfspec.make_draft(target, args.draft)
    ids = [common.prompt_ids(tok, text) for text in prompts]
    kw = dict(temperature=temperature, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens)
    hfspec.generate(target, ids[0], draft=draft, gamma=4, seed=args.seed, **kw)  # warm-up, not counted
    gammas = [int(g) for g in args.gammas.split(",")]
    record, plain, per_gamma, last = None, None, {g: [] for g in gammas}, None
    for _ in range(args.repeats):
        for i, x in enumerate(ids):
            plain_stats = hfspec.plain_generate(target, x, seed=args.seed + i, **kw).stats
            plain = plain_stats.costs if plain is None else plain.merge(plain_stats.costs)
            for g in gammas:
                last = hfspec.generate(target, x, draft=draft, gamma=g, seed=args.seed + i, **kw).stats
                record = last.costs if record is None else record.merge(last.costs)
                per_gamma[g].append(last)
    model = CostModel.fit(record, plain)
    step = model.step
    prices = _Prices.of(target, draft, last, "cpu")
    c = prices.c(last)
    prior = prior_model(c, prices.device, prices.dtype)
    by_gamma = {}
    for g, runs in per_gamma.items():
        passes = sum(s.target_passes for s in runs)
        seconds = sum(s.time_total for s in runs)
        draft_s, target_s = sum(s.time_draft for s in runs), sum(s.time_target for s in runs)
        by_gamma[g] = {"tokens_per_pass": sum(s.new_tokens for s in runs) / passes,
                       "tok_s": sum(s.new_tokens for s in runs) / seconds,
                       "draft": draft_s / passes / step, "verify": target_s / passes / step,
                       "other": (seconds - draft_s - target_s) / passes / step}
    return {"dtype": dtype, "temperature": temperature, "draft": args.draft, "step_ms": step * 1e3,
            "c_bytes": last.c_bytes, "draft_a": model.draft_a / step, "draft_b": model.draft_b / step,
            "other_a": model.other_a / step, "other_b": model.other_b / step, "prices": prices.dtype,
            "prior_draft_a": prior.draft_a, "prior_draft_b": prior.draft_b, "by_gamma": by_gamma}


def render(name: str, r: dict) -> list[str]:
    best = max(r["by_gamma"], key=lambda g: r["by_gamma"][g]["tok_s"])
    out = [f"{name}, {r['dtype']}, T = {r['temperature']:g}, {r['draft']} (c_bytes {r['c_bytes']:.3f}; priced as "
           f"{r['prices']}), one-token step {r['step_ms']:.1f} ms; in steps: draft per round {r['draft_a']:.3f} + "
           f"{r['draft_b']:.3f} · k (prior {r['prior_draft_a']:.3f} + {r['prior_draft_b']:.3f} · k), outside "
           f"forwards {r['other_a']:.3f} + {r['other_b']:.3f} · k", "",
           "| γ | tokens / pass | tok/s | draft / round | verify / round | other / round |", "|---|---|---|---|---|---|"]
    for g, v in r["by_gamma"].items():
        mark = "**" if g == best else ""
        out.append(f"| {g} | {v['tokens_per_pass']:.2f} | {mark}{v['tok_s']:.1f}{mark} | {v['draft']:.2f} | "
                   f"{v['verify']:.2f} | {v['other']:.2f} |")
    return out + [""]


if __name__ == "__main__":
    main()
