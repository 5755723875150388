"""The dashboard's views: live run, γ sweep, compare. Each takes plain data from hfspec.session."""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from hfspec.session import CompareRow, LiveSnapshot, RunResult, SweepPoint, SweepResult
from hfspec.stats import expected_tokens_per_pass

KIND_COLOURS = {  # background of a generated token, by how it was produced
    "accepted": "#b7e4b0",   # draft token the target accepted
    "resampled": "#f6c28b",  # draft rejected: sampled from the residual (target − draft)
    "bonus": "#a9c8f0",      # every draft token accepted: one more from the target
    "target": "#e0e0e0",     # plain decoding
}
KIND_LABELS = {"accepted": "accepted draft token", "resampled": "resampled (draft rejected)",
               "bonus": "bonus token (all accepted)"}
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def configure_pyqtgraph() -> None:
    """White plots, dark axes, antialiased lines (call once the QApplication exists)."""
    pg.setConfigOptions(antialias=True, background="w", foreground="#222")


def make_plot(title: str, x_label: str, y_label: str, x_units: str | None = None,
              y_units: str | None = None) -> pg.PlotWidget:
    widget = pg.PlotWidget()
    item = widget.getPlotItem()
    item.setTitle(title, size="10pt")
    item.setLabel("bottom", x_label, units=x_units)
    item.setLabel("left", y_label, units=y_units)
    item.showGrid(x=False, y=True, alpha=0.2)
    for axis in ("bottom", "left"):
        item.getAxis(axis).enableAutoSIPrefix(False)  # no label re-layout on every range change
    item.addLegend(offset=(-10, -10), labelTextSize="8pt", brush=pg.mkBrush(255, 255, 255, 210),
                   pen=pg.mkPen("#ccc"))
    widget.setMinimumSize(260, 180)
    return widget


def export_png(widget: pg.PlotWidget, path: str, width: int = 1200) -> None:
    """Save one plot as PNG with pyqtgraph's ImageExporter."""
    import pyqtgraph.exporters

    exporter = pyqtgraph.exporters.ImageExporter(widget.getPlotItem())
    exporter.parameters()["width"] = width
    exporter.export(path)


def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{suffix}"


class Metric(QLabel):
    """A big number with a caption."""

    def __init__(self, caption: str, tooltip: str = ""):
        super().__init__()
        self.caption = caption
        self.setToolTip(tooltip)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setMinimumWidth(110)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)  # new text: no relayout
        self.setStyleSheet("QLabel { background: #f4f6f8; border: 1px solid #d8dde3; border-radius: 4px;"
                           " padding: 4px; }")
        self.set_value("—")

    def set_value(self, text: str) -> None:
        self.value_text = text
        self.setText(f"<div style='font-size:10px;color:#555'>{self.caption}</div>"
                     f"<div style='font-size:17px;font-weight:600'>{text}</div>")


# --------------------------------------------------------------------------------------------------- live
class LiveView(QWidget):
    """Rolling acceptance, tokens per pass vs the formula, speed-ups, acceptance by position, coloured text."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.metrics = {
            "alpha": Metric("acceptance α", "accepted / checked draft tokens"),
            "tpp": Metric("tokens / target pass", "new tokens per target forward, bonus included"),
            "expected": Metric("formula E[tokens/pass]", "(1−α^(γ+1))/(1−α): expected tokens per pass for this α and γ"),
            "c": Metric("cost c: bytes · time", "draft/target weight bytes (used by the estimate) · measured "
                        "draft forward time / target forward time"),
            "est": Metric("est. speed-up", "tokens per pass / (1 + γc)"),
            "measured": Metric("measured speed-up", "tokens/s over a plain run of the same length"),
            "passes": Metric("target passes", ""),
            "rate": Metric("tokens / s", "wall clock, this run"),
        }
        metrics_row = QHBoxLayout()
        for metric in self.metrics.values():
            metrics_row.addWidget(metric)

        self.alpha_plot = make_plot("Acceptance rate", "target pass", "α")
        self.alpha_plot.setYRange(0, 1.02)
        self.alpha_plot.enableAutoRange(axis="y", enable=False)
        self.rolling_curve = self.alpha_plot.plot(pen=pg.mkPen(PALETTE[0], width=2), name="rolling (16 passes)")
        self.alpha_curve = self.alpha_plot.plot(pen=pg.mkPen(PALETTE[1], width=2, style=Qt.PenStyle.DashLine),
                                                name="cumulative")

        self.tpp_plot = make_plot("Tokens per target pass", "target pass", "tokens / pass")
        self.pass_points = pg.ScatterPlotItem(size=5, pen=None, brush=pg.mkBrush(120, 120, 120, 110),
                                              name="this pass")
        self.tpp_plot.addItem(self.pass_points)
        self.tpp_curve = self.tpp_plot.plot(pen=pg.mkPen(PALETTE[0], width=2), name="measured (mean)")
        self.expected_curve = self.tpp_plot.plot(pen=pg.mkPen(PALETTE[3], width=2, style=Qt.PenStyle.DashLine),
                                                 name="formula (1−α^(γ+1))/(1−α)")

        self.speed_plot = make_plot("Speed-up over plain decoding", "target pass", "speed-up (×)")
        self.speed_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.PenStyle.DotLine)))
        self.est_curve = self.speed_plot.plot(pen=pg.mkPen(PALETTE[2], width=2), name="estimated tpp/(1+γc)")
        self.measured_curve = self.speed_plot.plot(pen=pg.mkPen(PALETTE[4], width=2), name="measured (wall clock)")

        self.pos_plot = make_plot("Acceptance by draft position", "draft position", "P(accepted)")
        self.pos_plot.setYRange(0, 1.02)
        self.pos_plot.enableAutoRange(axis="y", enable=False)
        self.pos_bars = pg.BarGraphItem(x=[], height=[], width=0.7, brush=PALETTE[0], name="accepted / checked")
        self.pos_plot.addItem(self.pos_bars)

        self.plots = {"acceptance": self.alpha_plot, "tokens_per_pass": self.tpp_plot,
                      "speedup": self.speed_plot, "acceptance_by_position": self.pos_plot}
        grid = QGridLayout()
        grid.setSpacing(4)
        grid.addWidget(self.alpha_plot, 0, 0)
        grid.addWidget(self.tpp_plot, 0, 1)
        grid.addWidget(self.speed_plot, 1, 0)
        grid.addWidget(self.pos_plot, 1, 1)
        plots = QWidget()
        plots.setLayout(grid)

        self.text = QTextEdit()
        self.text.setReadOnly(True)
        font = self.text.font()
        font.setPointSize(font.pointSize() + 1)
        self.text.setFont(font)
        self.text.setMinimumHeight(140)
        legend = QHBoxLayout()
        legend.addWidget(QLabel("Generated text:"))
        for kind, label in KIND_LABELS.items():
            swatch = QLabel(f"<span style='background:{KIND_COLOURS[kind]};'>&nbsp;{label}&nbsp;</span>")
            legend.addWidget(swatch)
        legend.addWidget(QLabel("<span style='color:#666'>prompt in grey</span>"))
        legend.addStretch(1)
        text_box = QWidget()
        tl = QVBoxLayout(text_box)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addLayout(legend)
        tl.addWidget(self.text)

        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(plots)
        splitter.addWidget(text_box)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(metrics_row)
        layout.addWidget(splitter, 1)
        self.result: RunResult | None = None
        self.clear()

    def clear(self, prompt: str = "") -> None:
        self.rounds: list[int] = []
        self.rolling: list[float] = []
        self.alphas: list[float] = []
        self.tpp: list[float] = []
        self.expected: list[float] = []
        self.committed: list[int] = []
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
            self.est.append(s.estimated_speedup)
            if s.measured_speedup is not None:
                self.measured_rounds.append(s.round_index + 1)
                self.measured.append(s.measured_speedup)
            pieces.extend(s.pieces)
            self.last = s
        if pieces:
            self._append_pieces(pieces)
        if self.last is not None:
            s = self.last
            self.metrics["alpha"].set_value(_fmt(s.alpha, 3))
            self.metrics["tpp"].set_value(_fmt(s.tokens_per_pass))
            self.metrics["expected"].set_value(_fmt(s.expected_tokens_per_pass))
            self.metrics["c"].set_value(f"{_fmt(s.c, 3)} · {_fmt(s.c_time, 2)}")
            self.metrics["est"].set_value(_fmt(s.estimated_speedup, 2, "×"))
            self.metrics["measured"].set_value(_fmt(s.measured_speedup, 2, "×"))
            self.metrics["passes"].set_value(str(s.round_index + 1))
            self.metrics["rate"].set_value(_fmt(s.new_tokens / s.elapsed if s.elapsed else None, 1))
        self.redraw()

    def redraw(self) -> None:
        self.rolling_curve.setData(self.rounds, self.rolling)
        self.alpha_curve.setData(self.rounds, self.alphas)
        self.pass_points.setData(self.rounds, self.committed)
        self.tpp_curve.setData(self.rounds, self.tpp)
        self.expected_curve.setData(self.rounds, self.expected)
        self.est_curve.setData(self.rounds, self.est)
        self.measured_curve.setData(self.measured_rounds, self.measured)
        if self.last is not None and self.last.checked_by_position:
            acc, chk = self.last.accepted_by_position, self.last.checked_by_position
            xs = list(range(1, len(chk) + 1))
            heights = [a / c if c else 0.0 for a, c in zip(acc, chk, strict=True)]
            self.pos_bars.setOpts(x=xs, height=heights, width=0.7)
            self.pos_plot.setXRange(0.4, len(xs) + 0.6, padding=0)
            self.pos_plot.getPlotItem().getAxis("bottom").setTicks([[(x, str(x)) for x in xs]])
        else:
            self.pos_bars.setOpts(x=[], height=[], width=0.7)

    def finish(self, result: RunResult) -> None:
        """Final numbers from the finished run (the library's statistics) and the measured speed-up."""
        self.result = result
        summary = result.summary()
        self.metrics["alpha"].set_value(_fmt(summary["alpha"], 3))
        self.metrics["tpp"].set_value(_fmt(summary["tokens_per_pass"]))
        self.metrics["expected"].set_value(_fmt(summary["expected_tokens_per_pass"]))
        self.metrics["c"].set_value(f"{_fmt(summary['c'], 3)} · {_fmt(result.stats.c_time, 2)}")
        self.metrics["est"].set_value(_fmt(summary["estimated_speedup"], 2, "×"))
        self.metrics["measured"].set_value(_fmt(summary["measured_speedup"], 2, "×"))
        self.metrics["passes"].set_value(str(summary["target_passes"]))
        self.metrics["rate"].set_value(_fmt(summary["tokens_per_second"], 1))
        if result.measured_speedup is not None and self.rounds:
            self.measured_rounds = [self.rounds[0], self.rounds[-1]]
            self.measured = [result.measured_speedup] * 2
            self.measured_curve.setData(self.measured_rounds, self.measured)
        if not self.rounds:  # no snapshot came (e.g. zero tokens): still show the final text
            self._append_pieces(result.pieces)

    def _append_pieces(self, pieces, prompt: bool = False) -> None:
        """Append (text, kind) pieces, each on its kind's background (character formats: whitespace kept)."""
        cursor = self.text.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        for text, kind in pieces:
            fmt = QTextCharFormat()
            if kind == "prompt":
                fmt.setForeground(QColor("#777777"))
            else:
                fmt.setBackground(QColor(KIND_COLOURS.get(kind, "#ffffff")))
                fmt.setToolTip(KIND_LABELS.get(kind, kind))
            cursor.insertText(text, fmt)
        self.text.setTextCursor(cursor)
        self.text.ensureCursorVisible()


# -------------------------------------------------------------------------------------------------- sweep
class SweepView(QWidget):
    """The plate's figure: tokens per pass against γ (measured points, formula curve), estimated speed-up."""

    run_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.gamma_from = QSpinBox(minimum=1, maximum=16, value=1)
        self.gamma_to = QSpinBox(minimum=1, maximum=16, value=8)
        self.drafts = QLineEdit("rtn4, rtn3-g64")
        self.drafts.setToolTip("Comma-separated draft specs or sibling folders (empty: the draft on the left)")
        self.run_button = QPushButton("Run sweep")
        bar = QHBoxLayout()
        bar.addWidget(QLabel("γ from"))
        bar.addWidget(self.gamma_from)
        bar.addWidget(QLabel("to"))
        bar.addWidget(self.gamma_to)
        bar.addWidget(QLabel("drafts"))
        bar.addWidget(self.drafts, 1)
        bar.addWidget(self.run_button)
        self.run_button.clicked.connect(self.run_requested)

        self.tpp_plot = make_plot("Tokens per target pass against γ", "γ (draft tokens per pass)",
                                  "tokens / pass")
        self.speed_plot = make_plot("Speed-up against γ", "γ (draft tokens per pass)", "speed-up (×)")
        self.speed_plot.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=Qt.PenStyle.DotLine)))
        self.plots = {"sweep_tokens_per_pass": self.tpp_plot, "sweep_speedup": self.speed_plot}
        self.note = QLabel("Lines: the formula with α pooled over the measured points; dots: measured.")
        self.note.setStyleSheet("color:#555")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        row = QHBoxLayout()
        row.addWidget(self.tpp_plot)
        row.addWidget(self.speed_plot)
        layout.addLayout(row, 1)
        layout.addWidget(self.note)
        self.result: SweepResult | None = None
        self.points: list[SweepPoint] = []

    def gammas(self) -> list[int]:
        a, b = sorted((self.gamma_from.value(), self.gamma_to.value()))
        return list(range(a, b + 1))

    def clear(self) -> None:
        self.points = []
        self.result = None
        for plot in self.plots.values():
            item = plot.getPlotItem()
            for data in list(item.listDataItems()):
                item.removeItem(data)
            item.legend.clear()

    def add_point(self, point: SweepPoint) -> None:
        self.points.append(point)
        self._draw(SweepResult(settings=None, gammas=self.gammas(), points=list(self.points)))

    def show_result(self, result: SweepResult) -> None:
        self.result = result
        self.points = list(result.points)
        self._draw(result)

    def _draw(self, result: SweepResult) -> None:
        for plot in self.plots.values():
            item = plot.getPlotItem()
            for data in list(item.listDataItems()):
                item.removeItem(data)
            item.legend.clear()
        fine = [g / 4 for g in range(4, 4 * max(result.gammas) + 1)]
        for i, draft in enumerate(result.drafts()):
            colour = PALETTE[i % len(PALETTE)]
            pts = [p for p in result.points if p.draft == draft]
            alpha, c = result.pooled(draft)
            xs = [p.gamma for p in pts]
            self.tpp_plot.plot(fine, [expected_tokens_per_pass(alpha, g) for g in fine],
                               pen=pg.mkPen(colour, width=2), name=f"{draft}: formula, α={alpha:.2f}")
            self.tpp_plot.plot(xs, [p.tokens_per_pass for p in pts], pen=None, symbol="o", symbolSize=8,
                               symbolBrush=colour, symbolPen="w", name=f"{draft}: measured")
            self.speed_plot.plot(fine, [expected_tokens_per_pass(alpha, g) / (1 + g * c) for g in fine],
                                 pen=pg.mkPen(colour, width=2), name=f"{draft}: estimated, c={c:.3f}")
            self.speed_plot.plot(xs, [p.estimated_speedup for p in pts], pen=None, symbol="o", symbolSize=7,
                                 symbolBrush=colour, symbolPen="w")
            measured = [(p.gamma, p.measured_speedup) for p in pts if p.measured_speedup is not None]
            if measured:
                self.speed_plot.plot([m[0] for m in measured], [m[1] for m in measured], pen=None, symbol="t",
                                     symbolSize=9, symbolBrush=colour, symbolPen="k",
                                     name=f"{draft}: measured (wall clock)")


# ------------------------------------------------------------------------------------------------ compare
COMPARE_COLUMNS = [("label", "draft"), ("alpha", "α"), ("tokens_per_pass", "tokens/pass"), ("c", "c (bytes)"),
                   ("estimated_speedup", "est. speed-up"), ("measured_speedup", "measured speed-up"),
                   ("tokens_per_second", "tokens/s"), ("new_tokens", "tokens")]
COMPARE_BARS = [("alpha", "α"), ("tokens_per_pass", "tokens / pass"), ("estimated_speedup", "est. speed-up (×)"),
                ("measured_speedup", "measured speed-up (×)")]


class CompareView(QWidget):
    """Several drafts (or 'target | draft' pairs) on the same prompt and settings: a table and a bar chart."""

    run_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.items = QPlainTextEdit("rtn4\nrtn3-g64\nrtn8")
        self.items.setToolTip("One draft per line: rtn4, rtn3-g64, bnb-nf4, a sibling folder, "
                              "or 'target | draft' for another pair")
        self.items.setMaximumHeight(70)
        self.run_button = QPushButton("Run compare")
        self.run_button.clicked.connect(self.run_requested)
        top = QHBoxLayout()
        top.addWidget(QLabel("Drafts\n(one per line)"))
        top.addWidget(self.items, 1)
        top.addWidget(self.run_button, 0, Qt.AlignmentFlag.AlignBottom)

        self.table = QTableWidget(0, len(COMPARE_COLUMNS))
        self.table.setHorizontalHeaderLabels([h for _, h in COMPARE_COLUMNS])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.bar_plot = make_plot("Drafts side by side", "draft", "value")
        self.plots = {"compare": self.bar_plot}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.table)
        splitter.addWidget(self.bar_plot)
        splitter.setStretchFactor(1, 2)
        layout.addWidget(splitter, 1)
        self.rows: list[CompareRow] = []

    def entries(self) -> list[str]:
        return [line.strip() for line in self.items.toPlainText().splitlines() if line.strip()]

    def clear(self) -> None:
        self.rows = []
        self.table.setRowCount(0)
        self._draw()

    def add_row(self, row: CompareRow) -> None:
        self.rows.append(row)
        self._fill()

    def show_rows(self, rows: list[CompareRow]) -> None:
        self.rows = list(rows)
        self._fill()

    def _fill(self) -> None:
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            for col, (key, _) in enumerate(COMPARE_COLUMNS):
                value = getattr(row, key)
                text = value if isinstance(value, str) else (str(value) if isinstance(value, int) else _fmt(value, 3))
                item = QTableWidgetItem(text)
                if not isinstance(value, str):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, col, item)
        self._draw()

    def _draw(self) -> None:
        item = self.bar_plot.getPlotItem()
        item.clear()
        item.legend.clear()
        n = len(COMPARE_BARS)
        width = 0.8 / n
        for k, (key, label) in enumerate(COMPARE_BARS):
            xs = [i + (k - (n - 1) / 2) * width for i in range(len(self.rows))]
            hs = [getattr(row, key) or 0.0 for row in self.rows]
            bars = pg.BarGraphItem(x=xs, height=hs, width=width * 0.95, brush=PALETTE[k], pen=None)
            item.addItem(bars)
            item.legend.addItem(bars, label)
        ticks = [(i, row.label if len(row.label) < 28 else "…" + row.label[-26:]) for i, row in enumerate(self.rows)]
        item.getAxis("bottom").setTicks([ticks])
        if self.rows:
            item.setXRange(-0.6, len(self.rows) - 0.4, padding=0)
