"""Which calibration settings make the closest GPTQ draft: Σ min(p, q) of each setting on one target.

For each setting (sequences × tokens of self-sampled text, group size, dampening, grid refits, sequential
order) the target's Hessians are taken once per text size, `hfspec.quant.calibrate.gptq_codes` quantises every
matrix, and the target runs over held-out text it wrote itself (4 × 128 tokens, seed 1000) with its matrices'
outputs replaced by the dequantised codes' (`hfspec.drafts.sensitivity`'s hooks: the float weights are never
changed): mean Σ min(p, q) against the float target, the expected acceptance at T = 1. Timing-free except the
quantisation's own seconds (a one-shot duration: quiet machine for those). `--reference FOLDER` also measures a
model given as it is (e.g. the Q4_1 SmolLM2 that the off-grid target was made from).

    python benchmarks/bench_calibration_settings.py --model ~/.cache/hfspec-models/smollm2-135m-instruct-offgrid \\
        --reference ~/.cache/hfspec-models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402

from hfspec.drafts.fidelity import fidelity  # noqa: E402
from hfspec.drafts.sensitivity import _probs, coded_overlap  # noqa: E402
from hfspec.quant.calibrate import (  # noqa: E402
    Calibration,
    Coded,
    calibration_matrices,
    gptq_codes,
    hessians,
    self_samples,
)
from hfspec.quant.groupwise import group_quantize  # noqa: E402

# (label, sequences, tokens, group size, Calibration fields)
SETTINGS = [
    ("64 × 64, no refit", 64, 64, 32, {"refits": 0}),
    ("64 × 64", 64, 64, 32, {}),
    ("64 × 64, refits 2", 64, 64, 32, {"refits": 2}),
    ("64 × 64, damp 10 %", 64, 64, 32, {"damp": 0.1}),
    ("64 × 64, groups of 128", 64, 64, 128, {}),
    ("128 × 64, no refit", 128, 64, 32, {"refits": 0}),
    ("128 × 64", 128, 64, 32, {}),
    ("128 × 32 (default)", 128, 32, 32, {}),
    ("256 × 32", 256, 32, 32, {}),
    ("256 × 64", 256, 64, 32, {}),
    ("256 × 16", 256, 16, 32, {}),
    ("512 × 8", 512, 8, 32, {}),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(common.PAIRS["smollm2-offgrid"]))
    p.add_argument("--reference", default=None, help="a model folder measured as it is, beside the settings")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--only", default=None, help="comma-separated indices of SETTINGS to run (default: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--held-out", default="4x128", help="SEQUENCESxTOKENS of held-out text (seed 1000)")
    p.add_argument("--seeds", default="0", help="comma-separated calibration text seeds")
    p.add_argument("--rtn", action="store_true", help="add round-to-nearest at the same bits and group")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = common.load(Path(args.model), "float32")
    held_sequences, held_tokens = (int(x) for x in args.held_out.lower().split("x"))
    held_out = self_samples(target, held_sequences, held_tokens, 1000)
    p_float = list(_probs(target, held_out))
    names = list(calibration_matrices(target))
    seeds = [int(x) for x in args.seeds.split(",")]
    lines = [f"{common.machine_name()}, {args.threads} threads; Σ min(p, q) on {held_sequences} × {held_tokens} "
             f"held-out tokens (seed 1000) of {Path(args.model).name}, {args.bits}-bit GPTQ, calibration seeds "
             f"{args.seeds}", "",
             "| setting | seed | Σ min(p, q) | 1 − Σ min | RTN's gap closed | text s | quantisation s |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    rtn_gap = None
    if args.rtn:
        codes = {name: Coded(*group_quantize(target.get_submodule(name).weight.detach().float(), args.bits, 32))
                 for name in names}
        value = coded_overlap(target, names, codes, 32, held_out, p_float)
        rtn_gap = 1 - value
        rows.append({"setting": f"rtn{args.bits}-g32", "overlap": value})
        lines.append(f"| rtn{args.bits}-g32 | — | {value:.4f} | {1 - value:.4f} | 0 % | — | — |")
        print(lines[-1], flush=True)
    if args.reference:
        ref, _ = common.load(Path(args.reference), "float32")
        value = sum(fidelity(target, ref, held_out[i:i + 1]) for i in range(4)) / 4
        rows.append({"setting": f"reference {Path(args.reference).name}", "overlap": value})
        lines.append(f"| the model {Path(args.reference).name} as it is | — | {value:.4f} | {1 - value:.4f} | "
                     f"{_closed(value, rtn_gap)} | — | — |")
        del ref
    chosen = SETTINGS if not args.only else [SETTINGS[int(i)] for i in args.only.split(",")]
    found: dict[tuple[int, int, int], tuple[dict, float]] = {}
    for seed in seeds:
        for label, sequences, tokens, group, fields in chosen:
            if (sequences, tokens, seed) not in found:
                watch = common.Stopwatch()
                text = self_samples(target, sequences, tokens, seed)
                text_seconds = watch.seconds  # one entry at a time: a text's Hessians are ~1 GB
                found = {(sequences, tokens, seed): (hessians(target, text, names), text_seconds)}
            hessian, text_seconds = found[sequences, tokens, seed]
            watch = common.Stopwatch()
            codes = gptq_codes(target, hessian, names, args.bits, group,
                               Calibration(sequences=sequences, tokens=tokens, seed=seed, **fields))
            seconds = watch.seconds
            value = coded_overlap(target, names, codes, group, held_out, p_float)
            rows.append({"setting": label, "seed": seed, "overlap": value, "text_s": text_seconds,
                         "quantise_s": seconds})
            lines.append(f"| {label} | {seed} | {value:.4f} | {1 - value:.4f} | {_closed(value, rtn_gap)} | "
                         f"{text_seconds:.0f} | {seconds:.0f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    common.write_results(args.out, lines, rows)


def _closed(value: float, rtn_gap: float | None) -> str:
    return "—" if rtn_gap is None else f"{100 * (1 - (1 - value) / rtn_gap):.1f} %"


if __name__ == "__main__":
    main()
