"""Shared set-up for benchmark scripts: models from ../shared/models or the embedded presets."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "models"
PAIRS = {
    "micro": ROOT / "presets" / "models" / "micro",
    "stories260K": SHARED / "stories260K",
    "smollm2": Path.home() / ".cache" / "hfspec-models" / "smollm2-135m-instruct",  # get-smollm2.sh's default
}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--models", default="micro,stories260K,smollm2",
                   help="comma-separated: micro, stories260K, smollm2 (SmolLM2-135M from get-smollm2.sh), or folders")
    p.add_argument("--smollm2", default=str(PAIRS["smollm2"]), help="folder made by ../shared/models/get-smollm2.sh")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    return p


def model_folders(args) -> dict[str, Path]:
    PAIRS["smollm2"] = Path(args.smollm2)
    out = {}
    for name in args.models.split(","):
        path = PAIRS.get(name, Path(name))
        if (path / "config.json").exists():
            out[name] = path
        else:
            print(f"# skipping {name}: {path} not found")
    return out


def load(path: Path, dtype: str = "float32"):
    from hfspec.loading import load_model, load_tokenizer

    torch.manual_seed(0)
    return load_model(str(path), dtype=dtype, progress=False), load_tokenizer(str(path))


def prompt_ids(tokenizer, text: str = "Once upon a time") -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


def against_plain(target, ids: torch.Tensor, runs: dict, temperature: float, tokens: int, repeats: int,
                  seed: int) -> dict:
    """Plain `generate` and `hfspec.generate` with each of `runs` ({key: (draft, gamma)}), interleaved per repeat
    (repeat 0 a warm-up, not counted; repeat r seeded with seed + r), each making exactly `tokens` tokens.
    Per key: alpha and tokens_per_pass (pooled over repeats), draft_ms_per_forward, tok_s and vs_plain (medians),
    plain_tok_s."""
    import statistics
    import time

    import hfspec

    sample = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0
              else dict(do_sample=False))
    seconds = {m: [] for m in ["plain", *runs]}
    stats = {key: [] for key in runs}
    for r in range(repeats + 1):
        for m in seconds:
            torch.manual_seed(seed + r)
            began = time.perf_counter()
            if m == "plain":
                target.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **sample)
            else:
                draft, gamma = runs[m]
                out = hfspec.generate(target, ids, draft=draft, gamma=gamma, temperature=temperature,
                                      max_new_tokens=tokens, min_new_tokens=tokens, seed=seed + r)
            took = time.perf_counter() - began
            if r:
                seconds[m].append(took)
                if m != "plain":
                    stats[m].append(out.stats)
    plain = statistics.median(seconds["plain"])
    return {key: {"alpha": sum(s.accepted for s in st) / max(1, sum(s.checked for s in st)),
                  "tokens_per_pass": sum(s.new_tokens for s in st) / sum(s.target_passes for s in st),
                  "draft_ms_per_forward": statistics.median(s.time_draft / max(1, s.draft_forwards) for s in st) * 1e3,
                  "tok_s": tokens / statistics.median(seconds[key]), "plain_tok_s": tokens / plain,
                  "vs_plain": plain / statistics.median(seconds[key])}
            for key, st in stats.items()}


def write_results(out: str | None, lines: list[str], rows: list[dict]) -> None:
    """With --out OUT: the markdown table `lines` to OUT.md and `rows` to OUT.json."""
    import json

    if not out:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
