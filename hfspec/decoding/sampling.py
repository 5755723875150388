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


def first_argmax(scores: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """`scores.argmax(-1)` (the first index among equal maxima; NaN counts as the maximum), several times
    faster on large vocabularies on the CPU: vectorised block maxima find the first block holding the maximum,
    and torch.argmax (not vectorised on the CPU) runs only inside that block."""
    *lead, vocab = scores.shape
    if vocab < 4 * block or scores.numel() == 0 or scores.device.type != "cpu":
        return scores.argmax(-1)
    flat = scores.reshape(-1, vocab)
    full = vocab // block * block
    maxima = flat[:, :full].reshape(flat.shape[0], -1, block).amax(-1)
    if full < vocab:
        maxima = torch.cat([maxima, flat[:, full:].amax(-1, keepdim=True)], dim=1)
    top = maxima.amax(-1, keepdim=True)
    if bool(top.isnan().any()):  # amax propagates NaN: leave NaN rows to torch.argmax's own rule
        return scores.argmax(-1)
    first = (maxima == top).to(torch.uint8).argmax(-1, keepdim=True)  # the first block holding the maximum
    columns = (first * block + torch.arange(block, device=scores.device)).clamp_max(vocab - 1)
    inner = flat.gather(1, columns).argmax(-1, keepdim=True)  # clamped repeats come last: never chosen first
    return (first * block + inner).view(lead)


def kth_largest(scores: torch.Tensor, k: int, block: int = 256) -> torch.Tensor:
    """[R, 1]: the k-th largest value of each row of [R, V] scores, `torch.topk(scores, k).values[:, -1:]`, ties
    counted. Faster on large vocabularies: only the k blocks with the largest maxima can hold it (every other
    value is ≤ the k-th largest block maximum ≤ the answer), so topk runs over k · block values, not V."""
    rows, vocab = scores.shape
    full = vocab // block * block
    if vocab < 2 * k * block or scores.device.type != "cpu":  # (GPU topk is a parallel select already)
        return torch.topk(scores, k).values[:, -1:]
    maxima = scores[:, :full].reshape(rows, -1, block).amax(-1)
    if full < vocab:
        maxima = torch.cat([maxima, scores[:, full:].amax(-1, keepdim=True)], dim=1)
    if bool(maxima.isnan().any()):  # leave NaN rows to torch.topk's own rule
        return torch.topk(scores, k).values[:, -1:]
    chosen = torch.topk(maxima, k, sorted=False).indices  # [R, k] blocks
    columns = (chosen[..., None] * block + torch.arange(block, device=scores.device)).reshape(rows, -1)
    values = scores.gather(1, columns.clamp_max(vocab - 1)).masked_fill_(columns >= vocab, -float("inf"))
    return torch.topk(values, k).values[:, -1:]


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


SAMPLE_BLOCK = 1024  # tokens per block of `sample`'s two-level search
SINGLE_LEVEL_UP_TO = 1 << 15  # vocabularies up to this size take one float64 CDF (fewer ops than two levels)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, block: int = SAMPLE_BLOCK,
           single_up_to: int = SINGLE_LEVEL_UP_TO) -> torch.Tensor:
    """One token per row of a [B, V] distribution (unnormalised is fine), by inverting the CDF in float64.

    Above `single_up_to` tokens in two levels, so no [B, V] float64 copy is made (at V = 262k that copy and its
    cumsum cost ~10× the rest): float64 sums of blocks of `block` tokens locate u's block, a float64 cumsum
    inside that block its token. Exact like `torch.multinomial` (to float64 rounding), and much faster on large
    vocabularies. A token with zero mass is never drawn: u lies in [cdf[i-1], cdf[i]) only when cdf[i] > cdf[i-1].
    """
    batch, vocab = probs.shape
    if vocab <= single_up_to:
        cdf = probs.double().cumsum(-1)
        total = cdf[:, -1:]
        u = torch.rand(batch, 1, generator=generator, device=probs.device, dtype=torch.float64) * total
        u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # rand · total may round up to total
        return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(vocab - 1)
    block = max(1, min(block, vocab))
    full = vocab // block * block
    sums = probs[:, :full].reshape(batch, -1, block).sum(-1, dtype=torch.float64)  # [B, blocks]
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True, dtype=torch.float64)], dim=1)
    cdf = sums.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(batch, 1, generator=generator, device=probs.device, dtype=torch.float64) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # rand · total may round up to total
    b = torch.searchsorted(cdf, u, right=True).clamp_max(sums.shape[1] - 1)  # [B, 1]: u's block
    before = torch.cat([cdf.new_zeros(batch, 1), cdf[:, :-1]], dim=1).gather(1, b)  # cdf[b-1] ≤ u < cdf[b]
    columns = b * block + torch.arange(block, device=probs.device)
    inside = columns < vocab
    mass = probs.gather(1, columns.clamp_max(vocab - 1)).double().where(inside, 0.0)  # [B, block]
    offset = torch.searchsorted(mass.cumsum(-1), u - before, right=True)
    # Rounding can leave u − before at or past the block's own total: take the block's last token with mass.
    last = torch.where(mass > 0, torch.arange(block, device=probs.device), -1).amax(-1, keepdim=True)
    offset = torch.where(offset < block, offset, last).clamp_min(0)
    return (b * block + offset).squeeze(-1).clamp_max(vocab - 1)


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
    q: torch.Tensor | None,
    x: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One speculative round's decision.

    p: [B, γ+1, V] target, q: [B, γ, V] draft (None: the draft proposed deterministically, q one-hot on x),
    x: [B, γ] draft tokens. Returns (n, token): n [B] accepted draft tokens, token [B] the replacement (n < γ)
    or the bonus (n == γ). Only the one position per row that needs it is read over the vocabulary.
    """
    batch, gamma = x.shape
    rows = torch.arange(batch, device=p.device)
    if gamma:
        p_x = p[:, :gamma].gather(-1, x.unsqueeze(-1)).squeeze(-1)
        q_x = q.gather(-1, x.unsqueeze(-1)).squeeze(-1) if q is not None else torch.ones_like(p_x)
        r = torch.rand(batch, gamma, generator=generator, device=p.device)
        n = count_accepted(accept_draft(p_x, q_x, r))
    else:
        n = torch.zeros(batch, dtype=torch.long, device=p.device)
    p_n = p[rows, n]
    token = sample(residual(p_n, _draft_at(q, x, n, p_n)), generator)
    return n, token


def _draft_at(q: torch.Tensor | None, x: torch.Tensor, n: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B, V] draft distribution at each row's position n: q[row, n] (one-hot on x[row, n] when q is None),
    zeros where n == γ (no draft distribution after the last proposal: the residual is p itself)."""
    gamma = x.shape[1]
    if not gamma:
        return torch.zeros_like(like)
    rows = torch.arange(x.shape[0], device=x.device)
    at = n.clamp_max(gamma - 1)
    rejected = (n < gamma).unsqueeze(-1)
    if q is not None:
        return torch.where(rejected, q[rows, at], 0.0)
    hot = rejected.to(like.dtype)
    return torch.zeros_like(like).scatter_(-1, x[rows, at].unsqueeze(-1), hot)


def gumbel_argmax(scores: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(scores + noise) over the last dimension, in float64. With noise i.i.d. Gumbel(0, 1) this is a draw
    from softmax(scores) (the Gumbel-max trick; −inf scores are never chosen): the token rule of
    `coupling="gumbel"` (`hfspec.decoding.coupling`), for the draft's proposals and the target's tokens alike."""
    return first_argmax(scores.double() + noise)


def verify_greedy(target_tokens: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` at temperature 0, where p and q are one-hot: keep draft tokens while they equal the target's
    argmax, then take the target's token. target_tokens [B, γ+1] (argmax of p), x [B, γ]. Same result as
    `verify` on one-hot distributions, without touching the vocabulary."""
    gamma = x.shape[1]
    n = count_accepted(x == target_tokens[:, :gamma]) if gamma else x.new_zeros(x.shape[0])
    token = target_tokens.gather(1, n.unsqueeze(1)).squeeze(1)
    return n, token


# Tree speculation: one chain plus sibling leaves. At a chain position the draft's token x was drawn from q;
# siblings are further tokens drawn from the same q without replacement, one after another (`_draws`: the law of
# Gumbel-top-k, Kool et al., ICML 2019, whose perturbed keys' order is such a sequential draw). After x is rejected the siblings
# are tried in draw order by recursive rejection sampling (Jeon et al., 2024, "Recursive Speculative Decoding",
# Algorithm 1): each rejection replaces p by norm(max(0, p − q)) and removes the rejected token from q, so each
# candidate is tested against the distribution it was actually drawn from. The token kept is distributed as p.


def draw_siblings(q: torch.Tensor, first: torch.Tensor, m: int, generator: torch.Generator | None = None
                  ) -> torch.Tensor:
    """Up to m tokens [m'] drawn from q [V] without replacement and without `first` (a 0-dim token), in draw
    order; fewer when q has fewer other tokens with mass."""
    return _draws(q, m, generator, first)


def _draws(q: torch.Tensor, k: int, generator: torch.Generator | None, exclude=None) -> torch.Tensor:
    """Up to k tokens [k'] drawn from q [V] one after another, each from the mass the earlier ones (and `exclude`)
    left: a draw without replacement in draw order, the law Gumbel-top-k gives (Kool et al. 2019) by `sample`'s
    float64 inverse CDF per draw. At SmolLM2's 49k tokens 1 / 2 / 4 tokens took 0.17 / 0.30 / 0.48 ms against
    Gumbel-top-k's 0.51 (V float64 keys, two logarithms each and a top-k, whatever k; a one-off timing)."""
    rest = q.clone()
    if exclude is not None:
        rest[exclude] = 0
    out = []
    for _ in range(min(k, int((rest > 0).sum()))):
        token = int(sample(rest[None], generator)[0])
        out.append(token)
        rest[token] = 0
    return torch.tensor(out, dtype=torch.long, device=q.device)


def without(q: torch.Tensor, token) -> torch.Tensor:
    """q [V] with `token` removed and renormalised (zeros when nothing is left)."""
    out = q.clone()
    out[token] = 0
    total = out.sum()
    return out / total if total > 0 else out


def sibling_chances(p: torch.Tensor, q: torch.Tensor, first, siblings: torch.Tensor
                    ) -> tuple[list[float], torch.Tensor]:
    """Recursive rejection over siblings after `first` (drawn from q) was rejected by p.

    p, q: [V]; siblings: tokens drawn from q without replacement after `first`. Returns, per sibling, the
    probability it is accepted given that every candidate before it was rejected, and the distribution the
    token is drawn from when all are rejected. Deterministic: the random draws are the caller's."""
    return children_chances(residual(p, q), without(q, first), siblings)


def verify_tree(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, siblings: list[torch.Tensor],
                generator: torch.Generator | None = None) -> tuple[int, int, int | None]:
    """One round over a chain with sibling leaves (one row).

    p: [γ+1, V] target at the chain positions, q: [γ, V] draft, x: [γ] chain, siblings[j]: sibling tokens at
    chain position j (drawn from q[j] without replacement after x[j]). Returns (n, i, token): n chain tokens
    kept; i ≥ 0: sibling i at position n is kept too, and the next token comes from the target at that leaf
    (token None); i = −1: `token` is the replacement (n < γ) or the bonus (n == γ)."""
    gamma = x.shape[0]
    if gamma:
        p_x = p[:gamma].gather(-1, x[:, None]).squeeze(-1)
        q_x = q.gather(-1, x[:, None]).squeeze(-1)
        r = torch.rand(gamma, generator=generator, device=p.device)
        n = int(count_accepted(accept_draft(p_x, q_x, r)[None])[0])
    else:
        n = 0
    if n == gamma:
        return n, -1, int(sample(p[n][None], generator)[0])
    sibs = siblings[n] if n < len(siblings) else x.new_empty(0)
    if not sibs.numel():
        return n, -1, int(sample(residual(p[n], q[n])[None], generator)[0])
    chances, rest = sibling_chances(p[n], q[n], x[n], sibs)
    r = torch.rand(len(chances), generator=generator, device=p.device)
    for i, chance in enumerate(chances):
        if float(r[i]) < chance:
            return n, i, None
    return n, -1, int(sample(rest[None], generator)[0])


def verify_tree_greedy(target_tokens: torch.Tensor, x: torch.Tensor, siblings: list[torch.Tensor]
                       ) -> tuple[int, int, int | None]:
    """`verify_tree` at temperature 0 (one row): keep chain tokens while they equal the target's argmax; at the
    first mismatch keep the sibling equal to the target's argmax if there is one (then token None: the next
    token is the target's argmax at that leaf), else take the target's token."""
    gamma = x.shape[0]
    n = int(count_accepted((x == target_tokens[:gamma])[None])[0]) if gamma else 0
    best = int(target_tokens[n])
    if n < gamma and n < len(siblings):
        hits = (siblings[n] == best).nonzero()
        if hits.numel():
            return n, int(hits[0, 0]), None
    return n, -1, best


# Token trees (`hfspec.decoding.trees`): every node's children are drawn from the draft's q at that node without
# replacement (in draw order) and tried in that order by the same recursive rule as the siblings above (SpecInfer,
# Miao et al., ASPLOS 2024, with the without-replacement residual update of Jeon et al. 2024 / "multi-draft"
# speculative sampling): accept child c with probability min(1, p(c) / q(c)); on rejection p ← norm(max(0, p − q))
# and q ← q without c, renormalised; when every child is rejected the token is drawn from the last residual.
# The law of the token is p whatever the number of children, provided that number is not chosen by looking at the
# children themselves (it may depend on q, on the node's ancestors and on other nodes).


def draw_without_replacement(q: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to k tokens [k'] drawn from q [V] without replacement, in draw order (`_draws`); fewer when q has fewer
    tokens with mass."""
    return _draws(q, k, generator)


def children_chances(p: torch.Tensor, q: torch.Tensor, children: torch.Tensor) -> tuple[list[float], torch.Tensor]:
    """Recursive rejection over a node's children (drawn from q without replacement, in that order): per child,
    the probability it is accepted given every child before it was rejected, and the distribution the token is
    drawn from when all are rejected. p, q: [V]. Deterministic: the random draws are the caller's."""
    chances = []
    for c in children.tolist():
        q_c = float(q[c])
        chances.append(min(1.0, float(p[c]) / q_c) if q_c > 0 else 0.0)
        p, q = residual(p, q), without(q, c)
    return chances, p


def verify_children(p: torch.Tensor, q: torch.Tensor, children: torch.Tensor,
                    generator: torch.Generator | None = None) -> tuple[int, int | None]:
    """One node of a token tree: (i, None) when child i is accepted, (−1, token) when every child is rejected and
    `token` is drawn from the residual. Exactly p's law (`children_chances`)."""
    for i, c in enumerate(children.tolist()):
        q_c = float(q[c])
        r = float(torch.rand((), generator=generator, device=p.device))
        if q_c > 0 and r * q_c < float(p[c]):
            return i, None
        p, q = residual(p, q), without(q, c)
    return -1, int(sample(p[None], generator)[0])
