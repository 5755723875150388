"""How close an exported draft (`hfspec export-draft`, compressed-tensors) is to the target, beside hfspec's drafts.

    python benchmarks/bench_export.py --models micro,gemma3-tiny,smollm2 --out benchmarks/results/export

Per model: the rtn4 export (the decoder's Linear layers packed at 4 bits, the embedding and LM head the target's
own values) loaded back by transformers, against the target on 24 random tokens: mean |Δ logit| of hfspec's
all-quantised HF-forward rtn4 (`lean=False`), of the export, and the fidelity (mean Σ min(p, q) on the target's
own greedy text) of hfspec's default rtn4 draft (lean step, re-scored head) and of the export; then greedy α of
"Once upon a time" through `hfspec.generate` at γ 4 with each. "gemma3-tiny" has random weights: its α means
nothing, its distances are only a check of the format.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load, model_folders, parser, prompt_ids, write_results  # noqa: E402

import hfspec  # noqa: E402
from hfspec.drafts.fidelity import fidelity, probe_ids  # noqa: E402
from hfspec.io.export_draft import export_draft, load_export  # noqa: E402


def _gemma3_tiny():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import build_family

    return build_family("gemma3", init=0.1), None


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.set_defaults(models="micro,gemma3-tiny,smollm2", max_new_tokens=64)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--out", help="write OUT.md and OUT.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = ["| model | mean abs Δ logit, hfspec rtn4 (HF forward, quantised head) | mean abs Δ logit, export | "
             "fidelity, hfspec rtn4 (default) | fidelity, export | greedy α, hfspec rtn4 / export |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    names = args.models.split(",")
    folders = model_folders(argparse_without(args, "gemma3-tiny"))
    rows = []
    for name in names:
        if name == "gemma3-tiny":
            target, tok = _gemma3_tiny()
        elif name in folders:
            target, tok = load(folders[name], "float32")
        else:
            continue
        vocab = target.config.vocab_size
        ids = torch.randint(3, vocab, (1, 24), generator=torch.Generator().manual_seed(0))
        ours = hfspec.make_draft(target, "rtn4")
        hf_rtn = hfspec.make_draft(target, "rtn4", lean=False, fused=False)
        with tempfile.TemporaryDirectory() as tmp:
            folder = export_draft(target, "rtn4", Path(tmp) / "d", tokenizer=tok, check=False).folder
            exported = load_export(folder)
            with torch.no_grad():
                ref = target(ids).logits.float()
                d_hf = float((hf_rtn(ids).logits.float() - ref).abs().mean())
                d_ex = float((exported(ids).logits.float() - ref).abs().mean())
            probe = probe_ids(target, 64)
            fid = {"hfspec": fidelity(target, ours, probe), "export": fidelity(target, exported, probe)}
            alpha = {}
            if tok is not None:
                prompt = prompt_ids(tok, args.prompt)
                for label, d in (("hfspec", ours), ("export", exported)):
                    out = hfspec.generate(target, prompt, draft=d, gamma=4, temperature=0,
                                          max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens)
                    alpha[label] = out.stats.alpha
        row = {"model": name, "delta_hf_rtn4": d_hf, "delta_export": d_ex, "fidelity": fid, "alpha": alpha,
               "tokens": args.max_new_tokens}
        rows.append(row)
        a = f"{alpha['hfspec']:.3f} / {alpha['export']:.3f} ({args.max_new_tokens} tokens)" if alpha else ""
        line = (f"| {name} | {d_hf:.3f} | {d_ex:.3f} | {fid['hfspec']:.3f} | {fid['export']:.3f} | {a} |")
        lines.append(line)
        print(line, flush=True)
    write_results(args.out, lines, rows)


def argparse_without(args, name: str):
    """`args` with `name` left out of --models (it is built here, not read from a folder)."""
    import copy

    rest = copy.copy(args)
    rest.models = ",".join(m for m in args.models.split(",") if m != name)
    return rest


if __name__ == "__main__":
    main()
