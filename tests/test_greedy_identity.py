"""Temperature 0: hfspec's text is the target's greedy text, token for token, with real rejections."""

import pytest
import torch
from tiny_models import build, perturbed

import hfspec

ARCHS = ["gpt2", "llama", "qwen2", "gpt_neox", "opt"]


IDS = torch.tensor([[0, 5, 17, 33, 9]])


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    target = build(request.param, init=0.2)
    return target, perturbed(target, scale=0.5)


@pytest.fixture(scope="module")
def expected(pair):
    """The target's own greedy text (transformers' generate), computed once per architecture."""
    return pair[0].generate(IDS, do_sample=False, max_new_tokens=200, min_new_tokens=200)


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_identity(pair, expected, gamma):
    target, draft = pair
    ids = IDS
    out = hfspec.generate(target, ids, draft=draft, gamma=gamma, temperature=0, max_new_tokens=200,
                          min_new_tokens=200)
    assert out.sequences.shape == expected.shape
    assert torch.equal(out.sequences, expected)
    stats = out.stats
    assert stats.new_tokens == 200
    assert 0 < stats.accepted < stats.checked, "the draft must disagree sometimes for this test to mean anything"
    assert stats.target_passes < 200


def test_hf_custom_generate_path(pair):
    target, draft = pair
    ids = torch.tensor([[0, 5, 17]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=40, min_new_tokens=40)
    got = target.generate(ids, custom_generate=hfspec.speculative_generate, draft_model=draft, gamma=4,
                          do_sample=False, max_new_tokens=40, min_new_tokens=40)
    assert torch.equal(got, expected)
    out = target.generate(ids, custom_generate=hfspec.speculative_generate, draft_model=draft, gamma=4,
                          do_sample=False, max_new_tokens=40, min_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected) and out.stats.target_passes > 0
