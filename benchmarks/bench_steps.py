"""One decode step, side by side: the target's HF forward over 1 and γ + 1 tokens (the verify pass), and the
rtn draft through the HF forward (swapped quantised modules), its lean step, and its compiled lean step.

    python benchmarks/bench_steps.py --models micro,smollm2 --draft rtn4 --gamma 4

Each forward runs on a warm KV cache of `--context` tokens, which is cropped back after it (untimed). The steps
are timed by the benchmarks' one operator timer (`common.time_operators`: interleaved rounds, the order rotating,
two warm-up rounds not counted, outlier rounds re-measured): median milliseconds, and the ratios c = draft /
target one-token step and verify = (γ + 1)-token pass / one-token step as medians of per-round ratios with their
interval [low–high], then the rounds kept and the stability verdict.
"""

from __future__ import annotations

import torch
from common import (
    Operator,
    load,
    model_folders,
    op_ms,
    parser,
    time_operators,
    time_ratio,
    verdict_cell,
    verdict_columns,
)

import hfspec
from hfspec.kernels import cache as kv


def step_timer(model, ids: torch.Tensor, context: int, width: int) -> Operator:
    """One forward over ids[:, context:context+width] on a warm cache of `context`, as an operator for
    `common.time_operators` (the cache is cropped back after each call, untimed)."""
    cache = kv.new_cache(model)
    key = kv.cache_kwarg(model)
    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{key: cache})
    new = ids[:, context:context + width]
    positions = torch.arange(context, context + width)[None]

    def forward():
        with torch.no_grad():
            model(input_ids=new, position_ids=positions, use_cache=True, logits_to_keep=width, **{key: cache})

    return Operator(forward, lambda: kv.crop_to(cache, context))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--draft", default="rtn4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, context {args.context}, median of {args.steps} interleaved steps (ms); ratios: "
          "median of per-round ratios [interval]\n")
    print("| model | target 1 token | target γ+1 tokens | verify / step | HF-forward draft | c (HF forward) "
          "| lean draft | c (lean) | compiled lean draft | c (compiled) | lean path | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
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
        timings = time_operators(timers, args.steps, baseline="t1")
        ms = {k: op_ms(timings, k).median for k in timers}
        c = {k: time_ratio(timings, k, "t1").cell() for k in ("tv", "hf", "lean", "compiled")}
        path = hfspec.drafts.describe(lean)["step"]
        print(f"| {name} | {ms['t1']:.2f} | {ms['tv']:.2f} | {c['tv']} | {ms['hf']:.2f} | {c['hf']} "
              f"| {ms['lean']:.2f} | {c['lean']} | {ms['compiled']:.2f} | {c['compiled']} | {path} "
              f"| {verdict_cell(verdict_columns(timings))} |", flush=True)

if __name__ == "__main__":
    main()
