"""Batches: each row decodes exactly as it would alone, with its own acceptance and its own stop."""

import pytest
import torch
from tiny_models import build, perturbed

import hfspec

PROMPTS = [[0, 5, 17, 33, 9, 4], [0, 7], [0, 12, 40, 3], [0, 88, 21, 5, 61]]


def padded(prompts, pad=2):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2"])
def pair(request):
    target = build(request.param, init=0.2)
    return target, perturbed(target, scale=0.5)


def test_rows_equal_plain_batched_greedy(pair):
    target, draft = pair
    ids, mask = padded(PROMPTS)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60, min_new_tokens=60,
                               pad_token_id=2)
    out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=4, temperature=0,
                          max_new_tokens=60, min_new_tokens=60, pad_token_id=2)
    assert torch.equal(out.sequences, expected)
    s = out.stats
    assert s.new_tokens_per_row == [60] * 4
    assert len(set(s.accepted_per_row)) > 1, "rows should accept different numbers of tokens"
    assert s.target_passes < 60


def test_rows_equal_their_unbatched_greedy(pair):
    """Padding itself can change plain HF's output in low precision; in fp32 here it does not."""
    target, draft = pair
    ids, mask = padded(PROMPTS)
    out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=3, temperature=0,
                          max_new_tokens=40, min_new_tokens=40, pad_token_id=2)
    width = ids.shape[1]
    for row, prompt in enumerate(PROMPTS):
        alone = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=40, min_new_tokens=40)
        assert out.sequences[row, width:].tolist() == alone[0, len(prompt):].tolist()


def test_row_hitting_eos_early_finishes_alone(pair):
    target, draft = pair
    ids, mask = padded(PROMPTS)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=50, min_new_tokens=50,
                           pad_token_id=2)
    width = ids.shape[1]
    eos = free[1, width + 5].item()  # row 1 emits it at step 6 (or earlier)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=50, eos_token_id=eos,
                               pad_token_id=2)
    out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=4, temperature=0,
                          max_new_tokens=50, eos_token_id=eos, pad_token_id=2)
    n = min(out.sequences.shape[1], expected.shape[1])
    assert torch.equal(out.sequences[:, :n], expected[:, :n])
    assert (out.sequences[:, n:] == 2).all() and (expected[:, n:] == 2).all()
    lengths = out.stats.new_tokens_per_row
    assert lengths[1] <= 6 and max(lengths) > lengths[1]


def test_batch_of_one_matches_unbatched_call(pair):
    target, draft = pair
    ids, mask = padded(PROMPTS[:1])
    a = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=4, temperature=1.0, max_new_tokens=30,
                        seed=4)
    b = hfspec.generate(target, ids, draft=draft, gamma=4, temperature=1.0, max_new_tokens=30, seed=4)
    assert torch.equal(a.sequences, b.sequences)


def test_custom_generate_path_batched(pair):
    target, draft = pair
    ids, mask = padded(PROMPTS)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, min_new_tokens=20,
                               pad_token_id=2)
    got = target.generate(ids, attention_mask=mask, custom_generate=hfspec.speculative_generate,
                          draft_model=draft, gamma=5, do_sample=False, max_new_tokens=20, min_new_tokens=20,
                          pad_token_id=2)
    assert torch.equal(got, expected)


def test_plain_baseline_on_a_padded_batch_equals_generate(pair):
    target, _ = pair
    ids, mask = padded(PROMPTS)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=15, min_new_tokens=15,
                               pad_token_id=2)
    out = hfspec.plain_generate(target, ids, attention_mask=mask, temperature=0, max_new_tokens=15,
                                min_new_tokens=15, pad_token_id=2)
    assert torch.equal(out.sequences, expected)
    assert out.stats.target_passes == 15 and set(out.token_kinds[0]) == {"target"}
