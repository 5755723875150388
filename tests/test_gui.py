"""The dashboard, driven for real (pytest-qt, offscreen): run, stop, errors, latency, sweep, compare, export."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QElapsedTimer, QSettings, QTimer  # noqa: E402

import hfspec  # noqa: E402
from gui.main_window import MainWindow  # noqa: E402
from hfspec.session import RunSettings, Session  # noqa: E402

NANO = Path(__file__).resolve().parents[1] / "presets" / "models" / "nano"
TIMEOUT_MS = 180_000
# Event-loop gaps allowed while a run is going. Measured on a 2-core box shared with other test suites
# (load ~7): decoding-phase repaints 140-270 ms, first model load up to ~450 ms; an idle desktop is far lower.
MAX_GAP_MS = int(os.environ.get("HFSPEC_GUI_MAX_GAP_MS", "1000"))
MAX_GAP_DECODING_MS = int(os.environ.get("HFSPEC_GUI_MAX_GAP_DECODING_MS", "350"))


def _has_preset(name: str) -> bool:
    try:
        from hfspec.presets import list_presets

        return name in list_presets()
    except Exception:  # noqa: BLE001 - presets not there yet
        return False


pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


@pytest.fixture(scope="module")
def session():
    """One model cache for the module: the micro model loads once."""
    return Session()


@pytest.fixture
def window(qtbot, session, tmp_path, monkeypatch):
    monkeypatch.setenv("HFSPEC_GUI_SETTINGS", str(tmp_path / "env.ini"))  # never the user's settings
    store = QSettings(str(tmp_path / "gui.ini"), QSettings.Format.IniFormat)
    win = MainWindow(session=session, settings_store=store)
    qtbot.addWidget(win)
    win.show()
    errors = []
    monkeypatch.setattr("gui.main_window.QMessageBox.critical", lambda *args: errors.append(args[1:]))
    win.errors = errors
    assert win.controls.choose_preset("micro-rtn4")
    win.controls.max_new_tokens.setValue(16)
    win.controls.seed.setValue(2)  # seed 1 meets </s> after a few tokens with the current micro model
    win.controls.baseline.setChecked(False)
    yield win
    win.shutdown()
    assert not win.controller.thread.isRunning()


def _run(qtbot, win, button=None):
    with qtbot.waitSignal(win.controller.done, timeout=TIMEOUT_MS):
        if button is not None:
            button.click()
        else:
            assert win.start_run()


def test_run_micro_rtn4_shows_the_library_statistics(qtbot, window, tmp_path):
    c = window.controls
    c.gamma.setValue(4)
    c.baseline.setChecked(True)
    assert c.draft() == "rtn4" and c.settings().preset == "micro-rtn4"

    gaps, clock, phase = [], QElapsedTimer(), {"decoding": False}
    window.controller.worker.generating.connect(lambda: phase.update(decoding=True))
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: gaps.append((clock.restart(), phase["decoding"])))
    clock.start()
    timer.start()
    _run(qtbot, window)
    timer.stop()

    assert window.errors == []
    result = window.live.result
    assert result is not None and result.stats.new_tokens > 0
    # the plots hold data
    assert len(window.live.rolling_curve.xData) == result.stats.target_passes
    assert len(window.live.tpp_curve.yData) == result.stats.target_passes
    assert len(window.live.pos_bars.opts["height"]) == 4
    assert window.live.text.toPlainText().startswith("Return the")
    assert window.live.text.toPlainText().endswith(result.text)
    # the shown α is the library's for the same settings and seed
    settings = RunSettings.from_preset("micro-rtn4", gamma=4, max_new_tokens=16, seed=2)
    target, draft, tokenizer = window.controller.session.load(settings)
    ids = tokenizer(settings.prompt, return_tensors="pt").input_ids
    direct = hfspec.generate(target, ids, draft=draft, **settings.generate_kwargs())
    assert result.stats.alpha == direct.stats.alpha
    assert result.stats.new_tokens == direct.stats.new_tokens
    assert window.live.metrics["alpha"].value_text == f"{direct.stats.alpha:.3f}"
    assert [k for _, k in result.pieces] == direct.token_kinds[0]
    # measured speed-up from the baseline
    assert result.measured_speedup is not None and window.live.metrics["measured"].value_text.endswith("×")
    # the GUI thread stayed responsive throughout (model loading and decoding in the worker)
    worst = max(g for g, _ in gaps)
    worst_decoding = max(g for g, decoding in gaps if decoding)
    assert worst < MAX_GAP_MS, f"event loop blocked for {worst} ms"
    assert worst_decoding < MAX_GAP_DECODING_MS, f"event loop blocked for {worst_decoding} ms while decoding"

    # export: PNG per plot, statistics as JSON and CSV
    pngs = window.export_plots(str(tmp_path))
    assert len(pngs) == 4 and all(Path(p).stat().st_size > 1000 for p in pngs)
    data = json.loads(Path(window.export_statistics(str(tmp_path / "s.json"))).read_text())
    assert data["run"]["summary"]["alpha"] == direct.stats.alpha
    csv_text = Path(window.export_statistics(str(tmp_path / "s.csv"))).read_text()
    assert csv_text.startswith("quantity,value") and "alpha" in csv_text


def _long_running_seed(session) -> int:
    """A seed whose sample does not meet </s> early (the micro model may be retrained)."""
    for seed in range(2, 12):
        settings = RunSettings.from_preset("micro-rtn4", seed=seed, max_new_tokens=12, measure_baseline=False)
        if session.run(settings).stats.new_tokens == 12:
            return seed
    pytest.skip("no seed in 2..11 runs 12 tokens without </s>")


def test_stop_mid_run(qtbot, window, session):
    window.controls.seed.setValue(_long_running_seed(session))
    window.controls.max_new_tokens.setValue(400)
    with qtbot.waitSignal(window.controller.live, timeout=TIMEOUT_MS):
        window.start_run()
    assert window.controls.stop_button.isEnabled() and not window.controls.run_button.isEnabled()
    started = time.perf_counter()
    with qtbot.waitSignal(window.controller.done, timeout=20_000):
        window.controls.stop_button.click()
    stop_s = time.perf_counter() - started
    assert stop_s < 10, f"stop took {stop_s:.1f} s"
    result = window.live.result
    assert result.stats.stopped and result.stats.new_tokens < 400
    assert window.controls.run_button.isEnabled() and not window.controls.stop_button.isEnabled()
    assert "stopped" in window.statusBar().currentMessage()


def test_bad_model_path_shows_an_error_and_the_window_stays_usable(qtbot, window):
    window.controls.target.setText("/no/such/model/folder")
    _run(qtbot, window)
    assert len(window.errors) == 1
    title, message = window.errors[0]
    assert "target" in message and "/no/such/model/folder" in message
    assert window.controls.run_button.isEnabled()
    assert window.controller.thread.isRunning()
    # a bad draft spec is caught before anything runs
    window.controls.draft_kind.setCurrentIndex(window.controls.draft_kind.findData("sibling"))
    window.controls.sibling.setText("")
    assert window.start_run() is False and "sibling" in window.errors[-1][1]
    # and a good run still works afterwards
    assert window.controls.choose_preset("micro-rtn4")
    window.controls.max_new_tokens.setValue(4)
    window.controls.baseline.setChecked(False)
    _run(qtbot, window)
    assert window.live.result is not None and window.live.result.stats.new_tokens == 4


def test_sweep_tab_draws_the_formula_and_the_points(qtbot, window):
    window.controls.max_new_tokens.setValue(10)
    window.sweep.gamma_from.setValue(1)
    window.sweep.gamma_to.setValue(3)
    window.sweep.drafts.setText("rtn4")
    _run(qtbot, window, window.sweep.run_button)
    assert window.errors == []
    assert [(p.draft, p.gamma) for p in window.sweep.points] == [("rtn4", 1), ("rtn4", 2), ("rtn4", 3)]
    curves = window.sweep.tpp_plot.getPlotItem().listDataItems()
    assert len(curves) == 2  # formula curve + measured points
    assert list(curves[1].yData) == [p.tokens_per_pass for p in window.sweep.points]
    assert len(window.sweep.speed_plot.getPlotItem().listDataItems()) >= 2


def test_compare_tab_fills_table_and_bars(qtbot, window):
    window.controls.max_new_tokens.setValue(10)
    window.compare.items.setPlainText(f"rtn4\n{NANO}")
    _run(qtbot, window, window.compare.run_button)
    assert window.errors == []
    assert window.compare.table.rowCount() == 2
    assert window.compare.table.item(0, 0).text() == "rtn4"
    assert float(window.compare.table.item(0, 1).text()) == pytest.approx(window.compare.rows[0].alpha, abs=1e-3)
    bars = [i for i in window.compare.bar_plot.getPlotItem().items if type(i).__name__ == "BarGraphItem"]
    assert len(bars) == 4 and len(bars[0].opts["x"]) == 2


def test_settings_persist_between_runs(qtbot, session, tmp_path):
    store = QSettings(str(tmp_path / "p.ini"), QSettings.Format.IniFormat)
    first = MainWindow(session=session, settings_store=store)
    qtbot.addWidget(first)
    first.controls.choose_preset("micro-rtn4")
    first.controls.gamma_auto.setChecked(True)
    first.controls.temperature.setValue(0.7)
    first.controls.top_k.setValue(20)
    first.controls.seed.setValue(42)
    first.controls.prompt.setPlainText("Persist me")
    first.controls.set_draft("rtn3-g64")
    first.sweep.drafts.setText("rtn4, rtn8")
    first.close()
    second = MainWindow(session=session, settings_store=QSettings(str(tmp_path / "p.ini"),
                                                                    QSettings.Format.IniFormat))
    qtbot.addWidget(second)
    s = second.controls.settings()
    assert (s.gamma, s.temperature, s.top_k, s.seed, s.prompt, s.draft) == ("auto", 0.7, 20, 42, "Persist me",
                                                                             "rtn3-g64")
    assert second.sweep.drafts.text() == "rtn4, rtn8"
    assert not second.controls.gamma.isEnabled()
    second.close()
