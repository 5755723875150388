"""Tree speculation (chain + sibling leaves) against the plain chain: same draft, same γ, same prompt.

    python benchmarks/bench_tree.py --models micro,smollm2 --dtypes float32,bfloat16 --trees 2,3 \\
        --max-new-tokens 64 --repeats 2

Per model, dtype and temperature, the methods run interleaved per repeat (each repeat its own seed, the first
one a warm-up that is not counted): the chain (`tree=0`) and each tree width. Reported: tokens per target pass
(the tree's goal: more per pass at the same draft cost), target positions per pass (the verify width the leaves
add), siblings kept per pass, draft forwards per token, tokens/s and the ratio to the chain's. A markdown table
goes to stdout and, with --out, to OUT.md beside OUT.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from common import model_folders, parser, prompt_ids

import hfspec
import hfspec.tree


def load(path: Path, dtype: str):
    from hfspec.loading import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(path), dtype=dtype, progress=False), load_tokenizer(str(path))


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2", max_new_tokens=64, repeats=2)
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes for models other than micro")
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--trees", default="2,3", help="tree widths to compare with the chain")
    p.add_argument("--temperatures", default="1.0")
    p.add_argument("--below", type=float, default=hfspec.tree.DEFAULT_BELOW,
                   help="siblings where the draft's top probability is below this")
    p.add_argument("--always", action="store_true", help="leaves in every round (skip the run's cost rule)")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    hfspec.tree.DEFAULT_BELOW = args.below
    if args.always:
        hfspec.tree.LeafCost.pays = lambda self: True
    widths = [0] + [int(w) for w in args.trees.split(",") if w.strip()]
    rows = []
    header = ("| model | dtype | T | method | tokens/pass | positions/pass | siblings kept/pass | draft fwd/token "
              "| tok/s | vs chain |")
    lines = [header, "|" + "---|" * 10]
    print("\n".join(lines), flush=True)
    for name, folder in model_folders(args).items():
        for dtype in (["float32"] if name == "micro" else args.dtypes.split(",")):
            target, tokenizer = load(folder, dtype)
            draft = hfspec.make_draft(target, args.draft)
            ids = prompt_ids(tokenizer)
            n = args.max_new_tokens
            for t in (float(x) for x in args.temperatures.split(",")):
                pooled = {w: None for w in widths}
                seconds = dict.fromkeys(widths, 0.0)
                for r in range(args.repeats + 1):
                    for w in widths:
                        began = time.perf_counter()
                        out = hfspec.generate(target, ids, draft=draft, gamma=args.gamma, temperature=t,
                                              max_new_tokens=n, min_new_tokens=n, seed=args.seed + r, tree=w)
                        took = time.perf_counter() - began
                        if r:
                            seconds[w] += took
                            pooled[w] = out.stats if pooled[w] is None else pooled[w].merge(out.stats)
                chain_tps = pooled[0].new_tokens / seconds[0]
                for w in widths:
                    s = pooled[w]
                    tps = s.new_tokens / seconds[w]
                    row = {"model": name, "dtype": dtype, "temperature": t, "tree": w, "gamma": args.gamma,
                           "draft": args.draft, "below": args.below, "new_tokens": s.new_tokens,
                           "target_passes": s.target_passes, "tokens_per_pass": s.new_tokens / s.target_passes,
                           "positions_per_pass": s.positions_fed_target / s.target_passes,
                           "siblings_kept_per_pass": s.tree_kept / s.target_passes,
                           "draft_forwards_per_token": s.draft_forwards / s.new_tokens,
                           "tokens_per_second": tps, "vs_chain": tps / chain_tps}
                    rows.append(row)
                    line = (f"| {name} | {dtype} | {t:g} | {'chain' if not w else f'tree {w}'} "
                            f"| {row['tokens_per_pass']:.2f} | {row['positions_per_pass']:.2f} "
                            f"| {row['siblings_kept_per_pass']:.2f} | {row['draft_forwards_per_token']:.2f} "
                            f"| {tps:.1f} | {row['vs_chain']:.2f}× |")
                    lines.append(line)
                    print(line, flush=True)
    if args.out:
        meta = {"command": vars(args), "load": Path("/proc/loadavg").read_text().split()[:3]
                if Path("/proc/loadavg").exists() else None}
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        Path(args.out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
