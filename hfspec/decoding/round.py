"""The typed objects of one round, shared by the loop and the tree verifiers: the draft's `Proposal`, the target's
`Verdict`, what the rows `Committed`; and `history_groups`, rows grouped by history length for processors that
read the history."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    """One round's offer: draft tokens x [B, k] from slot `start`, their distributions q [B, k, V] (None: the
    draft proposes deterministically), and γ as asked (a draft may propose fewer)."""

    x: torch.Tensor
    q: torch.Tensor | None
    start: int
    asked: int
    groups: list | None = None  # per-history-length rows, for processors that read the history
    draft_clock: tuple[float, int] = (0.0, 0)  # the draft's (seconds, forwards) before proposing

    @property
    def gamma(self) -> int:
        return self.x.shape[1]


@dataclass(frozen=True)
class RoundTree:
    """One round's token tree as plain data, for live displays. Node k (from 0) holds the draft token `tokens[k]`,
    its parent `parents[k]` (−1: the root, the last committed token; a parent precedes its children) and its
    `depths[k]` (1 under the root). `path`: the accepted nodes, from the root down; `token`: the target's own
    token after them, of `kind` "bonus" (the path ends at a node without children) or "resampled". `texts` and
    `token_text`: the tokens decoded one by one, filled by a live recorder (`hfspec.live`); empty here. `chain`: the
round ran as the plain chain (tree "auto" falls back to it where a tree does not pay): one child per node."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    path: tuple[int, ...]
    token: int
    kind: str
    texts: tuple[str, ...] = ()
    token_text: str = ""
    chain: bool = False  # tree="auto" ran this round as the plain chain (a tree would not have paid)


@dataclass
class Verdict:
    """The target's answer: accepted draft tokens per row `n` [B] and one more token per row [B]."""

    n: torch.Tensor
    token: torch.Tensor
    target_seconds: float
    from_leaf: bool = False  # tree speculation: the token follows an accepted sibling (a bonus, not a replacement)
    last_kind: str | None = None  # a token tree: "bonus" (after a node without children) or "resampled"
    tree: RoundTree | None = None  # a token tree: the round's tree, for live displays


@dataclass
class Committed:
    """What the rows took this round (for statistics, the streamer and `on_round`)."""

    tokens: list[list[int]] = field(default_factory=list)
    kinds: list[list[str]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    checked: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)


def history_groups(histories: list[torch.Tensor], device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rows grouped by history length: (row indices, [rows, length] ids). Rows of a batch advance by different
    amounts, and processors that read the length (min_new_tokens, ...) must see each row's own."""
    by_length: dict[int, list[int]] = {}
    for i, h in enumerate(histories):
        by_length.setdefault(h.shape[0], []).append(i)
    return [(torch.tensor(rows, device=device), torch.stack([histories[i] for i in rows]))
            for rows in by_length.values()]
