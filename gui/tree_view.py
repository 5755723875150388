"""The Live tab's drawing of the last token tree a run grew (tree "auto", `hfspec.decoding.trees`; the pass is named): the
draft's tokens as nodes, laid out by depth (x) and by rank under their parent (y), edges parent → child; the
accepted path in the accepted colour with bold text, the target's own token after it marked as resampled or
bonus, the other drafted tokens grey."""

from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QVBoxLayout, QWidget

from gui import theme
from gui.live_text import KIND_COLOURS
from gui.plots import make_plot, retheme_plot, set_title

LABEL_CHARS = 6  # a node's text is cut to this many characters, then "…"
OTHER_COLOUR = "#c8c8c8"  # drafted, not accepted
TITLE = "Token tree of the last pass"
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥"}


def short(text: str) -> str:
    """A token's text for a node: whitespace made visible, cut to LABEL_CHARS."""
    text = "".join(VISIBLE.get(ch, ch) for ch in text) or "∅"
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"


def layout(parents: tuple[int, ...]) -> list[int]:
    """A row per node (the root's children under −1): a first child shares its parent's row, each later child
    opens the next free row, depth first, so every branch reads left to right on one line."""
    children: dict[int, list[int]] = {}
    for k, parent in enumerate(parents):
        children.setdefault(parent, []).append(k)
    rows, free = [0] * len(parents), 1
    stack = [(k, 0 if i == 0 else None) for i, k in enumerate(children.get(-1, []))][::-1]
    while stack:
        k, row = stack.pop()
        if row is None:
            row, free = free, free + 1
        rows[k] = row
        stack += [(c, row if i == 0 else None) for i, c in enumerate(children.get(k, []))][::-1]
    return rows


class TreeView(QWidget):
    """`show_tree(tree)` draws a `hfspec.decoding.round.RoundTree` in `plot`; `kinds` says what each drawn node is
    ("root", "accepted", "drafted", then "resampled" or "bonus" for the target's token) and `labels` holds their
    texts, in the same order."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.plot = make_plot(TITLE, "", "", 2)
        item = self.plot.getPlotItem()
        item.hideAxis("left")
        item.showGrid(x=False, y=False)
        item.setMouseEnabled(x=False, y=False)
        self.edges = item.plot(pen=pg.mkPen("#9a9a9a", width=1), connect="pairs")
        self.path_edges = item.plot(pen=pg.mkPen("#3c9a3c", width=3), connect="pairs")
        self.final_edge = item.plot(pen=pg.mkPen("#777", width=2, style=Qt.PenStyle.DashLine), connect="pairs")
        self.points = {}
        for kind, name in (("accepted", "accepted path"), ("drafted", "not accepted"),
                           ("resampled", "target: resampled"), ("bonus", "target: bonus")):
            colour = KIND_COLOURS.get(kind, OTHER_COLOUR)
            self.points[kind] = pg.ScatterPlotItem(size=11, pen=pg.mkPen("#555"), brush=pg.mkBrush(colour), name=name,
                                                   symbol="s" if kind in ("resampled", "bonus") else "o")
            self.plot.addItem(self.points[kind])
        self.points["root"] = pg.ScatterPlotItem(size=9, pen=pg.mkPen("#555"), brush=pg.mkBrush("#ffffff"))
        self.plot.addItem(self.points["root"])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot)
        self.kinds: list[str] = []
        self.labels: list[pg.TextItem] = []
        self.tree = self.pass_number = None

    def retheme(self) -> None:
        retheme_plot(self.plot)
        if self.tree is not None:
            self.show_tree(self.tree, self.pass_number)

    def clear(self) -> None:
        self.tree = self.pass_number = None
        self._draw([], [], [], [], [])

    def show_tree(self, tree, pass_number: int | None = None) -> None:
        """Draw `tree` (a RoundTree; node texts from `texts`, else the token ids) of target pass `pass_number`."""
        self.tree, self.pass_number = tree, pass_number
        rows = layout(tree.parents)
        path = set(tree.path)
        texts = tree.texts or tuple(str(t) for t in tree.tokens)
        pos = [(0.0, 0.0)] + [(float(d), -float(r)) for d, r in zip(tree.depths, rows, strict=True)]
        kinds = ["root"] + ["accepted" if k in path else "drafted" for k in range(len(tree.tokens))]
        labels = ["…"] + [short(t) for t in texts]
        edges = [(1 + k, 1 + p if p >= 0 else 0) for k, p in enumerate(tree.parents)]
        last = 1 + tree.path[-1] if tree.path else 0
        x, y = pos[last]
        pos.append((x + 1, y + 0.5))  # the target's token: half a row above the path's first rejected child
        kinds.append(tree.kind)
        labels.append(short(tree.token_text or str(tree.token)))
        edges.append((len(pos) - 1, last))
        self._draw(pos, kinds, labels, edges, [1 + k for k in tree.path])

    def _draw(self, pos, kinds, labels, edges, path) -> None:
        item = self.plot.getPlotItem()
        for label in self.labels:
            item.removeItem(label)
        self.kinds, self.labels = list(kinds), []
        for kind, scatter in self.points.items():
            mine = [p for p, k in zip(pos, kinds, strict=True) if k == kind]
            scatter.setData(x=[p[0] for p in mine], y=[p[1] for p in mine])
        on_path = set(path) | {0}
        plain, bold, final = [], [], []
        for child, parent in edges:
            pair = [pos[parent], pos[child]]
            if kinds[child] in ("resampled", "bonus"):
                final += pair
            elif child in on_path and parent in on_path:
                bold += pair
            else:
                plain += pair
        for curve, points in ((self.edges, plain), (self.path_edges, bold), (self.final_edge, final)):
            curve.setData([p[0] for p in points], [p[1] for p in points])
        fg = theme.current().plot_fg
        for (x, y), kind, text in zip(pos, kinds, labels, strict=True):
            weight = "bold" if kind in ("accepted", "resampled", "bonus") else "normal"
            label = pg.TextItem(html=f"<span style='color:{fg}; font-weight:{weight}'>{html.escape(text)}</span>",
                                anchor=(0.5, -0.15) if kind in ("resampled", "bonus") else (0.5, 1.15))
            label.setPos(x, y)
            item.addItem(label)
            self.labels.append(label)
        depth = max((p[0] for p in pos), default=1.0)
        low = min((p[1] for p in pos), default=0.0)
        item.setXRange(-0.5, depth + 0.5, padding=0)
        item.getAxis("bottom").setTicks([[(d, str(d)) for d in range(int(depth) + 1)]])
        item.setYRange(low - 0.6, 1.2, padding=0)
        which = f"pass {self.pass_number}" if self.pass_number else "the last pass"
        shape = ("Chain (tree \"auto\" fell back: a tree would not have paid)" if getattr(self.tree, "chain", False)
                 else "Token tree")
        title = (f"{shape} of {which}: {len(kinds) - 2} drafted, {kinds.count('accepted')} accepted, "
                 f"{kinds[-1]}" if kinds else TITLE)
        set_title(self.plot, title)
