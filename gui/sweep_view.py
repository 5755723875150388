"""The Sweep tab: the plate's figure from `hfspec.measure.sweep` (the CLI's engine): tokens per pass and speed-up
against γ, measured points ± 1 s.d. over repeats beside the paper's formula."""

from __future__ import annotations

from dataclasses import fields

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget

from gui import theme
from gui.figures import ROUGH_BELOW_PAIRS, Conditions, row_conditions, row_problem
from gui.plots import PALETTE, clear_plot, error_bars, make_plot, retheme_plot, unit_line
from gui.widgets import guard_wheel
from hfspec.compat import new_keys
from hfspec.session import GAMMA_MAX, SweepResult, SweepRow

NOTE = ("Points: measured speed-up, fixed length, pooled over the repeats (bars ± 1 s.d.). Lines, with α pooled over "
        "the points: tokens per pass from the formula; predicted speed-up (the cost models fitted at the points), "
        "dotted: ideal speed-up (the paper's formula with c bytes).")


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
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.conditions: Conditions | None = None
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

    def show_result(self, result: SweepResult, conditions: Conditions | None = None) -> None:
        self.result = result
        self.points = list(result.points)
        self.conditions = conditions
        self._draw(result)

    @staticmethod
    def rows_from(section: dict) -> SweepResult:
        """A saved sweep (the "sweep" section of an export) as a SweepResult; rows saved under the old names read
        too (`hfspec.compat`)."""
        from hfspec.session import RunSettings

        names = {f.name for f in fields(SweepRow)}
        points = [SweepRow(**{k: v for k, v in new_keys(row).items() if k in names}) for row in section["rows"]]
        settings = dict(section.get("settings") or {})
        gammas = settings.pop("gamma", None)
        settings.pop("draft", None)
        gammas = gammas if isinstance(gammas, list) else sorted({p.gamma for p in points})
        return SweepResult(settings=RunSettings.from_dict(settings) if settings else None,
                           gammas=[int(g) for g in gammas if str(g).isdigit()] or [1], points=points,
                           repeats=section.get("repeats") or 1)

    def retheme(self) -> None:
        for plot in self.plots.values():
            retheme_plot(plot)
        self._note()
        self._draw(self.result or SweepResult(settings=None, gammas=self.gammas(), points=list(self.points)))

    def _note(self) -> None:
        problems = [row_problem(p) for p in self.points]
        counts = {w: problems.count(w) for w in ("rough", "unstable", "implausible") if problems.count(w)}
        with_ = row_conditions(self.points[0], self.conditions) if self.points else None
        text = NOTE
        if with_ is not None:
            text += f" Measured with {with_.text()} (torch threads, 1-minute load average)."
        if counts:
            what = {"rough": f"Rough (fewer than {ROUGH_BELOW_PAIRS} timed pairs)",
                    "unstable": "unstable (the pairs disagreed)",
                    "implausible": "implausible (above what their passes allow; drawn at the axis edge)"}
            listed = "; ".join(f"{n} point(s) {what[w]}" for w, n in counts.items())
            text += (f" <span style='color:{theme.current().rough}'>Hollow markers: {listed}. Raise repeats or "
                     "rerun on a quieter machine for figures to rely on.</span>")
        self.note.setText(text)
        self.note.setStyleSheet(f"color:{theme.current().muted}")

    def _draw(self, result: SweepResult) -> None:
        for plot in self.plots.values():
            clear_plot(plot)
        self.speed_plot.addItem(unit_line())
        self._note()
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
            if result.pooled(draft)["c_time"] > 0:  # no prediction where no draft forward was timed
                self.speed_plot.plot(fine, curve["predicted_speedup"], pen=pg.mkPen(colour, width=2),
                                     name=f"{draft}: predicted")
            self.speed_plot.plot(fine, curve["ideal_speedup"],
                                 pen=pg.mkPen(colour, width=1, style=Qt.PenStyle.DotLine), name=f"{draft}: ideal")
            top = speed_top(result.points)
            measured = [min(p.measured_speedup, top * 0.97) for p in pts]  # an implausible 20× sits at the edge
            self.speed_plot.addItem(error_bars(xs, measured, [p.measured_speedup_sd if p.measured_speedup < top
                                                              else 0.0 for p in pts], colour))
            brushes = [None if row_problem(p) else colour for p in pts]  # unreliable points are hollow
            self.speed_plot.plot(xs, measured, pen=None, symbol="t", symbolSize=9, symbolBrush=brushes,
                                 symbolPen=colour, name=f"{draft}: measured")
        if result.points:
            self.speed_plot.setYRange(0, speed_top(result.points), padding=0)


def speed_top(points) -> float:
    """The speed-up axis's top: set by the plausible values (hfspec.report.speed_axis, as the CLI's plot)."""
    from hfspec.report import speed_axis

    plausible = []
    for p in points:
        plausible += [p.predicted_speedup, p.paper_speedup, p.ideal_speedup]
        plausible.append(p.speedup_bound if row_problem(p) else (p.measured_speedup_high or p.measured_speedup))
    return speed_axis([v for v in plausible if v])[1]
