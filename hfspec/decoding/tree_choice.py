"""tree="auto", each round: grow a token tree, or run the round as the plain chain where a tree does not pay.

A chain round is the chain's own code path (`hfspec.decoding.chain.propose` and `verify_chain`: the same draft
step, compiled where the draft is, the same verify pass, γ from the run's γ policy); a tree round is
`hfspec.decoding.trees.dynamic_round`. Each is exact, and the choice reads only earlier rounds and costs, never
this round's draws, so the output law is the target's whichever is taken.

- **Seeded** (`AutoShape.timed` False): both are priced with the acceptance model the tree grows with
  (`AutoShape.chance`, which chain rounds feed too: a chain's draft token is a first child) and costs fixed before
  decoding, in one-token target passes: a chain round of γ costs γ draft steps (c, the bytes-ratio prior) plus
  `verify_prior(γ + 1)`; a tree round costs its root step, each level at c × `TREE_LEVEL_PRIOR` (an eager
  multi-node call) × (1 + `TREE_ROW_PRIOR` × (w − 1)) for its w nodes, `verify_prior(n + 1)` for its n nodes
  and `TREE_ROUND_PRIOR` (the 4-D mask, position ids and the walk). The tree's expected tokens come from `plan`, the tree `grow` would build from the acceptance model
  alone. With a fixed γ the chain is priced at that γ; with γ "auto" at its best γ under the same model (the
  chain the policy aims at: a policy that has just dropped to γ 0 after a few early rejections is not taken for
  what the chain can do). A tree is grown when it promises `TREE_MARGIN` (10 %) more expected tokens per unit
  of cost than the chain; nothing here reads the clock, so the same seed gives the same text on any load. The first round (with the prompt) runs as the chain; the choice is remade each of the next rounds
  up to `DECIDE_EARLY`, then every `DECIDE_EVERY` rounds (a cheap counter in between).
- **Timed** (no seed): each path's measured tokens per second over this run's rounds (round start to next round
  start, decayed), after `MIN_MEASURED` measured rounds of each; the slower path is tried again after
  `PROBE_FIRST` rounds, then after twice as many each time it stays slower (up to `PROBE_MAX`), and after
  `PROBE_FIRST` again once the faster path changes.
"""

from __future__ import annotations

import time

from hfspec.decoding.priors import TREE_ROUND_PRIOR, verify_prior
from hfspec.decoding.tree_shape import AutoShape
from hfspec.decoding.verifier import RoundState
from hfspec.validate import AUTO_GAMMA_MAX

DECIDE_EVERY = 4  # seeded: rounds between two choices
DECIDE_EARLY = 8  # seeded: the first rounds, while the acceptance model moves fastest, each choose anew
MIN_MEASURED = 2  # timed: measured rounds of each path before choosing by their rates
PROBE_FIRST, PROBE_MAX = 8, 64  # timed: rounds before the slower path is tried again, first and at most
DECAY = 0.9  # timed: weight of a path's earlier rounds in its rate
# seeded: how much more a tree must promise than the chain (tokens per unit of cost) to be grown. Its two priors
# are inferred rather than timed on their own (`TREE_LEVEL_PRIOR`, `TREE_ROUND_PRIOR`), the chain's verify curve is
# measured, and a wrong choice of a tree costs more than one of the chain: where they are close, the chain.
TREE_MARGIN = 0.1


def plan(shape: AutoShape, depth_room: int) -> tuple[float, int, list[int]]:
    """The tree `grow` would build from the acceptance model alone (each candidate's worth: its reach): its
    expected tokens (1 + Σ reach), its nodes and the widths of its draft levels after the root."""
    limits = shape.limits
    node_floor = shape.node_floor()
    expand_floor = node_floor + shape.row_floor()
    depth_max = min(limits.depth, depth_room)
    frontier, tokens, nodes, levels = [1.0], 1.0, 0, []
    for depth in range(1, depth_max + 1):
        chances = [shape.chance(depth, r) for r in range(limits.branch)]
        cands = sorted(((x * ch, i, r) for i, x in enumerate(frontier) for r, ch in enumerate(chances)),
                       key=lambda t: -t[0])
        take: dict[int, int] = {}
        new: list[float] = []
        most = min(limits.nodes - nodes, limits.width)
        for worth, i, r in cands:
            if len(new) >= most or worth < node_floor:
                break
            if take.get(i, 0) == r:  # each node's children stay a prefix of its draw order
                take[i] = r + 1
                new.append(worth)
        if not new:
            break
        tokens += sum(new)
        nodes += len(new)
        if depth == depth_max or nodes >= limits.nodes:
            break
        nxt = shape.chance(depth + 1, 0)
        ranked = [x for x in sorted(new, reverse=True)[: limits.width] if x * nxt >= expand_floor]
        if not ranked or sum(ranked) * nxt < shape.level_floor(len(ranked)):
            break
        levels.append(len(ranked))
        frontier = ranked
    return tokens, nodes, levels


def chain_rate(shape: AutoShape, gamma: int, best: bool = False) -> float:
    """A chain round of γ: expected tokens per one-token target pass, with the priors (module doc). `best`: the
    most over γ' from 0 to γ instead (the chain a γ "auto" policy aims at)."""
    reach, tokens = 1.0, 1.0
    rate = 1.0 / verify_prior(1, shape.device, shape.dtype)  # γ 0: plain decoding
    for depth in range(1, gamma + 1):
        reach *= shape.chance(depth, 0)
        tokens += reach
        if best or depth == gamma:
            at = tokens / (depth * shape.c_prior + verify_prior(depth + 1, shape.device, shape.dtype))
            rate = max(rate, at) if best else at
    return rate


def tree_rate(shape: AutoShape, depth_room: int) -> float:
    """A tree round as `plan` sees it: expected tokens per one-token target pass, with the priors (module doc)."""
    tokens, nodes, levels = plan(shape, depth_room)
    cost = (shape.c_prior + sum(shape.level_cost(width) for width in levels)
            + verify_prior(nodes + 1, shape.device, shape.dtype))
    return tokens / (cost + TREE_ROUND_PRIOR)


class ChainOrTree:
    """Per run: whether the next round of tree="auto" grows a tree (module doc). `use_tree(run)` is asked at the
    start of each round; `ran(tree, tokens)` hears what the round was and how many tokens it gave."""

    def __init__(self, shape: AutoShape, gamma_auto: bool = False):
        self.shape = shape
        self.gamma_auto = gamma_auto  # the chain's γ is "auto": compare with the best chain, not this round's γ
        self.rounds = 0
        self._tree = False  # the current choice
        # timed: per path (False: chain, True: tree) decayed tokens, decayed seconds, rounds measured
        self._sums = {False: [0.0, 0.0, 0], True: [0.0, 0.0, 0]}
        self._open: tuple[bool, float, int] | None = None  # the round being timed: (tree, began, tokens)
        self._since, self._gap, self._best, self._began = 0, PROBE_FIRST, False, 0.0

    def use_tree(self, run: RoundState) -> bool:
        """This round's choice for `run` (a `RoundState`): True grows a tree, False runs the chain. A seeded choice
        reads the chain's γ (`run.gamma()`, the γ policy's) and the length budget only when it is remade."""
        self.rounds += 1
        if not self.shape.timed:
            if self.rounds == 1:  # the prompt's round runs as the chain: the acceptance model has no evidence yet
                return False
            if self.rounds <= DECIDE_EARLY or self.rounds % DECIDE_EVERY == 1 or DECIDE_EVERY == 1:
                room = max(0, run.room() - 1)
                chain = (chain_rate(self.shape, min(AUTO_GAMMA_MAX, room), best=True) if self.gamma_auto
                         else chain_rate(self.shape, run.gamma()))
                self._tree = tree_rate(self.shape, room) > (1 + TREE_MARGIN) * chain
            return self._tree
        now = time.perf_counter()
        if self._open is not None and self.rounds > 2:  # the first round holds the prompt: not measured
            tree, began, tokens = self._open
            sums = self._sums[tree]
            sums[0], sums[1], sums[2] = DECAY * sums[0] + tokens, DECAY * sums[1] + (now - began), sums[2] + 1
        self._open = None
        self._tree = self._timed_choice()
        self._began = now
        return self._tree

    def _timed_choice(self) -> bool:
        chain, tree = self._sums[False], self._sums[True]
        if self.rounds == 1 or chain[2] < MIN_MEASURED:
            return False
        if tree[2] < MIN_MEASURED:
            return True
        best = tree[0] / max(tree[1], 1e-12) > chain[0] / max(chain[1], 1e-12)
        if best != self._best:  # the faster path changed: probe the other one soon again
            self._best, self._since, self._gap = best, 0, PROBE_FIRST
        self._since += 1
        if self._since < self._gap:
            return best
        self._since = 0
        self._gap = min(2 * self._gap, PROBE_MAX)
        return not best  # a probe of the slower path

    def ran(self, tree: bool, tokens: int) -> None:
        """The round just run: a tree or the chain, and the tokens it gave (accepted + 1)."""
        if self.shape.timed:
            self._open = (tree, self._began, tokens)
