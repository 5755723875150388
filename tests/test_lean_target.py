"""The lean target (`hfspec.kernels.lean_target`): a float32 Llama-style target's passes through hfspec's lean decoder
over its own weights: the HF forward's logits, no weight copied, the target's greedy text through chains and token
trees, refused by name where it would not be the target's function, checked before use."""

import pytest
import torch
from tiny_models import build_family

import hfspec
from hfspec.attrs import BITWISE_VERIFY, set_attr
from hfspec.errors import HfspecError
from hfspec.kernels import lean_target
from hfspec.kernels.lean import LeanDecoder, LeanRunner
from hfspec.kernels.shared_linear import SharedLinear
from hfspec.kernels.slots import Slots

LEAN_FAMILIES = ["llama", "qwen2", "qwen3", "gemma", "phi3"]  # gemma3 has sliding layers: refused (below)


@pytest.fixture(autouse=True)
def lean_on(monkeypatch):
    """The lean target wherever it can run, with the few-row kernel or without (CI's CPU may lack AVX-512)."""
    monkeypatch.setenv(lean_target.MODE_ENV, "on")


def _target(family: str, seed: int = 3):
    return build_family(family, seed=seed, init=0.2, layers=2)


def _randomised(model, seed: int = 7):
    """Every bias and norm weight drawn at random: a tiny model is built with zero biases and unit (Gemma: zero)
    norms, under which a wrong column order of Q/K/V's bias or of a q/k norm, or a wrong (1 + w), would not show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5 + (0.0 if name.endswith("bias")
                                                                                     else 1.0))
    return model


def _partial_rotary_phi3():
    import transformers
    from tiny_models import FAMILIES, VOCAB

    config = transformers.Phi3Config(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                                     num_hidden_layers=2, hidden_size=32, initializer_range=0.2,
                                     partial_rotary_factor=0.5, **FAMILIES["phi3"][2])
    torch.manual_seed(3)
    return transformers.Phi3ForCausalLM(config).eval()


@pytest.mark.parametrize("family", LEAN_FAMILIES + ["phi3 partial rotary"])
def test_lean_target_passes_give_the_hf_forwards_logits(family):
    target = _randomised(_partial_rotary_phi3() if family == "phi3 partial rotary" else _target(family))
    runner, path = lean_target.runner_for(target)
    if family == "phi3 partial rotary":
        assert runner.model.blocks[0].rot < runner.model.blocks[0].head_dim  # the case is what it says
    assert isinstance(runner, LeanRunner), path
    ids = torch.tensor([[0, 5, 17, 33, 9, 41, 7, 60, 12, 3, 28]])
    slots = Slots(ids, torch.ones_like(ids))
    # a prompt, then a verify pass of 5 positions, then one of 1: what a chain's rounds feed
    got = [runner.feed(slots.tokens, slots.positions, slots.valid, 5, 5, slots.all_valid),
           runner.feed(slots.tokens, slots.positions, slots.valid, 10, 5, slots.all_valid),
           runner.feed(slots.tokens, slots.positions, slots.valid, 11, 1, slots.all_valid)]
    with torch.no_grad():
        want = target(ids).logits
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=2e-4, rtol=2e-4)


def test_no_weight_of_the_target_is_copied():
    target = _target("qwen2")  # QKV biases: the columns are permuted after the bias is added
    decoder, why = lean_target.built(target)
    assert decoder is not None, why
    own = {p.data_ptr() for p in target.parameters()}
    linears = [decoder.head] + [lin for block in decoder.blocks for lin in block.linears()]
    assert all(isinstance(lin, SharedLinear) for lin in linears)
    read = [t.data_ptr() for lin in linears for t in lin.tensors()]
    assert read and set(read) <= own
    # the control: a lean draft of the same float weights fuses and permutes, so its matrices are copies
    copy = LeanDecoder(target, bits=None)
    assert copy.blocks[0].qkv.weight.data_ptr() not in own


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_greedy_text_through_the_lean_target_is_the_targets(family):
    target = _target(family)
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.tensor([[1, 50, 60, 70, 8]])
    want = target.generate(ids, do_sample=False, max_new_tokens=32, min_new_tokens=32)
    chain = hfspec.generate(target, ids, draft=draft, gamma=4, temperature=0, max_new_tokens=32, min_new_tokens=32)
    tree = hfspec.generate(target, ids, draft=draft, tree=hfspec.TreeShape(8, 4, 2, 2), temperature=0,
                           max_new_tokens=32, min_new_tokens=32)
    for out in (chain, tree):
        assert out.stats.target_path.startswith(lean_target.PATH)
        assert torch.equal(out.sequences, want)
    assert tree.stats.tree_rounds > 0


def test_a_seeded_sampled_run_writes_the_same_text_through_either_path(monkeypatch):
    target = _target("llama")
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.tensor([[1, 50, 60, 70, 8]])
    runs = {}
    for mode in ("on", "off"):
        monkeypatch.setenv(lean_target.MODE_ENV, mode)
        runs[mode] = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=1.0, max_new_tokens=40,
                                     min_new_tokens=40, seed=5)
    assert runs["on"].stats.target_path.startswith(lean_target.PATH)
    assert runs["off"].stats.target_path == f"HF forward ({lean_target.MODE_ENV}=off)"
    assert torch.equal(runs["on"].sequences, runs["off"].sequences)


def test_where_it_is_not_the_targets_function_the_hf_forward_runs_and_says_why(monkeypatch):
    llama = _target("llama")
    assert lean_target.why_not(llama) == ""
    assert lean_target.why_not(llama, batch=2) == "a batch of 2 rows (one row only)"
    assert lean_target.why_not(_target("llama").to(torch.bfloat16)) == "not a float32 CPU target"
    assert "sliding" in lean_target.why_not(_target("gemma3"))
    assert lean_target.why_not(build_family("gpt2", seed=3, layers=1))  # another family: lean_reason's words
    bitwise = _target("llama")
    set_attr(bitwise, BITWISE_VERIFY, True)
    assert lean_target.why_not(bitwise) == "bit-for-bit verify (generate's own rounding)"
    monkeypatch.setenv(lean_target.MODE_ENV, "off")
    assert lean_target.why_not(llama) == f"{lean_target.MODE_ENV}=off"
    monkeypatch.setenv(lean_target.MODE_ENV, "sometimes")
    with pytest.raises(HfspecError, match=lean_target.MODE_ENV):
        lean_target.why_not(llama)


def test_plain_decoding_and_sibling_leaves_keep_the_hf_forward():
    target = _target("llama")
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.tensor([[1, 50, 60, 70, 8]])
    plain = hfspec.plain_generate(target, ids, temperature=0, max_new_tokens=8)
    siblings = hfspec.generate(target, ids, draft=draft, gamma=3, tree=3, temperature=0, max_new_tokens=8)
    assert plain.stats.target_path == "HF forward"
    assert siblings.stats.target_path == "HF forward"


def test_a_lean_decoder_whose_logits_differ_is_never_used(monkeypatch):
    class Off(LeanDecoder):  # a wrong layer, as a family the lean decoder misreads would give
        def logits(self, *args, **kwargs):
            return super().logits(*args, **kwargs) + 0.5

    monkeypatch.setattr(lean_target, "LeanDecoder", Off)
    target = _target("llama")
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.tensor([[1, 50, 60, 70, 8]])
    out = hfspec.generate(target, ids, draft=draft, gamma=4, temperature=0, max_new_tokens=16)
    assert out.stats.target_path.startswith("HF forward (its logits differ from the HF forward's by 0.5")
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=16))


def test_built_once_per_weights_and_again_after_an_in_place_change():
    target = _target("llama")
    first, _ = lean_target.built(target)
    assert first is not None and lean_target.built(target)[0] is first
    with torch.no_grad():
        target.model.norm.weight.mul_(2.0)  # a norm is a small copy in the lean decoder: it must be rebuilt
    second, _ = lean_target.built(target)
    assert second is not None and second is not first
    ids = torch.tensor([[0, 5, 17, 33]])
    with torch.no_grad():
        want = target(ids).logits
    got = second.logits(ids, None, None, second.hfspec_new_cache(), 0)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_the_audit_measures_the_lean_targets_rounding_where_decodes_take_it(monkeypatch):
    from hfspec.audit.exactness import rounding_difference

    target = _target("llama")
    ids = torch.tensor([[0, 5, 17, 33, 9]])
    out = target.generate(ids, do_sample=False, max_new_tokens=12, min_new_tokens=12, output_logits=True,
                          return_dict_in_generate=True)
    prefix, reference = out.sequences[:, :-1], out.logits[-1][0].float()
    schemes = rounding_difference(target, prefix, ids.shape[1], 4, reference)
    lean = {k: v for k, v in schemes.items() if k.startswith("lean ")}
    assert set(lean) == {"lean " + k for k in schemes if not k.startswith("lean ")}
    assert 0 <= max(lean.values()) < 1e-3  # fp32 rounding, not another function
    monkeypatch.setenv(lean_target.MODE_ENV, "off")
    assert not any(k.startswith("lean ") for k in rounding_difference(target, prefix, ids.shape[1], 4, reference))


def test_what_would_make_a_built_decoder_stale_or_wrong_keeps_the_hf_forward():
    target = _target("llama")
    first, _ = lean_target.built(target)
    with torch.no_grad():
        target.model.norm.weight.data.mul_(2.0)  # through .data: no version bump; the decoder holds a copy of norms
    second, _ = lean_target.built(target)
    assert second is not None and second is not first
    handle = target.model.layers[0].register_forward_hook(lambda module, args, out: out)  # e.g. steering code
    assert lean_target.why_not(target).startswith("forward hooks")
    handle.remove()
    assert lean_target.why_not(target) == ""
    with torch.inference_mode():
        frozen = _target("llama")
    assert lean_target.why_not(frozen).startswith("weights made under torch.inference_mode")
    out = hfspec.generate(frozen, torch.tensor([[1, 50, 60]]), draft=hfspec.make_draft(_target("llama"), "rtn4"),
                          gamma=3, temperature=0, max_new_tokens=6)
    assert out.stats.target_path.startswith("HF forward (weights made under torch.inference_mode")


def test_rotary_scaling_chosen_per_forward_is_refused():
    import transformers

    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                       "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                                                       "original_max_position_embeddings": 2048})
    assert lean_target.why_not(transformers.LlamaForCausalLM(config).eval()) == "longrope rotary scaling"


def test_a_long_prompt_is_prefilled_in_chunks_with_the_same_logits(monkeypatch):
    monkeypatch.setattr(lean_target, "PREFILL_CHUNK", 4)
    target = _target("llama")
    runner, _ = lean_target.runner_for(target)
    ids = torch.tensor([[0, 5, 17, 33, 9, 41, 7, 60, 12, 3, 28, 44, 8]])
    slots = Slots(ids, torch.ones_like(ids))
    got = runner.feed(slots.tokens, slots.positions, slots.valid, 13, 2, slots.all_valid)
    assert runner.cache.length == 13
    with torch.no_grad():
        want = target(ids).logits[:, -2:]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
