"""The Live tab: which settings produced what is on show, metric cards, per-pass plots, the speed-ups of the
timed measurement, and the generated text coloured by how each token was made."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QTextEdit,
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
from gui.plots import PALETTE, fmt, make_plot, retheme_plot, spaced_ticks, unit_line
from gui.widgets import FlowLayout, Metric
from hfspec.decoding.stats import expected_tokens_per_pass
from hfspec.session import ROLLING_WINDOW

KIND_COLOURS = {  # background of a generated token, by how it was produced
    "accepted": "#b7e4b0",   # draft token the target accepted
    "resampled": "#f6c28b",  # draft rejected: sampled from the residual (target − draft)
    "bonus": "#a9c8f0",      # every draft token accepted: one more from the target
    "target": "#e0e0e0",     # plain decoding: a pass where the draft proposed nothing
}
KIND_LABELS = {"accepted": "accepted draft token", "resampled": "resampled (draft rejected)",
               "bonus": "bonus token (all accepted)", "target": "target only (plain pass, γ = 0)"}
KIND_SHORT = {"accepted": "accepted", "resampled": "resampled", "bonus": "bonus", "target": "target only"}

TIMED = "from the timed measurement after the run (speculative decoding without the live display, beside plain " \
        "decoding of the same tokens)"
CARDS = [  # key, caption, tooltip, widest expected value
    ("alpha", "acceptance α", "accepted / checked draft tokens (positions after EOS are not checked)", "0.000"),
    ("tpp", "tokens / pass", "new tokens per target forward, bonus included", "00.00"),
    ("expected", "formula E[tok/pass]", "(1−α^(γ+1))/(1−α) for this α, averaged over the γ each pass proposed",
     "00.00"),
    ("c_time", "cost c (time)", "mean draft forward time / mean target forward time, " + TIMED, "0.000"),
    ("predicted", "predicted speed-up", "the cost model's prediction from the timed run's measured step costs "
     "and tokens per pass, " + TIMED + "; — where none exists", "00.00×"),
    ("ideal", "ideal speed-up", "the paper's formula with c = draft bytes / target bytes: what a machine bound by "
     "weight reads would reach (not an upper bound: the measured speed-up can exceed it)", "00.00× · c 0.000"),
    ("measured", "measured speed-up", "the median per-pair ratio of speculative over plain tokens/s, " + TIMED +
     " (hfspec.measure, the CLI's rule); 'rough' under 3 pairs, 'unstable' when the pairs disagree, 'implausible' "
     "when its own passes cannot produce it", "00.00× implausible"),
    ("timed_rate", "measured tok/s: spec vs plain", "speculative decoding (timed, no display) vs plain decoding "
     "of the same tokens", "00000 vs 00000"),
    ("with", "measured with", "timed (speculative, plain) pairs and the interval of the median ratio, torch's CPU "
     "threads and the machine's 1-minute load average while measuring", "9 pairs 00.00–00.00× · 00 thr · load 00.0"),
    ("rate", "tokens / s live (with display)", "wall clock of the run you watched: it pays for the live "
     "display, so it is below the measured rate", "00000.0"),
    ("passes", "target passes", "", "00000"),
    ("ended", "ended by", "EOS, max tokens, a stop string, or the Stop button", "user (Stop)"),
]
SPEED_BARS = [("predicted", "predicted"), ("measured", "measured"), ("ideal", "ideal")]


def prompt_note(settings, room: int = 60) -> str:
    """' · prompt "…"' for the Shown line: the prompt's start on one line, HTML-escaped."""
    import html

    prompt = " ".join(str(getattr(settings, "prompt", "") or "").split())
    if not prompt:
        return ""
    short = prompt if len(prompt) <= room else prompt[:room - 1] + "…"
    return f" · prompt “{html.escape(short)}”"


class LiveView(QWidget):
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
            plot.setMinimumSize(200, 120)
            grid.addWidget(plot, i // 2, i % 2)
        plots = QWidget()
        plots.setLayout(grid)

        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(plots)
        splitter.addWidget(self._text_box())
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([540, 200])  # proportions: the text keeps about a quarter of the height
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

    def _text_box(self) -> QWidget:
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.text.setMinimumHeight(60)
        legend_row = QWidget()
        legend = FlowLayout(legend_row, spacing=6)
        for kind, label in KIND_LABELS.items():
            swatch = QLabel(f"<span style='background:{KIND_COLOURS[kind]}; color:#000;'>&nbsp;{KIND_SHORT[kind]}"
                            "&nbsp;</span>")
            swatch.setToolTip(label)
            legend.addWidget(swatch)
        self.prompt_swatch = QLabel()
        legend.addWidget(self.prompt_swatch)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy prompt and generated text")
        self.copy_button.clicked.connect(self.copy_text)
        self.save_button = QPushButton("Save…")
        self.save_button.setToolTip("Save prompt and generated text as a .txt file")
        self.save_button.clicked.connect(lambda: self.save_text())
        row = QHBoxLayout()  # the buttons stay at the right, however narrow the window
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(legend_row, 1)
        row.addWidget(self.copy_button)
        row.addWidget(self.save_button)
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.text)
        self._style_prompt_swatch()
        return box

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
        for widget in (self.cards, *self.plots.values()):
            widget.setEnabled(not dim)
            widget.setGraphicsEffect(None)
        if dim:
            from PySide6.QtWidgets import QGraphicsOpacityEffect

            for widget in (self.cards, *self.plots.values()):
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
        self._show_measured(m)
        if s.checked_by_position:
            self._position_bars(s.accepted_by_position, s.checked_by_position)
        self._bars({"predicted": m.predicted_speedup if m else None, "measured": m.speedup if m else None,
                    "ideal": ideal})
        if not self.rounds:  # no snapshot came (a saved run, or zero tokens): the series and the text
            self._replay(shown)
        self._show_origin()

    def _show_measured(self, m) -> None:
        card = self.metrics["measured"]
        if m is None or m.speedup is None:
            card.set_value("—")
            card.set_flag("")
            self.metrics["timed_rate"].set_value("—")
            self.metrics["with"].set_value("—")
            return
        problem = m.unreliable
        why = {"rough": f"Rough: from {m.pairs or 'fewer than 3'} timed pair(s), fewer than 3; rerun for a figure "
                        "to rely on",
               "unstable": "Unstable: the timed pairs disagreed",
               "implausible": "Implausible: not a fact"}.get(problem, "")
        details = "\n".join(x for x in (m.why, m.disagreement and f"predicted vs measured: {m.disagreement}") if x)
        card.set_flag("\n".join(x for x in (why, details) if x) if problem else details)
        if not problem and details:  # a note (busy machine, a disagreement) without a mark on the value
            card.flag = ""
            card.setToolTip(f"{card.tip}\n\n{details}")
            card.restyle()
        card.set_value(f"{m.speedup:.2f}×{' ' + problem if problem else ''}")
        spec = f"{m.speculative_tps:.0f}" if m.speculative_tps else "—"
        plain = f"{m.plain_tps:.0f}" if m.plain_tps else "—"
        self.metrics["timed_rate"].set_value(f"{spec} vs {plain}")
        c = m.conditions
        interval = f" {m.low:.2f}–{m.high:.2f}×" if m.low and m.high and m.low != m.high else ""
        parts = [f"{m.pairs} pair{'s' if m.pairs != 1 else ''}{interval}"] if m.pairs is not None else []
        if c is not None:
            parts += [f"{c.threads} thr" if c.threads is not None else "? thr"]
            parts += [f"load {c.load_avg:.1f}"] if c.load_avg is not None else []
        self.metrics["with"].set_value(" · ".join(parts) or "—")

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
        self._style_prompt_swatch()
        self._show_origin()

    def _style_prompt_swatch(self) -> None:
        self.prompt_swatch.setText(f"<span style='color:{theme.current().muted}'>prompt in grey text</span>")

    # ------------------------------------------------------------------ text
    def plain_text(self) -> str:
        return self.text.toPlainText()

    def copy_text(self) -> None:
        QApplication.clipboard().setText(self.plain_text())

    def save_text(self, path: str | None = None) -> str | None:
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save generated text", "hfspec-text.txt", "Text (*.txt)")
            if not path:
                return None
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.plain_text())
        return path

    def _append_pieces(self, pieces) -> None:
        """Append (text, kind) pieces, each on its kind's background (character formats: whitespace kept)."""
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for text, kind in pieces:
            fmt_ = QTextCharFormat()
            if kind == "prompt":
                fmt_.setForeground(QColor("#808080"))
            elif kind in KIND_COLOURS:
                fmt_.setBackground(QColor(KIND_COLOURS[kind]))
                fmt_.setForeground(QColor("#000000"))  # dark text on the light token colours, in either theme
                fmt_.setToolTip(KIND_LABELS[kind])
            cursor.insertText(text, fmt_)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()
