"""Tokens per target pass, tokens/s and the cost model's predicted speed-up against the measured one, chain vs
draft-side early exit, greedy and sampled.

    python benchmarks/bench_tokens.py                        # micro, SmolLM2 fp32 + bf16, a tiny Gemma 3
    python benchmarks/bench_tokens.py --models micro --max-new-tokens 48 --repeats 1   # a quick check

Each row runs `repeats` (speculative, plain) pairs of exactly `max_new_tokens` tokens in one process, timed by
the benchmarks' ruler (`common.timed_rounds`: interleaved, alternating which goes first, a warm-up pair not
counted, outlier pairs re-measured), each run by its own clock (`SpecStats.time_total`, as `hfspec sweep` times):
the measured speed-up is the median per-pair ratio of tokens/s with its interval, followed by the pairs kept and
the stability verdict ("implausible: …" flags included). Three figures stand beside it:

- predicted: the cost model fitted to the speculative runs and the plain runs timed beside them (what the CLI,
  the dashboard and the sweep show);
- predicted alone: the cost model fitted to the speculative runs only (the one-token step from the timing passes
  after each run; what `SpecStats.predicted_speedup` gives a library user);
- paper (`paper_speedup`): (1 − α^(γ+1)) / ((1 − α)(1 + γc)) with the measured c, which leaves out the verify width, the time
  outside forwards and the prefill.

With --cross-gamma G a chain row is also measured at γ = G and predicted there from the model fitted at the
row's own γ (α and costs from one γ, the speed-up at another): the check that the model is more than a
re-reading of the run it was fitted to.

"gemma3-tiny" is a Gemma 3 text model built from a config with random weights, sharpened so its next-token
distributions are peaky: its costs are real, its α says little about trained models.
Writes a markdown table to stdout and, with --out, `<out>.md` and `<out>.json`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from common import (
    PAIRS,
    Stopwatch,
    interval_cell,
    load,
    own_clock,
    parser,
    prompt_ids,
    ruler_columns,
    timed_rounds,
    verdict_cell,
)

import hfspec
from hfspec.decoding.costmodel import predict


def gemma3_tiny():
    """A random-weight Gemma 3 text model (hidden 256, 4 layers, vocabulary 8192) with peaky distributions."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=64, sliding_window=64,
                              max_position_embeddings=2048, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        norm = model.model.norm  # Gemma's RMSNorm multiplies by (1 + weight): scale the logits by 8
        norm.weight.copy_((1 + norm.weight) * 8 - 1)
    return model, torch.tensor([[2, 17, 391, 4005, 77, 1200, 9, 640]])


def targets(args):
    """(label, target, prompt ids) for each requested model; absent folders are skipped with a note."""
    for name in args.models.split(","):
        if name == "gemma3-tiny":
            model, ids = gemma3_tiny()
            yield name, model, ids
            continue
        base, _, dtype = name.partition(":")
        folder = Path(args.smollm2) if base == "smollm2" else PAIRS.get(base, Path(base))
        if not (folder / "config.json").exists():
            print(f"# skipping {name}: {folder} not found")
            continue
        target, tokenizer = load(folder)
        if dtype:
            target = target.to(getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}.get(dtype, dtype)))
        yield name, target, prompt_ids(tokenizer, args.prompt)


def measure(target, draft, ids, gamma: int, early_exit: bool, temperature: float, n: int, repeats: int,
            seed: int) -> dict:
    """`repeats` (speculative, plain) pairs timed by the ruler; the median per-pair ratio with its interval and
    verdict, pooled rates, the estimates, greedy identity at T = 0."""
    kw = dict(temperature=temperature, max_new_tokens=n, min_new_tokens=n)

    def spec(r):
        return hfspec.generate(target, ids, draft=draft, gamma=gamma, early_exit=early_exit, seed=seed + r, **kw)

    def plain(r):
        return hfspec.plain_generate(target, ids, seed=seed + r, **kw)

    timings = timed_rounds({"spec": own_clock(spec), "plain": own_clock(plain)}, repeats, seed)
    kept = timings.kept
    runs = [k["spec"].out.stats for k in kept]
    plains = [k["plain"].out.stats for k in kept]
    identical = None
    if temperature == 0:
        identical = all(torch.equal(k["spec"].out.sequences, k["plain"].out.sequences) for k in kept)
    for s, b in zip(runs, plains, strict=True):
        s.attach_baseline(b)
    pooled, base = runs[0], plains[0]
    for s in runs[1:]:
        pooled = pooled.merge(s)
    for b in plains[1:]:
        base = base.merge(b)
    alone = copy.copy(pooled)
    alone.plain_costs = None
    ruler = ruler_columns(timings, "spec", base)
    measured = ruler["vs_plain"]
    predicted = pooled.predicted_speedup
    return {
        "alpha": pooled.alpha, "tokens_per_pass": pooled.tokens_per_pass, "mean_gamma": pooled.mean_gamma,
        "tokens_per_second": pooled.tokens_per_second, "plain_tokens_per_second": base.tokens_per_second,
        "measured_speedup": measured, "measured_speedup_low": ruler["vs_plain_low"],
        "measured_speedup_high": ruler["vs_plain_high"], "pairs": ruler["pairs"], "outliers": ruler["outliers"],
        "stable": ruler["stable"], "warnings": ruler["warnings"], "flags": ruler["flags"],
        "predicted_speedup": predicted,
        "predicted_error": predicted / measured - 1, "predicted_alone": predict(alone).speedup,
        "predicted_alone_source": predict(alone).source, "paper_speedup": pooled.paper_speedup,
        "c_time": pooled.c_time, "greedy_identical": identical,
        "time_split": {"draft": pooled.time_draft / pooled.time_total, "target": pooled.time_target /
                       pooled.time_total, "other": pooled.time_other / pooled.time_total},
        "cost_model": pooled.prediction.model.__dict__,
        "_stats": (pooled, base),
    }


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="micro,smollm2:fp32,smollm2:bf16,gemma3-tiny", repeats=2)
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=5, help="the chain's γ")
    p.add_argument("--exit-gamma", type=int, default=8, help="early exit's cap")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--methods", default="chain,early-exit")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--cross-gamma", type=int, help="also measure chain rows at this γ, predicted from their own γ")
    p.add_argument("--out", help="write <out>.md and <out>.json (e.g. benchmarks/results/tokens)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_avg = _load()
    header = (f"threads {args.threads}, {args.max_new_tokens} tokens, {args.repeats} pair(s) per row after a warm-up "
              f"pair, draft "
              f"{args.draft}, load average at start {load_avg}")
    lines = [f"<!-- {header} -->",
             "| model | T | method | γ | α | tokens / pass | spec tok/s | plain tok/s | measured × | interval "
             "| predicted × | error | predicted alone × | paper × | greedy same | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rows = []
    watch = Stopwatch()  # the whole script, one-shot
    for name, target, ids in targets(args):
        draft = hfspec.make_draft(target, args.draft)  # each row's warm-up pair (not counted) warms both models
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for method in args.methods.split(","):
                exit_ = method == "early-exit"
                gamma = args.exit_gamma if exit_ else args.gamma
                r = measure(target, draft, ids, gamma, exit_, temperature, args.max_new_tokens, args.repeats,
                            args.seed)
                r.update(model=name, temperature=temperature, method=method, gamma=gamma)
                pooled, base = r.pop("_stats")
                if args.cross_gamma and not exit_:
                    other = measure(target, draft, ids, args.cross_gamma, False, temperature, args.max_new_tokens,
                                    args.repeats, args.seed)
                    other.pop("_stats")
                    r["cross"] = {"gamma": args.cross_gamma, "measured_speedup": other["measured_speedup"],
                                  "predicted_from_own_gamma": predict(pooled, base, gamma=args.cross_gamma).speedup}
                rows.append(r)
                same = "-" if r["greedy_identical"] is None else ("yes" if r["greedy_identical"] else "NO")
                line = (f"| {name} | {temperature:g} | {method} | {gamma} | {r['alpha']:.3f} | "
                        f"{r['tokens_per_pass']:.2f} | {r['tokens_per_second']:.1f} | "
                        f"{r['plain_tokens_per_second']:.1f} | {r['measured_speedup']:.2f} | "
                        f"{interval_cell(r, 'measured_speedup')} | "
                        f"{r['predicted_speedup']:.2f} | {r['predicted_error']:+.0%} | {r['predicted_alone']:.2f} | "
                        f"{r['paper_speedup']:.2f} | {same} | {verdict_cell(r)} |")
                if "cross" in r:
                    c = r["cross"]
                    line += (f" at γ {c['gamma']}: measured {c['measured_speedup']:.2f}×, predicted from γ {gamma} "
                             f"{c['predicted_from_own_gamma']:.2f}× ({c['predicted_from_own_gamma'] / c['measured_speedup'] - 1:+.0%})")
                lines.append(line)
                print(line, flush=True)
    lines.append(f"<!-- {watch.seconds:.0f} s; load average at the end {_load()} -->")
    print(lines[-1])
    if args.out:
        Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
        Path(f"{args.out}.json").write_text(json.dumps({"settings": vars(args), "load_average": load_avg,
                                                        "rows": rows}, indent=2))


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
