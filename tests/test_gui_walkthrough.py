# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""Defects a user met walking the dashboard (issue 30), driven for real (pytest-qt, offscreen, waiting on
signals): the progress bar after a run that ended at EOS, after opening a saved run, after a failure and after
the settings change; an error about the input leaves the status bar once the input validates; invalid inputs
are not persisted."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings  # noqa: E402
from test_gui import EOS_PROMPT, _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

from gui import settings as store  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


# ------------------------------------------------------------------------------------- the progress bar
def test_a_run_that_ends_at_eos_fills_the_bar_and_says_so(qtbot, window):
    c = window.controls
    c.prompt.setPlainText(EOS_PROMPT)
    c.temperature.setValue(0.0)
    c.ignore_eos.setChecked(False)
    _run(qtbot, window)
    assert window.live.result.stats.new_tokens == 1 and window.live.result.stop_reason == "EOS"
    assert c.progress.value() == c.progress.maximum() == 16  # not 1 / 16
    assert c.progress.text() == "1 / 16 tokens · ended at EOS"


def test_the_bar_shows_an_opened_run_and_resets_when_the_settings_change(qtbot, window, tmp_path):
    c = window.controls
    c.max_new_tokens.setValue(6)
    _run(qtbot, window)
    window.export_statistics(str(tmp_path / "six.json"))
    c.max_new_tokens.setValue(9)
    assert c.progress.text() == "" and c.progress.value() <= 0  # the 6 / 6 of the last run is not of these settings
    _run(qtbot, window)
    assert c.progress.text() == "9 / 9 tokens"
    assert window.open_saved(str(tmp_path / "six.json"))
    assert c.progress.text() == "6 / 6 tokens" and c.progress.value() == 6  # not the 9 / 9 still


def test_a_failed_run_says_so_on_the_bar(qtbot, window):
    window.controls.target.setText("/no/such/model/folder")
    _run(qtbot, window)
    assert window.errors and "/no/such/model/folder" in window.errors[-1][1]
    assert window.controls.progress.text() == "run failed"  # not blank


# ------------------------------------------------------------------------------------- stale errors
def test_an_input_error_leaves_the_status_bar_once_the_input_validates(qtbot, window):
    c = window.controls
    c.prompt.setPlainText("")
    assert window.start_run() is False and window.status_text.startswith("Error: prompt")
    c.prompt.setPlainText("Fixed")
    assert window.status_text == "Ready"
    window.sweep.drafts.setText("rtn4, rtn99")
    assert window.start_sweep() is False and window.status_text.startswith("Error: Sweep γ tab, drafts")
    window.sweep.drafts.setText("rtn4, rtn8")
    assert window.status_text == "Ready"


# ------------------------------------------------------------------------------------- persistence
def test_invalid_inputs_are_not_saved(qtbot, window, tmp_path):
    window.sweep.drafts.setText("rtn4, rtn8")
    window.compare.items.setPlainText("rtn4\nrtn8")
    window.save_state()
    window.sweep.drafts.setText("rtn4, rtn99")  # rtn99: no such bit width
    window.compare.items.setPlainText("rtn4\nnot-a-draft-kind-9")
    window.controls.prompt.setPlainText("")
    window.save_state()
    kept = QSettings(window.store.fileName(), QSettings.Format.IniFormat)
    assert store.load_value(kept, "sweep/drafts") == "rtn4, rtn8"
    assert store.load_value(kept, "compare/items") == "rtn4\nrtn8"
    assert json.loads(kept.value("run/settings"))["prompt"] != ""


# ------------------------------------------------------------------------------------- the Live tab's words
def test_the_alpha_chart_shows_a_single_checked_pass_between_gaps(qtbot, window):
    live = window.live
    live.clear()
    for index, accepted, checked, alpha in ((1, 0, 0, None), (2, 2, 4, 0.5), (3, 0, 0, 0.5)):
        live._push(index, 4, accepted, checked, 1, 1.0, alpha)
    live.redraw()
    for curve in (live.rolling_curve, live.alpha_curve):
        assert curve.opts["connect"] == "finite" and curve.opts["symbol"] is not None
        shown = [p.pos() for p in curve.scatter.points()]
        assert [(p.x(), p.y()) for p in shown if p.y() == p.y()] == [(2.0, 0.5)]  # the lone pass is drawn


def test_the_shown_line_has_the_prompt_and_the_banner_the_forms_labels(qtbot, window):
    c = window.controls
    c.prompt.setPlainText("Tell me <b>everything</b>\nabout bees")
    c.max_new_tokens.setValue(4)
    _run(qtbot, window)
    assert "prompt “Tell me &lt;b&gt;everything&lt;/b&gt; about bees”" in window.live.origin.text()
    c.max_new_tokens.setValue(5)
    c.top_k.setValue(3)
    assert "form has changed since (top-k, max new tokens)" in window.live.origin.text()


def test_the_bf16_advice_names_the_dashboards_precision_box(qtbot, window, monkeypatch):
    from hfspec.measure import verify_cost

    monkeypatch.setattr(verify_cost, "verify_ratio", lambda stats, baseline: 2.5)  # as on a slow fp32 CPU
    window.controls.max_new_tokens.setValue(4)
    window.controls.baseline.setChecked(True)
    _run(qtbot, window)
    note = window.live.exactness.text()
    assert "verify pass 2.5×" in note and "bfloat16 in the Precision box" in note and "--dtype" not in note
