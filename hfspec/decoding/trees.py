"""Dynamic draft trees: branches that continue, verified by the target in one pass.

Each round the draft grows a token tree level by level (EAGLE-2, Li et al. 2024; SpecInfer, Miao et al. 2024):
at every level it gives children to the nodes with the highest cumulative draft probability, several per node, up
to a node budget and a depth. A level is one draft call over all the nodes it expands (a tree attention mask and
position ids over the draft's own cache: the lean step's `LeanCache`, or the HF forward with a 4-D mask). The
target scores every node in one forward (`feed_token_tree`) and the round walks the tree from the root:

- T > 0: at a node, its children (drawn from the draft's q there without replacement, in draw order) are tried
  by recursive rejection sampling (`hfspec.decoding.sampling.verify_children`); an accepted child becomes the next node;
  when every child is rejected, the token is drawn from the residual, and a node without children gives a token
  from the target's p. Each token is distributed exactly as the target's.
- T = 0: walk along the target's argmax while a child holds it, then take the argmax: the target's greedy text.

Which children a node gets and how many is decided before they are drawn, from the parent's q (its sorted
probabilities), the parent's cumulative probability and other nodes, never from the children themselves: deciding
by a drawn child's own probability would bias the rule (a test shows it). Afterwards the target's cache holds
exactly the accepted path (`hfspec.kernels.cache.keep_positions`), and so does the draft's (the path's nodes it decoded).

Shape: `hfspec.decoding.tree_shape` (a fixed `TreeShape`, or `tree="auto"`). With "auto" each round may instead run
as the plain chain, where a tree would not pay (`hfspec.decoding.tree_choice`).

Batch size 1; targets and drafts whose forward takes `position_ids` with full attention (sliding-window models
are refused); model drafts only (not prompt lookup or a self-draft sharing the target's cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hfspec.decoding.chain import propose, verify_chain
from hfspec.decoding.priors import tree_level_prior, tree_row_prior
from hfspec.decoding.round import Proposal, RoundTree, Verdict, history_groups
from hfspec.decoding.sampling import draw_without_replacement, sample, verify_children
from hfspec.decoding.siblings import check_tree_target
from hfspec.decoding.tree_choice import ChainOrTree
from hfspec.decoding.tree_forward import feed_token_tree, forward_level, keep_cached
from hfspec.decoding.tree_shape import AutoShape, TreeShape
from hfspec.decoding.verifier import RoundState
from hfspec.drafts.base import ModelDraft
from hfspec.dtypes import dtype_str
from hfspec.kernels import cache as kv
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.lean import LeanRunner
from hfspec.kernels.lean_layers import LeanLinear
from hfspec.validate import bad_value


@dataclass
class _Node:
    token: int
    parent: int
    depth: int
    rank: int  # its place in its parent's draw order
    reach: float  # "auto": its estimated chance to be on the accepted path
    value: float  # cumulative draft probability of the path to it
    children: list
    dist: torch.Tensor | None = None  # the draft's processed distribution here (expanded nodes)
    fed: int = -1  # its index among the nodes the draft decoded (draft cache slot start + fed), −1: not decoded


class DynamicTree:
    """The token-tree `Verifier` and its per-run state: a fixed `TreeShape`, or `AutoShape` for "auto" (which
    runs a round as the plain chain where a tree does not pay: `choice`, `hfspec.decoding.tree_choice`)."""

    lean_target = True  # the lean target scores a tree level in one call (`tree_forward.forward_level`)

    def __init__(self, shape: TreeShape | AutoShape, gamma_auto: bool = False):
        self.shape = shape
        # live acceptance by depth and rank: orders candidates at T > 0 (a first-drawn child is the likeliest
        # to be accepted, whatever its q), and, with "auto", sizes the tree
        self.acceptance = shape if isinstance(shape, AutoShape) else AutoShape(timed=False, c_prior=0.2)
        self.choice = ChainOrTree(shape, gamma_auto) if isinstance(shape, AutoShape) else None

    @property
    def auto(self) -> bool:
        return isinstance(self.shape, AutoShape)

    def check(self, target, run: RoundState) -> None:
        check_dynamic_tree(target, run.target, run.draft)
        step = getattr(getattr(run.draft.runner, "model", None), "compiled_step", None)
        level = step.tree_level.prepare() if step is not None else "eager"  # compiled on the first tree run
        if self.auto:  # a level is a multi-node call: dearer than a chain step, more with its width
            self.shape.level_factor = tree_level_prior(step is not None, level == "compiled")
            self.shape.row_factor = tree_row_prior(draft_storage(run.draft.runner))

    def propose_and_verify(self, run: RoundState) -> tuple[Proposal, Verdict]:
        if self.choice is not None and not self.choice.use_tree(run):
            return chain_round(run, self)
        proposal, verdict = dynamic_round(run, self)
        run.stats.tree_rounds += 1
        if self.choice is not None:
            self.choice.ran(True, len(verdict.tree.path) + 1)
        return proposal, verdict


def chain_round(run: RoundState, tree: DynamicTree) -> tuple[Proposal, Verdict]:
    """A round of tree="auto" run as the plain chain (`hfspec.decoding.chain`'s own propose and verify, γ from the
    run's γ policy); the acceptance model hears of it, and the round's record shows it as a one-branch tree."""
    proposal = propose(run)
    verdict = verify_chain(run, proposal)
    n, gamma = int(verdict.n[0]), proposal.gamma
    tree.shape.observe_chain(gamma, n)
    tree.choice.ran(False, n + 1)
    run.stats.chain_rounds += 1
    verdict.tree = RoundTree(tuple(proposal.x[0].tolist()), tuple(range(-1, gamma - 1)), tuple(range(1, gamma + 1)),
                             tuple(range(n)), int(verdict.token[0]), "bonus" if n == gamma else "resampled",
                             chain=True)
    return proposal, verdict


def draft_storage(runner) -> str:
    """What holds most of a draft's weights, as `TREE_ROW_PRIOR` names it: "int4" or "int8" (the lean step's packed
    CPU kernels), else the dtype of its float weights ("bfloat16", "float32", ...)."""
    model = getattr(runner, "model", runner)
    counts: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, LeanLinear):
            kind = "int4" if module.int4 else "int8" if module.int8 else None
            if kind is None:
                weight = getattr(module, "weight", None)
                kind = dtype_str(weight.dtype) if weight is not None else "float32"
            counts[kind] = counts.get(kind, 0) + module.out_features * module.in_features
    if not counts:
        for p in model.parameters():
            kind = dtype_str(p.dtype)
            counts[kind] = counts.get(kind, 0) + p.numel()
    return max(counts, key=counts.get) if counts else "float32"


def check_dynamic_tree(target, runner, draft) -> None:
    """Refuse, naming `tree`, what cannot grow or score a token tree (before any model runs)."""
    check_tree_target(target, runner)
    inner = getattr(draft, "runner", None)
    if not isinstance(draft, ModelDraft) or not isinstance(inner, CachedModel):
        raise bad_value("tree", "auto", "0 or 1 for this draft (a token tree needs a draft model with its own cache)")
    if not isinstance(inner, LeanRunner) and (not inner._has_positions or kv.has_sliding_layers(inner.model)):
        raise bad_value("tree", "auto", "0 or 1 for this draft (its forward needs position_ids and full attention)")


class _DraftSide:
    """The draft's part of a round: the root's logits, then one call per tree level."""

    def __init__(self, draft, slots, start: int):
        self.draft, self.runner = draft, draft.runner
        self.start, self.fed = start, 0
        self.tokens = slots.tokens if draft.rows is None else slots.tokens.clamp_max(draft.rows - 1)
        self.positions = slots.positions
        self.level_seconds: list[float] = []
        self._seen: list[list[int]] = []  # per decoded node: the decoded nodes it attends to (ancestors, itself)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        vocab = self.draft.vocab
        if vocab is not None and vocab < logits.shape[-1]:
            logits = logits.clone()
            logits[..., vocab:] = -float("inf")
        return logits

    def root(self) -> torch.Tensor:
        r = self.runner
        return self._fit(r.feed(self.tokens, self.positions, None, self.start, 1, True))

    def level(self, nodes: list[_Node], which: list[int]) -> torch.Tensor:
        """Decode nodes `which` (their parents already decoded) in one call; logits [1, len(which), V]."""
        r = self.runner
        began = time.perf_counter()
        base = self.positions[0, self.start - 1]
        ids = torch.tensor([nodes[k].token for k in which])
        if self.draft.rows is not None:
            ids = ids.clamp_max(self.draft.rows - 1)
        pos = base + torch.tensor([nodes[k].depth for k in which], dtype=self.positions.dtype)
        total = self.fed + len(which)
        allowed = torch.zeros(len(which), self.start + total, dtype=torch.bool)
        allowed[:, : self.start] = True
        for i, k in enumerate(which):
            nodes[k].fed = self.fed + i
            parent = nodes[k].parent
            seen = (self._seen[nodes[parent].fed] if parent > 0 else []) + [nodes[k].fed]
            self._seen.append(seen)
            allowed[i, [self.start + f for f in seen]] = True
        logits = forward_level(r, ids, pos, allowed, len(which))
        self.fed = total
        r.cached = self.start + total
        r.forwards += 1
        r.positions_fed += len(which)
        spent = time.perf_counter() - began
        r.seconds += spent
        self.level_seconds.append(spent)
        return self._fit(logits)


def _context(groups, path_tokens: list[int]):
    """The scorer's history for a node: each group's ids followed by the path to the node."""
    if not groups:
        return None
    extra = torch.tensor([path_tokens], dtype=groups[0][1].dtype, device=groups[0][1].device)
    return [(rows, torch.cat([ids, extra.expand(ids.shape[0], -1)], dim=1)) for rows, ids in groups]


def _path_tokens(nodes: list[_Node], k: int) -> list[int]:
    out = []
    while k > 0:
        out.append(nodes[k].token)
        k = nodes[k].parent
    return out[::-1]


def _dists(scorer, groups, nodes, which, logits, greedy: bool) -> list[torch.Tensor]:
    """The draft's processed distribution at each node of `which` (greedy: softmax of the processed scores,
    used only to rank; at T > 0 exactly the q the target's p is compared with)."""
    if not scorer.needs_history:
        extra = torch.zeros(1, logits.shape[1], dtype=torch.long)
        probs = (torch.softmax(scorer.scores(None, extra, logits).float(), -1) if greedy
                 else scorer.probs(None, extra, logits))
        return list(probs[0])
    empty = torch.zeros(1, 0, dtype=torch.long)
    out = []
    for i, k in enumerate(which):
        ctx = _context(groups, _path_tokens(nodes, k))
        one = logits[:, i : i + 1]
        out.append(torch.softmax(scorer.scores(ctx, empty, one)[0, 0].float(), -1) if greedy
                   else scorer.probs(ctx, empty, one)[0, 0])
    return out


def grow(tree: DynamicTree, draft_side: _DraftSide, scorer, groups, generator, greedy: bool, depth_room: int
         ) -> tuple[list[_Node], int]:
    """The round's token tree (node 0 is the root, the last committed token) and the number of draft levels."""
    shape, acc = tree.shape, tree.acceptance
    auto = tree.auto
    limits = shape.limits if auto else shape
    node_floor = shape.node_floor() if auto else 0.0
    expand_floor = node_floor + shape.row_floor() if auto else 0.0  # a node decoded in the next level
    nodes = [_Node(-1, -1, 0, 0, 1.0, 1.0, [])]
    nodes[0].dist = _dists(scorer, groups, nodes, [0], draft_side.root().float(), greedy)[0]
    frontier, levels = [0], 0
    depth_max = min(limits.depth, depth_room)
    for depth in range(1, depth_max + 1):
        # Candidate slots, most probable first (EAGLE-2): the r-th child of x scored by value(x) × (the r-th largest
        # q at x). How many children each node gets is fixed here, before they are drawn, from q's sorted values
        # and the other nodes, never from the children themselves.
        cands = []
        for x in frontier:
            top = torch.topk(nodes[x].dist, min(limits.branch, nodes[x].dist.shape[0])).values.tolist()
            cands += [(-(nodes[x].value * v if greedy else nodes[x].reach * acc.chance(depth, r) + 1e-9 * v), x, r)
                      for r, v in enumerate(top) if v > 0]
        cands.sort()
        take: dict[int, int] = {}
        room, count = limits.nodes - (len(nodes) - 1), 0
        for _, x, r in cands:
            if room <= 0 or count >= limits.width:
                break
            if take.get(x, 0) != r:  # each node's children stay a prefix of its draw order
                continue
            if auto and nodes[x].reach * acc.chance(depth, r) < node_floor:
                continue
            take[x], room, count = r + 1, room - 1, count + 1
        if not take:
            break
        new = []
        for x in frontier:
            k = take.get(x, 0)
            if not k:
                continue
            dist = nodes[x].dist
            children = torch.topk(dist, k).indices if greedy else draw_without_replacement(dist, k, generator)
            for r, c in enumerate(children.tolist()):
                reach = nodes[x].reach * acc.chance(depth, r)
                nodes.append(_Node(c, x, depth, r, reach, nodes[x].value * float(dist[c]), []))
                nodes[x].children.append(len(nodes) - 1)
                new.append(len(nodes) - 1)
        if depth == depth_max or len(nodes) - 1 >= limits.nodes:
            break
        # the next level: decode the most promising new nodes (greedy: highest cumulative draft probability; T > 0:
        # highest estimated reach, which favours first-drawn children, then cumulative draft probability)
        ranked = sorted(new, key=lambda k: -nodes[k].value if greedy else (-nodes[k].reach, -nodes[k].value))
        ranked = ranked[: limits.width]
        if auto:
            worth = {k: nodes[k].reach * acc.chance(depth + 1, 0) for k in ranked}
            ranked = [k for k in ranked if worth[k] >= expand_floor]
            if not ranked or sum(worth[k] for k in ranked) < shape.level_floor(len(ranked)):
                break
        logits = draft_side.level(nodes, ranked).float()
        levels += 1
        for k, dist in zip(ranked, _dists(scorer, groups, nodes, ranked, logits, greedy), strict=True):
            nodes[k].dist = dist
        frontier = ranked
    return nodes, levels


def dynamic_round(run: RoundState, tree: DynamicTree) -> tuple[Proposal, Verdict]:
    """One round with a token tree: grow, score in one target pass, walk; returns (Proposal, Verdict) shaped
    like a chain's whose x is the accepted path (padded to the tree's depth), so commit and settle are the
    chain's. Both caches are left holding the accepted path."""
    slots, scorer = run.slots, run.scorer
    greedy, generator, start = not scorer.do_sample, run.generator, slots.size
    device = run.device
    room = run.room()  # batch size 1: the one row's budget
    groups = history_groups([run.history(run.active[0])], device) if scorer.needs_history else None
    clock = (run.draft.seconds, run.draft.forwards)
    began = time.perf_counter()
    side = _DraftSide(run.draft, slots, start)
    nodes, levels = grow(tree, side, scorer, groups, generator, greedy, max(0, room - 1))
    run.meter.add_pick(time.perf_counter() - began - (run.draft.seconds - clock[0]))  # the tree's bookkeeping
    target, before, fed_before = run.target, run.target.seconds, run.target.positions_fed
    tokens = [n.token for n in nodes[1:]]
    logits = feed_token_tree(target, slots.tokens, slots.positions, start, tokens, [n.parent - 1 for n in nodes[1:]],
                             [n.depth for n in nodes[1:]]).to(device)
    run.meter.scoring()
    path, x, token = [], 0, None
    empty = torch.zeros(1, 0, dtype=torch.long, device=device)
    while True:
        ctx = _context(groups, [nodes[k].token for k in path])
        at = logits[:, x : x + 1]
        children = nodes[x].children
        if greedy:
            best = int(scorer.greedy(ctx, empty, at)[0, 0])
            hit = next((c for c in children if nodes[c].token == best), None)
            if hit is None:
                token = best
                break
            path.append(hit)
            x = hit
            continue
        p = scorer.probs(ctx, empty, at)[0, 0]
        if not children:
            token = int(sample(p[None], generator)[0])
            break
        i, token = verify_children(p, nodes[x].dist, torch.tensor([nodes[c].token for c in children]), generator)
        if i < 0:
            break
        path.append(children[i])
        x = children[i]
    last_kind = "bonus" if not nodes[x].children else "resampled"
    keep_cached(target, list(range(start)) + [start + k - 1 for k in path])
    decoded = [nodes[k].fed for k in path if nodes[k].fed >= 0]
    keep_cached(side.runner, list(range(start)) + [start + f for f in decoded])
    path_tokens = [nodes[k].token for k in path]
    slots.append(torch.tensor([path_tokens], dtype=slots.tokens.dtype, device=slots.tokens.device))
    run.meter.scored()
    depth = max((n.depth for n in nodes), default=0)
    x_row = path_tokens + [path_tokens[-1] if path_tokens else 0] * (depth - len(path_tokens))
    proposal = Proposal(torch.tensor([x_row], dtype=run.token_dtype, device=device), None, start, depth,
                        groups, clock)
    run.stats.tree_leaves += len(nodes) - 1
    run.stats.tree_kept += sum(nodes[k].rank > 0 for k in path)
    tree.acceptance.observe(nodes, path, levels, target.positions_fed - fed_before, target.seconds - before,
                            side.level_seconds)
    shown = RoundTree(tuple(tokens), tuple(n.parent - 1 for n in nodes[1:]), tuple(n.depth for n in nodes[1:]),
                      tuple(k - 1 for k in path), int(token), last_kind)
    verdict = Verdict(torch.tensor([len(path)], device=device), torch.tensor([token], device=device),
                      target.seconds - before, last_kind=last_kind, tree=shown)
    return proposal, verdict


def make_tree(tree, seeded: bool, c_prior: float, device: str = "cpu", dtype: str = "float32",
              gamma_auto: bool = False) -> DynamicTree | None:
    """The run's `DynamicTree` for a `tree` argument ("auto" or a `TreeShape`); None for the other values.
    `gamma_auto`: the run's γ is "auto" (tree "auto" then weighs a tree against the best chain)."""
    if isinstance(tree, TreeShape):
        return DynamicTree(tree)
    if tree == "auto":
        return DynamicTree(AutoShape(timed=not seeded, c_prior=c_prior, device=device, dtype=dtype), gamma_auto)
    return None
