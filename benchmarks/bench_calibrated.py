"""Acceptance of RTN against calibrated (GPTQ) drafts at the same bytes, on targets that were never on the grid.

For each target and draft: α and tokens per target pass, greedy and at T = 1 (pure sampling: top-k 0, top-p 1),
γ fixed, PROMPTS × --max-new-tokens tokens; and the mean overlap Σ_v min(p, q) (T = 1) over text the target
samples itself (a fresh seed, not the calibration text). Build time (calibration included, the first time) and
the cached build time are reported too. α is timing-free: this script can run on a busy machine.

    python benchmarks/bench_calibrated.py --models smollm2-offgrid --drafts rtn4,gptq4 --out results/calibrated

A draft written `gptq4@256x32` is calibrated on 256 texts of 32 tokens instead of the default
(`hfspec.quant.calibrate.Calibration`); `--held-out 16x128` measures the overlap on more text than 4 × 128.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):",
           "In a small village by the sea, there lived"]


def acceptance(target, tokenizer, draft, gamma: int, temperature: float, tokens: int, seed: int) -> dict:
    import hfspec

    accepted = checked = new = passes = 0
    for i, text in enumerate(PROMPTS):
        ids = common.prompt_ids(tokenizer, text)
        sample = {} if temperature == 0 else {"top_k": 0, "top_p": 1.0}
        out = hfspec.generate(target, ids, draft=draft, gamma=gamma, temperature=temperature, max_new_tokens=tokens,
                              min_new_tokens=tokens, seed=seed + i, **sample)
        s = out.stats
        accepted, checked, new, passes = (accepted + s.accepted, checked + s.checked, new + s.new_tokens,
                                          passes + s.target_passes)
    return {"alpha": accepted / max(1, checked), "tokens_per_pass": new / max(1, passes)}


def overlap(target, draft, seed: int, sequences: int = 4, tokens: int = 128) -> float:
    from hfspec.drafts.fidelity import fidelity
    from hfspec.quant.calibrate import self_samples

    ids = self_samples(target, sequences, tokens, seed)
    return sum(fidelity(target, draft, ids[i:i + 1]) for i in range(sequences)) / sequences


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(models="smollm2-offgrid")
    p.add_argument("--drafts", default="rtn4,gptq4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--held-out", default="4x128", help="SEQUENCESxTOKENS the overlap is measured on")
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from hfspec.drafts import make_draft
    from hfspec.quant.calibrate import Calibration

    held_sequences, held_tokens = (int(x) for x in args.held_out.lower().split("x"))

    lines = [f"γ {args.gamma}, {len(PROMPTS)} prompts × {args.max_new_tokens} tokens, {args.dtype}; overlap: mean "
             f"Σ min(p, q) at T = 1 on {held_sequences} × {held_tokens} tokens the target samples itself", "",
             "| target | draft | build s (first / cached) | greedy α | tok/pass | T=1 α | tok/pass | Σ min(p,q) | "
             "1 − Σ min |", "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for name, path in common.model_folders(args).items():
        target, tok = common.load(path, args.dtype)
        for entry in args.drafts.split(","):
            spec, _, text = entry.partition("@")
            options = {}
            if text:
                sequences, tokens = (int(x) for x in text.lower().split("x"))
                options["calibration"] = Calibration(sequences=sequences, tokens=tokens)
            first, draft = common.once(functools.partial(make_draft, target, spec, **options))
            again, draft = common.once(functools.partial(make_draft, target, spec, **options))
            greedy = acceptance(target, tok, draft, args.gamma, 0.0, args.max_new_tokens, args.seed)
            sampled = acceptance(target, tok, draft, args.gamma, 1.0, args.max_new_tokens, args.seed)
            ov = overlap(target, draft, args.seed + 1000, held_sequences, held_tokens)
            row = {"target": name, "draft": entry, "build_s": first, "cached_build_s": again,
                   "greedy": greedy, "t1": sampled, "overlap": ov}
            rows.append(row)
            lines.append(f"| {name} | {entry} | {first:.1f} / {again:.1f} | {greedy['alpha']:.3f} | "
                         f"{greedy['tokens_per_pass']:.2f} | {sampled['alpha']:.3f} | {sampled['tokens_per_pass']:.2f} "
                         f"| {ov:.4f} | {1 - ov:.4f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    common.write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
