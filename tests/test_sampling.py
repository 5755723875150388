"""The accept/reject rule on hand-made distributions: exact tokens and counts."""

import torch

from hfspec.decoding.sampling import count_accepted, residual, verify, warp

NEG = -float("inf")


def dist(*rows):
    """Rows of logits (±10, −inf) -> probabilities."""
    return torch.tensor(rows, dtype=torch.float32).softmax(-1)


def test_all_accepted_then_bonus_from_last_target_position():
    # V = 3, γ = 2; draft proposes 0 then 1; the target agrees and its 3rd distribution is all on token 2.
    p = dist([10, NEG, NEG], [NEG, 10, NEG], [NEG, NEG, 10])[None]
    q = dist([10, NEG, NEG], [NEG, 10, NEG])[None]
    n, token = verify(p, q, torch.tensor([[0, 1]]))
    assert n.tolist() == [2] and token.tolist() == [2]


def test_rejection_where_target_gives_zero_and_replacement_from_residual():
    # Target puts no mass on the drafted token 1 at position 2: it is always rejected; residual -> token 2.
    p = dist([10, NEG, NEG], [NEG, NEG, 10], [10, NEG, NEG])[None]
    q = dist([10, NEG, NEG], [NEG, 10, NEG])[None]
    for seed in range(20):
        n, token = verify(p, q, torch.tensor([[0, 1]]), torch.Generator().manual_seed(seed))
        assert n.tolist() == [1] and token.tolist() == [2]


def test_first_rejection_discards_the_rest_unchecked():
    kept = torch.tensor([[True, False, True, True], [True, True, True, True], [False, True, True, True]])
    assert count_accepted(kept).tolist() == [1, 4, 0]


def test_acceptance_probability_is_min_one_p_over_q():
    # p(x) = 0.25, q(x) = 1 on the drafted token: kept with probability 0.25 exactly.
    p = torch.tensor([[[0.25, 0.75], [0.5, 0.5]]]).expand(40000, 2, 2)
    q = torch.tensor([[[1.0, 0.0]]]).expand(40000, 1, 2)
    n, token = verify(p, q, torch.zeros(40000, 1, dtype=torch.long), torch.Generator().manual_seed(0))
    rate = n.float().mean().item()
    assert abs(rate - 0.25) < 0.01
    assert (token[n == 0] == 1).all()  # residual max(0, p - q) = [0, 0.75]: only token 1


def test_residual_clamps_and_normalises():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.1, 0.6, 0.3]])
    assert torch.allclose(residual(p, q), torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.allclose(residual(p, p), p)  # no mass left: falls back to p


def test_greedy_is_one_hot_and_accepts_only_the_argmax():
    p = torch.nn.functional.one_hot(torch.tensor([[2, 0]]), 3).float()
    q = torch.nn.functional.one_hot(torch.tensor([[2]]), 3).float()
    n, token = verify(p, q, torch.tensor([[2]]))
    assert n.tolist() == [1] and token.tolist() == [0]
    q_wrong = torch.nn.functional.one_hot(torch.tensor([[1]]), 3).float()
    n, token = verify(p, q_wrong, torch.tensor([[1]]))
    assert n.tolist() == [0] and token.tolist() == [2]


def test_warp_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    hf = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.8)])
    expected = hf(torch.zeros(4, 1, dtype=torch.long), logits.clone()).softmax(-1)
    assert torch.allclose(warp(logits, 0.7, 10, 0.8), expected, atol=1e-6)


def test_sample_matches_the_distribution_and_never_draws_zero_mass():
    from scipy.stats import chisquare

    from hfspec.decoding.sampling import sample

    probs = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3, 0.0]]).expand(60000, 6)
    tokens = sample(probs, torch.Generator().manual_seed(1))
    counts = torch.bincount(tokens, minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert chisquare(counts[[1, 3, 4]].numpy(), (probs[0, [1, 3, 4]] * 60000).numpy()).pvalue > 1e-3
    edge = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert sample(edge.expand(1000, 4)).eq(2).all()
