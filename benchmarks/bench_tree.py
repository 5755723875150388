"""Trees against the best chain: the chain at several γ, sibling leaves (`tree=k`), token trees (`tree="auto"` and
fixed `TreeShape`s), same draft, same prompts.

    python benchmarks/bench_tree.py --models micro,smollm2 --dtypes float32,bfloat16 --gammas 3,4,5 \\
        --shapes auto,24x6x4x4 --trees 3 --max-new-tokens 64 --repeats 2

    # a compiled draft's token trees with and without its compiled tree level:
    python benchmarks/bench_tree.py --models smollm2-offgrid --draft gptq4-compiled --dtypes bfloat16 --gammas 3,4,5 \\
        --shapes auto,24x6x4x4 --trees 0 --temperatures 1,0 --prompts 4 --max-new-tokens 96 --repeats 3 --eager-levels

    # timing-free (tokens per target pass only; fine on a busy machine):
    python benchmarks/bench_tree.py --models ~/.cache/hfspec-models/smollm2-135m-instruct-offgrid --draft rtn4 \\
        --dtypes float32 --gammas 3,4,5 --shapes auto,24x6x4x4 --trees 0 --temperatures 1,0 --no-timing

Per model, dtype and temperature, the methods run interleaved per repeat and prompt (each repeat its own seed;
with timing, the first repeat is a warm-up that is not counted). A shape is NODESxDEPTHxBRANCHxWIDTH (see
`hfspec.TreeShape`). Reported: tokens per target pass (what a tree is for), target positions per pass (the verify
width it costs), draft forwards per pass (a token tree's levels), where a pass's time went (the target's
forwards, the draft's, and the rest: sampling, the walk, masks, cache cuts, Python; from each method's `SpecStats`),
tokens/s, and the ratios to plain `generate` and to the best fixed-γ chain's tokens/s: medians of per-round ratios
with their intervals, by the benchmarks' one ruler, `common.timed_rounds`. `--gammas` may add `auto`, a chain at
γ auto, which token tree auto's row is then also paired with (the same γ policy for its chain rounds). Tokens per
pass are always given against the best chain's. --no-timing runs no clock at all. A markdown
table goes to stdout and, with --out, to OUT.md beside OUT.json.
"""

from __future__ import annotations

from pathlib import Path

import common
import torch
from common import model_dtypes, parser, verdict_cell, write_results

import hfspec
import hfspec.decoding.siblings

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "Here are three tips for sleeping"]


def load(path: Path, dtype: str):
    from hfspec.io.loading import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(path), dtype=dtype, progress=False), load_tokenizer(str(path))


AUTO_CHAIN = "chain γ=auto"


def methods(args) -> list[tuple[str, dict]]:
    """(label, generate keywords) per method: chains first."""
    out = [(f"chain γ={g}", {"gamma": g if g == "auto" else int(g)})
           for g in (x.strip() for x in args.gammas.split(",")) if g]
    for w in (int(x) for x in args.trees.split(",") if x.strip()):
        if w > 1:
            out.append((f"siblings {w} γ={args.gamma}", {"gamma": args.gamma, "tree": w}))
    for spec in (s.strip() for s in args.shapes.split(",") if s.strip()):
        if spec == "auto":
            # its chain rounds at γ auto, as `hfspec run --tree auto --gamma auto` and bench_results' draft:auto:auto
            # (before 7 December they ran at generate's default γ 4)
            trees = [("token tree auto, γ auto", {"tree": "auto", "gamma": "auto"})]
        else:
            n, d, b, w = (int(v) for v in spec.split("x"))
            trees = [(f"token tree {spec}", {"tree": hfspec.TreeShape(n, d, b, w)})]
        if args.eager_levels:
            trees.append((f"{trees[0][0]} (eager levels)", {**trees[0][1], "eager_levels": True}))
        out += trees
    return out


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2", max_new_tokens=64, repeats=2)
    p.add_argument("--dtypes", default="float32,bfloat16", help="dtypes for models other than micro")
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4, help="γ of the sibling-leaf trees")
    p.add_argument("--gammas", default="3,4,5", help="chain γs (the best fixed one is the reference); auto: also a "
                   "chain at γ auto, which token tree auto's row is then paired with too")
    p.add_argument("--trees", default="3", help="sibling-leaf widths (hfspec.decoding.siblings); 0: none")
    p.add_argument("--shapes", default="auto,24x6x4x4", help="token trees: auto and/or NODESxDEPTHxBRANCHxWIDTH")
    p.add_argument("--temperatures", default="1.0")
    p.add_argument("--prompts", type=int, default=2, help=f"how many of {len(PROMPTS)} built-in prompts")
    p.add_argument("--no-timing", action="store_true", help="tokens per pass only: no clock, no warm-up")
    p.add_argument("--eager-levels", action="store_true", help="each token tree also with a compiled draft's tree "
                   "levels on the eager lean step (what they ran before the compiled level)")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    timing = not args.no_timing
    rows = []
    header = ("| model | dtype | T | method | tokens/pass | vs best chain (tokens/pass) | positions/pass "
              "| draft fwd/pass | ms a pass: target / draft / rest | tok/s | vs plain [interval] | vs best chain (tok/s) [interval] "
              "| vs chain γ auto [interval] | verdict |")
    lines = [header, "|" + "---|" * 14]
    print("\n".join(lines), flush=True)
    for name, folder, dtype in model_dtypes(args):
        target, tokenizer = load(folder, dtype)
        draft = hfspec.make_draft(target, args.draft)
        prompts = [tokenizer(t, return_tensors="pt").input_ids for t in PROMPTS[: args.prompts]]
        todo = methods(args)
        for t in (float(x) for x in args.temperatures.split(",")):
            runs = {label: _method(target, draft, prompts, t, args, kwargs) for label, kwargs in todo}
            if timing:  # one ruler: interleaved rounds, a warm-up round, outliers re-measured, a verdict
                runs["plain"] = _plain(target, prompts, t, args.max_new_tokens)
                tokens = args.max_new_tokens * len(prompts)
                timings = common.timed_rounds({k: common.wall(fn, tokens) for k, fn in runs.items()},
                                              args.repeats, args.seed)
                pooled = {label: _pool(k[label].out for k in timings.kept) for label, _ in todo}
            else:
                timings = None
                pooled = {label: _pool(runs[label](r) for r in range(args.repeats)) for label, _ in todo}
            rows += _rows(name, dtype, t, todo, pooled, timings, args, lines)
    write_results(args.out, lines, rows)


def _method(target, draft, prompts, temperature: float, args, kwargs):
    """fn(round) decoding every prompt with one method, each seeded by the round and the prompt; returns the
    pooled `SpecStats`."""
    n = args.max_new_tokens
    kwargs = dict(kwargs)
    eager = kwargs.pop("eager_levels", False)
    step = getattr(draft, "compiled_step", None)
    if eager and step is None:
        raise SystemExit(f"--eager-levels: draft {args.draft!r} has no compiled step (use a -compiled spec)")

    def run(r: int):
        stats = None
        level = step.tree_level if eager else None
        if level is not None:  # compiled (or refused) before the swap: the run must not compile it again
            level.prepare()
            level.fn, kept = None, level.fn
        try:
            for i, ids in enumerate(prompts):
                out = hfspec.generate(target, ids, draft=draft, temperature=temperature, max_new_tokens=n,
                                      min_new_tokens=n, seed=args.seed + 100 * r + i, **kwargs)
                stats = out.stats if stats is None else stats.merge(out.stats)
        finally:
            if level is not None:
                level.fn = kept
        return stats
    return run


def _plain(target, prompts, temperature: float, tokens: int):
    sample = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
              else dict(do_sample=False))

    def run(r: int):
        for ids in prompts:
            target.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **sample)
    return run


def _pool(stats):
    pooled = None
    for s in stats:
        pooled = s if pooled is None else pooled.merge(s)
    return pooled


def _rows(name, dtype, t, todo, pooled, timings, args, lines) -> list[dict]:
    chains = [label for label, _ in todo if label.startswith("chain") and label != AUTO_CHAIN]  # fixed γ
    tpp = {label: s.new_tokens / s.target_passes for label, s in pooled.items()}
    best_tpp = max(tpp[c] for c in chains) if chains else None
    if timings is not None:
        best = max(chains, key=lambda c: timings.ratio(c).median) if chains else None
        verdict = verdict_cell(common.verdict_columns(timings))
    out = []
    for label, _ in todo:
        s = pooled[label]
        row = {"model": name, "dtype": dtype, "temperature": t, "method": label, "draft": args.draft,
               "new_tokens": s.new_tokens, "target_passes": s.target_passes, "tokens_per_pass": tpp[label],
               "tokens_per_pass_vs_best_chain": tpp[label] / best_tpp if best_tpp else None,
               "positions_per_pass": s.positions_fed_target / s.target_passes,
               "draft_forwards_per_pass": s.draft_forwards / s.target_passes,
               # where a pass's time went (each method's own rounds, pooled): the target's forwards, the draft's
               # (steps, tree levels), and the rest (sampling, verification, masks, cache cuts, Python)
               "ms_per_pass": {part: 1000 * seconds / s.target_passes for part, seconds in
                               (("target", s.time_target), ("draft", s.time_draft),
                                ("rest", s.time_total - s.time_target - s.time_draft))}}
        cells = ["", "", "", ""]
        if timings is not None:
            ratio = timings.ratio(label)
            row.update(tokens_per_second=ratio.tokens_per_second, vs_plain=ratio.median, vs_plain_low=ratio.low,
                       vs_plain_high=ratio.high)
            cells = [f"{ratio.tokens_per_second:.1f}", f"{ratio.median:.2f}× [{ratio.low:.2f}–{ratio.high:.2f}]", "", ""]
            if best:
                vs = common.rate_ratio(timings, label, best)
                row.update(vs_best_chain=vs.median, vs_best_chain_low=vs.low, vs_best_chain_high=vs.high,
                           best_chain=best)
                cells[2] = vs.cell(unit="×")
            if label.startswith("token tree auto") and AUTO_CHAIN in pooled:  # the same γ policy for its chain rounds
                vs = common.rate_ratio(timings, label, AUTO_CHAIN)
                row.update(vs_chain_auto=vs.median, vs_chain_auto_low=vs.low, vs_chain_auto_high=vs.high)
                cells[3] = vs.cell(unit="×")
        out.append(row)
        line = (f"| {name} | {dtype} | {t:g} | {label} | {row['tokens_per_pass']:.2f} "
                f"| {row['tokens_per_pass_vs_best_chain'] or 0:.2f}× | {row['positions_per_pass']:.1f} "
                f"| {row['draft_forwards_per_pass']:.1f} | {_split(row, timings)} | {' | '.join(cells)} | "
                f"{verdict if timings is not None else 'no timing'} |")
        lines.append(line)
        print(line, flush=True)
    return out


def _split(row: dict, timings) -> str:
    """The ms-a-pass cell (blank without timing: a --no-timing run's clock includes no warm-up)."""
    if timings is None:
        return ""
    return " / ".join(f"{row['ms_per_pass'][part]:.0f}" for part in ("target", "draft", "rest"))


if __name__ == "__main__":
    main()
