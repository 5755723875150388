"""The Live tab: which settings produced what is on show, metric cards (`live_cards`), per-pass plots, the last
pass's token tree (`tree_view`), the speed-ups of the timed measurement, and the generated text coloured by how
each token was made (`live_text`)."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QLabel,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from gui.figures import (
    Conditions,
    ShownRun,
    changed_fields,
    describe,
    gap,
    number,
)
from gui.live_cards import CARDS, show_measured
from gui.live_text import GeneratedText
from gui.plots import PALETTE, fmt, make_plot, retheme_plot, spaced_ticks, unit_line
from gui.tree_view import TreeView
from gui.widgets import FlowLayout, Metric
from hfspec.decoding.stats import expected_tokens_per_pass
from hfspec.session import ROLLING_WINDOW

TEXT_SIZES, TREE_SIZES = [540, 200], [540, 360]  # proportions of plots and text (and tree): a quarter, 2 fifths
PLOT_MIN_HEIGHT = 180  # below this title, axes and legend squeeze a plot's data to a line: the plots scroll
SPEED_BARS = [("predicted", "predicted"), ("measured", "measured"), ("ideal", "ideal")]


def prompt_note(settings, room: int = 60) -> str:
    """' · prompt "…"' for the Shown line: the prompt's start on one line, HTML-escaped."""
    import html

    prompt = " ".join(str(getattr(settings, "prompt", "") or "").split())
    if not prompt:
        return ""
    short = prompt if len(prompt) <= room else prompt[:room - 1] + "…"
    return f" · prompt “{html.escape(short)}”"


class LiveView(GeneratedText, QWidget):
    """Rolling acceptance, tokens per pass vs the formula with γ per pass, speed-ups, acceptance by position,
    the coloured text."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.origin = QLabel()
        self.origin.setWordWrap(True)
        self.origin.setTextFormat(Qt.TextFormat.RichText)
        self.exactness = QLabel()
        self.exactness.setWordWrap(True)
        self.exactness.hide()
        self.metrics = {key: Metric(caption, tip, template) for key, caption, tip, template in CARDS}
        self.cards = QWidget()
        flow = FlowLayout(self.cards)
        for metric in self.metrics.values():
            flow.addWidget(metric)

        self.alpha_plot = make_plot("Acceptance rate", "target pass", "α")
        self.alpha_plot.setYRange(0, 1.02)
        self.alpha_plot.enableAutoRange(axis="y", enable=False)
        # symbols as well as lines: a pass that checked something between two that did not (NaN gaps) has no
        # line segment, and would not show at all
        self.rolling_curve = self.alpha_plot.plot(pen=pg.mkPen(PALETTE[0], width=2), connect="finite",
                                                  symbol="o", symbolSize=4, symbolPen=None,
                                                  symbolBrush=PALETTE[0], name=f"rolling ({ROLLING_WINDOW} passes)")
        self.alpha_curve = self.alpha_plot.plot(pen=pg.mkPen(PALETTE[1], width=2, style=Qt.PenStyle.DashLine),
                                                connect="finite", symbol="o", symbolSize=3, symbolPen=None,
                                                symbolBrush=PALETTE[1], name="cumulative")

        self.tpp_plot = make_plot("Tokens per target pass, γ per pass", "target pass", "tokens", 3)
        self.gamma_curve = self.tpp_plot.plot(pen=pg.mkPen("#999", width=1.5), stepMode="left",
                                              name="γ proposed")
        self.pass_points = pg.ScatterPlotItem(size=5, pen=None, brush=pg.mkBrush(90, 90, 90, 120), name="this pass")
        self.tpp_plot.addItem(self.pass_points)
        self.tpp_curve = self.tpp_plot.plot(pen=pg.mkPen(PALETTE[0], width=2), name="mean")
        self.expected_curve = self.tpp_plot.plot(pen=pg.mkPen(PALETTE[3], width=2, style=Qt.PenStyle.DashLine),
                                                 connect="finite", name="formula")

        self.speed_plot = make_plot("Speed-up over plain decoding (timed)", "", "speed-up (×)", 3)
        self.speed_plot.addItem(unit_line())
        self.speed_bars = {}
        for i, (key, label) in enumerate(SPEED_BARS):
            bars = pg.BarGraphItem(x=[], height=[], width=0.6, brush=PALETTE[(2, 4, 3)[i]], pen=None, name=label)
            self.speed_plot.addItem(bars)
            self.speed_bars[key] = bars
        self.speed_plot.getPlotItem().getAxis("bottom").setTicks([[(i, label) for i, (_, label)
                                                                   in enumerate(SPEED_BARS)]])
        self.speed_plot.setXRange(-0.6, len(SPEED_BARS) - 0.4, padding=0)

        self.pos_plot = make_plot("Acceptance by draft position", "draft position", "P(accepted)")
        self.pos_plot.setYRange(0, 1.02)
        self.pos_plot.enableAutoRange(axis="y", enable=False)
        self.pos_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=PALETTE[0], name="accepted / checked")
        self.pos_plot.addItem(self.pos_bars)

        self.plots = {"acceptance": self.alpha_plot, "tokens_per_pass": self.tpp_plot,
                      "speedup": self.speed_plot, "acceptance_by_position": self.pos_plot}
        grid = QGridLayout()
        grid.setSpacing(4)
        grid.setContentsMargins(0, 0, 0, 0)
        for i, plot in enumerate(self.plots.values()):
            plot.setMinimumSize(200, PLOT_MIN_HEIGHT)
            grid.addWidget(plot, i // 2, i % 2)
        plots = QWidget()
        plots.setLayout(grid)
        self.plot_scroll = QScrollArea()  # on a small screen (1024×700) the plots scroll, at a readable height
        self.plot_scroll.setWidget(plots)
        self.plot_scroll.setWidgetResizable(True)
        self.plot_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.plot_scroll.setMinimumHeight(120)

        self.tree_view = TreeView()  # beside the text while the run on show grows token trees
        self.tree_view.setMinimumSize(200, 120)
        self.tree_view.hide()
        self.lower = QSplitter(Qt.Orientation.Horizontal)
        self.lower.addWidget(self._text_box())
        self.lower.addWidget(self.tree_view)
        self.lower.setChildrenCollapsible(False)
        self.splitter = splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.plot_scroll)
        splitter.addWidget(self.lower)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes(TEXT_SIZES)
        splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addWidget(self.origin)
        layout.addWidget(self.exactness)
        layout.addWidget(self.cards)
        layout.addWidget(splitter, 1)
        self.result: ShownRun | None = None
        self.shown_settings = None
        self._pending = ""
        self._changed: list[str] = []
        self.clear()

    # ------------------------------------------------------------------ what is on show
    def set_pending(self, description: str) -> None:
        """A job with other settings started: the results on show stay (greyed) until its first data."""
        self._pending = description
        self._dim(bool(description))
        self._show_origin()

    def form_changed(self, form_settings) -> None:
        """The form now holds `form_settings`: say which of them differ from the results on show."""
        self._changed = changed_fields(self.shown_settings, form_settings)
        self._show_origin()

    def _dim(self, dim: bool) -> None:
        for widget in (self.cards, self.tree_view, *self.plots.values()):
            widget.setEnabled(not dim)
            widget.setGraphicsEffect(None)
        if dim:
            from PySide6.QtWidgets import QGraphicsOpacityEffect

            for widget in (self.cards, self.tree_view, *self.plots.values()):
                effect = QGraphicsOpacityEffect(widget)
                effect.setOpacity(0.35)
                widget.setGraphicsEffect(effect)

    def is_dimmed(self) -> bool:
        return not self.cards.isEnabled()

    def set_exactness(self, note: str) -> None:
        """What "exact" means for the shown run's target when it is not float32 ("" hides the line)."""
        self.exactness.setText(note)
        self.exactness.setVisible(bool(note))

    def _show_origin(self) -> None:
        t = theme.current()
        self.exactness.setStyleSheet(f"color:{t.muted};")
        if self.shown_settings is None:
            text = "No run yet: choose settings on the left and press Run (Ctrl+R or Enter)."
            style = f"color:{t.muted};"
        else:
            where = f" (opened from {self.result.source})" if self.result and self.result.source else ""
            text = f"<b>Shown:</b> {describe(self.shown_settings)}{prompt_note(self.shown_settings)}{where}"
            style = ""
            if self._pending:
                text += f"<br><b>Now loading:</b> {self._pending} (the results above are the previous run's)"
                style = f"background:{t.stale_bg};"
            elif self._changed:
                text += (f"<br>The form has changed since ({', '.join(self._changed)}): press Run to see results of "
                         "the form's settings.")
                style = f"background:{t.stale_bg};"
        self.origin.setText(text)
        self.origin.setStyleSheet(f"QLabel {{ {style} padding: 2px 4px; }}")

    # ------------------------------------------------------------------ data
    def clear(self, prompt: str = "", settings=None) -> None:
        self.rounds: list[int] = []
        self.rolling: list[float] = []
        self.alphas: list[float] = []
        self.tpp: list[float] = []
        self.expected: list[float] = []
        self.committed: list[int] = []
        self.gammas: list[int] = []
        self._window: list[tuple[int, int]] = []
        self.last = None
        self.result = None
        self.shown_settings = settings
        self._pending = ""
        self._changed = []
        self._dim(False)
        self.set_exactness("")
        self.text.clear()
        if not self.tree_view.isHidden():
            self.tree_view.clear()
            self.tree_view.hide()
            self.splitter.setSizes(TEXT_SIZES)
        if prompt:
            self._append_pieces([(prompt, "prompt")])
        for metric in self.metrics.values():
            metric.set_value("—")
        self._bars({})
        self._show_origin()
        self.redraw()

    def add(self, snapshots) -> None:
        """Take the snapshots that arrived since the last redraw and redraw once."""
        pieces = []
        for s in snapshots:
            self.last = s
            self._push(s.round_index + 1, s.gamma, s.accepted, s.checked, s.committed, s.tokens_per_pass,
                       self._cumulative_alpha())
            pieces.extend(s.pieces)
        if pieces:
            self._append_pieces(pieces)
        grown = next((s for s in reversed(snapshots) if s.tree is not None and s.tree.tokens), None)
        if grown is not None:  # the last pass that grew a tree (the last passes may have no room for one)
            self.tree_view.show_tree(grown.tree, grown.round_index + 1)
            if self.tree_view.isHidden():
                self.tree_view.show()
                self.splitter.setSizes(TREE_SIZES)
                self.lower.setSizes([1, 1])
        if self.last is not None:
            s = self.last
            self.metrics["alpha"].set_value(fmt(self._cumulative_alpha(), 3))
            self.metrics["tpp"].set_value(fmt(s.tokens_per_pass))
            self.metrics["expected"].set_value(fmt(number(self.expected[-1])))
            self.metrics["passes"].set_value(str(s.round_index + 1))
            self.metrics["rate"].set_value(fmt(s.new_tokens / s.elapsed if s.elapsed else None, 1))
            for key in ("c_time", "predicted", "measured", "timed_rate", "with"):
                self.metrics[key].set_value("after run")
        self.redraw()

    def _cumulative_alpha(self) -> float | None:
        """α so far; None while nothing was checked."""
        s = self.last
        if s is None or not s.checked_by_position or not sum(s.checked_by_position):
            return None
        return s.alpha

    def _push(self, index: int, gamma: int, accepted: int, checked: int, committed: int, tpp: float,
              alpha: float | None) -> None:
        """One target pass onto the curves; a pass that checked nothing has no acceptance rate: a gap, not 0."""
        self.rounds.append(index)
        self._window = (self._window + [(accepted, checked)])[-ROLLING_WINDOW:]
        in_window = sum(k for _, k in self._window)
        self.rolling.append(sum(a for a, _ in self._window) / in_window if checked and in_window else math.nan)
        self.alphas.append(alpha if checked and alpha is not None else math.nan)
        self.tpp.append(tpp)
        self.committed.append(committed)
        self.gammas.append(gamma)
        self.expected.append(gap(expected_tokens_per_pass(alpha, self.gammas) if alpha is not None else None))

    def redraw(self) -> None:
        self.rolling_curve.setData(self.rounds, self.rolling)
        self.alpha_curve.setData(self.rounds, self.alphas)
        self.pass_points.setData(self.rounds, self.committed)
        self.gamma_curve.setData(self.rounds, self.gammas)
        self.tpp_curve.setData(self.rounds, self.tpp)
        self.expected_curve.setData(self.rounds, self.expected)
        if self.last is not None and self.last.checked_by_position:
            self._position_bars(self.last.accepted_by_position, self.last.checked_by_position)
        elif self.result is None:
            self.pos_bars.setOpts(x=[], height=[], width=0.7)

    def _position_bars(self, accepted: list[int], checked: list[int]) -> None:
        xs = [i + 1 for i, c in enumerate(checked) if c]  # an unchecked position has no rate: no bar
        heights = [accepted[x - 1] / checked[x - 1] for x in xs]
        self.pos_bars.setOpts(x=xs, height=heights, width=0.7)
        n = max(len(checked), 1)
        self.pos_plot.setXRange(0.4, n + 0.6, padding=0)
        ticks = spaced_ticks([(x, str(x)) for x in range(1, n + 1)], self.pos_plot.width() - 60)
        self.pos_plot.getPlotItem().getAxis("bottom").setTicks([ticks])

    def _bars(self, values: dict) -> None:
        """Speed-up bars; no bar where there is no figure (never a bar at 0)."""
        for i, (key, _) in enumerate(SPEED_BARS):
            v = number(values.get(key))
            self.speed_bars[key].setOpts(x=[i] if v else [], height=[v] if v else [], width=0.6)
        if any(number(v) for v in values.values()):
            top = max(number(v) or 0.0 for v in values.values())
            self.speed_plot.setYRange(0, max(1.2, top * 1.1), padding=0)

    def finish(self, result, conditions: Conditions | None = None) -> None:
        """Show a finished run (a RunResult of this session, or a ShownRun opened from a file)."""
        shown = result if isinstance(result, ShownRun) else ShownRun.from_result(result, conditions)
        if self.shown_settings is None or self._pending:
            self.clear(getattr(result, "prompt_text", "") if not isinstance(result, ShownRun) else
                       shown.data.get("prompt", ""), shown.settings)
        self.result, self.shown_settings, self._pending = shown, shown.settings, ""
        self._dim(False)
        s, m = shown.stats, shown.measured
        alpha = s.alpha if s.checked else None
        self.metrics["alpha"].set_value(fmt(alpha, 3))
        self.metrics["tpp"].set_value(fmt(s.tokens_per_pass))
        self.metrics["expected"].set_value(fmt(s.expected_tokens_per_pass if alpha is not None else None))
        self.metrics["passes"].set_value(str(s.target_passes))
        self.metrics["rate"].set_value(fmt(number(s.tokens_per_second), 1))
        self.metrics["ended"].set_value(shown.stop_reason or "—")
        ideal = number(s.ideal_speedup) if alpha is not None else None
        self.metrics["ideal"].set_value(f"{ideal:.2f}× · c {s.c_bytes:.3f}" if ideal else "—")
        from hfspec.measure import ideal_note

        note = ideal_note(m.stats or s, m.speedup) if m is not None else ""
        self.metrics["ideal"].set_flag("")
        self.metrics["ideal"].setToolTip(self.metrics["ideal"].tip + (f"\n\nNow: {note}" if note else ""))
        self.metrics["c_time"].set_value(fmt(m.c_time, 3) if m else "—")
        self.metrics["predicted"].set_value(fmt(m.predicted_speedup, 2, "×") if m else "—")
        show_measured(self.metrics, m)
        if s.checked_by_position:
            self._position_bars(s.accepted_by_position, s.checked_by_position)
        self._bars({"predicted": m.predicted_speedup if m else None, "measured": m.speedup if m else None,
                    "ideal": ideal})
        if not self.rounds:  # no snapshot came (a saved run, or zero tokens): the series and the text
            self._replay(shown)
        self._show_origin()

    def _replay(self, shown: ShownRun) -> None:
        """Curves and text of a run whose live snapshots this view did not see (opened from a file)."""
        checked_so_far = 0
        for row in shown.data.get("series") or []:
            checked_so_far += row.get("checked", 0)
            self._push(int(row["pass"]), row["gamma"], row.get("accepted", 0), row.get("checked", 0),
                       row.get("committed", 0), row["tokens_per_pass"], row["alpha"] if checked_so_far else None)
        self.redraw()
        if shown.stats.checked_by_position:
            self._position_bars(shown.stats.accepted_by_position, shown.stats.checked_by_position)
        self._append_pieces(shown.pieces)

    # ------------------------------------------------------------------ theme
    def retheme(self) -> None:
        for plot in self.plots.values():
            retheme_plot(plot)
        for metric in self.metrics.values():
            metric.restyle()
        self.tree_view.retheme()
        self._style_prompt_swatch()
        self._show_origin()
