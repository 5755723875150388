"""The Compare tab: several drafts (or 'target | draft' pairs) through `hfspec.measure.sweep` at one γ, as a table and
bars with ± 1 s.d. over repeats."""

from __future__ import annotations

from dataclasses import fields

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from gui.figures import ROUGH_BELOW_PAIRS, Conditions, number, row_conditions, row_problem
from gui.plots import (
    PALETTE,
    clear_plot,
    error_bars,
    fmt,
    fmt_sd,
    make_plot,
    retheme_plot,
    spaced_ticks,
    unit_line,
)
from gui.widgets import guard_wheel
from hfspec.compat import new_keys
from hfspec.report import WHY
from hfspec.session import CompareRow

COLUMNS = [  # key, header, tooltip: short headers, the full meaning in the tooltip (fits a 1024×700 window)
    ("label", "draft", "the entry as written (whole, and the target it ran on, in the cell's tooltip)"),
    ("alpha", "α", "acceptance rate, pooled (± 1 s.d. over repeats: in the cell's tooltip and the bars)"),
    ("tokens_per_pass", "tok/pass", "tokens per target pass, pooled (± 1 s.d.: in the cell's tooltip and the bars)"),
    ("c_time", "c (time)", "mean draft forward time / mean target forward time, measured"),
    ("predicted_speedup", "predicted ×", "the cost model's predicted speed-up for the timed runs (± 1 s.d.: in the "
     "cell's tooltip and the bars); — where none exists"),
    ("ideal_speedup", "ideal ×", "ideal speed-up: the paper's formula with c = draft bytes / target bytes "
     "(weight-bound; the measured speed-up can exceed it)"),
    ("measured_speedup", "measured ×", "tokens/s over plain decoding of the same length, measured beside each "
     "run; the cell's tooltip: its ± 1 s.d., the tokens run / plain, torch's CPU threads and the 1-minute load "
     "average while measuring"),
    ("tokens_per_second", "tok/s", "tokens per second: this draft's wall-clock rate (the plain baseline's in "
     "the cell's tooltip)"),
    ("fidelity", "Σmin(p,q)", "draft fidelity: mean overlap of draft and target distributions over the prompt"),
]
# figures folded into the measured × cell's tooltip rather than a column each: key, what it says
FOLDED = [("new_tokens", "tokens run / plain"), ("measured_with", "measured with")]
SD = {"alpha": "alpha_sd", "tokens_per_pass": "tokens_per_pass_sd", "predicted_speedup": "predicted_speedup_sd",
      "measured_speedup": "measured_speedup_sd"}
DOUBT = "?"  # after a measured speed-up not to rely on (rough, unstable, implausible), in the rough colour
DIGITS = {"alpha": 3, "tokens_per_pass": 2, "predicted_speedup": 2, "measured_speedup": 2}  # decimals shown
PLOTS = [  # name, title, y label, bars (key, label), with the 1× line
    ("compare_alpha", "Acceptance α", "α", [("alpha", "α")], False),
    ("compare_tokens_per_pass", "Tokens per target pass", "tokens / pass", [("tokens_per_pass", "tokens / pass")],
     False),
    ("compare_speedup", "Speed-up over plain decoding", "speed-up (×)",
     [("predicted_speedup", "predicted"), ("measured_speedup", "measured")], True),
]


class CompareView(QWidget):
    run_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.items = QPlainTextEdit("rtn4\nrtn3-g64\nrtn8")
        self.items.setToolTip("One draft per line: rtn4, rtn3-g64, bnb-nf4, a sibling folder, "
                              "or 'target | draft' for another pair")
        self.items.setMaximumHeight(70)
        self.repeats = QSpinBox(minimum=1, maximum=50, value=3)
        self.repeats.setToolTip("Seeded runs per draft, each beside its own plain baseline")
        self.run_button = QPushButton("Run compare")
        self.run_button.clicked.connect(self.run_requested)
        side = QVBoxLayout()
        side.addWidget(QLabel("repeats"))
        side.addWidget(self.repeats)
        side.addWidget(self.run_button)
        top = QHBoxLayout()
        top.addWidget(QLabel("Drafts\n(one per line)"))
        top.addWidget(self.items, 1)
        top.addLayout(side)

        self.table = QTableWidget(0, len(COLUMNS))
        for col, (_, header, tip) in enumerate(COLUMNS):
            item = QTableWidgetItem(header)
            item.setToolTip(tip)
            self.table.setHorizontalHeaderItem(col, item)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)  # the figures: as wide as they are
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)  # the draft: what is left, elided
        header.setStretchLastSection(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a folder's both ends stay in view
        self.table.setWordWrap(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.plots = {name: make_plot(title, "draft", y_label, 2) for name, title, y_label, _, _ in PLOTS}
        self.bar_plot = self.plots["compare_speedup"]
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.conditions: Conditions | None = None
        bars = QWidget()
        row = QHBoxLayout(bars)
        row.setContentsMargins(0, 0, 0, 0)
        for plot in self.plots.values():
            plot.setMinimumSize(160, 150)
            row.addWidget(plot)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.table)
        splitter.addWidget(bars)
        splitter.setStretchFactor(1, 2)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.note)
        self.wheel_guard = guard_wheel(self)
        self.rows: list[CompareRow] = []
        self._draw()

    def entries(self) -> list[str]:
        return [line.strip() for line in self.items.toPlainText().splitlines() if line.strip()]

    def clear(self) -> None:
        self.rows = []
        self.table.setRowCount(0)
        self._draw()

    def add_row(self, row: CompareRow) -> None:
        self.rows.append(row)
        self._fill()

    def show_rows(self, rows: list[CompareRow], conditions: Conditions | None = None) -> None:
        self.rows = list(rows)
        self.conditions = conditions or self.conditions
        self._fill()

    @staticmethod
    def rows_from(section: dict):
        """A saved compare (the "compare" section of an export): (rows, the settings it ran with); rows saved under
        the old names read too (`hfspec.compat`)."""
        from hfspec.session import RunSettings

        names = {f.name for f in fields(CompareRow)}
        rows = [CompareRow(**{k: v for k, v in new_keys(row).items() if k in names}) for row in section["rows"]]
        settings = dict(section.get("settings") or {})
        settings.pop("draft", None)
        return rows, RunSettings.from_dict(settings) if settings else None

    def retheme(self) -> None:
        for plot in self.plots.values():
            retheme_plot(plot)
        self._fill()

    def cell(self, row: CompareRow, key: str) -> str:
        """The text of one table cell: the figure alone, its ± 1 s.d. in the cell's tooltip (`tip`) and drawn as
        the bars' error bars; also the text of the figures folded into a tooltip (FOLDED)."""
        if key == "label":
            return row.label
        if key == "new_tokens":
            return f"{row.new_tokens} / {row.baseline_new_tokens}"
        if key == "measured_with":
            with_ = row_conditions(row, self.conditions)
            return with_.text() if with_ else "—"
        if key in ("c_time", "predicted_speedup") and not number(getattr(row, key)):
            return "—"  # none exists (e.g. prompt lookup times no draft forward): not 0
        if key == "tokens_per_second":
            return fmt(row.tokens_per_second, 0)
        text = fmt(getattr(row, key), DIGITS.get(key, 3), "×" if "speedup" in key else "")
        if key == "measured_speedup" and row_problem(row):
            text += " " + DOUBT  # which way it is not to be relied on: the cell's tooltip and the note below
        return text

    def tip(self, row: CompareRow, key: str) -> str:
        """The tooltip of one table cell: the whole entry and its target for the draft; a figure with its ± 1 s.d.;
        for the measured speed-up also the figures folded into it (FOLDED) and why it is not to be relied on."""
        if key == "label":
            return row.label + (f"\ntarget: {row.target}" if row.target else "")
        if key == "tokens_per_second":
            return (f"{fmt(row.tokens_per_second, 1)} tokens/s; plain decoding: "
                    f"{fmt(row.baseline_tokens_per_second, 1)} tokens/s")
        if key not in SD:
            return ""
        value, sd = getattr(row, key), getattr(row, SD[key])
        spread = " (± 1 s.d. over repeats)" if sd is not None else ""
        lines = [] if self.cell(row, key).startswith("—") else [
            fmt_sd(value, sd, DIGITS[key], "×" if "speedup" in key else "") + spread]
        if key == "measured_speedup":
            lines += [f"{what}: {self.cell(row, folded)}" for folded, what in FOLDED]
            lines += [WHY[problem]] if (problem := row_problem(row)) else []
            lines += [text for text in (row.flags, row.warnings) if text]
        return "\n".join(lines)

    def _fill(self) -> None:
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            for col, (key, _, _) in enumerate(COLUMNS):
                item = QTableWidgetItem(self.cell(row, key))
                item.setToolTip(self.tip(row, key))
                if key == "measured_speedup" and row_problem(row):
                    item.setForeground(QColor(theme.current().rough))
                if key != "label":
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, col, item)
        self._draw()

    def _draw(self) -> None:
        """One plot per unit (α, tokens / pass, speed-up with its 1× line); no bar where a row has no figure."""
        colour = 0
        for name, _, _, bars, unit in PLOTS:
            plot = self.plots[name]
            clear_plot(plot)
            item = plot.getPlotItem()
            if unit:
                item.addItem(unit_line())
            width = 0.8 / len(bars)
            for k, (key, label) in enumerate(bars):
                offset = (k - (len(bars) - 1) / 2) * width
                pts = [(i + offset, v, getattr(row, SD[key], None) if key in SD else None)
                       for i, row in enumerate(self.rows) if (v := self._value(row, key)) is not None]
                item.addItem(pg.BarGraphItem(x=[p[0] for p in pts], height=[p[1] for p in pts], width=width * 0.95,
                                             brush=PALETTE[colour % len(PALETTE)], pen=None, name=label))
                colour += 1
                if pts:
                    item.addItem(error_bars([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                                            theme.current().plot_fg))
            if self.rows:
                item.setXRange(-0.6, len(self.rows) - 0.4, padding=0)
        self._ticks()
        problems = [row_problem(r) for r in self.rows]
        counts = {w: problems.count(w) for w in ("rough", "unstable", "implausible") if problems.count(w)}
        listed = "; ".join(f"{n} row(s) {w}" for w, n in counts.items())
        self.note.setText(f"<span style='color:{theme.current().rough}'>Not to rely on (measured × marked {DOUBT}): "
                          f"{listed} (rough: fewer than {ROUGH_BELOW_PAIRS} timed pairs; unstable: the pairs "
                          "disagreed; implausible: above what its passes allow).</span>" if counts else "")

    def _ticks(self) -> None:
        """Draft names under the bars, shortened to the plot's width (again whenever it changes)."""
        for plot in self.plots.values():
            ticks = spaced_ticks([(i, row.label) for i, row in enumerate(self.rows)], max(60, plot.width() - 60))
            plot.getPlotItem().getAxis("bottom").setTicks([ticks])

    def resizeEvent(self, event):  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._ticks()

    @staticmethod
    def _value(row, key: str) -> float | None:
        return number(getattr(row, key))  # None where there is no figure: no bar, not a bar at 0
