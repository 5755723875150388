"""Does a short distillation of a GPTQ draft's grids against the target's own distributions raise its acceptance?

The issue on real weights names three ways to make a 4-bit draft closer at the same bytes: GPTQ, activation-aware
scales and "a short distillation of the draft's scales and zeros against the target's own distributions". This
script measures the third on top of the first. The codes of the cached `gptq4` draft stay fixed; each group's
scale and its value at the middle code (`--params groups`: two numbers per 32 weights, 8.4 M at SmolLM2-135M),
or one multiplier and one shift per output row folded into them (`--params rows`), are trained by Adam on
KL(p_target ‖ p_draft) at T = 1 over the text the target writes for its calibration (the default `Calibration`'s,
seed 0, as `hfspec.quant.calibrate`; 64 × 64 tokens when docs/drafts.md's results were taken), `--batch`
sequences a step, the draft's forward under bf16 autocast (`--amp`). Every
`--every` steps the mean Σ min(p, q) (the expected acceptance at T = 1) is measured on 4 × 128 held-out tokens the
target writes with seed 1000 (as benchmarks/bench_calibration_settings.py), with the trained grids rounded to fp16
as a draft would store them. The draft's format, bytes and step are unchanged by it; only whether it pays is asked.

    python benchmarks/bench_distill.py --steps 40 --lr 3e-4 --params groups --out results/distill
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402

from hfspec.drafts.calibrated import calibrated_codes  # noqa: E402
from hfspec.drafts.sensitivity import _probs, coded_overlap  # noqa: E402
from hfspec.quant.calibrate import Calibration, Coded, calibration_matrices, self_samples  # noqa: E402


class Grids:
    """The trainable grids of fixed codes: Ŵ = (q − mid) · s0 (1 + a) + o0 + s0 b per group (a, b zero at the
    start: the GPTQ draft itself), with a and b per group or per output row."""

    def __init__(self, codes: dict[str, Coded], group_size: int, per_row: bool):
        self.codes, self.group_size = codes, group_size
        self.mid = {n: float(c.q.max()) / 2 for n, c in codes.items()}
        self.q = {n: (c.q.float() - self.mid[n]).view(c.q.shape[0], -1, group_size).to(torch.bfloat16)
                  for n, c in codes.items()}  # codes 0..15 less 7.5: exact in bf16
        self.s0 = {n: c.scale.float() for n, c in codes.items()}
        self.o0 = {n: c.zero.float() + self.mid[n] * c.scale.float() for n, c in codes.items()}
        shape = {n: (s.shape[0], 1) if per_row else tuple(s.shape) for n, s in self.s0.items()}
        self.a = {n: torch.zeros(shape[n], requires_grad=True) for n in codes}
        self.b = {n: torch.zeros(shape[n], requires_grad=True) for n in codes}

    def parameters(self) -> list[torch.Tensor]:
        return list(self.a.values()) + list(self.b.values())

    def _grid(self, n: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.s0[n] * (1 + self.a[n]), self.o0[n] + self.s0[n] * self.b[n]

    def weights(self) -> dict[str, torch.Tensor]:
        out = {}
        for n, q in self.q.items():
            s, o = self._grid(n)
            out[f"{n}.weight"] = (q.float() * s[..., None] + o[..., None]).view(q.shape[0], -1)
        return out

    @torch.no_grad()
    def coded(self) -> dict[str, Coded]:
        """The trained grids as a draft stores them (fp16 scale and zero)."""
        out = {}
        for n, c in self.codes.items():
            s, o = self._grid(n)
            scale = s.expand_as(self.s0[n]).half()
            out[n] = Coded(c.q, scale, (o.expand_as(self.s0[n]) - self.mid[n] * scale.float()).half())
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(common.PAIRS["smollm2-offgrid"]))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch", type=int, default=8, help="calibration sequences a step")
    p.add_argument("--params", choices=("groups", "rows"), default="groups")
    p.add_argument("--amp", choices=("bfloat16", "none"), default="bfloat16")
    p.add_argument("--every", type=int, default=10, help="steps between held-out measurements")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = common.load(Path(args.model), "float32")
    for param in target.parameters():
        param.requires_grad_(False)
    names = list(calibration_matrices(target))
    settings = Calibration()
    codes, where = calibrated_codes(target, 4, 32, settings)
    held_out = self_samples(target, 4, 128, 1000)
    p_float = list(_probs(target, held_out))
    text = self_samples(target, settings.sequences, settings.tokens, settings.seed)
    with torch.no_grad():
        teacher = torch.cat([F.log_softmax(target(text[i:i + 8], use_cache=False).logits.float(), -1).bfloat16()
                             for i in range(0, text.shape[0], 8)])
    grids = Grids(codes, 32, args.params == "rows")
    opt = torch.optim.Adam(grids.parameters(), lr=args.lr)
    order = torch.randperm(text.shape[0], generator=torch.Generator().manual_seed(0))
    lines = [f"{common.machine_name()}, {args.threads} threads; gptq4 draft of {Path(args.model).name} ({where}); "
             f"grids trained per {args.params[:-1]}, Adam lr {args.lr:g}, {args.batch} × {settings.tokens + 1} "
             f"tokens a step, autocast {args.amp}; Σ min(p, q) on 4 × 128 held-out tokens", "",
             "| steps | train KL (last step) | held-out Σ min(p, q) | seconds training |", "|---|---|---|---|"]
    start = coded_overlap(target, names, codes, 32, held_out, p_float)
    lines.append(f"| 0 (GPTQ) | — | {start:.4f} | 0 |")
    print(lines[-1], flush=True)
    rows, trained, loss = [{"steps": 0, "overlap": start}], 0.0, float("nan")
    for step in range(1, args.steps + 1):
        watch = common.Stopwatch()
        at = ((step - 1) * args.batch) % text.shape[0]
        pick = order[at:at + args.batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp != "none"):
            logits = torch.func.functional_call(target, grids.weights(), (text[pick],), {"use_cache": False},
                                                tie_weights=False, strict=False).logits
        lp = teacher[pick].float()
        kl = (lp.exp() * (lp - F.log_softmax(logits.float(), -1))).sum(-1).mean()
        opt.zero_grad()
        kl.backward()
        opt.step()
        loss, trained = float(kl), trained + watch.seconds
        if step % args.every == 0 or step == args.steps:
            seconds = trained
            value = coded_overlap(target, names, grids.coded(), 32, held_out, p_float)
            rows.append({"steps": step, "train_kl": loss, "overlap": value, "seconds": seconds})
            lines.append(f"| {step} | {loss:.4f} | {value:.4f} | {seconds:.0f} |")
            print(lines[-1], flush=True)
    print("\n".join(lines))
    common.write_results(args.out, lines, rows)


if __name__ == "__main__":
    main()
