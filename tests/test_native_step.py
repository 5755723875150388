"""The native draft step (`hfspec.kernels.native_step`): a 4-bit lean draft's layers over a few new tokens in one C
call give the eager lean step's logits (families, GQA, biases, partial rotary, GeLU, cache growth, multi-token
feeds), keep the target's greedy text, are refused by name where they do not reproduce the layer, and are never used
when their check fails."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_family

import hfspec
from hfspec.drafts import describe
from hfspec.errors import HfspecError
from hfspec.kernels import int4_rows, lean_layers, lean_target, native_step, verify_linear
from hfspec.kernels.lean import LeanDecoder

needs_kernel = pytest.mark.skipif(int4_rows.function() is None, reason="hfspec's int4 kernel does not run here")
# the lean target's fp32 matrices need the library only (an AVX2 CPU builds it; its int4 kernel is AVX-512's layout)
needs_library = pytest.mark.skipif(verify_linear.load_library()[0] is None, reason="the C library does not build here")


@pytest.fixture(autouse=True)
def tiny_int4(monkeypatch):
    """Every matrix of a tiny model as int4 (real drafts' are far above `INT4_FROM`)."""
    monkeypatch.setattr(lean_layers, "INT4_FROM", 1)
    monkeypatch.delenv(native_step.MODE_ENV, raising=False)


def _randomised(model, seed: int = 7):
    """Biases and norm weights at random (a tiny model is built with zero biases and unit norms, under which a
    wrong bias column or norm would not show)."""
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


def _decoder(family: str) -> LeanDecoder:
    target = _partial_rotary_phi3() if family == "phi3 partial rotary" else build_family(family, seed=3, init=0.2)
    return LeanDecoder(_randomised(target), bits=4, head_top=0)


def _eager(decoder, ids, cache):
    with torch.no_grad():
        return decoder.logits(ids, None, None, cache, 0, native=False)


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "phi3", "phi3 partial rotary"])
def test_native_step_gives_the_eager_steps_logits(family):
    decoder = _decoder(family)
    step = native_step.of(decoder)
    assert step is not None, native_step.path_of(decoder)
    if family == "phi3 partial rotary":
        assert decoder.blocks[0].rot < decoder.blocks[0].head_dim
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, decoder.vocab, (1, 300), generator=generator)
    native, eager = decoder.hfspec_new_cache(), decoder.hfspec_new_cache()
    _eager(decoder, ids[:, :6], native)
    _eager(decoder, ids[:, :6], eager)
    # one-token steps and feeds of 2..MAX_ROWS, across the cache's growth at 256 slots
    at, widths = 6, [1, 2, 1, 5, native_step.MAX_ROWS, 3, 1]
    while at < ids.shape[1]:
        width = min(widths[at % len(widths)], ids.shape[1] - at)
        with torch.no_grad():
            got = decoder.logits(ids[:, at:at + width], None, None, native)
        want = _eager(decoder, ids[:, at:at + width], eager)
        assert native.length == eager.length == at + width
        torch.testing.assert_close(got, want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)
        at += width
    torch.testing.assert_close(torch.stack(native.keys)[..., :at, :], torch.stack(eager.keys)[..., :at, :],
                               atol=1e-4, rtol=1e-4)


@needs_kernel
def test_a_rollback_and_a_replaced_weight_are_followed():
    decoder = _decoder("llama")
    ids = torch.tensor([[5, 9, 13, 40, 7, 22, 31, 8]])
    cache = decoder.hfspec_new_cache()
    with torch.no_grad():
        decoder.logits(ids[:, :6], None, None, cache)
        first = decoder.logits(ids[:, 6:7], None, None, cache)
        cache.crop(6)  # a rejected proposal: the same slot written again gives the same logits
        again = decoder.logits(ids[:, 6:7], None, None, cache)
    assert torch.equal(first, again)
    step = native_step.of(decoder)
    block = decoder.blocks[0]
    block.qkv.packed = block.qkv.packed.clone()  # weights replaced (a `.to()`, a reload): addresses re-read
    assert step.stale() and native_step.of(decoder) is not step


@needs_kernel
def test_greedy_text_through_the_native_step_is_the_targets():
    target = _randomised(build_family("llama", seed=5, init=0.2))
    draft = hfspec.make_draft(target, "rtn4")
    assert isinstance(draft, LeanDecoder) and describe(draft)["native"].startswith("native C step")
    ids = torch.tensor([[0, 5, 17, 33]])
    out = hfspec.generate(target, ids, draft, gamma=4, max_new_tokens=40, temperature=0)
    with torch.no_grad():
        want = target.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=2)
    assert torch.equal(out.sequences[:, :want.shape[1]], want[:, :out.sequences.shape[1]])
    assert out.stats.proposed > 0 and out.stats.accepted > 0


@needs_kernel
def test_a_seed_gives_the_same_text_through_the_native_step():
    target = _randomised(build_family("qwen2", seed=5, init=0.2))
    draft = hfspec.make_draft(target, "rtn4")
    ids = torch.tensor([[0, 5, 17, 33]])
    runs = [hfspec.generate(target, ids, draft, gamma=3, max_new_tokens=30, temperature=1.0, top_k=0, top_p=1.0,
                            seed=11).sequences for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("family, why", [("qwen3", "q/k or sandwich norms"), ("gemma2", "more than one rotary type")])
def test_layers_the_c_does_not_reproduce_are_refused_by_name(family, why):
    decoder = LeanDecoder(build_family(family, seed=3, init=0.2), bits=4, head_top=0)
    assert native_step.of(decoder) is None
    assert why in native_step.path_of(decoder)


def test_matrices_that_are_not_int4_are_refused():
    decoder = LeanDecoder(build_family("llama", seed=3, init=0.2), bits=8, group_size=32, head_top=0)
    assert native_step.of(decoder) is None
    assert "neither int4 nor the target" in native_step.path_of(decoder)


@needs_kernel
def test_a_step_that_fails_its_check_is_never_used(monkeypatch):
    """The negative control of the check: a tolerance nothing meets stands for a native step that disagrees."""
    monkeypatch.setattr(native_step, "TOLERANCE", -1.0)
    decoder = _decoder("llama")
    assert native_step.of(decoder) is None
    assert "disagrees with the eager lean step" in native_step.path_of(decoder)
    cache = decoder.hfspec_new_cache()
    with torch.no_grad():
        decoder.logits(torch.tensor([[5, 9, 13]]), None, None, cache)  # the other paths run
    assert cache.length == 3


def test_the_mode_is_honoured_and_a_bad_value_refused(monkeypatch):
    decoder = _decoder("llama")
    monkeypatch.setenv(native_step.MODE_ENV, "off")
    assert native_step.of(decoder) is None and "=off" in native_step.path_of(decoder)
    monkeypatch.setenv(native_step.MODE_ENV, "sometimes")
    with pytest.raises(HfspecError, match=native_step.MODE_ENV):
        native_step.of(decoder)


@needs_library
@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3 partial rotary"])
def test_the_lean_targets_passes_take_the_native_step_and_give_the_hf_logits(family, monkeypatch):
    """The lean target (the target's own fp32 weights, unfused, rotate-half rotary) through the C: its verify-sized
    passes give the HF forward's logits."""
    monkeypatch.setenv(lean_target.MODE_ENV, "on")
    target = _partial_rotary_phi3() if family == "phi3 partial rotary" else build_family(family, seed=3, init=0.2)
    target = _randomised(target)
    runner, path = lean_target.runner_for(target)
    assert runner is not None, path
    decoder = runner.model
    step = native_step.of(decoder)
    assert step is not None, native_step.path_of(decoder)
    assert step.takes(1) and step.takes(5) and not step.takes(native_step.TARGET_ROWS[1] + 1)  # a prompt: eager
    ids = torch.randint(3, 90, (1, 28), generator=torch.Generator().manual_seed(2))
    # native alone, then a prompt longer than TARGET_ROWS (the eager step writes its cache) followed by native
    # passes that read it: a cache layout other than the eager step's would attend to the prompt wrongly
    for feeds in (((0, 6), (6, 11), (11, 12), (12, 14)), ((0, 20), (20, 25), (25, 26), (26, 28))):
        cache = decoder.hfspec_new_cache()
        end = feeds[-1][1]
        with torch.no_grad():
            got = torch.cat([decoder.logits(ids[:, a:b], None, None, cache) for a, b in feeds], 1)
            want = target(ids[:, :end]).logits
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


@needs_kernel
def test_a_used_decoder_can_be_copied_and_is_not_kept_alive():
    import copy
    import gc
    import weakref

    decoder = _decoder("llama")
    assert native_step.of(decoder) is not None
    twin = copy.deepcopy(decoder)  # its native step is its own, built on first use, reading its own tensors
    step = native_step.of(twin)
    assert step is not None and step.decoder is twin and step is not native_step.of(decoder)
    gone = weakref.ref(decoder)
    del decoder
    gc.collect()
    assert gone() is None


def _tree_level_inputs(decoder, prompt: int, width: int, seed: int = 4):
    """A prompt fed eagerly, then a level of `width` nodes at explicit positions, each seeing the prompt, a random
    set of the nodes before it and itself (a token tree's shape)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (1, prompt + width), generator=generator)
    positions = prompt + torch.randint(0, 3, (width,), generator=generator)
    allowed = torch.zeros(width, prompt + width, dtype=torch.bool)
    allowed[:, :prompt] = True
    for i in range(width):
        allowed[i, prompt + i] = True
        allowed[i, prompt:prompt + i] = torch.rand(i, generator=generator) < 0.5
    return ids, positions, allowed


@needs_library
@pytest.mark.parametrize("which", ["draft", "lean target"])
def test_a_token_tree_level_through_the_native_step_gives_the_eager_levels_logits(which, monkeypatch):
    from hfspec.decoding.tree_forward import _lean_forward, forward_level
    from hfspec.kernels.lean import LeanRunner

    if which == "draft":
        if int4_rows.function() is None:
            pytest.skip(f"a draft's int4 matrices: {int4_rows.status()}")
        decoder = _decoder("qwen2")
    else:
        monkeypatch.setenv(lean_target.MODE_ENV, "on")
        decoder = lean_target.built(_randomised(build_family("llama", seed=3, init=0.2)))[0]
    assert native_step.of(decoder) is not None, native_step.path_of(decoder)
    prompt, width = 7, 6
    ids, positions, allowed = _tree_level_inputs(decoder, prompt, width)
    runner = LeanRunner(decoder)
    with torch.no_grad():
        decoder.logits(ids[:, :prompt], None, None, runner.cache, native=False)
        eager_cache = decoder.hfspec_new_cache()
        decoder.logits(ids[:, :prompt], None, None, eager_cache, native=False)
        got = forward_level(runner, ids[0, prompt:], positions, allowed, width)
        want = _lean_forward(decoder, eager_cache, ids[:, prompt:], positions[None], allowed)
    assert runner.cache.length == eager_cache.length == prompt + width
    torch.testing.assert_close(got, want, atol=1e-4 * want.abs().max().item(), rtol=1e-4)
    # the control: the same level with every node seeing every slot (a chain's mask) gives other logits
    with torch.no_grad():
        runner.cache.crop(prompt)
        wrong = forward_level(runner, ids[0, prompt:], positions, torch.ones_like(allowed), width)
    assert (wrong - want).abs().max() > 1e-2 * want.abs().max()
