"""The shape of a token tree (`hfspec.decoding.trees`): a fixed budget (`TreeShape`), or "auto" (`AutoShape`).

Shape (`TreeShape`, or `tree="auto"`): with "auto" (`AutoShape`) a candidate node joins the tree when its
estimated chance to be accepted (its cumulative draft probability times the live acceptance ratio at its depth
and rank) is worth the marginal cost of one more verify position, and a level is drafted when its expected
tokens are worth a draft level: both costs in units of a one-token target pass, from this run's timings, or,
with a seed, from priors fixed before decoding (the draft's bytes ratio times a tree level's prior over a draft
step, and a per-device verify slope), so a seed gives the same text on any load. Where no branch pays, the tree is
a chain; where no tree pays, "auto" runs the round as the plain chain (`hfspec.decoding.tree_choice`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hfspec.decoding.priors import tree_level_prior, verify_slope_prior
from hfspec.validate import bad_value

NODES_MAX, DEPTH_MAX, BRANCH_MAX, WIDTH_MAX = 64, 12, 8, 16
RATE_DECAY = 0.9  # weight of earlier rounds in the run's tokens per unit of cost (`AutoShape.rate`)
SHRINK = 4.0  # pseudo-counts pulling a depth/rank's acceptance ratio to the prior while it has little evidence


@dataclass(frozen=True)
class TreeShape:
    """A fixed tree budget: at most `nodes` nodes, `depth` levels, `branch` children per node and `width` nodes
    expanded per level (one draft call each). Every round fills it with the most probable candidates."""

    nodes: int = 24
    depth: int = 6
    branch: int = 4
    width: int = 4

    def __post_init__(self):
        for name, top in (("nodes", NODES_MAX), ("depth", DEPTH_MAX), ("branch", BRANCH_MAX), ("width", WIDTH_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise bad_value(f"tree.{name}", value, f"an integer from 1 to {top}")


class AutoShape:
    """`tree="auto"`: the budget from the cost model and the live acceptance (module docstring).

    Units: one one-token target pass. `costs()` gives s, a verify position's marginal cost, and c, a draft level's.
    `rate()` ρ: tokens per unit over recent rounds. `chance(d, r)`: the live probability that a node's r-th child
    (draw order) at depth d is accepted when the node is reached: counts by depth and rank, shrunk toward that
    rank's rate pooled over every depth, which is itself shrunk toward a fixed prior. Pooling keeps a few early
    rejections at one depth from closing that depth for the rest of the run (a depth never drafted again gathers
    no evidence to reopen it). A
    node's `reach` is the product of those chances along its path. A candidate joins when its reach ≥ ρ · s; the
    next level is drafted when the expected tokens its first children bring, Σ reach · chance(d + 1, 0), ≥ ρ · c:
    each decision is worth making when it adds tokens faster than the run's rate per unit of cost."""

    PRIOR = (0.7, 0.15)  # chance of a first child, of a later one, before evidence
    PSEUDO = 2.0  # pseudo-counts of the fixed prior in a rank's pooled rate
    DEPTH_PSEUDO = 4.0  # pseudo-counts of the pooled rate in a (depth, rank)'s chance

    def __init__(self, timed: bool, c_prior: float, device: str = "cpu", dtype: str = "float32"):
        self.timed = timed
        self.c_prior = c_prior if c_prior > 0 else 0.2
        self.device, self.dtype = device, dtype
        self.slope_prior = verify_slope_prior(device, dtype, "tree")  # seeded runs: fixed before decoding
        self.level_factor = tree_level_prior(compiled=False)  # a level over a draft step (`DynamicTree.check` sets it)
        self.row_factor = 0.0  # seeded: one more node of a level over a one-node level (`TREE_ROW_PRIOR`, ditto)
        self.limits = TreeShape(NODES_MAX, DEPTH_MAX, BRANCH_MAX, 8)
        self.tried: dict[tuple[int, int], float] = {}
        self.accepted: dict[tuple[int, int], float] = {}
        self.tried_rank: dict[int, float] = {}  # the same counts, pooled over depths
        self.accepted_rank: dict[int, float] = {}
        self.tokens, self.units = 2.0, 1.0 + 4 * self.c_prior  # decayed sums, from a chain-like prior
        self._verify: list[tuple[int, float]] = []  # (positions, seconds) of this run's tree passes
        self._levels: list[float] = []  # seconds per draft level

    def _fit(self) -> tuple[float, float] | None:
        """Verify seconds = a + b · positions over the last passes (None until the widths differ)."""
        pts = self._verify[-64:]
        n = len(pts)
        if n < 4:
            return None
        sx, sy = sum(w for w, _ in pts), sum(t for _, t in pts)
        sxx, sxy = sum(w * w for w, _ in pts), sum(w * t for w, t in pts)
        var = n * sxx - sx * sx
        if var <= 1e-9 * max(1.0, n * sxx):
            return None
        b = (n * sxy - sx * sy) / var
        a = (sy - b * sx) / n
        return (a, b) if a + b > 0 else None

    def costs(self) -> tuple[float, float]:
        """(s, c): a verify position's and a draft level's cost in one-token target passes. Seeded (not timed):
        the priors, so the text never depends on the clock; otherwise this run's fit once it has one."""
        fit = self._fit() if self.timed else None
        if fit is None:
            return self.slope_prior, self.level_prior
        a, b = fit
        step = a + b
        recent = sorted(self._levels[-64:])
        level = recent[len(recent) // 2] if recent else self.level_prior * step
        return max(0.0, b / step), level / step

    @property
    def level_prior(self) -> float:
        """A draft level's cost in one-token target passes, fixed before decoding: a draft step's prior (the bytes
        ratio) times `level_factor` (an eager multi-node call against the chain's step, `TREE_LEVEL_PRIOR`)."""
        return self.c_prior * self.level_factor

    def chance(self, depth: int, rank: int) -> float:
        r = min(rank, BRANCH_MAX)
        key = (min(depth, DEPTH_MAX), r)
        prior = self.PRIOR[0] if rank == 0 else self.PRIOR[1] / rank
        pooled = (self.accepted_rank.get(r, 0.0) + self.PSEUDO * prior) / (self.tried_rank.get(r, 0.0) + self.PSEUDO)
        return ((self.accepted.get(key, 0.0) + self.DEPTH_PSEUDO * pooled)
                / (self.tried.get(key, 0.0) + self.DEPTH_PSEUDO))

    def rate(self) -> float:
        return self.tokens / self.units

    def node_floor(self) -> float:
        return self.rate() * self.costs()[0]

    def level_floor(self, width: int = 1) -> float:
        """What a level of `width` nodes must bring in expected tokens: the rate times its cost."""
        return self.rate() * self.level_cost(width)

    def level_cost(self, width: int) -> float:
        """A draft level of `width` nodes in one-token target passes: seeded, a one-node level's prior × (1 + row ×
        (width − 1)) (the packed kernels' cost grows with their rows); timed, the run's median level."""
        level = self.costs()[1]
        return level if self.timed else level * (1.0 + self.row_factor * (max(1, width) - 1))

    def row_floor(self) -> float:
        """What expanding one more node of a level must bring beyond its verify position (seeded: its row of the
        level's products; timed: 0, the measured level holds the run's usual widths)."""
        return 0.0 if self.timed else self.rate() * self.costs()[1] * self.row_factor

    def observe(self, nodes: list, path: list[int], levels: int, positions: int, verify_seconds: float,
                level_seconds: list[float]) -> None:
        """After a round: the tree, the accepted path (node indices), the draft levels run and the verify pass."""
        for at, v in enumerate([0, *path]):
            children = nodes[v].children
            nxt = path[at] if at < len(path) else None
            for r, c in enumerate(children):
                self._count(nodes[c].depth, r, c == nxt)
        s, c = self.costs()
        self._rate(len(path) + 1, 1 + s * max(0, positions - 1) + c * levels)
        if self.timed:
            self._verify.append((positions, verify_seconds))
            self._levels.extend(level_seconds)

    def observe_chain(self, gamma: int, accepted: int) -> None:
        """After a round run as the chain: its draft tokens are first children (the draft's one draw, or its
        argmax, at each depth), so they count for chance(d, 0); the run's rate hears of the round too."""
        for depth in range(1, min(accepted + 1, gamma) + 1):
            self._count(depth, 0, depth <= accepted)
        self._rate(accepted + 1, 1 + (self.costs()[0] + self.c_prior) * gamma)

    def _count(self, depth: int, rank: int, hit: bool) -> None:
        """One node tried at (depth, rank), accepted or not: by depth and rank, and pooled over depths."""
        key = (min(depth, DEPTH_MAX), min(rank, BRANCH_MAX))
        self.tried[key] = self.tried.get(key, 0.0) + 1.0
        self.tried_rank[key[1]] = self.tried_rank.get(key[1], 0.0) + 1.0
        if hit:
            self.accepted[key] = self.accepted.get(key, 0.0) + 1.0
            self.accepted_rank[key[1]] = self.accepted_rank.get(key[1], 0.0) + 1.0

    def _rate(self, tokens: float, units: float) -> None:
        """A round's tokens and cost (one-token target passes) into the run's decayed rate `rate()`."""
        self.tokens = RATE_DECAY * self.tokens + tokens
        self.units = RATE_DECAY * self.units + units
