"""Speculative sampling maths: pure functions on tensors.

Notation follows Leviathan et al. (ICML 2023), Algorithm 1: the draft proposes γ tokens x_1..x_γ from its
distributions q; the target's distributions p at the γ + 1 positions decide. x_i is kept with probability
min(1, p(x_i) / q(x_i)); at the first rejection a replacement is drawn from norm(max(0, p − q)); if all γ are
kept a bonus token is drawn from p at position γ + 1. All tensors carry a leading batch dimension B.
"""

from __future__ import annotations

import torch


def one_hot_argmax(scores: torch.Tensor) -> torch.Tensor:
    """Greedy decoding as a distribution: all mass on the argmax (first index on ties, like torch.argmax)."""
    out = torch.zeros_like(scores, dtype=torch.float32)
    return out.scatter_(-1, scores.argmax(-1, keepdim=True), 1.0)


def scores_to_probs(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """Processed logits -> the distribution a token is drawn from (softmax, or one-hot argmax when greedy)."""
    if not do_sample:
        return one_hot_argmax(scores)
    return torch.softmax(scores.float(), dim=-1)


def warp(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """Reference warper (temperature, then top-k, top-p, min-p) returning probabilities.

    Matches the order transformers applies its warpers in; temperature 0 means greedy (one-hot).
    """
    if temperature == 0:
        return one_hot_argmax(logits)
    scores = logits.float() / temperature
    if top_k:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1 - top_p
        drop_sorted[..., -1:] = False
        scores = scores.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -float("inf"))
    if min_p is not None:
        probs = scores.softmax(-1)
        floor = min_p * probs.max(-1, keepdim=True).values
        scores = scores.masked_fill(probs < floor, -float("inf"))
    return scores.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of a [B, V] distribution (unnormalised is fine), by inverting the CDF.

    Exact like `torch.multinomial`, several times faster on large vocabularies. A token with zero mass can
    never be drawn: u lies in [cdf[i-1], cdf[i]) only when cdf[i] > cdf[i-1].
    """
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64) * cdf[:, -1:]
    token = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return token.clamp_max(probs.shape[-1] - 1)


def accept_draft(p_x: torch.Tensor, q_x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Keep x when r < p(x) / q(x), with r ~ U[0, 1): i.e. with probability min(1, p(x)/q(x))."""
    return r * q_x < p_x


def count_accepted(kept: torch.Tensor) -> torch.Tensor:
    """Length of the accepted prefix per row: tokens after the first rejection are discarded unchecked."""
    return kept.long().cumprod(dim=-1).sum(dim=-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)); falls back to p where p == q leaves no mass (rejection then has probability 0)."""
    diff = (p - q).clamp_min(0)
    total = diff.sum(-1, keepdim=True)
    return torch.where(total > 0, diff / total.clamp_min(torch.finfo(diff.dtype).tiny), p)


def verify(
    p: torch.Tensor,
    q: torch.Tensor,
    x: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One speculative round's decision.

    p: [B, γ+1, V] target, q: [B, γ, V] draft, x: [B, γ] draft tokens.
    Returns (n, token): n [B] accepted draft tokens, token [B] the replacement (n < γ) or the bonus (n == γ).
    """
    batch, gamma = x.shape
    rows = torch.arange(batch, device=p.device)
    if gamma:
        p_x = p[:, :gamma].gather(-1, x.unsqueeze(-1)).squeeze(-1)
        q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1)
        r = torch.rand(batch, gamma, generator=generator, device=p.device)
        n = count_accepted(accept_draft(p_x, q_x, r))
    else:
        n = torch.zeros(batch, dtype=torch.long, device=p.device)
    q_padded = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)  # q at position γ+1 is 0: residual = p
    token = sample(residual(p[rows, n], q_padded[rows, n]), generator)
    return n, token


def verify_greedy(target_tokens: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` at temperature 0, where p and q are one-hot: keep draft tokens while they equal the target's
    argmax, then take the target's token. target_tokens [B, γ+1] (argmax of p), x [B, γ]. Same result as
    `verify` on one-hot distributions, without touching the vocabulary."""
    gamma = x.shape[1]
    n = count_accepted(x == target_tokens[:, :gamma]) if gamma else x.new_zeros(x.shape[0])
    token = target_tokens.gather(1, n.unsqueeze(1)).squeeze(1)
    return n, token
