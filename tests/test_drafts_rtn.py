"""RTN drafts of tiny models (Llama, GPT-2, Qwen2, GPT-NeoX): coverage, ties, bytes, forward vs reference."""

import copy
import os
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.pytorch_utils import Conv1D

from hfspec.drafts import make_draft as _make_draft
from hfspec.drafts import weight_bytes
from hfspec.quant import QuantEmbedding, QuantLinear, describe, int4_cpu_kernel_ok, summary, weight_matrices


def make_draft(target, spec, **options):
    """These tests check the module-swap path (HF forward over quantised modules), not the lean step."""
    return _make_draft(target, spec, lean=False, **options)


def tiny(arch: str, hidden=64, vocab=128, inter=172):
    torch.manual_seed(0)
    if arch == "llama":  # intermediate 172: ragged last group, like stories260K
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        model = LlamaForCausalLM(cfg)
    elif arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=2, n_head=4, n_positions=64))
    elif arch == "qwen2":
        cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = GPTNeoXConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=64)
        model = GPTNeoXForCausalLM(cfg)
    return model.eval()


ARCHS = ["llama", "gpt2", "qwen2", "neox"]


def dequantised_reference(target, draft):
    """A float copy of `target` holding the draft's dequantised weights."""
    ref = copy.deepcopy(target)
    with torch.no_grad():
        for name, module in weight_matrices(ref):
            w = draft.get_submodule(name).qweight.dequantize()
            module.weight.copy_(w.t() if isinstance(module, Conv1D) else w)
    return ref


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("bits,fused", [(4, True), (4, False), (3, None), (8, None), (2, None)])
def test_forward_equals_dequantised_reference(arch, bits, fused):
    target = tiny(arch)
    draft = make_draft(target, f"rtn{bits}", fused=fused)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    ref, got = logits(dequantised_reference(target, draft), ids), logits(draft, ids)
    any_fused = any("fused int4" in row["path"] for row in describe(draft))
    assert any_fused == (bits == 4 and fused is True and int4_cpu_kernel_ok())
    tol = 0.03 if any_fused else 1e-4  # fused: bf16 activations
    assert (got - ref).abs().max() <= tol * max(1.0, ref.abs().max())


@pytest.mark.parametrize("arch", ARCHS)
def test_every_weight_matrix_is_quantised(arch):
    target = tiny(arch)
    draft = make_draft(target, "rtn4")
    for name, module in draft.named_modules():
        assert not isinstance(module, nn.Linear | nn.Embedding | Conv1D), name
    for name, p in draft.named_parameters():
        assert p.dim() < 2, f"float matrix left: {name}"
    assert len(describe(draft)) == len(weight_matrices(target))
    assert sum(summary(draft).values()) == len(weight_matrices(target))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tied_weights_stay_tied(arch):
    target = tiny(arch)
    draft = make_draft(target, "rtn4")
    head, emb = draft.get_output_embeddings(), draft.get_input_embeddings()
    assert isinstance(head, QuantLinear) and isinstance(emb, QuantEmbedding)
    assert head.qweight is emb.qweight
    untied_total = weight_bytes(draft) + sum(b.numel() * b.element_size() for b in head.qweight.buffers())
    assert weight_bytes(draft) < untied_total


def test_untied_head_has_its_own_storage():
    draft = make_draft(tiny("qwen2"), "rtn4")
    assert draft.get_output_embeddings().qweight is not draft.get_input_embeddings().qweight


def test_target_unchanged_and_not_shared():
    target = tiny("llama")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    draft = make_draft(target, "rtn3-g64")
    after = target.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    assert not any(t.data_ptr() in target_ptrs for t in list(draft.parameters()) + list(draft.buffers()))
    assert isinstance(target.lm_head, nn.Linear)


def test_embedding_reads_only_looked_up_rows():
    draft = make_draft(tiny("llama"), "rtn4")
    emb = draft.get_input_embeddings()
    ids = torch.tensor([[5, 0, 127], [64, 63, 5]])
    full = emb.qweight.dequantize()
    assert torch.equal(emb(ids), full[ids])


@pytest.mark.parametrize("bits,ratio", [(4, 0.156), (3, 0.125), (8, 0.281), (2, 0.094)])
def test_weight_bytes_ratio(bits, ratio):
    target = tiny("llama", hidden=256, vocab=512, inter=512)
    draft = make_draft(target, f"rtn{bits}")
    c_bytes = weight_bytes(draft) / weight_bytes(target)
    assert ratio <= c_bytes <= ratio + 0.01  # B/32 for codes + 4 bytes / 32 weights for fp16 scale & zero


@pytest.mark.parametrize("bits", range(2, 9))
def test_packed_bytes_exact(bits):
    target = tiny("qwen2")
    draft = make_draft(target, f"rtn{bits}", fused=False)
    for row in describe(draft):
        q = draft.get_submodule(row["name"]).qweight
        n, k = row["shape"]
        groups = -(-k // 32)
        assert q.packed.numel() == n * k * bits // 8
        assert q.scale.numel() * 2 + q.zero.numel() * 2 == 4 * n * groups


def test_draft_generates_greedy_like_target():
    target = tiny("llama")
    draft = make_draft(target, "rtn8")
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        a = target.generate(ids, max_new_tokens=6, do_sample=False)
        b = draft.generate(ids, max_new_tokens=6, do_sample=False)
    assert b.shape == a.shape


STORIES = str(Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K")  # ../shared


@pytest.mark.shared
@pytest.mark.skipif(not os.path.isdir(STORIES), reason="needs ../shared/models/stories260K")
def test_stories_rtn4_draft_keeps_greedy_text():
    import hfspec

    target = LlamaForCausalLM.from_pretrained(STORIES, local_files_only=True).eval()
    draft = make_draft(target, "rtn4")
    assert any("K=172" in row["path"] for row in describe(draft))  # ragged MLP handled by the fallback path
    prompt = torch.tensor([[1]])
    spec = hfspec.generate(target, prompt, draft=draft, gamma=4, temperature=0, max_new_tokens=24)
    plain = hfspec.plain_generate(target, prompt, temperature=0, max_new_tokens=24)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.alpha > 0.5
