"""Plot helpers shared by the views: pyqtgraph plots in the theme's colours with their legend below the axes
(never over the data), error bars, ticks that never overlap, PNG export with the settings, number formatting."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from gui import theme

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
LEGEND_ROW = 4  # PlotItem's layout: 0 title, 1 top axis, 2 view box, 3 bottom axis; the legend goes under it


def configure_pyqtgraph() -> None:
    """Plots in the current theme's colours, antialiased lines (call once the QApplication exists)."""
    t = theme.current()
    pg.setConfigOptions(antialias=True, background=t.plot_bg, foreground=t.plot_fg)


def make_plot(title: str, x_label: str, y_label: str, legend_columns: int = 2) -> pg.PlotWidget:
    """A plot whose legend sits in its own row below the x axis: named items added later are listed there."""
    widget = pg.PlotWidget()
    item = widget.getPlotItem()
    widget.plot_title = title  # kept for `retheme_plot`
    item.setTitle(title, size="10pt", color=theme.current().plot_fg)
    item.setLabel("bottom", x_label)
    item.setLabel("left", y_label)
    widget.plot_y_label = y_label  # the full label, for `fit_y_label`
    item.vb.sigResized.connect(lambda *_: fit_y_label(widget))  # a short plot elides its y label
    item.showGrid(x=False, y=True, alpha=0.2)
    for axis in ("bottom", "left"):
        item.getAxis(axis).enableAutoSIPrefix(False)  # no label re-layout on every range change
    legend = pg.LegendItem(offset=None, labelTextSize="8pt", colCount=legend_columns, verSpacing=-6)
    item.layout.addItem(legend, LEGEND_ROW, 1)
    item.legend = legend  # PlotItem.addItem lists every item given a name here
    widget.setMinimumSize(220, 150)
    return widget


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
    item.setTitle(getattr(widget, "plot_title", ""), size="10pt", color=t.plot_fg)
    for name in ("bottom", "left"):
        axis = item.getAxis(name)
        axis.setPen(t.plot_fg)
        axis.setTextPen(t.plot_fg)
        axis.setLabel(axis.labelText, color=t.plot_fg)
    item.legend.setLabelTextColor(t.plot_fg)


def spaced_ticks(labels: list[tuple[float, str]], width_px: int, char_px: int = 7) -> list[tuple[float, str]]:
    """Tick labels that never overlap in `width_px` pixels: each shortened from the left with "…" to its share
    of the width, and only every k-th kept when even 4 characters would not fit."""
    if not labels:
        return []
    min_chars = 4
    step = 1
    while (width_px * step // len(labels) - 8) // char_px < min(min_chars, max(len(t) for _, t in labels)):
        step += 1
        if step >= len(labels):
            break
    chars = max(min_chars, (width_px * step // len(labels) - 8) // char_px)
    return [(x, text if len(text) <= chars else "…" + text[-(chars - 1):]) for x, text in labels[::step]]


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
