"""The embedded micro/nano models: load offline, generate, documented sizes, one shared tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

MODELS = Path(__file__).resolve().parents[1] / "presets" / "models"
PARAMS = {"micro": 1_783_200, "nano": 691_680}  # as in presets/models/MODEL_CARD.md
LAYERS = {"micro": 4, "nano": 1}


@pytest.fixture(scope="module")
def loaded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for name in PARAMS:
        model = AutoModelForCausalLM.from_pretrained(MODELS / name, local_files_only=True).eval()
        tok = AutoTokenizer.from_pretrained(MODELS / name, local_files_only=True)
        out[name] = (model, tok)
    return out


def test_files_present_and_small():
    total = 0
    for name in PARAMS:
        folder = MODELS / name
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json"):
            assert (folder / f).is_file(), f"{folder / f} missing"
        total += sum(f.stat().st_size for f in folder.iterdir())
    assert total <= 10 * 1024 * 1024
    assert (MODELS / "MODEL_CARD.md").is_file()


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_parameter_counts_and_architecture(loaded, name):
    model, _ = loaded[name]
    assert sum(p.numel() for p in model.parameters()) == PARAMS[name]
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == LAYERS[name]
    assert model.dtype == torch.float32  # stored as fp16, loaded as float32 (config.dtype)
    assert model.config.tie_word_embeddings


def test_shared_tokenizer(loaded):
    (_, t1), (_, t2) = loaded["micro"], loaded["nano"]
    assert t1.get_vocab() == t2.get_vocab()
    assert len(t1) == 2048 == loaded["micro"][0].config.vocab_size == loaded["nano"][0].config.vocab_size
    assert (MODELS / "micro" / "tokenizer.json").read_bytes() == (MODELS / "nano" / "tokenizer.json").read_bytes()
    assert (t1.bos_token, t1.eos_token, t1.pad_token) == ("<s>", "</s>", "<pad>")
    ids = t1("Return the value.").input_ids
    assert ids[0] == t1.bos_token_id
    assert t1.decode(ids, skip_special_tokens=True) == "Return the value."


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_greedy_generation(loaded, name):
    model, tok = loaded[name]
    ids = tok("Return the", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 8  # may stop early at </s>
    text = tok.decode(out[0], skip_special_tokens=True)
    assert text.startswith("Return the") and len(text) > len("Return the")


def test_micro_is_trained(loaded):
    """The micro model predicts its own domain far better than chance (log 2048 = 7.6 nats)."""
    model, tok = loaded["micro"]
    text = "Return the number of elements in the list. If the list is empty, raise a ValueError."
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    assert loss < 4.0


def test_training_info_matches_card():
    for name in PARAMS:
        info = json.loads((MODELS / name / "training_info.json").read_text())
        assert info["params"] == PARAMS[name]
        card = (MODELS / "MODEL_CARD.md").read_text()
        assert f"{PARAMS[name]:,}" in card
