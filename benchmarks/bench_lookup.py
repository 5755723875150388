"""Prompt lookup on input-grounded text: hfspec's lookup draft against plain decoding and transformers'
`prompt_lookup_num_tokens`, greedy and T = 1.

    python benchmarks/bench_lookup.py --models micro --prompts edit,repeat --temperatures 0,1 --gamma 4 \
        --ngram 3 --max-new-tokens 128 --repeats 5 --json benchmarks/results/lookup_micro.json

Four methods on the same prompt (`--prompts`: "edit", a docstring then the start of an edited copy of it;
"repeat", the docstring three times then its start again; or any text), each producing exactly
max_new_tokens (EOS suppressed): hfspec lookup, hfspec plain, HF plain `generate`, HF `generate` with
`prompt_lookup_num_tokens=γ, max_matching_ngram_size=N`. They are timed by the benchmarks' ruler
(`common.timed_rounds`: interleaved rounds, the order rotating, the first round a warm-up not counted, outlier
rounds re-measured), each by the wall clock: tokens/s are medians over the kept rounds, the ratios medians of
per-round ratios with their interval, then the rounds kept and the stability verdict. Target forwards are
counted with a hook, so tokens per target pass compares the two lookups directly. Only meaningful on a quiet
machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from common import load, model_folders, parser, rate_ratio, timed_rounds, verdict_cell, verdict_columns, wall

import hfspec

DOC = '''def get(self, key, default=None):
    """Return the value for key if key is in the dictionary, else default.

    If default is not given, it defaults to None, so that this method never raises a KeyError.
    """
    return self._data.get(key, default)
'''
PROMPTS = {
    "edit": DOC + "\n\n" + DOC.replace("def get", "def pop").split("else default.")[0],  # an edit, begun
    "repeat": DOC * 3 + DOC[:40],  # the same docstring again: the most copying a model can do
}
METHODS = ("hfspec lookup", "hfspec plain", "HF plain", "HF prompt lookup")


class ForwardCounter:
    """Counts the target's forward calls (one per target pass, whatever the method)."""

    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        self.calls += 1


def run_once(method: str, target, draft, ids, n: int, temperature: float, gamma: int, ngram: int, seed: int):
    """(new tokens [n], hfspec stats or None) of one run."""
    sample = temperature > 0
    if method.startswith("hfspec"):
        kwargs = dict(temperature=temperature, top_k=0 if sample else None, max_new_tokens=n,
                      min_new_tokens=n, seed=seed)
        out = (hfspec.generate(target, ids, draft=draft, gamma=gamma, **kwargs) if method == "hfspec lookup"
               else hfspec.plain_generate(target, ids, **kwargs))
        return out.sequences[0, ids.shape[1]:], out.stats
    torch.manual_seed(seed)
    kwargs = dict(do_sample=sample, max_new_tokens=n, min_new_tokens=n, attention_mask=torch.ones_like(ids))
    greedy = dict(temperature=None, top_k=None, top_p=None)
    kwargs |= dict(temperature=temperature, top_k=0) if sample else greedy
    if method == "HF prompt lookup":
        kwargs |= dict(prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram)
    return target.generate(ids, **kwargs)[0, ids.shape[1]:], None


def measure(target, draft, ids, n, temperature, gamma, ngram, repeats, seed) -> dict:
    counter = ForwardCounter(target)

    def method_run(method):
        def run(r):
            counter.calls = 0
            tokens, run_stats = run_once(method, target, draft, ids, n, temperature, gamma, ngram, seed + r)
            return tokens, run_stats, counter.calls
        return wall(run, n)

    timings = timed_rounds({m: method_run(m) for m in METHODS}, repeats, seed, baseline="HF plain")
    counter.handle.remove()
    kept = timings.kept
    stats = None
    for k in kept:
        run_stats = k["hfspec lookup"].out[1]
        stats = run_stats if stats is None else stats.merge(run_stats)
    outputs = {m: kept[0][m].out[0].tolist() for m in METHODS}
    vs_hf = {m: rate_ratio(timings, m, "HF plain") for m in METHODS}
    vs_ours = {m: rate_ratio(timings, m, "hfspec plain") for m in METHODS}
    result = {
        "temperature": temperature, "gamma": gamma, "ngram": ngram, "new_tokens": n, "repeats": repeats,
        "prompt_tokens": ids.shape[1],
        "tokens_per_second": {m: timings.ratio(m).tokens_per_second for m in METHODS},
        "seconds": {m: [k[m].seconds for k in kept] for m in METHODS},
        "tokens_per_target_pass": {m: n * len(kept) / sum(k[m].out[2] for k in kept) for m in METHODS},
        "ratio_vs_hf_plain": {m: r.median for m, r in vs_hf.items()},
        "ratio_vs_hf_plain_interval": {m: (r.low, r.high) for m, r in vs_hf.items()},
        "ratio_vs_hfspec_plain": {m: r.median for m, r in vs_ours.items()},
        "ratio_vs_hfspec_plain_interval": {m: (r.low, r.high) for m, r in vs_ours.items()},
        "hfspec_lookup": {"alpha": stats.alpha, "mean_gamma": stats.mean_gamma, "accepted": stats.accepted,
                          "checked": stats.checked},
        **verdict_columns(timings),
    }
    if temperature == 0:  # greedy: every method must write the same tokens
        result["greedy_identical"] = all(outputs[m] == outputs["HF plain"] for m in METHODS)
    return result


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro", repeats=5)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--gamma", type=int, default=4, help="hfspec γ and HF prompt_lookup_num_tokens")
    p.add_argument("--ngram", type=int, default=3, help="hfspec lookup-nN and HF max_matching_ngram_size")
    p.add_argument("--prompts", default="edit,repeat",
                   help=f"comma-separated: {', '.join(PROMPTS)}, or a text")
    p.add_argument("--json", default=None, help="write the results here (e.g. results/lookup_micro.json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts = {name: PROMPTS.get(name, name) for name in args.prompts.split(",")}
    results = {"threads": args.threads, "torch": torch.__version__, "prompts": prompts, "runs": []}
    print("| model | prompt | T | method | tok/s | vs HF plain | vs hfspec plain | tokens per target pass | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, folder in model_folders(args).items():
        target, tokenizer = load(folder)
        draft = hfspec.make_draft(target, f"lookup-n{args.ngram}")
        for label, text in prompts.items():
            ids = tokenizer(text, return_tensors="pt").input_ids
            for temperature in (float(t) for t in args.temperatures.split(",")):
                row = measure(target, draft, ids, args.max_new_tokens, temperature, args.gamma, args.ngram,
                              args.repeats, args.seed)
                results["runs"].append({"model": name, "prompt": label[:40]} | row)
                where = f"{name} | {label[:20]} | {temperature:g}"
                for m in METHODS:
                    low, high = row["ratio_vs_hf_plain_interval"][m]
                    low2, high2 = row["ratio_vs_hfspec_plain_interval"][m]
                    print(f"| {where} | {m} | {row['tokens_per_second'][m]:.1f} | "
                          f"{row['ratio_vs_hf_plain'][m]:.2f}× [{low:.2f}–{high:.2f}] | "
                          f"{row['ratio_vs_hfspec_plain'][m]:.2f}× [{low2:.2f}–{high2:.2f}] | "
                          f"{row['tokens_per_target_pass'][m]:.2f} | {verdict_cell(row)} |", flush=True)
                look = row["hfspec_lookup"]
                print(f"<!-- {where}: hfspec lookup α {look['alpha']:.3f}, mean γ {look['mean_gamma']:.2f}; "
                      f"greedy identical: {row.get('greedy_identical', 'n/a')} -->")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
