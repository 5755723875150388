"""Why a big fp32 target's verify pass is expensive on a CPU: one linear layer over M = 1..8 rows, by method.

    python benchmarks/bench_fp32_linear.py                 # 8192x2048 and 2048x8192 (SmolLM2-1.7B's MLP), M 1..8
    python benchmarks/bench_fp32_linear.py --threads 1 --repeats 50

Methods (all compute x @ W.T for a weight W [N, K]; the ratio is to the fp32 F.linear of one row):
  F.linear fp32      what an HF model runs (MKL sgemm; sgemv at one row)
  mm(W, x.T)         the same product with the roles of the operands swapped
  MKL prepacked      torch.ops.mkl._mkl_linear over a weight packed for M rows (what inductor's freezing uses)
  oneDNN prepacked   torch.ops.mkldnn._linear_pointwise over a weight reordered to oneDNN's blocked layout
  F.linear bf16      the same layer in bf16 (oneDNN), for comparison
Both prepacked forms hold a second full copy of the weight. Methods are interleaved per repeat; medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


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
    print(f"threads {args.threads}, median of {args.repeats} interleaved calls; ms (ratio to fp32 F.linear of 1 row)\n")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k) * 0.02
        rows = [int(m) for m in args.rows.split(",")]
        fns = {(m, name): fn for m in rows for name, fn in methods(w, m).items()}
        for fn in fns.values():
            fn()
        samples = {key: [] for key in fns}
        for _ in range(args.repeats):
            for key, fn in fns.items():
                began = time.perf_counter()
                fn()
                samples[key].append(time.perf_counter() - began)
        ms = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
        names = list(dict.fromkeys(name for _, name in fns))
        one = ms[(rows[0], "F.linear fp32")]
        print(f"W {n}x{k}\n\n| M | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
        for m in rows:
            cells = [f"{ms[(m, name)]:.2f} ({ms[(m, name)] / one:.2f})" if (m, name) in ms else "–" for name in names]
            print(f"| {m} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
