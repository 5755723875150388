"""γ = "auto": chosen from live α and c before each round, so exactness is untouched."""

import pytest
import torch
from test_distribution import exact_law, p_value, run
from test_distribution import pair as distribution_pair  # noqa: F401  (fixture)
from tiny_models import build, perturbed

import hfspec
from hfspec.gamma import AdaptiveGamma


def test_greedy_identity_with_auto_gamma():
    target = build("qwen2", init=0.2)
    draft = perturbed(target, scale=0.5)
    ids = torch.tensor([[0, 5, 17, 33]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=120, min_new_tokens=120)
    out = hfspec.generate(target, ids, draft=draft, gamma="auto", temperature=0, max_new_tokens=120,
                          min_new_tokens=120)
    assert torch.equal(out.sequences, expected)
    assert out.stats.gamma == "auto"
    assert len(out.stats.gamma_per_round) == out.stats.target_passes
    assert len(set(out.stats.gamma_per_round)) > 1, "γ should move with the live estimates"


@pytest.mark.slow
def test_distribution_with_auto_gamma(distribution_pair):  # noqa: F811
    target, draft = distribution_pair
    prompt = [0, 3, 5]
    (samples,), stats = run(target, draft, [prompt], gamma="auto", seed=21, temperature=1.0)
    assert p_value(samples, exact_law(target, prompt, temperature=1.0)) > 1e-3


def feed(policy, alpha_true, c, rounds=60, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        g = policy.next()
        kept = (torch.rand(g, generator=gen) < alpha_true).long().cumprod(0)
        n = int(kept.sum())
        policy.update(g, n, min(n + 1, g), c * 1.0, 1.0)
    return policy


@pytest.mark.parametrize("alpha, c, lo, hi", [(0.9, 0.05, 6, 16), (0.6, 0.3, 1, 2), (0.7, 0.15, 2, 5)])
def test_policy_converges_to_the_formula_optimum(alpha, c, lo, hi):
    policy = feed(AdaptiveGamma(gamma_max=16, c_prior=c), alpha, c)
    assert abs(policy.alpha - alpha) < 0.2
    assert lo <= policy.next() <= hi
    assert hfspec.optimal_gamma(alpha, c) in range(lo, hi + 1)


def test_optimal_gamma_is_the_argmax_of_the_formula():
    for alpha in (0.2, 0.5, 0.8, 0.95):
        for c in (0.01, 0.1, 0.5):
            best = hfspec.optimal_gamma(alpha, c, 16)
            values = [hfspec.estimated_speedup(alpha, g, c) for g in range(1, 17)]
            assert values[best - 1] == max(values)


def test_policy_falls_back_to_plain_decoding_when_drafting_cannot_pay():
    policy = feed(AdaptiveGamma(gamma_max=16, c_prior=2.0), alpha_true=0.9, c=2.0, rounds=40)
    chosen = []
    for _ in range(32):
        g = policy.next()
        chosen.append(g)
        policy.update(g, g, g, 2.0, 1.0)
    assert chosen.count(0) >= 24 and 1 in chosen, "mostly plain rounds, with periodic γ = 1 probes"


def test_auto_with_a_costly_draft_is_still_exact_and_labels_plain_tokens():
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.5)
    ids = torch.tensor([[0, 5, 17, 33]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=60, min_new_tokens=60)
    out = hfspec.generate(target, ids, draft=draft, gamma="auto", temperature=0, max_new_tokens=60,
                          min_new_tokens=60)
    assert torch.equal(out.sequences, expected)
    rounds = out.stats.gamma_per_round
    if 0 in rounds:
        assert "target" in out.token_kinds[0]


def test_first_clean_measurement_replaces_the_prior():
    """A lean draft's bytes ratio can be far from its time ratio: the prior must not linger."""
    policy = AdaptiveGamma(c_prior=0.95)
    policy.update(4, 4, 4, 0.5, 1.0)  # round 1 includes the prompt: not a clean measurement
    assert policy.c == 0.95
    policy.update(4, 4, 4, 0.2, 1.0)
    assert policy.c == pytest.approx(0.2)
    assert policy.next() >= 2  # with α high and c = 0.2, speculation pays
