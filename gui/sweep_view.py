"""The Sweep tab: the plate's figure from `hfspec.sweep` (the CLI's engine): tokens per pass and speed-up
against γ, measured points ± 1 s.d. over repeats beside the paper's formula."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget

from gui.plots import PALETTE, clear_plot, error_bars, make_plot, unit_line
from gui.widgets import guard_wheel
from hfspec.session import GAMMA_MAX, SweepResult, SweepRow


class SweepView(QWidget):
    run_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.gamma_from = QSpinBox(minimum=1, maximum=GAMMA_MAX, value=1)
        self.gamma_to = QSpinBox(minimum=1, maximum=GAMMA_MAX, value=8)
        self.repeats = QSpinBox(minimum=1, maximum=50, value=3)
        self.repeats.setToolTip("Seeded runs per point, each beside its own plain baseline (error bars: ± 1 s.d.)")
        self.drafts = QLineEdit("rtn4, rtn3-g64")
        self.drafts.setToolTip("Comma-separated draft specs or sibling folders (empty: the draft on the left)")
        self.run_button = QPushButton("Run sweep")
        bar = QHBoxLayout()
        for widget in (QLabel("γ"), self.gamma_from, QLabel("to"), self.gamma_to, QLabel("repeats"), self.repeats,
                       QLabel("drafts")):
            bar.addWidget(widget)
        bar.addWidget(self.drafts, 1)
        bar.addWidget(self.run_button)
        self.run_button.clicked.connect(self.run_requested)

        self.tpp_plot = make_plot("Tokens per target pass against γ", "γ (draft tokens per pass)", "tokens / pass")
        self.speed_plot = make_plot("Speed-up against γ", "γ (draft tokens per pass)", "speed-up (×)")
        self.plots = {"sweep_tokens_per_pass": self.tpp_plot, "sweep_speedup": self.speed_plot}
        self.note = QLabel("Points: measured, fixed length, pooled over the repeats (bars ± 1 s.d.). Lines: the "
                           "formula with α pooled over the points; estimate with the measured c (time), dotted: "
                           "weight-bound ideal (c bytes).")
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#555")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        row = QHBoxLayout()
        row.addWidget(self.tpp_plot)
        row.addWidget(self.speed_plot)
        layout.addLayout(row, 1)
        layout.addWidget(self.note)
        self.wheel_guard = guard_wheel(self)
        self.result: SweepResult | None = None
        self.points: list[SweepRow] = []
        self.clear()

    def gammas(self) -> list[int]:
        a, b = sorted((self.gamma_from.value(), self.gamma_to.value()))
        return list(range(a, b + 1))

    def clear(self) -> None:
        self.points = []
        self.result = None
        self._draw(SweepResult(settings=None, gammas=self.gammas()))

    def add_point(self, point: SweepRow) -> None:
        self.points.append(point)
        self._draw(SweepResult(settings=None, gammas=self.gammas(), points=list(self.points)))

    def show_result(self, result: SweepResult) -> None:
        self.result = result
        self.points = list(result.points)
        self._draw(result)

    def _draw(self, result: SweepResult) -> None:
        for plot in self.plots.values():
            clear_plot(plot)
        self.speed_plot.addItem(unit_line())
        fine = [g / 4 for g in range(4, 4 * max(result.gammas) + 1)]
        for i, draft in enumerate(result.drafts()):
            colour = PALETTE[i % len(PALETTE)]
            pts = [p for p in result.points if p.draft == draft]
            xs = [p.gamma for p in pts]
            curve = result.curve(draft, fine)
            alpha = result.pooled(draft)["alpha"]
            self.tpp_plot.plot(fine, curve["tokens_per_pass"], pen=pg.mkPen(colour, width=2),
                               name=f"{draft}: formula, α={alpha:.2f}")
            tpp = [p.tokens_per_pass for p in pts]
            self.tpp_plot.addItem(error_bars(xs, tpp, [p.tokens_per_pass_sd for p in pts], colour))
            self.tpp_plot.plot(xs, tpp, pen=None, symbol="o", symbolSize=8, symbolBrush=colour, symbolPen="w",
                               name=f"{draft}: measured")
            if result.pooled(draft)["c_time"] > 0:  # no estimate where no draft forward was timed
                self.speed_plot.plot(fine, curve["estimated_speedup"], pen=pg.mkPen(colour, width=2),
                                     name=f"{draft}: estimated")
            self.speed_plot.plot(fine, curve["ideal_speedup"],
                                 pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DotLine), name=f"{draft}: ideal")
            measured = [p.measured_speedup for p in pts]
            self.speed_plot.addItem(error_bars(xs, measured, [p.measured_speedup_sd for p in pts], colour))
            self.speed_plot.plot(xs, measured, pen=None, symbol="t", symbolSize=9, symbolBrush=colour,
                                 symbolPen="k", name=f"{draft}: measured")
