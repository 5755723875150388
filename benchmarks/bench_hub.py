"""hfspec through the Hub `custom_generate` folder against `hfspec.generate`: same tokens, same speed-up?

    python benchmarks/bench_hub.py --models smollm2 --max-new-tokens 128 --repeats 3

Per model: plain `generate` (greedy), `hfspec.generate(target, ids, draft=<rtn draft>)`, and
`target.generate(ids, custom_generate=<folder from export_hub>, trust_remote_code=True, draft=SPEC)`, each making
exactly --max-new-tokens tokens. The three are timed by the benchmarks' ruler (`common.timed_rounds`: interleaved
rounds, the order rotating, the first round a warm-up not counted, outlier rounds re-measured), each by the wall
clock; the table gives the median seconds, each method's speed-up over plain generate (median per-round ratio),
the ratio hub / hfspec.generate of the medians and paired (median per-round ratio, with its interval; 1.00 = the
folder keeps the whole speed-up; the goal is within 5 %), the rounds kept and the stability verdict, and whether
the hub output equals hfspec.generate's token for token. The hub's draft is built by the warm-up round (untimed)
and kept on the target, as in real use.
--export also decodes with the draft exported by `export_draft` (compressed-tensors, loaded by transformers):
its acceptance rate against the in-memory draft's.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
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

import hfspec  # noqa: E402
from hfspec.hub_export import export_hub, forget_drafts  # noqa: E402


def bench_model(name: str, path: Path, args, folder: Path) -> dict:
    target, tok = load(path)
    ids = prompt_ids(tok, args.prompt)
    n = args.max_new_tokens
    draft = hfspec.make_draft(target, args.draft)
    forget_drafts(target)
    common = dict(max_new_tokens=n, min_new_tokens=n)
    methods = {
        "plain generate": lambda: target.generate(ids, do_sample=False, **common),
        "hfspec.generate": lambda: hfspec.generate(target, ids, draft=draft, gamma=args.gamma, temperature=0,
                                                   **common).sequences,
        "custom_generate folder": lambda: target.generate(ids, custom_generate=str(folder), trust_remote_code=True,
                                                          draft=args.draft, gamma=args.gamma, do_sample=False,
                                                          **common),
    }
    # the warm-up round (not counted) builds the hub's draft once
    timings = timed_rounds({label: wall(lambda r, fn=fn: fn(), n) for label, fn in methods.items()}, args.repeats,
                           args.seed, baseline="plain generate")
    outputs = {label: timings.kept[-1][label].out for label in methods}
    med = {label: statistics.median(k[label].seconds for k in timings.kept) for label in methods}
    paired = rate_ratio(timings, "custom_generate folder", "hfspec.generate")  # = hfspec s / folder s per round
    row = {
        "model": name, "draft": args.draft, "gamma": args.gamma, "tokens": n,
        "seconds": med, "speedup": {label: timings.ratio(label).median for label in methods},
        "speedup_interval": {label: (timings.ratio(label).low, timings.ratio(label).high) for label in methods},
        "hub_over_hfspec": med["hfspec.generate"] / med["custom_generate folder"],
        "hub_over_hfspec_paired": paired.median,
        "hub_over_hfspec_paired_low": paired.low, "hub_over_hfspec_paired_high": paired.high,
        "identical": bool(torch.equal(outputs["custom_generate folder"], outputs["hfspec.generate"])),
        "greedy_identical": bool(torch.equal(outputs["hfspec.generate"], outputs["plain generate"])),
        **verdict_columns(timings),
    }
    if args.export:
        row["export_alpha"] = _export_alpha(target, tok, draft, ids, args)
    forget_drafts(target)
    return row


def _export_alpha(target, tok, draft, ids, args) -> dict:
    from hfspec.io.export_draft import export_draft, load_export

    with tempfile.TemporaryDirectory() as tmp:
        result = export_draft(target, args.draft, Path(tmp) / "draft", tokenizer=tok, check=False)
        exported = load_export(result.folder)
        alphas = {}
        for label, d in (("in-memory", draft), ("exported", exported)):
            out = hfspec.generate(target, ids, draft=d, gamma=args.gamma, temperature=0,
                                  max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens)
            alphas[label] = out.stats.alpha
        return alphas


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.set_defaults(models="micro,smollm2")
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--export", action="store_true", help="also compare the exported draft's acceptance rate")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"\nhfspec via custom_generate vs hfspec.generate: draft {args.draft}, gamma {args.gamma}, greedy, "
          f"{args.max_new_tokens} tokens, median of {args.repeats} interleaved after a warm-up, {args.threads} "
          "threads\n")
    print("| model | plain s | hfspec.generate s | folder s | speed-up hfspec | speed-up folder | folder / hfspec "
          "| paired | paired interval | identical | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hub(Path(tmp) / "hfspec_hub_bench", draft=args.draft, gamma=args.gamma)
        for name, path in model_folders(args).items():
            r = bench_model(name, path, args, folder)
            rows.append(r)
            s, x = r["seconds"], r["speedup"]
            print(f"| {r['model']} | {s['plain generate']:.2f} | {s['hfspec.generate']:.2f} | "
                  f"{s['custom_generate folder']:.2f} | {x['hfspec.generate']:.2f}× | "
                  f"{x['custom_generate folder']:.2f}× | {r['hub_over_hfspec']:.3f} | {r['hub_over_hfspec_paired']:.3f} | "
                  f"{r['hub_over_hfspec_paired_low']:.3f}–{r['hub_over_hfspec_paired_high']:.3f} | "
                  f"{'yes' if r['identical'] and r['greedy_identical'] else 'NO'} | {verdict_cell(r)} |", flush=True)
    if args.export:
        print("\n| model | α in-memory draft | α exported draft (compressed-tensors) |\n|---|---|---|")
        for r in rows:
            a = r["export_alpha"]
            print(f"| {r['model']} | {a['in-memory']:.3f} | {a['exported']:.3f} |")


if __name__ == "__main__":
    main()
