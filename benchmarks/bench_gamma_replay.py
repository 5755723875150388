"""Greedy γ policies replayed on many prompts and priced by measured round costs: γ auto against fixed γ, no clock.

    python benchmarks/bench_gamma_replay.py --models smollm2-offgrid --dtypes float32 \\
        --costs benchmarks/results/epyc-avx2-2c-2026-12-07-round-costs-chunk12-greedy.json

At temperature 0 a run's text and the draft tokens each round keeps are fixed by the prompt, so a γ policy can be
replayed round by round without decoding (`hfspec.measure.replay`; a seeded γ auto's replay makes the real run's
choices, tests/test_replay.py). Each round is priced by the cost model of a `bench_round_costs.py` row of the same
target, dtype, draft and T = 0 (`--costs`, its JSON): the draft's line, the time outside forwards and the verify
pass at each width it timed (flat below the narrowest, rising past the widest at their mean slope), all in one-token
HF steps, so a policy's rate reads as a speed-up over plain `generate`. The figure is as right as those costs; what
it removes is the noise of timing each policy on its own rounds, which on a 2-core machine is wider than the gaps
between γ auto and the fixed γs (±8-13 % over 5 rounds of 4 prompts). γ auto is the policy a seeded
`hfspec.generate` would take on this machine (`hfspec.api.seeded_gamma_policy`: a saved cost profile, else the
priors).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from statistics import median

import common
import torch

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):",
           "In a small village by the sea, there lived", "Write a short email to a colleague asking to move a meeting.",
           "The three laws of thermodynamics are", "import numpy as np\n\ndef normalize(x):",
           "Q: What is the boiling point of water?\nA:", "My favourite recipe for pancakes",
           "The history of the Roman Empire", "Dear diary, today", "Here is a list of tips for learning a new language:",
           "class Stack:\n    def __init__(self):", "The weather tomorrow will be", "Photosynthesis is the process",
           "Once there was a robot who"]


def costs_model(path: str, target: str, dtype: str, draft: str):
    """The `ProfileModel` of the T = 0 row of a bench_round_costs JSON for this target, dtype and draft."""
    from hfspec.decoding.profile import ProfileModel, monotone

    rows = [r for r in json.loads(Path(path).read_text()) if r["target"] == target and r["dtype"] == dtype
            and r["draft"] == draft and float(r["temperature"]) == 0.0]
    if not rows:
        raise SystemExit(f"{path}: no T = 0 row for {target}, {dtype}, {draft}")
    row = rows[0]
    widths = sorted((int(g) + 1, cell["verify"], 1.0) for g, cell in row["by_gamma"].items())
    points = tuple(monotone(widths))
    return ProfileModel(step=1.0, verify_a=0.0, verify_b=0.0, draft_a=row["draft_a"], draft_b=row["draft_b"],
                        draft_zero=0.0, other_a=row["other_a"], other_b=row["other_b"], plain_other=0.0,
                        source=f"{path} (T = 0 row)", points=points)


def main() -> None:
    import hfspec
    from hfspec.api import seeded_gamma_policy
    from hfspec.decoding.gamma import FixedGamma
    from hfspec.measure.replay import draft_matches, replay

    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(models="smollm2-offgrid", max_new_tokens=192)
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--draft", default="gptq4-compiled")
    p.add_argument("--costs", required=True, help="a bench_round_costs.py JSON with a T = 0 row for each target")
    p.add_argument("--gammas", default="1,2,3,4,5,6,7,8", help="fixed γs to replay beside γ auto")
    p.add_argument("--best-of", default="3,4,5", help="the fixed γs γ auto is compared with (the best of them)")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeat for several; default: 16)")
    p.add_argument("--decays", default="",
                   help="also replay γ auto with these decays of its acceptance estimate (comma-separated, in (0, 1]; "
                        "1: the whole run's counts; γ auto's own is 0.95): does remembering more or less help?")
    p.add_argument("--timed", type=int, default=0,
                   help="also time γ auto and the --best-of γs side by side (common.timed_rounds: interleaved, by the "
                        "wall clock, each prompt this many rounds), paired against the best of them: the clock's "
                        "figure beside the replay's (0: replay only)")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts = args.prompt or PROMPTS
    gammas = [int(g) for g in args.gammas.split(",")]
    best_of = [int(g) for g in args.best_of.split(",")]
    decays = [float(d) for d in args.decays.split(",") if d.strip()]
    if any(not 0.0 < d <= 1.0 for d in decays):
        p.error(f"--decays {args.decays}: each must be in (0, 1]")
    if not set(best_of) <= set(gammas):
        p.error(f"--best-of {args.best_of}: each must be one of --gammas {args.gammas}")
    lines, rows = [], []
    for name, folder in common.model_folders(args).items():
        for dtype in args.dtypes.split(","):
            model = costs_model(args.costs, name, dtype, args.draft)
            target, tok = common.load(folder, dtype)
            draft = hfspec.make_draft(target, args.draft)
            matches = [draft_matches(target, draft, common.prompt_ids(tok, text), args.max_new_tokens)
                       for text in prompts]
            runs = {f"γ {g}": [replay(m, FixedGamma(g), model) for m in matches] for g in gammas}
            runs["γ auto"] = [replay(m, seeded_gamma_policy(target, draft, "auto"), model) for m in matches]
            for d in decays:
                runs[f"γ auto, decay {d:g}"] = [replay(m, with_decay(seeded_gamma_policy(target, draft, "auto"), d),
                                                       model) for m in matches]
            best = {g: sum(r.tokens for r in runs[f"γ {g}"]) / sum(r.seconds for r in runs[f"γ {g}"])
                    for g in best_of}
            top = max(best, key=best.get)
            per_prompt = [a.rate / max(runs[f"γ {g}"][i].rate for g in best_of) for i, a in enumerate(runs["γ auto"])]
            head = (f"{name}, {dtype}, T = 0, {args.draft}, {len(prompts)} prompts × {args.max_new_tokens} tokens; "
                    f"draft α {sum(map(sum, matches)) / sum(map(len, matches)):.3f} (greedy matches); "
                    f"costs from {args.costs}")
            table = [head, "", "| policy | tokens / pass | speed-up over plain generate (priced) | vs best fixed γ of "
                     f"{args.best_of} (γ {top}) | γ chosen |", "|---|---|---|---|---|"]
            for key, replays in runs.items():
                tokens, seconds = sum(r.tokens for r in replays), sum(r.seconds for r in replays)
                passes = sum(len(r.gammas) for r in replays)
                hist = dict(sorted(sum((Counter(r.gammas) for r in replays), Counter()).items()))
                rate = tokens / seconds
                table.append(f"| {key} | {tokens / passes:.2f} | {rate:.2f}× | {rate / best[top]:.3f} | "
                             f"{', '.join(f'{g}: {n}' for g, n in hist.items())} |")
                rows.append({"target": name, "dtype": dtype, "draft": args.draft, "policy": key, "tokens": tokens,
                             "passes": passes, "speedup": rate, "vs_best_fixed": rate / best[top],
                             "gamma_hist": hist})
            structure = match_structure(matches)
            table += ["", "What γ auto could adapt to (the draft's greedy matches over every position of the texts): "
                      "P(match at depth j | the j − 1 before it matched), j = 1…6: "
                      + ", ".join(f"{r:.3f}" for r in structure["by_depth"])
                      + f"; P(match | the previous position missed) {structure['after_miss']:.3f}, "
                      f"| it matched {structure['after_match']:.3f}"]
            rows.append({"target": name, "dtype": dtype, "draft": args.draft, "policy": "match structure",
                         **structure})
            table += ["", f"γ auto over the best of γ {args.best_of} per prompt (each prompt's own best): median "
                      f"{median(per_prompt):.3f}, range {min(per_prompt):.3f}-{max(per_prompt):.3f}", ""]
            rows.append({"target": name, "dtype": dtype, "draft": args.draft, "policy": "auto per prompt",
                         "vs_own_best": per_prompt})
            if args.timed:
                timed = timed_against(target, draft, [common.prompt_ids(tok, t) for t in prompts], best_of,
                                      args.max_new_tokens, args.timed, args.seed, top)
                table += timed["lines"]
                rows.append({"target": name, "dtype": dtype, "draft": args.draft, "policy": "timed",
                             **{k: v for k, v in timed.items() if k != "lines"}})
            print("\n".join(table), flush=True)
            lines += table
    common.write_results(args.out, lines, rows)


def with_decay(policy, decay: float):
    """The seeded γ auto `policy` remembering its acceptance counts with `decay` per round instead of its own."""
    policy.decay = decay
    return policy


def match_structure(matches: list[list[bool]], depths: int = 6) -> dict:
    """How the draft's greedy matches hang together, over every start position of every text: the chance of a match
    at depth j given the j − 1 positions before it matched (a chain's acceptance by position; flat means a fixed γ
    loses nothing to a γ that adapts), and the chance of a match right after a miss and right after a match (how
    much one round's outcome says about the next)."""
    by_depth = []
    for j in range(1, depths + 1):
        reached = [m[i + j - 1] for m in matches for i in range(len(m) - j + 1) if all(m[i:i + j - 1])]
        by_depth.append(sum(reached) / len(reached) if reached else float("nan"))
    after_miss = [m[i] for m in matches for i in range(1, len(m)) if not m[i - 1]]
    after_match = [m[i] for m in matches for i in range(1, len(m)) if m[i - 1]]
    return {"by_depth": by_depth,
            "after_miss": sum(after_miss) / len(after_miss) if after_miss else float("nan"),
            "after_match": sum(after_match) / len(after_match) if after_match else float("nan")}


def timed_against(target, draft, prompts: list, gammas: list[int], tokens: int, per_prompt: int, seed: int,
                  top: int) -> dict:
    """γ auto and each fixed γ of `gammas`, seeded and greedy, timed side by side by the wall clock in interleaved
    rounds (`common.timed_rounds`, each prompt `per_prompt` rounds, prompts as strata), each over γ `top` (the
    replay's best) round by round: the measured counterpart of the replay's table, on the same prompts."""
    import hfspec

    def run(gamma):
        def go(r):
            return hfspec.generate(target, prompts[r % len(prompts)], draft=draft, gamma=gamma, temperature=0,
                                   max_new_tokens=tokens, min_new_tokens=tokens, seed=seed + r)
        return common.wall(go, tokens)

    names = [f"γ {g}" for g in gammas] + ["γ auto"]
    runs = {name: run("auto" if name == "γ auto" else int(name[2:])) for name in names}
    baseline = f"γ {top}"
    timings = common.timed_rounds(runs, per_prompt * len(prompts), seed, baseline=baseline,
                                  strata=lambda r: r % len(prompts))
    stable, warnings = timings.verdict()
    lines = [f"Timed side by side (wall clock, {timings.pairs} rounds, each prompt {per_prompt}×, interleaved), "
             f"tokens/s over {baseline} round by round: "
             + ", ".join(f"{n} {timings.ratio(n).median:.3f} ({timings.ratio(n).low:.3f}–{timings.ratio(n).high:.3f})"
                         for n in names if n != baseline)
             + f"; {'stable' if stable else 'unstable'}" + (f" ({'; '.join(warnings)})" if warnings else ""), ""]
    return {"lines": lines, "baseline": baseline, "pairs": timings.pairs, "stable": stable, "warnings": warnings,
            "over_baseline": {n: [timings.ratio(n).median, timings.ratio(n).low, timings.ratio(n).high]
                              for n in names if n != baseline}}


if __name__ == "__main__":
    main()
