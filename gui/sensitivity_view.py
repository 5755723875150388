"""The Sensitivity tab: which of the target's matrices cost its quantised draft the most acceptance
(`hfspec.drafts.sensitivity`: one unit quantised at a time), as bars of overlap lost per unit, largest first,
with the fully quantised draft's loss as a line and the report's advice under the plot."""

from __future__ import annotations

import html

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QGridLayout, QLabel, QPushButton, QSpinBox, QVBoxLayout, QWidget

from gui.plots import PALETTE, clear_plot, make_plot, retheme_plot, spaced_ticks
from gui.widgets import guard_wheel
from hfspec.drafts.rtn import RTN_BITS
from hfspec.drafts.sensitivity import BY, METHODS, TOKENS_RANGE

GROUPS = (32, 64, 128, 256)
DEFAULT_TOKENS = 256  # the tab's default: a quick report (the CLI's default is 512)
GUI_GPTQ = "gptq in the method box above"  # the advice's switch to GPTQ, in the tab's words (not the CLI's flag)
KIND_COLOURS = {"attention": PALETTE[0], "mlp": PALETTE[2], "head": PALETTE[1]}  # others: PALETTE[3]


class SensitivityView(QWidget):
    run_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.bits = QSpinBox(minimum=RTN_BITS[0], maximum=RTN_BITS[1], value=4)
        self.bits.setToolTip("Bits of the draft's codes")
        self.group = QComboBox()
        self.group.addItems([str(g) for g in GROUPS])
        self.group.setToolTip("Weights per group along the input dimension (each group has its own scale and zero)")
        self.method = QComboBox()
        self.method.addItems(list(METHODS))
        self.method.setToolTip("rtn: round to nearest; gptq: calibrated on the same text (slower to build)")
        self.by = QComboBox()
        self.by.addItems(list(BY))
        self.by.setToolTip("layer: each layer's attention and MLP matrices, and the head; matrix: every matrix alone")
        self.tokens = QSpinBox(minimum=TOKENS_RANGE[0], maximum=4096, value=DEFAULT_TOKENS, singleStep=64)
        self.tokens.setToolTip("Positions of text the target samples itself (seeded) that the overlap is measured on")
        self.run_button = QPushButton("Run sensitivity")
        self.run_button.setToolTip("Quantise one unit of the form's target at a time and measure what it costs")
        self.run_button.clicked.connect(self.run_requested)
        top = QGridLayout()  # two rows: the tab fits beside the form at 1024 × 700
        for i, (label, widget) in enumerate((("bits", self.bits), ("group", self.group), ("method", self.method),
                                             ("by", self.by), ("tokens", self.tokens))):
            top.addWidget(QLabel(label), i // 3, 2 * (i % 3))
            top.addWidget(widget, i // 3, 2 * (i % 3) + 1)
        top.addWidget(self.run_button, 1, 4, 1, 2)
        top.setColumnStretch(6, 1)
        self.plot = make_plot("Overlap lost with only this unit quantised", "unit", "1 − Σmin(p, q)", 4)
        self.note = QLabel("Which matrices cost the draft its acceptance: run it on the form's target.")
        self.note.setWordWrap(True)
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addWidget(self.plot, 1)
        self.plots = {"sensitivity": self.plot}  # File → Export plots
        layout.addWidget(self.note)
        self.wheel_guard = guard_wheel(self)
        self.report = None
        self.bars: pg.BarGraphItem | None = None

    def options(self) -> dict:
        """`hfspec.drafts.sensitivity.sensitivity`'s arguments from the tab."""
        return {"bits": self.bits.value(), "group_size": int(self.group.currentText()),
                "method": self.method.currentText(), "by": self.by.currentText(), "tokens": self.tokens.value()}

    def clear(self) -> None:
        self.report = None
        self._draw()

    def show_report(self, report) -> None:
        self.report = report
        self._draw()

    def retheme(self) -> None:
        retheme_plot(self.plot)
        self._draw()

    def _draw(self) -> None:
        clear_plot(self.plot)
        item = self.plot.getPlotItem()
        self.bars = None
        r = self.report
        if r is None or not r.units:
            self.plot.getPlotItem().getAxis("bottom").setTicks([[]])
            return
        by_kind: dict[str, list[int]] = {}
        for i, unit in enumerate(r.units):
            by_kind.setdefault(unit.kind if unit.kind in KIND_COLOURS else "other", []).append(i)
        for kind, index in by_kind.items():  # one bar item per kind: its colour and its legend entry
            bars = pg.BarGraphItem(x=index, height=[r.units[i].loss for i in index], width=0.8, pen=None,
                                   brush=KIND_COLOURS.get(kind, PALETTE[3]), name=kind)
            item.addItem(bars)
            self.bars = self.bars or bars
        item.addItem(pg.InfiniteLine(pos=r.full_loss, angle=0, pen=pg.mkPen("#888", style=Qt.PenStyle.DashLine),
                                     label=f"all units quantised: {r.full_loss:.3f}",
                                     labelOpts={"position": 0.85, "color": "#888", "anchors": [(1, 1), (1, 1)]}))
        item.setXRange(-0.6, len(r.units) - 0.4, padding=0)
        item.setYRange(0, max(r.full_loss, max(u.loss for u in r.units)) * 1.1 or 1.0, padding=0)
        self._ticks()
        notes = "".join(f"<br>note: {html.escape(n)}" for n in r.notes)
        self.note.setText(
            f"<b>{html.escape(r.method)}{r.bits}-g{r.group_size}</b> by {html.escape(r.by)} over {r.tokens} positions "
            f"of the target's own text: all units quantised keep overlap {r.full_overlap:.3f} (loss "
            f"{r.full_loss:.3f}; the units' losses sum to {r.sum_loss:.3f}).<br>{html.escape(r.advice(gptq=GUI_GPTQ))}{notes}")

    def provenance(self) -> tuple[str, dict]:
        """An exported plot's caption and settings: the report's width, method, units and text."""
        r = self.report
        if r is None:
            return "", {}
        settings = {k: getattr(r, k) for k in ("bits", "group_size", "method", "by", "tokens", "seed")}
        return (f"{r.method}{r.bits}-g{r.group_size} by {r.by} · {r.tokens} positions of the target's own text · seed "
                f"{r.seed} · all units quantised lose {r.full_loss:.3f}"), settings

    def unit_losses(self) -> list[tuple[str, float]]:
        """(unit, loss) as drawn, left to right."""
        return [(u.name, u.loss) for u in self.report.units] if self.report else []

    def _ticks(self) -> None:
        """Unit names under the bars, shortened to the plot's width (again whenever it changes)."""
        names = [(i, short_name(u.name)) for i, u in enumerate(self.report.units)] if self.report else []
        # the layer's number first: the bar's colour already says attention, MLP or head
        ticks = spaced_ticks(names, max(60, self.plot.width() - 60), keep="start")
        self.plot.getPlotItem().getAxis("bottom").setTicks([ticks])

    def resizeEvent(self, event):  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._ticks()


def short_name(unit: str) -> str:
    """A tick label: "layer 3 attention" -> "L3 attn", "model.layers.3.mlp.up_proj" -> "L3 up_proj"."""
    words = unit.split(" ")
    if len(words) == 3 and words[0] == "layer":
        return f"L{words[1]} {'attn' if words[2] == 'attention' else words[2]}"
    parts = unit.split(".")
    layer = next((p for p in parts if p.isdigit()), None)
    return f"L{layer} {parts[-1]}" if layer is not None else parts[-1]


class SensitivityActions:
    """A mixin of MainWindow: start the Sensitivity tab's job on the form's target, show its report."""

    def start_sensitivity(self) -> bool:
        from gui.worker import Job

        settings = self._settings()
        if settings is None:
            return False
        self.tabs.setCurrentWidget(self.sensitivity)
        return self._start(Job("sensitivity", settings, options=self.sensitivity.options()))

    def _show_sensitivity(self, report) -> None:
        self.sensitivity.show_report(report)
        self.controls.set_points_done(len(report.units), len(report.units))
        self.controls.progress.setFormat(f"{len(report.units)} / {len(report.units)} units measured")
        top = report.units[0] if report.units else None
        most = f", most costly: {top.name} ({top.loss:.3f})" if top else ""
        self._status(f"Sensitivity done: {len(report.units)} units, all quantised lose {report.full_loss:.3f}{most}")
