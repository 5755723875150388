# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""The dashboard measures by the one ruler (hfspec.measure) and shows it: no estimate for a draft without a
forward to time, placeholders that fit their cards, y labels that fit their axes at 1024×700, and PNG captions
that say how the figures were measured (pytest-qt, offscreen, waiting on the worker's signals)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtGui import QFontMetrics, QImage  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from test_gui import _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


def test_lookup_has_no_cost_model_estimate_dash_and_no_bar(qtbot, window):
    """Prompt lookup runs no draft forward: there are no step costs to price, so the card says "—" and the
    speed-up plot draws no predicted bar (it showed 0.91× with a bar)."""
    c = window.controls
    c.set_draft("lookup")
    c.gamma.setValue(3)
    c.temperature.setValue(0.0)
    c.baseline.setChecked(True)
    c.max_new_tokens.setValue(24)
    _run(qtbot, window)
    live = window.live
    assert live.result.stats.draft_forwards == 0
    assert live.metrics["predicted"].value_text == "—"
    assert len(live.speed_bars["predicted"].opts["x"]) == 0
    assert live.result.measured.predicted_speedup is None and live.result.measured.speedup  # measured: shown


def test_after_run_fits_every_card_and_y_labels_fit_their_axes_at_1024x700(qtbot, window):
    window.resize(1024, 700)
    qtbot.waitExposed(window)
    QApplication.processEvents()
    live = window.live
    for key in ("c_time", "predicted", "measured", "timed_rate", "with"):  # what the cards show mid-run
        metric = live.metrics[key]
        width = metric.width()
        metric.set_value("after run")
        assert metric.sizeHint().width() <= width, f"card {key} clips 'after run'"
    for key, value in {"measured": "20.10× implausible", "with": "9 pairs 12.34–56.78× · 16 thr · load 12.3"}.items():
        metric = live.metrics[key]
        width = metric.width()
        metric.set_value(value)
        assert metric.sizeHint().width() <= width, f"card {key} clips {value!r}"
    QApplication.processEvents()
    for view in (window.live, window.sweep, window.compare):
        for name, plot in view.plots.items():
            axis = plot.getPlotItem().getAxis("left")
            text_width = QFontMetrics(axis.label.font()).horizontalAdvance(axis.labelText)
            assert text_width <= axis.geometry().height(), f"{name}: y label {axis.labelText!r} runs past its axis"


def test_exported_pngs_say_pairs_threads_load_and_verdict(qtbot, window, tmp_path):
    window.controls.baseline.setChecked(True)
    _run(qtbot, window)
    window.tabs.setCurrentWidget(window.live)
    (tmp_path / "run").mkdir()
    (tmp_path / "sweep").mkdir()
    paths = window.export_plots(str(tmp_path / "run"))
    caption = QImage(paths[0]).text("Description")
    m = window.live.result.measured
    assert f"{m.pairs} pair" in caption and "threads" in caption and "load" in caption
    assert f"measured: {m.verdict}" in caption
    # a sweep: repeats, threads, load and how many points are not to be relied on
    window.sweep.gamma_from.setValue(1)
    window.sweep.gamma_to.setValue(2)
    window.sweep.drafts.setText("rtn4")
    window.sweep.repeats.setValue(1)
    _run(qtbot, window, window.sweep.run_button.click)
    window.tabs.setCurrentWidget(window.sweep)
    caption = QImage(window.export_plots(str(tmp_path / "sweep"))[0]).text("Description")
    assert "repeats" in caption and "threads" in caption and "load up to" in caption
    assert "points rough" in caption or "all points stable" in caption or "points unstable" in caption
