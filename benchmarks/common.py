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
