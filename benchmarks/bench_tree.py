"""Trees against the best chain: the chain at several γ, sibling leaves (`tree=k`), token trees (`tree="auto"` and
fixed `TreeShape`s), same draft, same prompts.

    python benchmarks/bench_tree.py --models micro,smollm2 --dtypes float32,bfloat16 --gammas 3,4,5 \\
        --shapes auto,24x6x4x4 --trees 3 --max-new-tokens 64 --repeats 2

    # timing-free (tokens per target pass only; fine on a busy machine):
    python benchmarks/bench_tree.py --models ~/.cache/hfspec-models/smollm2-135m-instruct-offgrid --draft rtn4 \\
        --dtypes float32 --gammas 3,4,5 --shapes auto,24x6x4x4 --trees 0 --temperatures 1,0 --no-timing

Per model, dtype and temperature, the methods run interleaved per repeat and prompt (each repeat its own seed;
with timing, the first repeat is a warm-up that is not counted). A shape is NODESxDEPTHxBRANCHxWIDTH (see
`hfspec.TreeShape`). Reported: tokens per target pass (what a tree is for), target positions per pass (the verify
width it costs), draft forwards per pass (a token tree's levels), tokens/s and the ratio to the best chain's
tokens/s (and, always, tokens per pass against the best chain's). --no-timing runs no clock at all. A markdown
table goes to stdout and, with --out, to OUT.md beside OUT.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from common import model_folders, parser

import hfspec
import hfspec.decoding.siblings

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "Here are three tips for sleeping"]


def load(path: Path, dtype: str):
    from hfspec.io.loading import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(path), dtype=dtype, progress=False), load_tokenizer(str(path))


def methods(args) -> list[tuple[str, dict]]:
    """(label, generate keywords) per method: chains first."""
    out = [(f"chain γ={g}", {"gamma": g}) for g in (int(x) for x in args.gammas.split(",") if x.strip())]
    for w in (int(x) for x in args.trees.split(",") if x.strip()):
        if w > 1:
            out.append((f"siblings {w} γ={args.gamma}", {"gamma": args.gamma, "tree": w}))
    for spec in (s.strip() for s in args.shapes.split(",") if s.strip()):
        if spec == "auto":
            out.append(("token tree auto", {"tree": "auto"}))
        else:
            n, d, b, w = (int(v) for v in spec.split("x"))
            out.append((f"token tree {spec}", {"tree": hfspec.TreeShape(n, d, b, w)}))
    return out


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2", max_new_tokens=64, repeats=2)
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes for models other than micro")
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4, help="γ of the sibling-leaf trees")
    p.add_argument("--gammas", default="3,4,5", help="chain γs (the best one is the reference)")
    p.add_argument("--trees", default="3", help="sibling-leaf widths (hfspec.decoding.siblings); 0: none")
    p.add_argument("--shapes", default="auto,24x6x4x4", help="token trees: auto and/or NODESxDEPTHxBRANCHxWIDTH")
    p.add_argument("--temperatures", default="1.0")
    p.add_argument("--prompts", type=int, default=2, help=f"how many of {len(PROMPTS)} built-in prompts")
    p.add_argument("--no-timing", action="store_true", help="tokens per pass only: no clock, no warm-up")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    timing = not args.no_timing
    rows = []
    header = ("| model | dtype | T | method | tokens/pass | vs best chain (tokens/pass) | positions/pass "
              "| draft fwd/pass | tok/s | vs best chain (tok/s) |")
    lines = [header, "|" + "---|" * 10]
    print("\n".join(lines), flush=True)
    for name, folder in model_folders(args).items():
        for dtype in (["float32"] if name == "micro" else args.dtypes.split(",")):
            target, tokenizer = load(folder, dtype)
            draft = hfspec.make_draft(target, args.draft)
            prompts = [tokenizer(t, return_tensors="pt").input_ids for t in PROMPTS[: args.prompts]]
            n = args.max_new_tokens
            todo = methods(args)
            for t in (float(x) for x in args.temperatures.split(",")):
                pooled = {label: None for label, _ in todo}
                seconds = dict.fromkeys(pooled, 0.0)
                for r in range(args.repeats + int(timing)):
                    for i, ids in enumerate(prompts):
                        for label, kwargs in todo:  # interleaved: every method sees the same load
                            began = time.perf_counter() if timing else 0.0
                            out = hfspec.generate(target, ids, draft=draft, temperature=t, max_new_tokens=n,
                                                  min_new_tokens=n, seed=args.seed + 100 * r + i, **kwargs)
                            if r or not timing:
                                if timing:
                                    seconds[label] += time.perf_counter() - began
                                pooled[label] = out.stats if pooled[label] is None else pooled[label].merge(out.stats)
                chains = [label for label, _ in todo if label.startswith("chain")]
                tpp = {label: s.new_tokens / s.target_passes for label, s in pooled.items()}
                tps = {label: pooled[label].new_tokens / seconds[label] for label in pooled} if timing else {}
                best_tpp = max(tpp[c] for c in chains) if chains else None
                best_tps = max(tps[c] for c in chains) if chains and timing else None
                for label, _ in todo:
                    s = pooled[label]
                    row = {"model": name, "dtype": dtype, "temperature": t, "method": label, "draft": args.draft,
                           "new_tokens": s.new_tokens, "target_passes": s.target_passes,
                           "tokens_per_pass": tpp[label],
                           "tokens_per_pass_vs_best_chain": tpp[label] / best_tpp if best_tpp else None,
                           "positions_per_pass": s.positions_fed_target / s.target_passes,
                           "draft_forwards_per_pass": s.draft_forwards / s.target_passes,
                           "tokens_per_second": tps.get(label),
                           "vs_best_chain": tps[label] / best_tps if best_tps else None}
                    rows.append(row)
                    speed = f"{tps[label]:.1f}" if timing else ""
                    ratio = f"{row['vs_best_chain']:.2f}×" if best_tps else ""
                    line = (f"| {name} | {dtype} | {t:g} | {label} | {row['tokens_per_pass']:.2f} "
                            f"| {row['tokens_per_pass_vs_best_chain'] or 0:.2f}× | {row['positions_per_pass']:.1f} "
                            f"| {row['draft_forwards_per_pass']:.1f} "
                            f"| {speed} | {ratio} |")
                    lines.append(line)
                    print(line, flush=True)
    if args.out:
        meta = {"command": vars(args), "timing": timing, "load": Path("/proc/loadavg").read_text().split()[:3]
                if Path("/proc/loadavg").exists() else None}
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
