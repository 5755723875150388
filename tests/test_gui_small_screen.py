# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""The dashboard at 1024×700, the smallest laptop screen supported (issue 30 item 5, what the walk found), driven
offscreen: the Live tab's plots scroll at a readable height with y ticks spaced by pixels; no plot title or legend
is cut off at its plot's edge in the Live, Sweep, Compare and tree views; an error from a failed run leaves the
status bar once an edit makes the input valid; the Sensitivity advice names the tab's method box; the docs give
`hfspec gui --threads N`, which the CLI passes on."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QApplication  # noqa: E402
from test_gui import _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

from gui import app as gui_app  # noqa: E402
from gui.live_view import PLOT_MIN_HEIGHT  # noqa: E402
from gui.plots import TICK_ROOM_PX  # noqa: E402
from hfspec.decoding.round import RoundTree  # noqa: E402
from hfspec.session import CompareRow, SweepResult, SweepRow  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = (1024, 700)

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


def _small(qtbot, window):
    window.resize(*SMALL)
    qtbot.waitExposed(window)
    QApplication.processEvents()
    assert (window.width(), window.height()) == SMALL


def _row(cls, draft: str, gamma: int, **extra):
    """A pooled point with plausible figures (no cost model: no predicted curve)."""
    return cls(draft=draft, gamma=gamma, repeats=3, alpha=0.9, alpha_sd=0.01, checked=30, accepted=27,
               target_passes=8, new_tokens=32, tokens_per_pass=1 + 0.9 * gamma, tokens_per_pass_sd=0.1,
               expected_tokens_per_pass=1 + 0.9 * gamma, c_bytes=0.3, c_time=0.35, predicted_speedup=1.5,
               predicted_speedup_sd=0.1, ideal_speedup=2.0, tokens_per_second=300.0, baseline_tokens_per_second=200.0,
               baseline_new_tokens=32, measured_speedup=1.5, measured_speedup_sd=0.1, pairs=3, threads=2,
               load_avg=1.0, **extra)


def _tick_gaps_px(plot) -> list[float]:
    """Pixels between neighbouring labelled ticks of the plot's y axis, as pyqtgraph would draw them now."""
    axis = plot.getPlotItem().getAxis("left")
    low, high = axis.range
    height = axis.geometry().height()
    return [spacing / (high - low) * height for spacing, values in axis.tickValues(low, high, height)
            if len(values) > 1]


def _cut_off(plot) -> list[str]:
    """The title and legend texts of `plot` that reach past the plot widget's right edge."""
    item = plot.getPlotItem()
    texts = [("title", item.titleLabel.item)] if item.titleLabel.isVisible() else []
    texts += [(f"legend {label.text}", label.item) for _, label in item.legend.items]
    return [f"{what} ends at {text.sceneBoundingRect().right():.0f} > {plot.width()}"
            for what, text in texts if text.sceneBoundingRect().right() > plot.width() + 1]


# ------------------------------------------------------------------------------------- item 1: the Live plots
def test_the_live_plots_scroll_at_a_readable_height_at_1024x700(qtbot, window):
    _small(qtbot, window)
    live = window.live
    for name, plot in live.plots.items():
        assert plot.height() >= PLOT_MIN_HEIGHT, f"{name} squeezed to {plot.height()} px"
        assert live.plot_scroll.widget().isAncestorOf(plot)
    assert live.plot_scroll.verticalScrollBar().maximum() > 0  # they scroll rather than squeeze
    assert live.text.isVisible() and live.text.height() > 60  # the text keeps its room below them


def test_y_ticks_are_spaced_by_the_axis_height(window):
    # a plot of the window's, not one of its own: a PlotWidget left to the garbage collector can be collected on
    # the worker thread of a later test, and its deletion there deadlocked that test's run (seen: py-spy showed
    # ~QObject in the worker's gc waiting for the GIL, the main thread's ~QMenu waiting on Qt's mutex)
    axis = window.live.alpha_plot.getPlotItem().getAxis("left")
    for low, high, height in ((0, 1.02, 60), (0, 1.02, 140), (0, 6.5, 45), (0, 2.3, 90), (0.5, 100, 400)):
        for spacing, _ in axis.tickValues(low, high, height):
            assert spacing / (high - low) * height >= TICK_ROOM_PX, (low, high, height, spacing)
    assert axis.tickValues(0, 1.02, 400)[0][0] <= 0.2  # a tall axis keeps fine ticks


def test_no_y_labels_overlap_in_the_views_at_1024x700(qtbot, window):
    _small(qtbot, window)
    for view in (window.live, window.sweep, window.compare):
        window.tabs.setCurrentWidget(view)
        QApplication.processEvents()
        for name, plot in view.plots.items():
            assert all(gap >= TICK_ROOM_PX for gap in _tick_gaps_px(plot)), name


# ------------------------------------------------------------------------------------- item 2: titles and legends
def test_titles_and_legends_fit_their_plots_at_1024x700(qtbot, window):
    _small(qtbot, window)
    sweep = [_row(SweepRow, draft, g) for draft in ("rtn4-compiled", "rtn3-g64-compiled") for g in (1, 2, 3)]
    window.sweep.show_result(SweepResult(settings=None, gammas=[1, 2, 3], points=sweep, repeats=3))
    window.compare.show_rows([_row(CompareRow, d, 4, label=d) for d in ("rtn4", "rtn3", "rtn8", "presets/models/nano")])
    tree = RoundTree((5, 6, 7), (-1, 0, 1), (1, 2, 3), (0,), 9, "resampled", chain=True)
    window.live.add([])  # the tree view shows beside the text as after a tree "auto" run
    window.live.tree_view.show_tree(tree, 12)
    window.live.tree_view.show()
    cut = {}
    for view in (window.live, window.sweep, window.compare):
        window.tabs.setCurrentWidget(view)
        QApplication.processEvents()
        plots = dict(view.plots) | ({"tree": view.tree_view.plot} if view is window.live else {})
        for name, plot in plots.items():
            if problems := _cut_off(plot):
                cut[name] = problems
    assert not cut, cut
    item = window.live.tree_view.plot.getPlotItem()
    assert item.titleLabel.text.endswith("…") and item.titleLabel.toolTip().startswith("Chain (tree")  # elided


# ------------------------------------------------------------------------------------- item 3: stale errors
def test_a_failed_runs_error_leaves_the_status_bar_once_a_valid_edit_fixes_the_input(qtbot, window):
    c = window.controls
    good = c.target.text()
    c.target.setText("/no/such/model/folder")
    _run(qtbot, window)
    assert window.errors and window.status_text.startswith("Error:") and "/no/such/model/folder" in window.status_text
    c.target.setText(good)
    assert window.status_text == "Ready"
    _run(qtbot, window)  # a run after it: its line stays after a later valid edit
    assert window.status_text.startswith("Run done")
    c.seed.setValue(c.seed.value() + 1)
    assert window.status_text.startswith("Run done")


# ------------------------------------------------------------------------------------- item 4: the advice's words
def test_the_sensitivity_advice_names_the_method_box_not_a_cli_flag(window):
    from hfspec.drafts.sensitivity import SensitivityReport, UnitLoss

    units = [UnitLoss(name=f"layer {i} mlp", kind="mlp", matrices=[], weights=100, bytes=50,
                      overlap=1 - 0.01 * (3 - i), loss=0.01 * (3 - i), share=0.3) for i in range(3)]
    report = SensitivityReport(bits=4, group_size=32, method="rtn", by="layer", tokens=64, sequences=1, seed=0,
                               full_overlap=0.9, units=units, top_float_overlap=0.95)
    assert "--method gptq" in report.advice()  # the CLI's words stay the CLI's
    window.sensitivity.show_report(report)
    note = window.sensitivity.note.text()
    assert "gptq in the method box" in note and "--method" not in note


def test_sensitivity_ticks_keep_the_layer_when_shortened(qtbot, window):
    from hfspec.drafts.sensitivity import SensitivityReport, UnitLoss

    _small(qtbot, window)
    units = [UnitLoss(name=f"model.layers.{i // 2}.{('self_attn.q_proj', 'mlp.up_proj')[i % 2]}", kind="matrix",
                      matrices=[], weights=100, bytes=50, overlap=0.99, loss=0.01 - 0.0005 * i, share=0.1)
             for i in range(10)]
    window.tabs.setCurrentWidget(window.sensitivity)
    window.sensitivity.show_report(SensitivityReport(bits=4, group_size=32, method="rtn", by="matrix", tokens=64,
                                                     sequences=1, seed=0, full_overlap=0.9, units=units,
                                                     top_float_overlap=0.95))
    QApplication.processEvents()
    ticks = [text for _, text in window.sensitivity.plot.getPlotItem().getAxis("bottom")._tickLevels[0]]
    assert any(text.endswith("…") for text in ticks)  # shortened at this width
    assert all(text.startswith("L") for text in ticks), ticks  # "L3 q_…", not "…q_proj": the layer stays


# ------------------------------------------------------------------------------------- the form's width
def test_the_form_is_as_wide_as_its_fields_need_at_1024x700(qtbot, window):
    from PySide6.QtWidgets import QLabel

    _small(qtbot, window)
    c, form = window.controls, window.controls.draft
    assert c.width() <= 380, c.width()  # was 438: the longest draft kind and "head logits re-scored" set it
    page = form.stack.currentWidget()
    assert "head logits\nre-scored" in [label.text() for label in page.findChildren(QLabel)]
    assert form.stack.height() == page.sizeHint().height()  # no gap: the stack is the shown kind's height
    lookup = form.kind.findData("lookup")
    form.kind.setCurrentIndex(lookup)
    QApplication.processEvents()
    assert form.stack.height() == form.stack.widget(lookup).sizeHint().height()
    widest = max(form.kind.fontMetrics().horizontalAdvance(form.kind.itemText(i)) for i in range(form.kind.count()))
    assert form.kind.view().minimumWidth() >= widest  # the drop-down list shows each kind whole


# ------------------------------------------------------------------------------------- item 5: --threads
def test_hfspec_gui_threads_reaches_the_dashboard_as_the_docs_say(monkeypatch):
    from hfspec import cli

    got = []
    monkeypatch.setattr(gui_app, "main", lambda argv: got.append(argv) or 0)
    assert cli.main(["gui", "--threads", "3"]) == 0
    assert got == [["--threads", "3"]]
    docs = (ROOT / "docs" / "dashboard.md").read_text()
    assert "`hfspec gui --threads N`" in docs and "plus `--threads N`" not in docs


# ------------------------------------------------------------------------------------- item 5: the Compare table
COMPARED_DRAFTS = ("rtn4", "rtn3-g64", "bnb-nf4", "lookup", "presets/models/nano",
                   "presets/models/micro | presets/models/nano-rtn4-compiled")


def test_the_compare_table_shows_every_column_without_scrolling_sideways_at_1024x700(qtbot, window):
    _small(qtbot, window)
    window.tabs.setCurrentWidget(window.compare)
    rows = [_row(CompareRow, d, 4, label=d, fidelity=0.912) for d in COMPARED_DRAFTS]
    for row in rows:  # 3 repeats of 16 tokens at a small model's CPU rate
        row.tokens_per_second, row.new_tokens, row.baseline_new_tokens = 1234.5, 48, 48
    rows[1].pairs = 2  # rough: its measured cell carries the word
    rows[2].measured_speedup, rows[2].flags = 12.34, "implausible: above the 3.9× its passes allow"
    rows[3].c_time = rows[3].predicted_speedup = 0.0  # lookup: no draft forward, "—"
    rows[4].load_avg = 12.75
    window.compare.show_rows(rows)
    QApplication.processEvents()
    table = window.compare.table
    bar = table.horizontalScrollBar()
    widths = ", ".join(f"{table.horizontalHeaderItem(c).text()}={table.columnWidth(c)}"
                       for c in range(table.columnCount()))
    assert bar.maximum() == 0 or not bar.isVisible(), f"scrolls sideways in {table.viewport().width()} px: {widths}"
    assert sum(map(table.columnWidth, range(table.columnCount()))) <= table.viewport().width(), widths
    # the draft column keeps room for a short entry; a long one is elided with its whole text in the tooltip
    assert table.columnWidth(0) >= table.fontMetrics().horizontalAdvance("rtn3-g64-compiled"), widths
    assert table.item(5, 0).toolTip().startswith(COMPARED_DRAFTS[5])
    # nothing is lost: each figure's ± 1 s.d., the tokens run / plain and the conditions are in the tooltips
    col = {table.horizontalHeaderItem(c).text(): c for c in range(table.columnCount())}
    assert table.item(0, col["α"]).text() == "0.900" and "0.900 ± 0.010" in table.item(0, col["α"]).toolTip()
    rough = table.item(1, col["measured ×"])
    assert rough.text() == "1.50× ?" and "rough" in rough.toolTip()  # the word in the tooltip, the cell coloured
    assert table.item(2, col["measured ×"]).text() == "12.34× ?"
    assert "implausible: above the 3.9×" in table.item(2, col["measured ×"]).toolTip()
    measured = table.item(4, col["measured ×"]).toolTip()
    assert "1.50× ± 0.10" in measured and "48 / 48" in measured and "2 threads · load 12.75" in measured
    assert table.item(3, col["predicted ×"]).text() == "—"
