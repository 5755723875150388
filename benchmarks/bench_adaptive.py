"""Adaptive γ against the best fixed γ and against HF's heuristic schedule, on the same pair.

    python benchmarks/bench_adaptive.py --models micro,smollm2 --drafts rtn4,rtn3 --gammas 1-8

For each draft: tokens/s of hfspec at every fixed γ (the best one is what `hfspec sweep` would pick), of
hfspec with gamma="auto", and of HF assisted generation with its default heuristic schedule (+2 when all
drafts are accepted, −1 otherwise). Runs are interleaved per repeat, temperature 1, fixed length.
"""

from __future__ import annotations

import time

import torch
from common import load, model_folders, parser, prompt_ids

import hfspec
from hfspec.sweep import parse_gammas


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--drafts", default="rtn4,rtn3")
    p.add_argument("--gammas", default="1-8")
    p.add_argument("--temperature", type=float, default=1.0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gammas = [g for g in parse_gammas(args.gammas) if g != "auto"]
    print("| model | draft | best fixed γ | best fixed tok/s | auto tok/s | auto / best | mean auto γ "
          "| HF heuristic tok/s | auto / HF heuristic |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, folder in model_folders(args).items():
        target, tokenizer = load(folder)
        ids = prompt_ids(tokenizer)
        n, t = args.max_new_tokens, args.temperature
        for spec in args.drafts.split(","):
            draft = hfspec.make_draft(target, spec, target_tokenizer=tokenizer) if "/" in spec else \
                hfspec.make_draft(target, spec)
            gen = dict(temperature=t, max_new_tokens=n, min_new_tokens=n)
            # HF's heuristic schedule runs an HF model: the draft itself, or its HF-forward copy for a lean draft
            assistant = draft if callable(getattr(draft, "generate", None)) else \
                hfspec.make_draft(target, spec, lean=False)
            assistant.generation_config.num_assistant_tokens = 4
            assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
            assistant.generation_config.assistant_confidence_threshold = 0.0

            keys = gammas + ["auto"]
            seconds = dict.fromkeys(keys + ["hf"], 0.0)
            auto_gammas: list[int] = []
            for r in range(args.repeats + 1):  # the first round warms up and is not counted
                for g in keys:
                    began = time.perf_counter()
                    out = hfspec.generate(target, ids, draft=draft, gamma=g, seed=args.seed + r, **gen)
                    if r:
                        seconds[g] += time.perf_counter() - began
                        if g == "auto":
                            auto_gammas += out.stats.gamma_per_round
                torch.manual_seed(args.seed + r)
                began = time.perf_counter()
                target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=assistant, do_sample=True,
                                temperature=t, max_new_tokens=n, min_new_tokens=n)
                took = time.perf_counter() - began
                if r:
                    seconds["hf"] += took
            tps = {k: n * args.repeats / s for k, s in seconds.items()}
            best = max(gammas, key=lambda g: tps[g])
            print(f"| {name} | {spec} | {best} | {tps[best]:.1f} | {tps['auto']:.1f} | {tps['auto'] / tps[best]:.2f} "
                  f"| {sum(auto_gammas) / len(auto_gammas):.1f} | {tps['hf']:.1f} | {tps['auto'] / tps['hf']:.2f}× |",
                  flush=True)


if __name__ == "__main__":
    main()
