"""The output is distributed exactly as the target's own samples (chi-square), per row of a batch.

A tiny-vocabulary target and an unrelated draft; 20,000 seeded runs as rows of one batch. The joint law of
the first three generated tokens is compared with the target's exact law, computed independently with
`hfspec.decoding.sampling.warp`. Deliberately wrong rules must fail the same test (negative controls). The pair also
runs in bfloat16 (a subset of the settings, to keep the suite short): there the target's law is computed from
its bfloat16 logits, which differ from the speculative run's by rounding (~1e-2 of a logit), far below what
20,000 samples resolve.
"""

import laws
import pytest
import torch
from laws import WRONG_RULES
from tiny_models import build

import hfspec
import hfspec.decoding.sampling as sampling

pytestmark = pytest.mark.slow  # 20,000-row batches per law: the fast loop (-m "not slow") skips them

V = 8
NEW = 3
ROWS = 20_000


def make_pair(dtype=torch.float32):
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16).to(dtype)
    draft = build("llama", vocab=V, layers=1, seed=5, init=0.6, hidden=16).to(dtype)
    return target, draft


@pytest.fixture(scope="module")
def pair():
    return make_pair()


@pytest.fixture(scope="module")
def pair_bf16():
    return make_pair(torch.bfloat16)


def exact_law(target, prompt: list[int], **warp_kwargs) -> dict[tuple, float]:
    return laws.exact_law(target, prompt, V, NEW, **warp_kwargs)


def p_value(samples: torch.Tensor, law: dict[tuple, float]) -> float:
    return laws.p_value(samples, law, V, NEW)


def run(target, draft, prompts, gamma, seed, **sampling_kwargs):
    """Rows alternate between `prompts` (left-padded to one width); returns new tokens per prompt."""
    width = max(map(len, prompts))
    rows = [prompts[i % len(prompts)] for i in range(ROWS)]
    ids = torch.tensor([[2] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    out = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=gamma, max_new_tokens=NEW,
                          min_new_tokens=NEW, seed=seed, pad_token_id=2, **sampling_kwargs)
    new = out.sequences[:, width:]
    assert not (new == 1).any(), "min_new_tokens masks EOS for every row, whatever its progress in the batch"
    return [new[i :: len(prompts)] for i in range(len(prompts))], out.stats


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.0, top_k=5),
    dict(temperature=0.9, top_p=0.8),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("prompt", [[0, 3], [0, 3, 5]])
def test_matches_target_law(pair, settings, prompt):
    target, draft = pair
    (samples,), stats = run(target, draft, [prompt], gamma=4, seed=11, **settings)
    assert 0.05 < stats.alpha < 0.95, "the draft must be different enough for rejections and acceptances"
    assert p_value(samples, exact_law(target, prompt, **settings)) > 1e-3


@pytest.mark.parametrize("settings", [SETTINGS[0], SETTINGS[3]], ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_bf16_matches_target_law(pair_bf16, settings):
    target, draft = pair_bf16
    prompt = [0, 3, 5]
    (samples,), stats = run(target, draft, [prompt], gamma=4, seed=11, **settings)
    assert 0.05 < stats.alpha < 0.95
    assert p_value(samples, exact_law(target, prompt, **settings)) > 1e-3


def test_each_row_of_a_ragged_batch_matches_its_own_law(pair):
    target, draft = pair
    prompts = [[0, 3], [0, 6, 1, 4, 7]]
    groups, stats = run(target, draft, prompts, gamma=3, seed=5, temperature=1.0)
    assert len(set(stats.accepted_length_hist)) > 1
    for prompt, samples in zip(prompts, groups, strict=True):
        assert p_value(samples, exact_law(target, prompt, temperature=1.0)) > 1e-3


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("rule", list(WRONG_RULES))
def test_negative_control_wrong_rule_fails(pair, pair_bf16, monkeypatch, rule, dtype):
    target, draft = pair if dtype == "fp32" else pair_bf16
    name, wrong = WRONG_RULES[rule]
    monkeypatch.setattr(sampling, name, wrong)
    prompts = [[0, 3], [0, 6, 1, 4, 7]]
    groups, _ = run(target, draft, prompts, gamma=3, seed=5, temperature=1.0)
    assert all(p_value(s, exact_law(target, p, temperature=1.0)) < 1e-6 for p, s in zip(prompts, groups, strict=True))
