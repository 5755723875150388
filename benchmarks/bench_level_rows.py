"""What a token-tree draft level costs per node: one call of a draft's matrices over w rows against one row, per
storage the lean step runs (the int4 and int8 CPU kernels, a dense bf16 or fp32 copy), at a model's own shapes.

    python benchmarks/bench_level_rows.py --models smollm2-offgrid --rows 1,2,4,8,16

A tree level decodes its nodes in one draft call, so its cost grows with its width as these products do:
`hfspec.decoding.priors.TREE_ROW_PRIOR` holds, per storage, the marginal cost of one more node in units of a
one-node level, (ratio − 1) / (w − 1), that seeded `tree="auto"` prices levels with. Reported per storage and
width: the summed milliseconds of one call of each of a layer's matrices (q, k, v, o, gate, up, down) and of the
LM head, and the ratio to one row with its interval (interleaved rounds, warm-up not counted, outliers
re-measured: `common.time_operators`).

`--layers N` calls the matrices of N distinct layers (each its own random weights) and the head: with a model's
own layer count a call reads the whole draft's bytes from memory, as a draft level in decoding does, where one
layer's matrices stay in the caches between calls (hot).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import torch
from common import (
    model_folders,
    op_ms,
    parser,
    time_operators,
    time_ratio,
    verdict_cell,
    verdict_columns,
    write_results,
)

from hfspec.kernels import int4_rows
from hfspec.kernels.lean_layers import LeanLinear
from hfspec.quant import int8

STORAGES = {"int4 kernel": (4, 32), "int4 torch": (4, 32), "int8 kernel": (8, int8.PER_CHANNEL), "dense bf16": None, "dense fp32": None,
            "int8 dynamic": None}
# "int4 kernel" is what a 4-bit draft runs (hfspec's own int4 kernel where it builds, `hfspec.kernels.int4_rows`),
# "int4 torch" the same storage through torch's `_weight_int4pack_mm_for_cpu`.
# "int8 dynamic" is not a storage hfspec runs: fbgemm's dynamically quantised int8 linear (torch.ops.quantized, the
# x86 engine: int8 weights with one scale per row as `int8`'s, each call's activations rounded to uint8 with one
# scale), measured to see whether a level could be cheaper per node on VNNI (docs/trees.md says what it found).


@contextmanager
def env(name: str, value: str):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before


def shapes(folder) -> list[tuple[int, int]]:
    """[N, K] of one layer's matrices and the head, from a model folder's config.json."""
    config = json.loads((folder / "config.json").read_text())
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    d = config.get("head_dim") or h // heads
    return [(heads * d, h), (kv * d, h), (kv * d, h), (h, heads * d), (i, h), (i, h), (h, i), (v, h)]


def calls(storage: str, dims: list[tuple[int, int]]):
    """One matmul function per matrix in `storage` (random weights: cost depends on shapes, not values)."""
    out = []
    for n, k in dims:
        w = torch.randn(n, k) * 0.02
        if storage == "dense bf16":
            wb = w.to(torch.bfloat16)
            out.append(lambda x, wb=wb: torch.nn.functional.linear(x.to(torch.bfloat16), wb).float())
        elif storage == "dense fp32":
            out.append(lambda x, w=w: torch.nn.functional.linear(x, w))
        elif storage == "int8 dynamic":
            scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-8).double()
            qw = torch.quantize_per_channel(w, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(qw, None)
            out.append(lambda x, packed=packed: torch.ops.quantized.linear_dynamic(x, packed, False))
        elif storage == "int4 torch":  # the same storage through torch's kernel instead of hfspec's
            with env(int4_rows.MODE_ENV, "off"):
                out.append(LeanLinear(w, None, *STORAGES[storage]).matmul())
        else:
            out.append(LeanLinear(w, None, *STORAGES[storage]).matmul())
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(models="smollm2-offgrid", repeats=15)
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--storages", default=",".join(s for s in STORAGES if s not in ("int8 dynamic", "int4 torch")),
                   help=f"comma-separated, from: {', '.join(STORAGES)}")
    p.add_argument("--layers", type=int, default=1, help="distinct layers' matrices per call (the model's layer "
                   "count: the whole draft's bytes, out of cache)")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    if args.layers < 1:
        raise SystemExit(f"--layers: {args.layers}; allowed: 1 or more")
    storages = args.storages.split(",")
    for storage in storages:
        if storage not in STORAGES:
            raise SystemExit(f"--storages: unknown {storage!r}; allowed: {', '.join(STORAGES)}")
    torch.set_num_threads(args.threads)
    widths = sorted({1, *(int(w) for w in args.rows.split(","))})
    calls_per_op = max(1, 20 // args.layers)
    what = "a layer's matrices" if args.layers == 1 else f"the matrices of {args.layers} distinct layers"
    lines = [f"{args.threads} threads, {args.repeats} interleaved rounds; {what} and the LM head, one call each", "", "| model | storage | rows | ms | × one row | interval | per extra node | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    rows = []
    for name, folder in model_folders(args).items():
        layer = shapes(folder)
        dims = layer[:-1] * args.layers + layer[-1:]
        for storage in storages:
            fns = calls(storage, dims)
            ops = {}
            for w in widths:
                inputs = {k: torch.randn(w, k) for _, k in dims}  # the down projection's input is intermediate-wide

                def op(inputs=inputs, fns=fns, dims=dims):
                    for (_, k), fn in zip(dims, fns, strict=True):
                        fn(inputs[k])
                ops[f"w{w}"] = lambda op=op: [op() for _ in range(calls_per_op)]
            timings = time_operators(ops, args.repeats)
            verdict = verdict_columns(timings)
            for w in widths:
                ratio = time_ratio(timings, f"w{w}", "w1")
                slope = (ratio.median - 1) / (w - 1) if w > 1 else float("nan")
                row = {"model": name, "storage": storage, "rows": w, "ms": op_ms(timings, f"w{w}").median / calls_per_op,
                       "ratio": ratio.median, "ratio_low": ratio.low, "ratio_high": ratio.high, "per_node": slope,
                       **verdict}
                rows.append(row)
                lines.append(f"| {name} | {storage} | {w} | {row['ms']:.3f} | {ratio.median:.2f} | "
                             f"{ratio.low:.2f}–{ratio.high:.2f} | {'' if w == 1 else f'{slope:.2f}'} | "
                             f"{verdict_cell(row)} |")
            print("\n".join(lines[-len(widths):]), flush=True)
    print("\n".join(lines))
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
