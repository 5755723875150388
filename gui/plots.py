"""Plot helpers shared by the views: pyqtgraph plots in the theme's colours with their legend below the axes
(never over the data, in as many columns as fit), titles and y labels elided to the plot, error bars, ticks that
never overlap, PNG export with the settings, number formatting."""

from __future__ import annotations

import math
import weakref

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from gui import theme

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
LEGEND_ROW = 4  # PlotItem's layout: 0 title, 1 top axis, 2 view box, 3 bottom axis; the legend goes under it
TITLE_SIZE = "10pt"
TICK_ROOM_PX = 26  # pixels of y axis per labelled tick: an 8-9 pt label and a gap (no two labels overlap)
SAMPLE_PX = 20  # a legend entry's line / symbol sample
LEGEND_SPACING = 10  # pixels between a legend's sample and its label, and between entries
LABEL_MARGIN_PX = 10  # a pyqtgraph LabelItem's text margins


class SpacedAxis(pg.AxisItem):
    """A y axis whose labelled ticks are spaced by the axis's height in pixels: `TICK_ROOM_PX` apart at least,
    on the next coarser 1-2-5 step (up to the axis's span). pyqtgraph always labels its first tick level, however
    short the axis, so on a short plot (seen at 1024×700) "0.8 0.6 0.4 0.2" ran into each other."""

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802, N803 - pyqtgraph's names
        levels = super().tickSpacing(minVal, maxVal, size)
        if self.orientation not in ("left", "right") or not levels or self._tickSpacing is not None:
            return levels
        span = abs(maxVal - minVal)
        if not span or size <= 0:
            return levels
        kept = [(spacing, offset) for spacing, offset in levels if spacing / span * size >= TICK_ROOM_PX]
        if kept:  # a tall axis: pyqtgraph's levels, less the ones too dense to label
            return kept
        spacing = levels[0][0]
        while 0 < spacing < span and spacing / span * size < TICK_ROOM_PX:
            spacing = coarser(spacing)
        return [(spacing, 0)]


def coarser(spacing: float) -> float:
    """The next step of 1, 2, 5 × 10^k above `spacing`."""
    power = 10.0 ** math.floor(math.log10(spacing))
    for step in (1, 2, 5, 10):
        if step * power > spacing * (1 + 1e-9):
            return step * power
    return 10 * power


class FittingLegend(pg.LegendItem):
    """A legend in as many columns (up to the plot's `columns`) as fit in `room` pixels, each entry elided in the
    middle when even one column is too narrow for it (the whole of it in its tooltip): entries no longer run
    past a narrow plot's right edge (seen at 1024×700)."""

    def __init__(self, columns: int, **kwargs):
        super().__init__(colCount=columns, horSpacing=LEGEND_SPACING, **kwargs)
        self.columns = columns
        self.room = 0
        self.plot = lambda: None  # a weak reference to the widget to refit after entries are added (a strong
        # one made a cycle that the garbage collector could free on the worker thread: a deadlock with Qt)

    def addItem(self, item, name):  # noqa: N802 - pyqtgraph's name
        super().addItem(item, name)
        self.items[-1][1].full_text = name
        self.fit()
        if (plot := self.plot()) is not None:
            plot.refit()

    def fit(self, room: int | None = None) -> None:
        """Columns and entries for `room` pixels (the last room given when None)."""
        from PySide6.QtGui import QFont, QFontMetrics

        self.room = self.room if room is None else room
        if not self.items or self.room <= 0:
            return
        font = QFont(self.items[0][1].item.font())
        font.setPointSizeF(float(self.opts["labelTextSize"].removesuffix("pt")))
        metrics = QFontMetrics(font)
        beside = SAMPLE_PX + 2 * LEGEND_SPACING + LABEL_MARGIN_PX  # the sample, the gaps, the label's margins
        widest = max(metrics.horizontalAdvance(label.full_text) for _, label in self.items) + beside
        columns = max(1, min(self.columns, int(self.room // widest)))
        self.setColumnCount(columns)
        room = max(24, int(self.room // columns) - beside)
        for _, label in self.items:
            text = metrics.elidedText(label.full_text, Qt.TextElideMode.ElideMiddle, room)
            if text != label.text:
                label.setText(text)
                label.setToolTip(label.full_text if text != label.full_text else "")


class FittedPlot(pg.PlotWidget):
    """A plot that fits its title, y label and legend to its size on every resize (`fit_plot`)."""

    def resizeEvent(self, event):  # noqa: N802 - Qt's name
        if hasattr(self, "plot_title"):
            fit_plot(self, event.size().width())  # before the plot item takes the new size: its minimum shrinks
        super().resizeEvent(event)

    def refit(self) -> None:
        """The plot item back to the widget's size: it grows to its layout's minimum (a long title or legend)
        and stays that wide when the minimum shrinks again unless told."""
        if not self.closed:
            pg.GraphicsView.setRange(self, self.range, padding=0, disableAutoPixel=False)


def configure_pyqtgraph() -> None:
    """Plots in the current theme's colours, antialiased lines (call once the QApplication exists)."""
    t = theme.current()
    pg.setConfigOptions(antialias=True, background=t.plot_bg, foreground=t.plot_fg)


def make_plot(title: str, x_label: str, y_label: str, legend_columns: int = 2) -> FittedPlot:
    """A plot whose legend sits in its own row below the x axis: named items added later are listed there."""
    widget = FittedPlot(axisItems={"left": SpacedAxis("left")})
    item = widget.getPlotItem()
    item.setLabel("bottom", x_label)
    item.setLabel("left", y_label)
    widget.plot_y_label = y_label  # the full label, for `fit_y_label`
    legend = FittingLegend(legend_columns, offset=None, labelTextSize="8pt", verSpacing=-6)
    item.layout.addItem(legend, LEGEND_ROW, 1)
    item.legend = legend  # PlotItem.addItem lists every item given a name here
    legend.plot = weakref.ref(widget)
    set_title(widget, title)
    item.vb.sigResized.connect(lambda *_: fit_y_label(widget))  # a short plot elides its y label
    item.showGrid(x=False, y=True, alpha=0.2)
    for axis in ("bottom", "left"):
        item.getAxis(axis).enableAutoSIPrefix(False)  # no label re-layout on every range change
    widget.setMinimumSize(220, 150)
    return widget


def set_title(widget: pg.PlotWidget, title: str) -> None:
    """The plot's title, elided to the plot's width (the whole of it in the title's tooltip)."""
    widget.plot_title = title  # kept for `fit_title` and `retheme_plot`
    widget.getPlotItem().titleLabel.shown_title = None
    fit_title(widget)


def text_room(widget: pg.PlotWidget, width: int | None = None) -> int:
    """Pixels across the plot's data area: the widget (`width` wide, else as it is now) less its y axis and a
    margin."""
    axis = widget.getPlotItem().getAxis("left")
    return int((widget.width() if width is None else width) - (axis.width() if axis.isVisible() else 0) - 16)


def fit_title(widget: pg.PlotWidget, width: int | None = None) -> None:
    """The title elided with "…" to the data area's width: a long title would widen the plot past its widget
    and be cut off at the edge (seen at 1024×700)."""
    from PySide6.QtGui import QFont, QFontMetrics

    full = getattr(widget, "plot_title", "")
    label = widget.getPlotItem().titleLabel
    font = QFont(label.item.font())
    font.setPointSizeF(float(TITLE_SIZE.removesuffix("pt")))
    text = QFontMetrics(font).elidedText(full, Qt.TextElideMode.ElideRight, max(40, text_room(widget, width)))
    if text != getattr(label, "shown_title", None):
        label.shown_title = text
        widget.getPlotItem().setTitle(text, size=TITLE_SIZE, color=theme.current().plot_fg)
        label.setToolTip(full if text != full else "")


def fit_plot(widget: pg.PlotWidget, width: int | None = None) -> None:
    """Title, y label and legend fitted to the plot's size (on every resize; `width`: the new width)."""
    fit_title(widget, width)
    fit_y_label(widget)
    widget.getPlotItem().legend.fit(text_room(widget, width))


def fit_y_label(widget: pg.PlotWidget) -> None:
    """The y-axis label elided to the axis's height: a rotated label longer than its axis runs into the title
    and the neighbouring plot (seen at 1024×700). The full label stays in the tooltip."""
    from PySide6.QtGui import QFontMetrics

    axis = widget.getPlotItem().getAxis("left")
    full = getattr(widget, "plot_y_label", "")
    room = int(axis.geometry().height()) - 6
    if not full or room <= 0:
        return
    text = QFontMetrics(axis.label.font()).elidedText(full, Qt.TextElideMode.ElideRight, room)
    if text != axis.labelText:
        axis.setLabel(text, color=theme.current().plot_fg)
        axis.setToolTip(full if text != full else "")


def retheme_plot(widget: pg.PlotWidget) -> None:
    """Restyle a plot in the current theme (after the system's colour scheme changed)."""
    t = theme.current()
    widget.setBackground(t.plot_bg)
    item = widget.getPlotItem()
    item.titleLabel.shown_title = None
    fit_title(widget)
    for name in ("bottom", "left"):
        axis = item.getAxis(name)
        axis.setPen(t.plot_fg)
        axis.setTextPen(t.plot_fg)
        axis.setLabel(axis.labelText, color=t.plot_fg)
    item.legend.setLabelTextColor(t.plot_fg)


def spaced_ticks(labels: list[tuple[float, str]], width_px: int, char_px: int = 7,
                 keep: str = "end") -> list[tuple[float, str]]:
    """Tick labels that never overlap in `width_px` pixels: each shortened with "…" to its share of the width
    (keeping its `keep` "end", as a path's last part, or its "start", as "L3" of "L3 attn"), and only every k-th
    kept when even 4 characters would not fit."""
    if not labels:
        return []
    min_chars = 4
    step = 1
    while (width_px * step // len(labels) - 8) // char_px < min(min_chars, max(len(t) for _, t in labels)):
        step += 1
        if step >= len(labels):
            break
    chars = max(min_chars, (width_px * step // len(labels) - 8) // char_px)

    def cut(text: str) -> str:
        if len(text) <= chars:
            return text
        return "…" + text[-(chars - 1):] if keep == "end" else text[:chars - 1] + "…"

    return [(x, cut(text)) for x, text in labels[::step]]


def clear_plot(widget: pg.PlotWidget) -> None:
    """Remove every item and legend entry."""
    item = widget.getPlotItem()
    item.clear()
    item.legend.clear()


def unit_line() -> pg.InfiniteLine:
    """The dotted y = 1 line of speed-up plots (plain decoding's speed)."""
    return pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen("#888", style=pg.QtCore.Qt.PenStyle.DotLine))


def error_bars(xs, ys, sds, colour: str) -> pg.ErrorBarItem:
    """± 1 s.d. bars (no bar where the s.d. is unknown)."""
    half = np.array([sd or 0.0 for sd in sds], dtype=float)
    return pg.ErrorBarItem(x=np.array(xs, dtype=float), y=np.array(ys, dtype=float), top=half, bottom=half,
                           beam=0.15, pen=pg.mkPen(colour, width=1.5))


def export_png(widget: pg.PlotWidget, path: str, caption: str = "", metadata: dict | None = None,
               width: int = 1200) -> None:
    """Save one plot (legend included) as PNG, with `caption` (the settings it shows) printed under it and
    `metadata` written as PNG text chunks (QImage.text(key) reads them back)."""
    import pyqtgraph.exporters
    from PySide6.QtCore import QRect, Qt
    from PySide6.QtGui import QColor, QFont, QImage, QPainter

    exporter = pyqtgraph.exporters.ImageExporter(widget.getPlotItem())
    exporter.parameters()["width"] = width
    plot = exporter.export(toBytes=True)
    lines = caption.count("\n") + 1 if caption else 0
    font = QFont()
    font.setPixelSize(14)
    band = lines * 20 + 12 if lines else 0
    image = QImage(plot.width(), plot.height() + band, QImage.Format.Format_ARGB32)
    image.fill(QColor(theme.current().plot_bg))
    painter = QPainter(image)
    painter.drawImage(0, 0, plot)
    if caption:
        painter.setPen(QColor(theme.current().plot_fg))
        painter.setFont(font)
        painter.drawText(QRect(10, plot.height() + 4, plot.width() - 20, band - 4),
                         int(Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap), caption)
    painter.end()
    for key, value in (metadata or {}).items():
        image.setText(key, str(value))
    if not image.save(path, "PNG"):
        raise OSError(f"could not write {path}")


def fmt(value, digits: int = 2, suffix: str = "") -> str:
    """A number for a card or table cell; "—" for None / NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def fmt_sd(value, sd, digits: int = 3, suffix: str = "") -> str:
    """"0.812 ± 0.021" (just the value when the s.d. is unknown)."""
    text = fmt(value, digits, suffix)
    return text if sd is None or value is None else f"{text} ± {sd:.{digits}f}"
