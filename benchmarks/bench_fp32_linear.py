"""Why a big fp32 target's verify pass is expensive on a CPU: one linear layer over M = 1..8 rows, by method.

    python benchmarks/bench_fp32_linear.py                 # 8192x2048 and 2048x8192 (SmolLM2-1.7B's MLP), M 1..8
    python benchmarks/bench_fp32_linear.py --threads 1 --repeats 50

Methods (all compute x @ W.T for a weight W [N, K]; the ratio is to the fp32 F.linear of one row):
  F.linear fp32      what an HF model runs (MKL sgemm; sgemv at one row)
  mm(W, x.T)         the same product with the roles of the operands swapped
  MKL prepacked      torch.ops.mkl._mkl_linear over a weight packed for M rows (what inductor's freezing uses)
  oneDNN prepacked   torch.ops.mkldnn._linear_pointwise over a weight reordered to oneDNN's blocked layout
  F.linear bf16      the same layer in bf16 (oneDNN), for comparison
Both prepacked forms hold a second full copy of the weight. Per M the methods and the fp32 F.linear of the first
M are timed by the benchmarks' one operator timer (`common.time_operators`: interleaved rounds, the order
rotating, two warm-up rounds not counted, outlier rounds re-measured): median ms, the median per-round ratio with
its interval [low–high], then the rounds kept and the stability verdict of that row.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import op_ms, time_operators, time_ratio, verdict_cell, verdict_columns


def methods(w: torch.Tensor, m: int) -> dict:
    x = torch.randn(m, w.shape[1])
    xt = x.t().contiguous()
    w16 = w.bfloat16()
    out = {"F.linear fp32": lambda: F.linear(x, w), "mm(W, x.T)": lambda: torch.mm(w, xt)}
    try:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        out["MKL prepacked"] = lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, m)
    except (AttributeError, RuntimeError):
        pass
    try:
        blocked = torch.ops.mkldnn._reorder_linear_weight(w, None)
        out["oneDNN prepacked"] = lambda: torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], "")
    except (AttributeError, RuntimeError):
        pass
    out["F.linear bf16"] = lambda: F.linear(x.bfloat16(), w16)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="8192x2048,2048x8192", help="comma-separated NxK weights")
    p.add_argument("--rows", default="1,2,3,5,8", help="comma-separated M")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, median of {args.repeats} interleaved calls; ms (median per-round ratio to fp32 "
          "F.linear of the first M [interval])\n")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k) * 0.02
        rows = [int(m) for m in args.rows.split(",")]
        base = methods(w, rows[0])["F.linear fp32"]
        names, lines = [], []
        for m in rows:
            fns = {f"{name} M={m}": fn for name, fn in methods(w, m).items()}
            one = f"F.linear fp32 M={rows[0]}"
            fns.setdefault(one, base)  # the reference, timed in the same rounds as this row
            timings = time_operators(fns, args.repeats, baseline=one)
            names += [name for name in methods(w, m) if name not in names]
            cells = {name: f"{op_ms(timings, key).median:.2f} ({time_ratio(timings, key, one).cell()})"
                     for name in names if (key := f"{name} M={m}") in fns}
            lines.append((m, cells, verdict_cell(verdict_columns(timings))))
        print(f"W {n}x{k}\n\n| M | " + " | ".join(names) + " | verdict |\n" + "|---" * (len(names) + 2) + "|")
        for m, cells, verdict in lines:
            print(f"| {m} | " + " | ".join(cells.get(name, "–") for name in names) + f" | {verdict} |")
        print()

if __name__ == "__main__":
    main()
