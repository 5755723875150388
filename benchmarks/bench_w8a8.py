"""Would an 8-bit draft with 8-bit activations (W8A8) be cheaper than `int8` (W8A16) at the same acceptance?

    python benchmarks/bench_w8a8.py --models smollm2-offgrid --out benchmarks/results/w8a8

Three parts, per model:
1. **Kernels** (timed): the products of a whole decoder body at the model's shapes (every layer's q, k, v, o,
   gate, up and down matrices, random weights, each layer its own, so the weights stream as a real model's do),
   at 1, 2, 4, 8 and 16 activation rows, per kernel: fp32 and bf16 `F.linear`, `aten._weight_int8pack_mm` (what
   `int8` runs: int8 weights, bf16 activations), fbgemm's dynamic W8A8 `quantized.linear_dynamic` (int8 weights,
   activations quantised to 8 bits per call) and `aten._weight_int4pack_mm_for_cpu` (what `rtn4`/`gptq4` run).
   Median milliseconds over `--rounds` interleaved rounds (`common.time_operators`), and the cost of one more row
   as a share of a one-row call (the slope from 1 to 8 rows: what a token-tree level pays per node).
2. **Fidelity** (timing-free): mean Σ min(p, q) against the target on text it wrote itself (4 × 128 tokens,
   seed 1000) of copies whose decoder linears are fake-quantised: per-row int8 weights with float activations
   (what `int8` computes), and with activations quantised per token to int8, plain or with SmoothQuant's
   per-channel migration (Xiao et al., ICML 2023, "SmoothQuant": s_j = max|x_j|^a / max|W_j|^(1-a), statistics from
   16 × 64 tokens the target wrote, seed 7), and with the MLP's down projection left at float activations.
   The heads stay float in every row, so the rows compare the decoder bodies.
3. Whether `torch.compile(fullgraph=True)` takes fbgemm's op (the draft's fast path is the compiled step).
"""

from __future__ import annotations

import copy
import os
import warnings

import torch
import torch.nn.functional as F
from common import load, model_folders, op_ms, parser, time_operators, write_results

from hfspec.drafts import fidelity
from hfspec.quant import int8
from hfspec.quant.calibrate import self_samples

ROWS = (1, 2, 4, 8, 16)
KERNELS = ("fp32", "bf16", "w8a16", "w8a8 fbgemm", "int4 g32")


def _matrix(n: int, k: int, g: torch.Generator) -> dict:
    w = torch.randn(n, k, generator=g) * 0.02
    codes, scale = int8.quantize_rows(w)
    with warnings.catch_warnings():  # quantised tensors are deprecated in torch 2.13; fbgemm's packing still takes them
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    nibbles = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    return {"fp32": w, "bf16": w.bfloat16(), "codes": codes, "scale": scale.bfloat16(),
            "fbgemm": torch.ops.quantized.linear_prepack(q, None),
            "int4": torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1),
            "sz": torch.randn(k // 32, n, 2, generator=g).bfloat16(), "k": k}


def _call(kernel: str, m: dict, x: torch.Tensor, xb: torch.Tensor):
    if kernel == "fp32":
        return F.linear(x, m["fp32"])
    if kernel == "bf16":
        return F.linear(xb, m["bf16"])
    if kernel == "w8a16":
        return torch.ops.aten._weight_int8pack_mm(xb, m["codes"], m["scale"])
    if kernel == "w8a8 fbgemm":
        return torch.ops.quantized.linear_dynamic(x, m["fbgemm"])
    return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, m["int4"], 32, m["sz"])


def kernels(config, rounds: int) -> dict:
    """{kernel: {rows: median ms}} for one decoder body's products, timed by the benchmarks' operator timer."""
    g = torch.Generator().manual_seed(0)
    hidden, inter = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
              (hidden, inter)]
    mats = [_matrix(n, k, g) for _ in range(config.num_hidden_layers) for n, k in shapes]
    out: dict = {}
    for rows in ROWS:
        inputs = {k: torch.randn(rows, k, generator=g) for k in {hidden, inter}}
        inputs = {k: (x, x.bfloat16()) for k, x in inputs.items()}

        def body(name, inputs=inputs):
            return lambda: [_call(name, m, *inputs[m["k"]]) for m in mats]
        timings = time_operators({name: body(name) for name in KERNELS}, rounds)
        for name in KERNELS:
            out.setdefault(name, {})[rows] = op_ms(timings, name).median
    return out


class _FakeQuant(torch.nn.Module):
    """A linear with per-row int8 weights (after SmoothQuant's scaling by s) and, with `act`, activations
    quantised per token to int8."""

    def __init__(self, lin: torch.nn.Linear, s: torch.Tensor, act: bool):
        super().__init__()
        codes, scale = int8.quantize_rows(lin.weight.detach().float() * s[None, :])
        self.w, self.s, self.act, self.bias = int8.dequantize(codes, scale), s, act, lin.bias

    def forward(self, x):
        x = x / self.s
        if self.act:
            scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-8) / 127
            x = torch.round(x / scale).clamp(-127, 127) * scale
        return F.linear(x, self.w, self.bias)


def fidelities(target) -> list[tuple[str, float]]:
    calib, text = self_samples(target, 16, 64, seed=7), self_samples(target, 4, 128, seed=1000)
    layers = target.model.layers
    amax: dict = {}

    def hook(name):
        def take(_module, inputs, _output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0)
            amax[name] = torch.maximum(amax[name], x) if name in amax else x
        return take
    linears = [(name, m) for name, m in layers.named_modules() if isinstance(m, torch.nn.Linear)]
    handles = [m.register_forward_hook(hook(name)) for name, m in linears]
    with torch.no_grad():
        target(calib)
    for handle in handles:
        handle.remove()
    variants = [("W8A16 (int8's grid, float activations)", None, False, ()),
                ("W8A8 per token", 0.0, True, ()),
                ("W8A8 per token, SmoothQuant a 0.5", 0.5, True, ()),
                ("W8A8 per token, SmoothQuant a 0.5, down_proj W8A16", 0.5, True, ("down_proj",)),
                ("W8A8 per token, SmoothQuant a 0.6, down_proj W8A16", 0.6, True, ("down_proj",))]
    out = []
    for label, a, act, keep in variants:
        copy_ = copy.deepcopy(target)
        for name, lin in [(n, m) for n, m in copy_.model.layers.named_modules() if isinstance(m, torch.nn.Linear)]:
            parent, _, child = name.rpartition(".")
            smooth = a is not None and a > 0 and child not in keep
            if smooth:
                wmax = lin.weight.detach().float().abs().amax(0).clamp_min(1e-5)
                s = amax[name].clamp_min(1e-5) ** a / wmax ** (1 - a)
            else:
                s = torch.ones(lin.in_features)
            setattr(copy_.model.layers.get_submodule(parent), child, _FakeQuant(lin, s, act and child not in keep))
        out.append((label, fidelity(target, copy_, text)))
        del copy_
    return out


def compiles() -> str:
    w = torch.randn(64, 64)
    codes, scale = int8.quantize_rows(w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale.double(), torch.zeros(64, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(q, None)
    try:
        torch.compile(lambda x: torch.ops.quantized.linear_dynamic(x * 2, packed), fullgraph=True)(torch.randn(1, 64))
    except Exception as error:  # noqa: BLE001 - what fails is the finding
        return f"no: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return "yes"


def main() -> None:
    p = parser(__doc__)
    p.set_defaults(models="smollm2-offgrid")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = [f"<!-- threads {args.threads}, {args.rounds} interleaved rounds; load average at start "
             f"{os.getloadavg()[0]:.2f} -->"]
    rows: list[dict] = []
    for name, folder in model_folders(args).items():
        target, _ = load(folder)
        timing = kernels(target.config, args.rounds)
        lines += ["", f"**{name}**: one decoder body's products ({target.config.num_hidden_layers} layers), median ms",
                  "", "| kernel | " + " | ".join(f"{r} row{'s' * (r > 1)}" for r in ROWS) + " | one more row |",
                  "|---" * (len(ROWS) + 2) + "|"]
        for kernel, by_rows in timing.items():
            slope = (by_rows[8] - by_rows[1]) / 7 / by_rows[1]
            lines.append(f"| {kernel} | " + " | ".join(f"{by_rows[r]:.2f}" for r in ROWS) + f" | {slope:.2f} |")
            rows.append({"model": name, "kernel": kernel, "ms": by_rows, "row_slope": slope})
        lines += ["", "| decoder linears | fidelity |", "|---|---|"]
        for label, value in fidelities(target):
            lines.append(f"| {label} | {value:.4f} |")
            rows.append({"model": name, "variant": label, "fidelity": value})
    verdict = compiles()
    lines += ["", f"torch.compile(fullgraph=True) of fbgemm's quantized.linear_dynamic: {verdict}",
              f"<!-- load average at the end {os.getloadavg()[0]:.2f} -->"]
    rows.append({"compiles": verdict})
    print("\n".join(lines))
    write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
