"""The chain, the default `Verifier`: the draft proposes up to γ tokens in a line, and one target forward over
them keeps a prefix and draws one more (Leviathan et al. 2023, Algorithm 1; `hfspec.decoding.sampling.verify`).

`propose` and `verify_chain` are the two halves; the sibling-leaf verifier (`hfspec.decoding.siblings.Tree`)
reuses both, with its own `pick` wrapper and its own verification where a round has leaves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hfspec.decoding.round import Proposal, Verdict, history_groups
from hfspec.decoding.sampling import sample, verify, verify_greedy
from hfspec.decoding.verifier import RoundState
from hfspec.drafts.base import Pick


class Chain:
    """The plain chain: nothing to check, no state between rounds."""

    lean_target = True  # its passes may run through the lean target (`hfspec.decoding.verifier.Verifier`)

    def check(self, target: torch.nn.Module, run: RoundState) -> None:
        """Every target and draft can run a chain."""

    def propose_and_verify(self, run: RoundState) -> tuple[Proposal, Verdict]:
        proposal = propose(run)
        return proposal, verify_chain(run, proposal)


def propose(run: RoundState, wrap: Callable[[Pick, list | None], Pick] | None = None) -> Proposal:
    """The draft appends up to γ tokens to the slots; q is processed exactly as the target's p will be.
    `wrap(pick, groups)`: a verifier's own view of each draft step (sibling leaves keep the top candidates)."""
    gamma = run.gamma()
    start = run.slots.size
    groups = history_groups([run.history(r) for r in run.active], run.device) if run.scorer.needs_history else None
    clock = (run.draft.seconds, run.draft.forwards)
    pick = picker(run, groups)
    if wrap is not None:
        pick = wrap(pick, groups)
    x, q = run.draft.propose(run.slots, gamma, run.meter.timed(pick), run.decide)
    return Proposal(x, q, start, gamma, groups, clock)


def picker(run: RoundState, groups) -> Pick:
    """The draft's `pick` for this round: logits to its next token and q, with the target's processing."""
    scorer, generator, noise, device = run.scorer, run.generator, run.noise, run.device
    batch_rows, offsets = list(run.active), run.offsets()

    def pick(logits: torch.Tensor, x_so_far: torch.Tensor):
        """The draft's next token and its distribution q, processed exactly as the target's p will be."""
        logits = logits.to(device)
        ctx = [(rows, torch.cat([ids, x_so_far[rows]], dim=1)) for rows, ids in groups] if groups else None
        if not scorer.do_sample:
            return scorer.greedy(ctx, x_so_far, logits)[:, 0], None
        if noise is not None:  # coupling="gumbel": argmax(log q + g) with the target's noise at this position
            j = x_so_far.shape[1]
            g = noise.at(batch_rows, [o + j for o in offsets], 1, scorer.vocab_size, device)
            x_j, q_j = scorer.gumbel(ctx, x_so_far, logits, g, with_probs=True)
            return x_j[:, 0], q_j[:, 0]
        q_j = scorer.probs(ctx, x_so_far, logits)[:, 0]
        return sample(q_j, generator), q_j

    return pick


def verify_chain(run: RoundState, proposal: Proposal) -> Verdict:
    """One target forward over everything it has not seen, distributions at γ + 1 positions; keep a prefix of x
    and draw one more token (the rule of `hfspec.decoding.sampling.verify`)."""
    scorer, slots, gamma = run.scorer, run.slots, proposal.gamma
    before = run.target.seconds
    logits = run.target.feed(slots.tokens, slots.positions, slots.valid, proposal.start + gamma, gamma + 1,
                             slots.all_valid)
    logits = logits.to(run.device)
    run.meter.scoring()
    if scorer.do_sample and run.noise is not None:
        # coupling="gumbel": the target's tokens are argmax(log p + g) at the γ + 1 positions; a proposal is kept
        # iff it is the target's token there (greedy verification of the perturbed argmaxes)
        noise = run.noise.at(run.active, run.offsets(), gamma + 1, scorer.vocab_size, run.device)
        tokens, _ = scorer.gumbel(proposal.groups, proposal.x, logits, noise)
        n, token = verify_greedy(tokens, proposal.x)
    elif scorer.do_sample:
        # q None: a draft without distributions proposes deterministically (q one-hot on x; `verify` forms it
        # only at the one position per row that needs it)
        n, token = verify(scorer.probs(proposal.groups, proposal.x, logits), proposal.q, proposal.x, run.generator)
    else:
        n, token = verify_greedy(scorer.greedy(proposal.groups, proposal.x, logits), proposal.x)
    run.meter.scored()
    return Verdict(n, token, run.target.seconds - before)
