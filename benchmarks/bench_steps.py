"""One decode step, side by side: the target's HF forward over 1 and γ + 1 tokens (the verify pass), and the
rtn draft through the HF forward (swapped quantised modules), its lean step, and its compiled lean step.

    python benchmarks/bench_steps.py --models micro,smollm2 --draft rtn4 --gamma 4

Each forward runs on a warm KV cache of `--context` tokens, which is cropped back after it; methods are
interleaved per repeat, and the median is reported with the ratios c = draft / target one-token step and
verify = (γ + 1)-token pass / one-token step.
"""

from __future__ import annotations

import statistics
import time

import torch
from common import load, model_folders, parser

import hfspec
from hfspec import cache as kv


def step_timer(model, ids: torch.Tensor, context: int, width: int):
    """A function that times one forward over ids[:, context:context+width] on a warm cache of `context`."""
    cache = kv.new_cache(model)
    key = kv.cache_kwarg(model)
    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{key: cache})
    new = ids[:, context:context + width]
    positions = torch.arange(context, context + width)[None]

    def once() -> float:
        began = time.perf_counter()
        with torch.no_grad():
            model(input_ids=new, position_ids=positions, use_cache=True, logits_to_keep=width, **{key: cache})
        elapsed = time.perf_counter() - began
        kv.crop_to(cache, context)
        return elapsed

    return once


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, context {args.context}, median of {args.steps} interleaved steps (ms)\n")
    print("| model | target 1 token | target γ+1 tokens | verify / step | HF-forward draft | c (HF forward) "
          "| lean draft | c (lean) | compiled lean draft | c (compiled) | lean path |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, folder in model_folders(args).items():
        target, _ = load(folder)
        hf_draft = hfspec.make_draft(target, args.draft, lean=False)
        lean = hfspec.make_draft(target, args.draft)
        compiled = hfspec.make_draft(target, args.draft + "-compiled")  # cached on disk after the first time
        vocab = target.config.vocab_size
        ids = torch.randint(0, vocab, (1, args.context + args.gamma + 1), generator=torch.Generator().manual_seed(0))
        timers = {"t1": step_timer(target, ids, args.context, 1),
                  "tv": step_timer(target, ids, args.context, args.gamma + 1),
                  "hf": step_timer(hf_draft, ids, args.context, 1),
                  "lean": step_timer(lean, ids, args.context, 1),
                  "compiled": step_timer(compiled, ids, args.context, 1)}
        for t in timers.values():  # warm-up
            t(), t()
        samples = {k: [] for k in timers}
        for _ in range(args.steps):
            for k, t in timers.items():
                samples[k].append(t())
        ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        path = hfspec.drafts.describe(lean)["step"]
        print(f"| {name} | {ms['t1']:.2f} | {ms['tv']:.2f} | {ms['tv'] / ms['t1']:.2f} | {ms['hf']:.2f} "
              f"| {ms['hf'] / ms['t1']:.2f} | {ms['lean']:.2f} | {ms['lean'] / ms['t1']:.2f} | {ms['compiled']:.2f} "
              f"| {ms['compiled'] / ms['t1']:.2f} | {path} |", flush=True)


if __name__ == "__main__":
    main()
