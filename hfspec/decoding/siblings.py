"""Tree speculation: the draft's chain plus sibling leaves, scored by the target in one forward.

At chain positions where the draft is unsure (the top probability of its distribution below `below`), up to
k − 1 siblings are added: further tokens from the same draft distribution, drawn without replacement (greedy:
the draft's next-best tokens). They cost no draft forward. The target scores chain and leaves in one pass: a
leaf of chain position j sits at x_j's position and attends to the prefix and x_1..x_{j−1} only (a 4D attention
mask and explicit position ids). Verification (`hfspec.decoding.sampling.verify_tree`) walks the chain; where it rejects,
the siblings there are tried by recursive rejection sampling, and an accepted sibling brings one more token from
the target's distribution at its leaf. Afterwards the target's cache holds exactly the accepted path
(`hfspec.kernels.cache.keep_positions`) and the draft catches up through its usual feed.

Batch size 1, full-attention targets with `position_ids`; drafts that give no distributions (prompt lookup)
get no leaves at T > 0.
"""

from __future__ import annotations

import time

import torch

from hfspec.decoding.chain import propose, verify_chain
from hfspec.decoding.round import Proposal, Verdict
from hfspec.decoding.sampling import draw_siblings, sample, verify_tree, verify_tree_greedy
from hfspec.decoding.verifier import RoundState
from hfspec.kernels import cache as kv
from hfspec.kernels.kv_model import CachedModel
from hfspec.validate import bad_value

DEFAULT_BELOW = 0.8  # siblings where the draft's top probability is under this: confident positions rarely reject


class Tree:
    """The sibling-leaf `Verifier` and its per-run state: `width` candidates per unsure position (the chain token
    and width − 1 siblings).

    Whether leaves pay is decided from the run's own measurements (`LeafCost`) unless `always`: a leaf costs
    the verify pass's marginal seconds per position and is worth a token whenever its sibling is kept. Which
    leaves are added depends only on the draft and on earlier rounds, never on this round's target output, so
    the rule cannot bias what is accepted."""

    def __init__(self, width: int, below: float | None = None, always: bool = False):
        self.width = int(width)
        self.below = DEFAULT_BELOW if below is None else float(below)
        self.always = always
        self.cost = LeafCost()
        self._tops: list[torch.Tensor] = []

    def check(self, target, run: RoundState) -> None:
        check_tree_target(target, run.target)

    def propose_and_verify(self, run: RoundState) -> tuple[Proposal, Verdict]:
        """The chain's proposal (this tree's `pick` keeps each position's top candidates), verified with sibling
        leaves where the draft is unsure (`tree_round`), else as a chain."""
        proposal = propose(run, lambda pick, groups: self.wrap_pick(pick, run.scorer, groups))
        verdict = tree_round(run, proposal, self)
        return proposal, verdict if verdict is not None else verify_chain(run, proposal)

    def wrap_pick(self, pick, scorer, groups):
        """The loop's `pick`, also keeping each position's top candidates when greedy (q is None there)."""
        self._tops = []

        def tree_pick(logits: torch.Tensor, x_so_far: torch.Tensor):
            token, q_j = pick(logits, x_so_far)
            if q_j is None:
                ctx = ([(rows, torch.cat([ids, x_so_far[rows]], dim=1)) for rows, ids in groups] if groups
                       else None)
                scores = scorer.scores(ctx, x_so_far, logits.to(x_so_far.device))[:, 0]
                probs = torch.softmax(scores.float(), -1)
                top = torch.topk(probs, min(self.width, probs.shape[-1]))
                self._tops.append((top.values, top.indices))
            return token, q_j

        return tree_pick

    def leaf_budget(self, gamma: int) -> int:
        """Most leaves this round may add: all of them when `always` or while they pay, else none (with a
        periodic full round to keep measuring). The hook for `hfspec.decoding.costmodel` to replace."""
        full = gamma * (self.width - 1)
        return full if self.always or self.cost.pays() else 0

    def siblings(self, x: torch.Tensor, q: torch.Tensor | None, generator) -> list[torch.Tensor]:
        """Sibling tokens per chain position (one row), empty where the draft is sure."""
        gamma, m = x.shape[0], self.width - 1
        out, budget = [], self.leaf_budget(gamma)
        for j in range(gamma):
            sibs = x.new_empty(0)
            if q is not None:
                if float(q[j].max()) < self.below and budget > 0:
                    sibs = draw_siblings(q[j], x[j], min(m, budget), generator)
            elif j < len(self._tops):
                values, indices = self._tops[j]
                if float(values[0, 0]) < self.below and budget > 0:
                    sibs = indices[0][indices[0] != x[j]][: min(m, budget)]
            budget -= sibs.numel()
            out.append(sibs)
        return out


class LeafCost:
    """A run's evidence on leaves: the target's verify seconds as a + b · positions (least squares over this
    run's passes, with and without leaves), the share of leaves whose sibling was kept, and the run's seconds
    per token. Leaves pay while kept-per-leaf × seconds-per-token > b. The first rounds and every
    `EXPLORE`-th round carry leaves whatever the estimate says, so both sides stay measured."""

    EXPLORE = 8
    WARMUP = 4

    def __init__(self):
        self.rounds = 0
        self.sums = [0.0] * 5  # n, Σw, Σs, Σw², Σws
        self.leaves = 0
        self.kept = 0
        self.seconds = 0.0
        self.tokens = 0
        self._last = None  # (target seconds, positions fed, forwards) at the start of the previous round

    def observe_runner(self, runner, draft_seconds: float, tokens: int) -> None:
        """Called at the start of each round: the previous round's single target pass, if it was one."""
        now = (runner.seconds, runner.positions_fed, runner.forwards)
        if self._last is not None and now[2] - self._last[2] == 1:
            width, seconds = now[1] - self._last[1], now[0] - self._last[0]
            for i, v in enumerate((1.0, width, seconds, width * width, width * seconds)):
                self.sums[i] += v
        self._last = now
        self.seconds, self.tokens = runner.seconds + draft_seconds, tokens
        self.rounds += 1

    def per_position(self) -> float | None:
        """b: the verify pass's marginal seconds per position (None until the widths differ)."""
        n, sw, ss, sww, sws = self.sums
        var = n * sww - sw * sw
        return None if n < 2 or var <= 1e-9 * max(1.0, n * sww) else (n * sws - sw * ss) / var

    def pays(self) -> bool:
        if self.rounds <= self.WARMUP or self.rounds % self.EXPLORE == 0:
            return True
        b = self.per_position()
        if b is None or not self.tokens:
            return True
        kept_per_leaf = (self.kept + 1) / (self.leaves + 2)
        return kept_per_leaf * self.seconds / self.tokens > b


def tree_round(run: RoundState, proposal: Proposal, tree: Tree) -> Verdict | None:
    """Verify `proposal` with sibling leaves and return the `Verdict`; None when this round has no leaves (the
    chain is verified as usual).

    When a sibling is kept, `proposal.x` at that position becomes the sibling and the verdict counts it as
    accepted, so commit and settle need nothing else; the caches are already set to the accepted path."""
    scorer, gamma, generator = run.scorer, proposal.gamma, run.generator
    greedy = not scorer.do_sample
    if not gamma or (proposal.q is None and not greedy):
        return None
    tree.cost.observe_runner(run.target, run.draft.seconds, run.new_tokens())
    x = proposal.x[0]
    siblings = tree.siblings(x, None if greedy else proposal.q[0], generator)
    leaves = [(j, int(t)) for j, sibs in enumerate(siblings) for t in sibs.tolist()]
    if not leaves:
        return None
    target, slots, start = run.target, run.slots, proposal.start
    before = target.seconds
    logits = feed_tree(target, slots, start, gamma, leaves).to(run.device)
    run.meter.scoring()
    chain, leaf_logits = logits[:, : gamma + 1], logits[:, gamma + 1 :]
    if greedy:
        n, i, token = verify_tree_greedy(scorer.greedy(proposal.groups, proposal.x, chain)[0], x, siblings)
    else:
        n, i, token = verify_tree(scorer.probs(proposal.groups, proposal.x, chain)[0], proposal.q[0], x, siblings,
                                  generator)
    if i >= 0:
        leaf = sum(s.numel() for s in siblings[:n]) + i
        sibling = int(siblings[n][i])
        path = proposal.x.clone()
        path[0, n] = sibling
        # The target's distribution at the leaf follows prefix + x_1..x_n + sibling: score it with that history.
        at_leaf = leaf_logits[:, leaf : leaf + 1]
        history = ([(rows, torch.cat([ids, path[rows, : n + 1]], dim=1)) for rows, ids in proposal.groups]
                   if proposal.groups else None)
        if greedy:
            token = int(scorer.greedy(history, path[:, :0], at_leaf)[0, 0])
        else:
            token = int(sample(scorer.probs(history, path[:, :0], at_leaf)[0], generator)[0])
        kv.keep_positions(target.cache, list(range(start + n)) + [start + gamma + leaf])
        target.cached = start + n + 1
        slots.tokens[0, start + n] = sibling  # the slot held x_{n+1}: the draft catches up on what was kept
        run.draft.rollback(start + n)
        proposal.x, n = path, n + 1
    run.meter.scored()
    device = proposal.x.device
    run.stats.tree_leaves += len(leaves)
    run.stats.tree_kept += int(i >= 0)
    tree.cost.leaves += len(leaves)
    tree.cost.kept += int(i >= 0)
    return Verdict(torch.tensor([n], device=device), torch.tensor([token], device=device), target.seconds - before,
                   from_leaf=i >= 0)


def feed_tree(runner, slots, start: int, gamma: int, leaves: list[tuple[int, int]]) -> torch.Tensor:
    """One target forward over the unseen chain slots [cached, start + γ) and the leaves (chain position j,
    token), each leaf at x_j's position seeing the prefix and x_1..x_j−1 only. Returns logits [1, γ + 1 + L, V]:
    the γ + 1 chain positions from slot start − 1, then one per leaf. `runner`: a `CachedModel`."""
    began = time.perf_counter()
    cached, end = runner.cached, start + gamma
    n_chain, n_leaf = end - cached, len(leaves)
    depth = torch.tensor([j for j, _ in leaves], dtype=torch.long)
    ids = torch.cat([slots.tokens[0, cached:end], torch.tensor([t for _, t in leaves], dtype=slots.tokens.dtype)])
    positions = torch.cat([slots.positions[0, cached:end], slots.positions[0, start + depth]])
    total = cached + n_chain + n_leaf
    kv_index = torch.arange(total)
    # chain row r (slot cached + r) sees slots ≤ cached + r; a leaf of position j sees slots < start + j, itself
    sees_up_to = torch.cat([torch.arange(cached, end), start + depth - 1])
    allowed = kv_index[None, :] <= sees_up_to[:, None]
    allowed[:, end:] = False
    allowed[n_chain:, end:] = torch.eye(n_leaf, dtype=torch.bool)
    dtype = _dtype(runner.model)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    keep = gamma + 1 + n_leaf
    logits = runner.masked_forward(ids[None], positions[None], mask[None, None], keep)
    runner.seconds += time.perf_counter() - began
    runner.cached = total
    runner.forwards += 1
    runner.positions_fed += n_chain + n_leaf
    return logits


def _dtype(model) -> torch.dtype:
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if dtype.is_floating_point else torch.float32


def check_tree_target(target, runner) -> None:
    """Raise a clear error when the target cannot score a tree: no position ids, a sliding-window cache, or a
    runner that is not the HF forward with a KV cache."""
    if not isinstance(runner, CachedModel) or not runner._has_positions:
        raise bad_value("tree", "on", "off for this target (tree speculation needs the HF forward with position_ids)")
    if kv.has_sliding_layers(target):
        raise bad_value("tree", "on", "off for targets with sliding-window attention layers (full attention only)")
