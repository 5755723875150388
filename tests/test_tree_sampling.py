"""Tree verification maths on hand-made distributions: recursive rejection over siblings keeps the target's law.

The exact tests enumerate every chain token and every ordered sibling draw, with the implementation's own
acceptance chances (`sibling_chances`), and compare the law of the kept token with p to float precision. The
sampled tests run `draw_siblings` + `verify_tree` many times (chi-square); wrong rules must fail both.
"""

import itertools

import pytest
import torch
from scipy.stats import chisquare

import hfspec.decoding.sampling as sampling
from hfspec.decoding.sampling import draw_siblings, sibling_chances, verify_tree, verify_tree_greedy


def dist(*values):
    t = torch.tensor(values, dtype=torch.float64)
    return t / t.sum()


CASES = {
    "disjoint-ish": (dist(0.5, 0.3, 0.1, 0.1, 0.0), dist(0.05, 0.05, 0.3, 0.3, 0.3)),
    "close": (dist(0.3, 0.25, 0.2, 0.15, 0.1), dist(0.25, 0.3, 0.15, 0.2, 0.1)),
    "q-zeros (top-k)": (dist(0.2, 0.2, 0.2, 0.2, 0.2), dist(0.0, 0.5, 0.3, 0.2, 0.0)),
    "p-zeros": (dist(0.0, 0.6, 0.0, 0.4, 0.0), dist(0.3, 0.1, 0.3, 0.2, 0.1)),
    "equal": (dist(0.4, 0.3, 0.2, 0.1, 0.0), dist(0.4, 0.3, 0.2, 0.1, 0.0)),
}


def kept_law(p: torch.Tensor, q: torch.Tensor, m: int) -> torch.Tensor:
    """Exact law of the kept token at one position: x ~ q, accepted with min(1, p/q); otherwise m siblings
    drawn from q without replacement after x, tried by `sibling_chances`, then its residual."""
    vocab = p.shape[0]
    law = torch.zeros(vocab, dtype=torch.float64)
    support = [t for t in range(vocab) if q[t] > 0]
    for x in support:
        a0 = min(1.0, float(p[x] / q[x]))
        law[x] += q[x] * a0
        others = [t for t in support if t != x]
        for seq in itertools.permutations(others, min(m, len(others))):
            prob, left = 1.0, 1.0 - float(q[x])
            for y in seq:
                prob *= float(q[y]) / left
                left -= float(q[y])
            chances, rest = sibling_chances(p, q, x, torch.tensor(seq, dtype=torch.long))
            reach = float(q[x]) * (1 - a0) * prob
            for y, chance in zip(seq, chances, strict=True):
                law[y] += reach * chance
                reach *= 1 - chance
            law += reach * rest
    return law


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_recursive_rejection_keeps_the_target_law_exactly(case, m):
    p, q = CASES[case]
    assert torch.allclose(kept_law(p, q, m), p, atol=1e-12)


def test_negative_control_siblings_tested_against_q_with_the_rejected_token_still_in_it(monkeypatch):
    monkeypatch.setattr(sampling, "without", lambda q, token: q)
    bad = [float((kept_law(p, q, 2) - p).abs().max()) for p, q in CASES.values()]
    assert max(bad) > 0.02


def candidate_kept(p: torch.Tensor, q: torch.Tensor, m: int) -> float:
    """Exact probability that the kept token is one of the draft's candidates (chain token or a sibling)."""
    total = 0.0
    support = [t for t in range(p.shape[0]) if q[t] > 0]
    for x in support:
        a0 = min(1.0, float(p[x] / q[x]))
        others = [t for t in support if t != x]
        for seq in itertools.permutations(others, min(m, len(others))):
            prob, left = 1.0, 1.0 - float(q[x])
            for y in seq:
                prob, left = prob * float(q[y]) / left, left - float(q[y])
            chances, _ = sibling_chances(p, q, x, torch.tensor(seq, dtype=torch.long))
            none = 1.0
            for chance in chances:
                none *= 1 - chance
            total += float(q[x]) * prob * (a0 + (1 - a0) * (1 - none))
    return total


def test_siblings_raise_the_chance_a_draft_candidate_is_kept():
    p, q = CASES["disjoint-ish"]
    chances = [candidate_kept(p, q, m) for m in range(4)]
    assert chances == sorted(chances) and chances[2] > chances[0] + 0.1


def test_draw_siblings_is_a_draw_without_replacement():
    q = dist(0.4, 0.3, 0.2, 0.1, 0.0)
    gen = torch.Generator().manual_seed(3)
    counts: dict[tuple, int] = {}
    runs = 20_000
    for _ in range(runs):
        s = tuple(draw_siblings(q, torch.tensor(0), 2, gen).tolist())
        counts[s] = counts.get(s, 0) + 1
    cells = list(itertools.permutations([1, 2, 3], 2))
    assert set(counts) <= set(cells), "never the excluded token, never a zero-mass token, never a repeat"
    expected = [runs * float(q[a] / 0.6 * q[b] / (0.6 - q[a])) for a, b in cells]
    assert chisquare([counts.get(c, 0) for c in cells], expected).pvalue > 1e-3
    assert draw_siblings(q, torch.tensor(0), 8, gen).numel() == 3, "fewer when q has fewer other tokens"


def _kept_tokens(p, q, m, runs, seed):
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(runs, dtype=torch.long)
    p2 = torch.stack([p.float(), p.float()])  # γ = 1: the chain position, then the bonus position (unused)
    for k in range(runs):
        x = sampling.sample(q[None].float(), gen)
        sibs = sampling.draw_siblings(q.float(), x[0], m, gen)
        n, i, token = verify_tree(p2, q[None].float(), x, [sibs], gen)
        out[k] = x[0] if n == 1 else (sibs[i] if i >= 0 else token)
    return out


def _with_replacement(q, first, m, generator=None):
    """A wrong sibling draw for the negative control: independent draws (repeats allowed) from q without `first`."""
    rest = q.clone()
    rest[first] = 0
    return torch.multinomial(rest / rest.sum(), m, replacement=True, generator=generator)


def test_verify_tree_samples_match_p():
    p, q = CASES["disjoint-ish"]
    tokens = _kept_tokens(p, q, 2, 8000, seed=1)
    counts = torch.bincount(tokens, minlength=5)
    assert counts[4] == 0, "a token the target gives no mass is never kept"
    assert chisquare(counts[:4].tolist(), (8000 * p[:4]).tolist()).pvalue > 1e-3


def test_negative_control_siblings_with_replacement_fail(monkeypatch):
    monkeypatch.setattr(sampling, "draw_siblings", _with_replacement)
    p, q = CASES["disjoint-ish"]
    counts = torch.bincount(_kept_tokens(p, q, 3, 8000, seed=1), minlength=5)
    assert chisquare(counts[:4].tolist(), (8000 * p[:4]).tolist()).pvalue < 1e-6


def test_verify_tree_cases():
    p = dist(0.0, 1.0, 0.0)[None].repeat(3, 1).float()
    q = dist(0.6, 0.4, 0.0)[None].repeat(2, 1).float()
    # chain token 0 is impossible under p: rejected at position 0; the sibling 1 then carries all of p's
    # residual and all of q's remaining mass: always taken
    n, i, token = verify_tree(p, q, torch.tensor([0, 0]), [torch.tensor([1]), torch.tensor([], dtype=torch.long)])
    assert (n, i, token) == (0, 0, None)
    # no siblings there: the replacement comes from the residual
    n, i, token = verify_tree(p, q, torch.tensor([0, 0]), [torch.tensor([], dtype=torch.long)] * 2)
    assert (n, i, token) == (0, -1, 1)


def test_verify_tree_greedy():
    target = torch.tensor([4, 7, 9, 2])
    none = torch.tensor([], dtype=torch.long)
    assert verify_tree_greedy(target, torch.tensor([4, 7, 9]), [none] * 3) == (3, -1, 2)
    assert verify_tree_greedy(target, torch.tensor([4, 6, 9]), [none, torch.tensor([5, 7]), none]) == (1, 1, None)
    assert verify_tree_greedy(target, torch.tensor([4, 6, 9]), [none, torch.tensor([5, 8]), none]) == (1, -1, 7)
