"""Exact laws and goodness of fit for the statistical tests, and the deliberately wrong rules that serve as
their negative controls (a test of exactness must fail when the accept/reject rule is broken)."""

from __future__ import annotations

import itertools

import torch
from scipy.stats import chisquare

from hfspec.decoding.sampling import warp

EOS = 1  # the tiny models' EOS id, masked as `min_new_tokens` does

# name -> (function of hfspec.decoding.sampling to replace, its wrong replacement)
WRONG_RULES = {
    "always-accept": ("accept_draft", lambda p_x, q_x, r: torch.ones_like(p_x, dtype=torch.bool)),
    "residual-without-subtraction": ("residual", lambda p, q: p),
}


def exact_law(target, prompt: list[int], vocab: int, new: int, **warp_kwargs) -> dict[tuple, float]:
    """P(t1, ..., t_new | prompt) under the target with the given warping (default: temperature 1) over the
    first `vocab` ids; EOS is masked."""
    law = {(): 1.0}
    for _ in range(new):
        prefixes = list(law)
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        with torch.no_grad():
            logits = target(ids).logits[:, -1]
        logits[:, EOS] = -float("inf")
        probs = warp(logits, **(warp_kwargs or {"temperature": 1.0}))
        law = {p + (t,): law[p] * probs[i, t].item() for i, p in enumerate(prefixes) for t in range(vocab)}
    return law


def p_value(samples: torch.Tensor, law: dict[tuple, float], vocab: int, new: int) -> float:
    """Chi-square goodness of fit over the vocab**new cells; cells expecting fewer than 5 counts are pooled,
    together with any outcome outside the law (which the target can never produce)."""
    counts: dict[tuple, int] = {}
    for row in map(tuple, samples.tolist()):
        counts[row] = counts.get(row, 0) + 1
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for cell in itertools.product(range(vocab), repeat=new):
        e, o = law.get(cell, 0.0) * len(samples), counts.get(cell, 0)
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            observed.append(o)
            expected.append(e)
    observed.append(pool_o + sum(c for cell, c in counts.items() if cell not in law))
    expected.append(pool_e)
    if expected[-1] == 0:
        if observed[-1]:
            return 0.0
        observed, expected = observed[:-1], expected[:-1]
    scale = sum(observed) / sum(expected)  # float rounding of the law's total
    return chisquare(observed, [e * scale for e in expected]).pvalue
