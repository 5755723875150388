"""Adaptive γ against the best fixed γ and against HF's heuristic schedule, on the same pair.

    python benchmarks/bench_adaptive.py --models micro,smollm2 --drafts rtn4,rtn3 --gammas 1-8

For each draft: tokens/s of hfspec at every fixed γ (the best one is what `hfspec sweep` would pick), of
hfspec with gamma="auto", and of HF assisted generation with its default heuristic schedule (+2 when all
drafts are accepted, −1 otherwise). Temperature 1, fixed length. The runs are timed by the benchmarks' ruler
(`common.timed_rounds`: interleaved rounds, the order rotating, the first round a warm-up not counted, outlier
rounds re-measured), each by the wall clock: tokens/s are medians over the kept rounds, the ratios medians of
per-round ratios with their interval [low–high], then the rounds kept and the stability verdict.
"""

from __future__ import annotations

import torch
from common import (
    load,
    model_folders,
    parser,
    prompt_ids,
    rate_ratio,
    timed_rounds,
    verdict_cell,
    verdict_columns,
    wall,
)

import hfspec
from hfspec.measure.sweep import parse_gammas


def measure(target, ids, draft, assistant, gammas: list[int], args):
    """hfspec at every fixed γ and at "auto", and HF's heuristic schedule (the baseline), timed by the ruler."""
    n, t = args.max_new_tokens, args.temperature
    gen = dict(temperature=t, max_new_tokens=n, min_new_tokens=n)

    def ours(g):
        return lambda r: hfspec.generate(target, ids, draft=draft, gamma=g, seed=args.seed + r, **gen)

    def heuristic(r):  # timed_rounds seeds torch with seed + r before it
        return target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant,
                               do_sample=True, temperature=t, max_new_tokens=n, min_new_tokens=n)

    runs = {str(g): wall(ours(g), n) for g in gammas + ["auto"]} | {"hf": wall(heuristic, n)}
    return timed_rounds(runs, args.repeats, args.seed, baseline="hf")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--drafts", default="rtn4,rtn3")
    p.add_argument("--gammas", default="1-8")
    p.add_argument("--temperature", type=float, default=1.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gammas = [g for g in parse_gammas(args.gammas) if g != "auto"]
    print("| model | draft | best fixed γ | best fixed tok/s | auto tok/s | auto / best | mean auto γ "
          "| HF heuristic tok/s | auto / HF heuristic | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, folder in model_folders(args).items():
        target, tokenizer = load(folder)
        ids = prompt_ids(tokenizer)
        for spec in args.drafts.split(","):
            draft = hfspec.make_draft(target, spec, target_tokenizer=tokenizer) if "/" in spec else \
                hfspec.make_draft(target, spec)
            # HF's heuristic schedule runs an HF model: the draft itself, or its HF-forward copy for a lean draft
            assistant = draft if callable(getattr(draft, "generate", None)) else \
                hfspec.make_draft(target, spec, lean=False)
            assistant.generation_config.num_assistant_tokens = 4
            assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
            assistant.generation_config.assistant_confidence_threshold = 0.0

            timings = measure(target, ids, draft, assistant, gammas, args)
            tps = {k: timings.ratio(k).tokens_per_second if k != "hf" else
                   timings.ratio("auto").baseline_tokens_per_second for k in timings.names}
            best = str(max(gammas, key=lambda g: tps[str(g)]))
            auto_gammas = [g for k in timings.kept for g in k["auto"].out.stats.gamma_per_round]
            print(f"| {name} | {spec} | {best} | {tps[best]:.1f} | {tps['auto']:.1f} "
                  f"| {rate_ratio(timings, 'auto', best).cell()} | {sum(auto_gammas) / len(auto_gammas):.1f} "
                  f"| {tps['hf']:.1f} | {rate_ratio(timings, 'auto', 'hf').cell(unit='×')} "
                  f"| {verdict_cell(verdict_columns(timings))} |", flush=True)

if __name__ == "__main__":
    main()
