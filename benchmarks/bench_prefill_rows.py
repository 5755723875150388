"""A long prompt's prefill through a packed (int4 / int8) lean draft: the packed kernels, or the weights
dequantised to bf16 a block of rows at a time (`hfspec.kernels.lean_layers.DEQUANTISED_FROM`).

    python benchmarks/bench_prefill_rows.py                                  # SmolLM2 off the grid, rtn4 and int8
    python benchmarks/bench_prefill_rows.py --models micro --rows 64,256,1024 --repeats 10

For each draft and prompt length R (rows), three operators are timed side by side (`common.time_operators`:
interleaved rounds, the order rotating, warm-up rounds not counted, outlier rounds re-measured): the draft's
prefill of R tokens through its packed kernel (the threshold set above R), the same prefill dequantised (the
threshold set to 1), and the target's own prefill of the same tokens (an HF forward, no cache kept). Per row: the
median ms of each, the dequantised prefill's median per-round time ratio to the kernel's [interval], and each
draft prefill's ratio to the target's. The tokens are the prompt repeated to R tokens (what is prefilled does not
change the cost).
"""

from __future__ import annotations

import common
import torch
from common import op_ms, time_operators, time_ratio, verdict_cell, verdict_columns, write_results

from hfspec.kernels import lean_layers


def prefill(draft, ids: torch.Tensor, threshold: int):
    """The draft's prefill of `ids` with every packed storage's threshold set to `threshold` rows."""
    def run():
        saved = dict(lean_layers.DEQUANTISED_FROM)
        lean_layers.DEQUANTISED_FROM.update(dict.fromkeys(saved, threshold))
        try:
            draft(ids, logits_to_keep=1)
        finally:
            lean_layers.DEQUANTISED_FROM.update(saved)
    return run


def main() -> None:
    p = common.parser(__doc__)
    p.set_defaults(models="smollm2-offgrid", repeats=8)
    p.add_argument("--drafts", default="rtn4,int8", help="comma-separated lean draft specs (packed storages)")
    p.add_argument("--rows", default="64,128,256,512,1024", help="comma-separated prompt lengths")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args()
    import hfspec

    torch.set_num_threads(args.threads or 2)
    header = (f"threads {torch.get_num_threads()}; median ms of {args.repeats} interleaved rounds; "
              "dequantised / kernel: median per-round time ratio [interval]")
    lines, rows = [header, ""], []
    for name, folder in common.model_folders(args).items():
        target, tokenizer = common.load(folder)
        base = common.prompt_ids(tokenizer, "In a small village by the sea, there lived an old fisherman who")
        for spec in args.drafts.split(","):
            draft = hfspec.make_draft(target, spec)
            lines += [f"## {name}, draft {spec} (fp32 target)", "",
                      "| rows | kernel ms | dequantised ms | dequantised / kernel | kernel / target | "
                      "dequantised / target | target ms | verdict |", "|---" * 8 + "|"]
            for r in (int(v) for v in args.rows.split(",")):
                ids = base.repeat(1, -(-r // base.shape[1]))[:, :r]
                ops = {"kernel": prefill(draft, ids, r + 1), "dequantised": prefill(draft, ids, 1),
                       "target": lambda ids=ids, target=target: target(ids, use_cache=False, logits_to_keep=1)}
                with torch.no_grad():
                    t = time_operators(ops, args.repeats, baseline="kernel")
                row = {"model": name, "draft": spec, "rows": r,
                       **{f"{k}_ms": op_ms(t, k).median for k in ops},
                       "dequantised_over_kernel": time_ratio(t, "dequantised", "kernel").cell(),
                       "kernel_over_target": time_ratio(t, "kernel", "target").cell(),
                       "dequantised_over_target": time_ratio(t, "dequantised", "target").cell(),
                       "verdict": verdict_cell(verdict_columns(t))}
                rows.append(row)
                lines.append(f"| {r} | {row['kernel_ms']:.1f} | {row['dequantised_ms']:.1f} | "
                             f"{row['dequantised_over_kernel']} | {row['kernel_over_target']} | "
                             f"{row['dequantised_over_target']} | {row['target_ms']:.1f} | {row['verdict']} |")
            lines.append("")
    print("\n".join(lines))
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
