"""Plot helpers shared by the views: white pyqtgraph plots with their legend below the axes (never over the
data), error bars, PNG export, number formatting."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
LEGEND_ROW = 4  # PlotItem's layout: 0 title, 1 top axis, 2 view box, 3 bottom axis; the legend goes under it


def configure_pyqtgraph() -> None:
    """White plots, dark axes, antialiased lines (call once the QApplication exists)."""
    pg.setConfigOptions(antialias=True, background="w", foreground="#222")


def make_plot(title: str, x_label: str, y_label: str, legend_columns: int = 2) -> pg.PlotWidget:
    """A plot whose legend sits in its own row below the x axis: named items added later are listed there."""
    widget = pg.PlotWidget()
    item = widget.getPlotItem()
    item.setTitle(title, size="10pt")
    item.setLabel("bottom", x_label)
    item.setLabel("left", y_label)
    item.showGrid(x=False, y=True, alpha=0.2)
    for axis in ("bottom", "left"):
        item.getAxis(axis).enableAutoSIPrefix(False)  # no label re-layout on every range change
    legend = pg.LegendItem(offset=None, labelTextSize="8pt", colCount=legend_columns, verSpacing=-6)
    item.layout.addItem(legend, LEGEND_ROW, 1)
    item.legend = legend  # PlotItem.addItem lists every item given a name here
    widget.setMinimumSize(220, 150)
    return widget


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


def export_png(widget: pg.PlotWidget, path: str, width: int = 1200) -> None:
    """Save one plot (legend included) as PNG with pyqtgraph's ImageExporter."""
    import pyqtgraph.exporters

    exporter = pyqtgraph.exporters.ImageExporter(widget.getPlotItem())
    exporter.parameters()["width"] = width
    exporter.export(path)


def fmt(value, digits: int = 2, suffix: str = "") -> str:
    """A number for a card or table cell; "—" for None / NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}{suffix}"


def fmt_sd(value, sd, digits: int = 3, suffix: str = "") -> str:
    """"0.812 ± 0.021" (just the value when the s.d. is unknown)."""
    text = fmt(value, digits, suffix)
    return text if sd is None or value is None else f"{text} ± {sd:.{digits}f}"
