"""bitsandbytes drafts (nf4 / fp4 / int8) of a tiny Llama on this machine's device (CPU here)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hfspec.drafts import make_draft, weight_bytes
from hfspec.errors import HfspecError
from hfspec.quant import describe


def tiny_llama(inter):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=inter, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def greedy(model, ids, steps):
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids


bnb = pytest.importorskip("bitsandbytes")


def test_bnb_int8_draft_generates():
    target = tiny_llama(inter=128)
    draft = make_draft(target, "bnb-int8")
    out = greedy(draft, torch.tensor([[1, 2, 3]]), 4)
    assert out.shape == (1, 7)
    assert any(row["path"].startswith("bnb int8") for row in describe(draft))
    assert weight_bytes(draft) < weight_bytes(target)
    assert draft.get_input_embeddings().weight is target.get_input_embeddings().weight  # shared, not copied


@pytest.mark.parametrize("kind", ["nf4", "fp4"])
def test_bnb_4bit_works_or_raises_clearly(kind):
    target = tiny_llama(inter=172)  # N=172: not a multiple of bnb's CPU block
    try:
        draft = make_draft(target, f"bnb-{kind}")
    except HfspecError as err:
        assert "rtn4" in str(err) and "layer" in str(err)
        return
    assert greedy(draft, torch.tensor([[1, 2]]), 3).shape == (1, 5)


def test_bnb_4bit_avoids_cpu_repack_for_ragged_rows(monkeypatch):
    monkeypatch.setattr(bnb.nn.Linear4bit, "__init__", _force_repack(bnb.nn.Linear4bit.__init__))
    draft = make_draft(tiny_llama(inter=172), "bnb-nf4")
    ragged = [r for r in describe(draft) if r["shape"][0] == 172]
    assert ragged and all("generic CPU kernel" in r["path"] for r in ragged)


def _force_repack(init):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.support_avx512bf16_for_cpu = True  # as on a CPU with AVX512-BF16
    return wrapped


