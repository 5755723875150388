"""Move a checkpoint's weights off hfspec's quantisation grids: an honest benchmark target.

The SmolLM2-135M folder that ../shared/models/get-smollm2.sh builds is dequantised Q4_1, which is exactly
hfspec's rtn4 grid (asymmetric, groups of 32, fp16 scale and zero): an rtn4 draft reproduces its body bit for bit,
so every acceptance or speed-up measured on it is a best case. A user's bf16 checkpoint is on no 4-bit grid.

The transformation (seeded, documented, repeatable): every weight matrix (each 2-D parameter: linear layers and
the embedding / tied head; norms and biases stay as they are) that sits on the rtn4 grid is cut into rtn4-g32 groups along its input
dimension, and each weight moves by u * s, u ~ Uniform(-FRACTION/2, +FRACTION/2) drawn independently,
s its own group's rtn4 step (a matrix already off the grid, such as SmolLM2's 6-bit embedding, is left as it is:
moving it would only add noise). Every weight stays within half a step of where it was (it cannot cross into another
model), and its place between grid points becomes uniform, as a real checkpoint's is. The perturbation has the
variance of 4-bit rounding noise, so the model loses a little quality: `--report` measures how much (mean NLL
per token of both models on text the original model samples itself, which favours the original, and on a short
neutral English paragraph written here; and how often their greedy next tokens agree).

    python benchmarks/offgrid.py SRC_FOLDER OUT_FOLDER [--seed 0] [--report]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hfspec.quant.groupwise import _pad_groups, group_qparams  # noqa: E402

NEUTRAL_TEXT = (
    "The river runs past the old mill and under a stone bridge before it reaches the town. In spring the water "
    "rises and the meadows on both banks turn green. Farmers bring their goods to the market on Saturday "
    "mornings: bread, cheese, apples and honey. Children play near the fountain while their parents talk. "
    "In the evening the bells of the church ring, and people walk home along the narrow streets. The town has a "
    "small library, a school and a museum about the history of the region. Many visitors come in summer to walk "
    "in the hills, to swim in the lake and to eat in the restaurants by the water. In winter it is quiet; snow "
    "covers the roofs, and the mill wheel stands still until the ice melts.")
FRACTION = 0.98  # of a step: |move| < 0.49 step, so no weight can reach the next grid point's rounding edge
GROUP = 32
ALREADY_OFF = 0.5  # a matrix with more than this share of its weights off the rtn4 grid is left as it is
SEED = 0


def move_off_grid(state: dict[str, torch.Tensor], seed: int = SEED, fraction: float = FRACTION,
                  group_size: int = GROUP) -> dict[str, torch.Tensor]:
    """A new state dict: each 2-D float tensor moved by u * (its group's rtn4 step), u ~ U(-fraction/2,
    fraction/2), drawn from one generator seeded with `seed`, tensors in sorted name order; others unchanged.
    Tensors that share storage (tied weights) are moved once and stay shared."""
    gen = torch.Generator().manual_seed(seed)
    out, moved = {}, {}
    for name in sorted(state):
        t = state[name]
        if t.dim() != 2 or not t.is_floating_point():
            out[name] = t
            continue
        key = (t.data_ptr(), tuple(t.shape))
        if key not in moved and off_grid_share(t, group_size) > ALREADY_OFF:
            moved[key] = t  # already off the grid (e.g. a GGUF's 6- or 8-bit embedding): no noise added
        if key not in moved:
            w = t.detach().float()
            scale, _ = group_qparams(w, 4, group_size)  # [N, G]
            rows, cols = w.shape
            step = scale.float().unsqueeze(-1).expand(-1, -1, group_size).reshape(rows, -1)[:, :cols]
            u = (torch.rand(w.shape, generator=gen) - 0.5) * fraction
            moved[key] = (w + u * step).to(t.dtype)
        out[name] = moved[key]
    return out


def off_grid_share(w: torch.Tensor, group_size: int = GROUP) -> float:
    """Share of a matrix's weights that are not on their group's rtn4 grid (within 1e-3 of a step)."""
    w = w.detach().float()
    scale, zero = group_qparams(w, 4, group_size)
    g = _pad_groups(w, group_size)
    pos = (g - zero.float().unsqueeze(-1)) / scale.float().clamp_min(1e-12).unsqueeze(-1)
    return float(((pos - pos.round()).abs() > 1e-3).float().mean())


def write_off_grid(src: Path, out: Path, seed: int = SEED) -> dict:
    """Load `src`, move it off the grid and save a complete folder (config, tokenizer) at `out`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    new = move_off_grid(dict(model.named_parameters()), seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(new[name])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in src.iterdir():
        if f.is_file() and not (out / f.name).exists() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    probe = [n for n, p in before.items() if p.dim() == 2][:3]
    card = {"source": str(src), "seed": seed, "fraction_of_step": FRACTION, "group_size": GROUP,
            "moved": sorted({n for n, p in before.items() if p.dim() == 2 and not torch.equal(p, new[n])}).__len__(),
            "off_grid_share_before": {n: off_grid_share(before[n]) for n in probe},
            "off_grid_share_after": {n: off_grid_share(dict(model.named_parameters())[n]) for n in probe}}
    (out / "offgrid.json").write_text(json.dumps(card, indent=1) + "\n")
    return card


@torch.no_grad()
def quality(src: Path, moved: Path, sequences: int = 8, tokens: int = 128, seed: int = 1) -> dict:
    """Mean NLL per token of each model on text the original samples itself (T = 1), and greedy agreement."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(moved, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(src)
    bos = tok.bos_token_id if tok.bos_token_id is not None else 0
    torch.manual_seed(seed)
    ids = a.generate(torch.full((sequences, 1), bos), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                     max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=bos)
    la, lb = a(ids).logits[:, :-1].float(), b(ids).logits[:, :-1].float()
    target = ids[:, 1:]
    nll = [float(torch.nn.functional.cross_entropy(x.flatten(0, 1), target.flatten())) for x in (la, lb)]
    agree = float((la.argmax(-1) == lb.argmax(-1)).float().mean())
    text = tok(NEUTRAL_TEXT, return_tensors="pt").input_ids
    neutral = [float(torch.nn.functional.cross_entropy(m(text).logits[0, :-1].float(), text[0, 1:])) for m in (a, b)]
    return {"nll_on_own_samples": {"original": nll[0], "off_grid": nll[1]},
            "nll_on_neutral_text": {"original": neutral[0], "off_grid": neutral[1], "tokens": text.shape[1]},
            "greedy_agreement": agree, "sequences": sequences, "tokens": tokens, "sample_seed": seed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--report", action="store_true", help="also measure text quality against the original")
    p.add_argument("--report-only", action="store_true", help="measure an existing OUT folder only")
    args = p.parse_args()
    if args.report_only:
        card = json.loads((args.out / "offgrid.json").read_text())
        args.report = True
    else:
        card = write_off_grid(args.src, args.out, args.seed)
    if args.report:
        card["quality"] = quality(args.src, args.out)
        (args.out / "offgrid.json").write_text(json.dumps(card, indent=1) + "\n")
    print(json.dumps(card, indent=1))


if __name__ == "__main__":
    main()
