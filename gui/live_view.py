"""The Live tab: metric cards, per-pass plots and the generated text, coloured by how each token was made."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QGridLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from gui.plots import PALETTE, fmt, make_plot, unit_line
from gui.widgets import FlowLayout, Metric
from hfspec.session import ROLLING_WINDOW, LiveSnapshot, RunResult

KIND_COLOURS = {  # background of a generated token, by how it was produced
    "accepted": "#b7e4b0",   # draft token the target accepted
    "resampled": "#f6c28b",  # draft rejected: sampled from the residual (target − draft)
    "bonus": "#a9c8f0",      # every draft token accepted: one more from the target
    "target": "#e0e0e0",     # plain decoding: a pass where the draft proposed nothing
}
KIND_LABELS = {"accepted": "accepted draft token", "resampled": "resampled (draft rejected)",
               "bonus": "bonus token (all accepted)", "target": "target only (plain pass, γ = 0)"}

CARDS = [  # key, caption, tooltip, widest expected value
    ("alpha", "acceptance α", "accepted / checked draft tokens (positions after EOS are not checked)", "0.000"),
    ("tpp", "tokens / pass", "new tokens per target forward, bonus included", "00.00"),
    ("expected", "formula E[tok/pass]", "(1−α^(γ+1))/(1−α) for this α and γ", "00.00"),
    ("c_time", "cost c (time)", "mean draft forward time / mean target forward time, measured in this run",
     "0.000"),
    ("est", "est. speed-up", "(1−α^(γ+1)) / ((1−α)(1+γc)) with the measured c (time)", "00.00×"),
    ("ideal", "weight-bound ideal", "the same formula with c = draft bytes / target bytes: what a machine bound "
     "by weight reads would reach", "00.00× · c 0.000"),
    ("measured", "measured speed-up", "tokens/s of this run over plain decoding of exactly as many tokens "
     "(same prompt and seed), measured right after it", "00.00×"),
    ("baseline", "plain baseline", "the plain run compared with: tokens · tokens/s", "0000 tok · 0000/s"),
    ("rate", "tokens / s", "wall clock, this run", "00000.0"),
    ("passes", "target passes", "", "00000"),
    ("ended", "ended by", "EOS, max tokens, a stop string, or the Stop button", "user (Stop)"),
]


class LiveView(QWidget):
    """Rolling acceptance, tokens per pass vs the formula with γ per pass, speed-ups, acceptance by position,
    the coloured text."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.metrics = {key: Metric(caption, tip, template) for key, caption, tip, template in CARDS}
        cards = QWidget()
        flow = FlowLayout(cards)
        for metric in self.metrics.values():
            flow.addWidget(metric)

        self.alpha_plot = make_plot("Acceptance rate", "target pass", "α")
        self.alpha_plot.setYRange(0, 1.02)
        self.alpha_plot.enableAutoRange(axis="y", enable=False)
        self.rolling_curve = self.alpha_plot.plot(pen=pg.mkPen(PALETTE[0], width=2),
                                                  name=f"rolling ({ROLLING_WINDOW} passes)")
        self.alpha_curve = self.alpha_plot.plot(pen=pg.mkPen(PALETTE[1], width=2, style=Qt.PenStyle.DashLine),
                                                name="cumulative")

        self.tpp_plot = make_plot("Tokens per target pass, γ per pass", "target pass", "tokens", 3)
        self.gamma_curve = self.tpp_plot.plot(pen=pg.mkPen("#999", width=1.5), stepMode="left",
                                              name="γ proposed")
        self.pass_points = pg.ScatterPlotItem(size=5, pen=None, brush=pg.mkBrush(90, 90, 90, 120), name="this pass")
        self.tpp_plot.addItem(self.pass_points)
        self.tpp_curve = self.tpp_plot.plot(pen=pg.mkPen(PALETTE[0], width=2), name="mean")
        self.expected_curve = self.tpp_plot.plot(pen=pg.mkPen(PALETTE[3], width=2, style=Qt.PenStyle.DashLine),
                                                 name="formula")

        self.speed_plot = make_plot("Speed-up over plain decoding", "target pass", "speed-up (×)")
        self.speed_plot.addItem(unit_line())
        self.est_curve = self.speed_plot.plot(pen=pg.mkPen(PALETTE[2], width=2), name="estimated (c time)")
        self.measured_curve = self.speed_plot.plot(pen=pg.mkPen(PALETTE[4], width=2),
                                                   name="measured")

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
        layout.addWidget(cards)
        layout.addWidget(splitter, 1)
        self.result: RunResult | None = None
        self.clear()

    def _text_box(self) -> QWidget:
        self.text = QTextEdit()
        self.text.setReadOnly(True)
        self.text.setMinimumHeight(70)
        legend_row = QWidget()
        legend = FlowLayout(legend_row, spacing=6)
        for kind, label in KIND_LABELS.items():
            swatch = QLabel(f"<span style='background:{KIND_COLOURS[kind]};'>&nbsp;{label}&nbsp;</span>")
            swatch.setToolTip(label)
            legend.addWidget(swatch)
        legend.addWidget(QLabel("<span style='color:#777'>prompt in grey text</span>"))
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy prompt and generated text")
        self.copy_button.clicked.connect(self.copy_text)
        self.save_button = QPushButton("Save…")
        self.save_button.setToolTip("Save prompt and generated text as a .txt file")
        self.save_button.clicked.connect(lambda: self.save_text())
        legend.addWidget(self.copy_button)
        legend.addWidget(self.save_button)
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(legend_row)
        layout.addWidget(self.text)
        return box

    # ------------------------------------------------------------------ data
    def clear(self, prompt: str = "") -> None:
        self.rounds: list[int] = []
        self.rolling: list[float] = []
        self.alphas: list[float] = []
        self.tpp: list[float] = []
        self.expected: list[float] = []
        self.committed: list[int] = []
        self.gammas: list[int] = []
        self.est: list[float] = []
        self.measured: list[float] = []
        self.measured_rounds: list[int] = []
        self.last: LiveSnapshot | None = None
        self.result = None
        self.text.clear()
        if prompt:
            self._append_pieces([(prompt, "prompt")])
        for metric in self.metrics.values():
            metric.set_value("—")
        self.redraw()

    def add(self, snapshots: list[LiveSnapshot]) -> None:
        """Take the snapshots that arrived since the last redraw and redraw once."""
        pieces = []
        for s in snapshots:
            self.rounds.append(s.round_index + 1)
            self.rolling.append(s.rolling_alpha)
            self.alphas.append(s.alpha)
            self.tpp.append(s.tokens_per_pass)
            self.expected.append(s.expected_tokens_per_pass)
            self.committed.append(s.committed)
            self.gammas.append(s.gamma)
            self.est.append(s.estimated_speedup)
            pieces.extend(s.pieces)
            self.last = s
        if pieces:
            self._append_pieces(pieces)
        if self.last is not None:
            s = self.last
            self._show(alpha=s.alpha, tpp=s.tokens_per_pass, expected=s.expected_tokens_per_pass, c_time=s.c_time,
                       est=s.estimated_speedup, passes=s.round_index + 1,
                       rate=s.new_tokens / s.elapsed if s.elapsed else None)
            self.metrics["measured"].set_value("after run")
        self.redraw()

    def redraw(self) -> None:
        self.rolling_curve.setData(self.rounds, self.rolling)
        self.alpha_curve.setData(self.rounds, self.alphas)
        self.pass_points.setData(self.rounds, self.committed)
        self.gamma_curve.setData(self.rounds, self.gammas)
        self.tpp_curve.setData(self.rounds, self.tpp)
        self.expected_curve.setData(self.rounds, self.expected)
        self.est_curve.setData(self.rounds, self.est)
        self.measured_curve.setData(self.measured_rounds, self.measured)
        if self.last is not None and self.last.checked_by_position:
            self._bars(self.last.accepted_by_position, self.last.checked_by_position)
        else:
            self.pos_bars.setOpts(x=[], height=[], width=0.7)

    def _bars(self, accepted: list[int], checked: list[int]) -> None:
        xs = list(range(1, len(checked) + 1))
        heights = [a / c if c else 0.0 for a, c in zip(accepted, checked, strict=True)]
        self.pos_bars.setOpts(x=xs, height=heights, width=0.7)
        self.pos_plot.setXRange(0.4, len(xs) + 0.6, padding=0)
        self.pos_plot.getPlotItem().getAxis("bottom").setTicks([[(x, str(x)) for x in xs]])

    def finish(self, result: RunResult) -> None:
        """Final numbers from the finished run (the library's statistics) and the measured speed-up."""
        self.result = result
        s, b = result.stats, result.baseline
        self._show(alpha=s.alpha, tpp=s.tokens_per_pass, expected=s.expected_tokens_per_pass, c_time=s.c_time,
                   est=s.estimated_speedup, passes=s.target_passes, rate=s.tokens_per_second)
        self.metrics["measured"].set_value(fmt(result.measured_speedup, 2, "×"))
        self.metrics["baseline"].set_value(f"{b.new_tokens} tok · {b.tokens_per_second:.0f}/s" if b else "—")
        self.metrics["ended"].set_value(result.stop_reason or "—")
        if s.checked_by_position:
            self._bars(s.accepted_by_position, s.checked_by_position)
        if result.measured_speedup is not None and self.rounds:
            self.measured_rounds = [self.rounds[0], self.rounds[-1]]
            self.measured = [result.measured_speedup] * 2
            self.measured_curve.setData(self.measured_rounds, self.measured)
        if not self.rounds:  # no snapshot came (e.g. zero tokens): still show the final text
            self._append_pieces(result.pieces)

    def _show(self, alpha, tpp, expected, c_time, est, passes, rate) -> None:
        s = self.result.stats if self.result else None
        self.metrics["alpha"].set_value(fmt(alpha, 3))
        self.metrics["tpp"].set_value(fmt(tpp))
        self.metrics["expected"].set_value(fmt(expected))
        self.metrics["c_time"].set_value(fmt(c_time, 3) if c_time else "—")
        self.metrics["est"].set_value(fmt(est, 2, "×") if c_time else "—")
        if s is not None:
            self.metrics["ideal"].set_value(f"{s.ideal_speedup:.2f}× · c {s.c_bytes:.3f}")
        elif self.last is not None:
            self.metrics["ideal"].set_value(f"c {self.last.c:.3f}")
        self.metrics["passes"].set_value(str(passes))
        self.metrics["rate"].set_value(fmt(rate, 1))

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
                fmt_.setForeground(QColor("#777777"))
            else:
                fmt_.setBackground(QColor(KIND_COLOURS.get(kind, "#ffffff")))
                fmt_.setToolTip(KIND_LABELS.get(kind, kind))
            cursor.insertText(text, fmt_)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()
