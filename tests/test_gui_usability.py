# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""What a newcomer meets first in the dashboard, driven for real (pytest-qt, offscreen, waiting on signals): the
first window fits the screen; every number agrees with every other and says what produced it (the timed
measurement, its threads, load and pairs); keys, input limits, exports, errors; saved runs, compile progress,
the system's dark theme."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

import pyqtgraph as pg  # noqa: E402
import torch  # noqa: E402
from PySide6.QtCore import QPoint, QRect, Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel  # noqa: E402
from test_gui import TIMEOUT_MS, _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

from gui import app as gui_app  # noqa: E402
from hfspec.decoding.stats import expected_tokens_per_pass  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARTEFACTS = Path(os.environ.get("HFSPEC_TEST_ARTEFACTS", ROOT / "tests" / "artefacts"))

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


def _in_view(widget, window) -> bool:
    """Shown, and every pixel of it inside the window and inside each scrolling or clipping ancestor."""
    if not widget.isVisible() or widget.width() <= 0 or widget.height() <= 0:
        return False
    rect = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    parent = widget.parentWidget()
    while parent is not None and parent is not window:
        clip = QRect(parent.mapTo(window, QPoint(0, 0)), parent.size())
        if not clip.contains(rect):
            return False
        parent = parent.parentWidget()
    return window.rect().contains(rect)


# ------------------------------------------------------------------------------------- the first screen
FIRST_LAUNCH = """
import json, sys
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
sys.path.insert(0, sys.argv[1])
app = QApplication([])
from gui.main_window import MainWindow
from test_gui_usability import _in_view
win = MainWindow(settings_store=QSettings(sys.argv[2], QSettings.Format.IniFormat))
win.show()
app.processEvents()
c, live = win.controls, win.live
hidden = [type(w).__name__ + getattr(w, "caption", "") for w in (c.run_button, c.prompt, c.progress,
          *live.metrics.values(), live.copy_button, live.save_button) if not _in_view(w, win)]
win.grab().save(sys.argv[3])
print(json.dumps({"frame": win.frameGeometry().getRect(), "available": win.screen().availableGeometry().getRect(),
                  "hidden": hidden}))
win.shutdown()
"""


@pytest.mark.parametrize("screen", [(1366, 768), (1024, 700)])
def test_a_first_launch_fits_the_screen_with_run_prompt_and_cards_in_view(tmp_path, screen):
    """A fresh start (no saved geometry) on a screen of that size, in its own process."""
    from gui.main_window import first_size

    for w, h in ((1366, 768), (1024, 700), (1920, 1080)):
        size = first_size(QRect(0, 0, w, h))
        assert size.width() <= w - 16 and size.height() <= h - 48
    config = tmp_path / "screen.json"
    config.write_text(json.dumps({"screens": [{"name": "screen", "x": 0, "y": 0, "width": screen[0],
                                               "height": screen[1], "logicalDpi": 96, "logicalBaseDpi": 96,
                                               "dpr": 1}]}))
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / f"first-launch-{screen[0]}x{screen[1]}.png"
    env = dict(os.environ, QT_QPA_PLATFORM=f"offscreen:configfile={config}", PYTHONPATH=str(ROOT),
               HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", FIRST_LAUNCH, str(ROOT / "tests"), str(tmp_path / "new.ini"),
                          str(shot)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    fx, fy, fw, fh = got["frame"]
    ax, ay, aw, ah = got["available"]
    assert (ax, ay, aw, ah) == (0, 0, *screen)
    assert fx >= ax and fy >= ay and fx + fw <= ax + aw and fy + fh <= ay + ah, got
    assert got["hidden"] == []


@pytest.mark.parametrize("size", [(1366, 768), (1024, 700)])
def test_run_the_prompt_and_every_card_show_without_scrolling(qtbot, window, size):
    window.resize(*size)
    qtbot.waitExposed(window)
    QApplication.processEvents()
    assert (window.width(), window.height()) == size
    c, live = window.controls, window.live
    # the plots show whole at 1366×768; at 1024×700 their area scrolls (each keeps a readable height) and is in view
    plots = [*live.plots.values()] if size == (1366, 768) else [live.plot_scroll]
    for widget in (c.run_button, c.stop_button, c.progress, c.prompt, c.preset, window.tabs.tabBar(),
                   live.copy_button, live.save_button, live.text, *live.metrics.values(), *plots):
        assert _in_view(widget, window), f"{type(widget).__name__} {getattr(widget, 'caption', '')} at {size}"
    for label in window.findChildren(QLabel):  # no word cut at the right edge of the form
        if label.isVisible() and label.window() is window and c.isAncestorOf(label) and label.wordWrap():
            assert label.width() <= c.scroll.viewport().width()
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    assert window.grab().save(str(ARTEFACTS / f"dashboard-{size[0]}x{size[1]}.png"))


# ------------------------------------------------------------------- numbers that agree with each other
def test_measured_rates_sit_beside_the_baseline_and_the_live_rate_says_so(qtbot, window):
    window.controls.baseline.setChecked(True)
    _run(qtbot, window)
    m = window.live.result.measured
    cards = {k: card.value_text for k, card in window.live.metrics.items()}
    assert "live (with display)" in window.live.metrics["rate"].caption
    spec, plain = cards["timed_rate"].split(" vs ")
    assert (float(spec), float(plain)) == (round(m.speculative_tps), round(m.plain_tps))
    # the figure is the ruler's median per-pair ratio, inside its interval (the rates are each side's median)
    assert m.low <= m.speedup <= m.high
    assert cards["measured"].startswith(f"{m.speedup:.2f}×")


def test_the_estimate_is_the_timed_measurements_and_threads_match_the_cli(qtbot, window):
    threads = 3
    torch.set_num_threads(threads)  # as torch's default would be on a 3-core machine (the autouse fixture resets)
    assert gui_app.default_threads() == threads  # torch's default, which `hfspec run` keeps
    window.controls.baseline.setChecked(True)
    raw = []
    window.controller.result.connect(raw.append)
    _run(qtbot, window)
    measurement = raw[0].measurement  # what the library timed after the run, without the display
    timed = measurement.speculative_runs
    assert timed and all(run is not raw[0].stats for run in timed)
    own = getattr(measurement, "predicted_speedup", None)  # the cost model fitted to the timed pairs
    pooled = timed[0]
    for run in timed[1:]:
        pooled = pooled.merge(run)
    expected = own if own else pooled.predicted_speedup
    assert window.live.metrics["predicted"].value_text == f"{expected:.2f}×"
    assert window.live.metrics["c_time"].value_text == f"{pooled.c_time:.3f}"
    assert f"{threads} thr" in window.live.metrics["with"].value_text and "load" in window.live.metrics["with"].value_text
    assert measurement.threads == threads and window.threads_label.text().startswith(f"torch: {threads} thread")


def test_auto_gamma_formula_uses_the_gamma_of_each_pass(qtbot, window):
    c = window.controls
    c.gamma_auto.setChecked(True)
    c.temperature.setValue(0.7)
    c.max_new_tokens.setValue(24)
    _run(qtbot, window)
    s = window.live.result.stats
    per_pass = sum(expected_tokens_per_pass(s.alpha, g) for g in s.gamma_per_round) / len(s.gamma_per_round)
    assert window.live.metrics["expected"].value_text == f"{per_pass:.2f}"
    cost = sum(1 + g * s.c_bytes for g in s.gamma_per_round) / len(s.gamma_per_round)
    assert window.live.metrics["ideal"].value_text.startswith(f"{per_pass / cost:.2f}×")
    assert list(window.live.gamma_curve.yData) == s.gamma_per_round


def test_lookup_draws_no_estimate_at_zero_and_alpha_has_gaps_where_nothing_was_checked(qtbot, window, tmp_path):
    c = window.controls
    c.set_draft("lookup")
    c.gamma.setValue(3)
    c.temperature.setValue(0.0)
    c.baseline.setChecked(True)
    c.max_new_tokens.setValue(24)
    _run(qtbot, window)
    live, raw = window.live, window.live.result
    est = live.metrics["predicted"].value_text
    if raw.measured.predicted_speedup is None:  # the paper's formula: no estimate without a timed draft forward
        assert est == "—" and len(live.speed_bars["predicted"].opts["x"]) == 0
    else:  # a cost model that prices the lookup's rounds from the timed pairs
        assert est == f"{raw.measured.predicted_speedup:.2f}×" and raw.measured.predicted_speedup > 0
    assert 0.0 not in list(live.speed_bars["measured"].opts["height"]) + list(live.speed_bars["predicted"].opts["height"])
    unchecked = [i for i, g in enumerate(live.gammas) if g == 0]
    assert unchecked, "a lookup run with passes that proposed nothing"
    alpha = live.alpha_curve.yData
    assert all(math.isnan(alpha[i]) for i in unchecked) and live.alpha_curve.opts["connect"] == "finite"
    # compare: no bar and an empty CSV cell where the lookup row has no estimate; never a 0
    window.compare.items.setPlainText("lookup\nrtn4")
    window.compare.repeats.setValue(1)
    _run(qtbot, window, window.compare.run_button.click)
    lookup_row = window.compare.rows[0]
    est_bars = [i for i in window.compare.plots["compare_speedup"].getPlotItem().items
                if isinstance(i, pg.BarGraphItem) and i.name() == "predicted"][0]
    assert 0.0 not in list(est_bars.opts["height"])
    window.tabs.setCurrentWidget(window.compare)
    with open(window.export_statistics(str(tmp_path / "c.csv")), newline="", encoding="utf-8") as fh:
        lookup = next(csv.DictReader(fh))
    assert lookup["label"] == "lookup"
    if not lookup_row.predicted_speedup:
        assert lookup["predicted_speedup"] == "" and len(est_bars.opts["x"]) == 1  # rtn4's bar only
        assert window.compare.table.item(0, 4).text() == "—"
    else:
        assert float(lookup["predicted_speedup"]) > 0 and len(est_bars.opts["x"]) == 2


# --------------------------------------------------------------------------------------------- keys
def test_tab_leaves_the_prompt_and_enter_runs(qtbot, window):
    c = window.controls
    c.prompt.setPlainText("Return the")
    c.prompt.setFocus()
    qtbot.waitUntil(c.prompt.hasFocus)
    seen = []
    for _ in range(6):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        seen.append(QApplication.focusWidget())
    assert c.prompt.toPlainText() == "Return the"  # no tab character in the prompt
    assert c.run_button in seen and window.tabs.tabBar() in seen
    c.seed.setFocus()
    qtbot.waitUntil(c.seed.hasFocus)
    with qtbot.waitSignal(window.controller.done, timeout=TIMEOUT_MS):
        qtbot.keyClick(c.seed, Qt.Key.Key_Return)  # Enter in a field runs
    assert window.live.result is not None
    with qtbot.waitSignal(window.controller.done, timeout=TIMEOUT_MS):
        qtbot.keyClick(c.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert c.prompt.toPlainText() == "Return the"


# ---------------------------------------------------------------------------- results and their settings
def test_results_say_which_settings_produced_them(qtbot, window):
    c, live = window.controls, window.live
    c.gamma.setValue(4)
    c.max_new_tokens.setValue(64)
    with qtbot.waitSignal(window.controller.live, timeout=TIMEOUT_MS):
        window.start_run()
    assert not c.target.isEnabled() and not c.gamma.isEnabled() and c.prompt.isReadOnly()  # frozen during a run
    qtbot.waitSignal(window.controller.done, timeout=TIMEOUT_MS).wait()
    assert c.target.isEnabled() and c.gamma.isEnabled() and not c.prompt.isReadOnly()
    assert "γ 4" in live.origin.text() and "rtn4-compiled" in live.origin.text()
    c.gamma.setValue(7)
    assert "form has changed since (γ)" in live.origin.text()  # γ 7 on the form, results of γ 4
    c.gamma.setValue(4)
    assert "changed" not in live.origin.text()
    c.set_draft("rtn3")
    c.max_new_tokens.setValue(8)
    with qtbot.waitSignal(window.controller.done, timeout=TIMEOUT_MS):
        window.start_run()
        assert live.is_dimmed() and "Now loading" in live.origin.text()  # the old plots are marked, not current
    assert not live.is_dimmed() and "+ rtn3 ·" in live.origin.text() and "Now loading" not in live.origin.text()
    assert live.result.settings.draft == "rtn3"


# ------------------------------------------------------------------------------------------------ exports
def test_exports_record_the_sweep_that_ran_and_pngs_carry_their_settings(qtbot, window, tmp_path):
    window.controls.gamma.setValue(5)
    window.controls.max_new_tokens.setValue(6)
    window.sweep.gamma_from.setValue(1)
    window.sweep.gamma_to.setValue(2)
    window.sweep.repeats.setValue(1)
    window.sweep.drafts.setText("rtn4, rtn3")
    _run(qtbot, window, window.sweep.run_button.click)
    data = json.loads(Path(window.export_statistics(str(tmp_path / "s.json"))).read_text())
    assert data["sweep"]["settings"]["draft"] == ["rtn4", "rtn3"] and data["sweep"]["settings"]["gamma"] == [1, 2]
    assert all(row["rough"] and row["threads"] >= 1 for row in data["sweep"]["rows"])  # 1 repeat: rough
    assert "Rough" in window.sweep.note.text() and "thread" in window.sweep.note.text()
    window.tabs.setCurrentWidget(window.sweep)
    pngs = window.export_plots(str(tmp_path))
    image = QImage(pngs[0])
    settings = json.loads(image.text("hfspec-settings"))
    assert settings["draft"] == ["rtn4", "rtn3"] and settings["gamma"] == [1, 2]
    assert "rtn4, rtn3" in image.text("Description") and "γ 1–2" in image.text("Description")
    assert image.width() == 1200


# ------------------------------------------------------------------------------------------- smaller
def test_progress_is_full_when_the_last_point_is_done(qtbot, window):
    window.controls.max_new_tokens.setValue(4)
    window.compare.items.setPlainText("rtn4\nrtn8")
    window.compare.repeats.setValue(1)
    _run(qtbot, window, window.compare.run_button.click)
    progress = window.controls.progress
    assert progress.value() == progress.maximum() == 2


def test_refused_input_is_named_with_its_range(qtbot, window):
    c = window.controls
    assert "Allowed: 1 to" in c.gamma.toolTip() and "Allowed: 0.00 to 5.00" in c.temperature.toolTip()
    c.gamma.setFocus()
    c.gamma.lineEdit().selectAll()
    qtbot.keyClicks(c.gamma.lineEdit(), "100")
    assert c.input_note.isVisible() and "γ (draft length): got '100'; allowed: 1 to" in c.input_note.text()
    c.temperature.setFocus()
    c.temperature.lineEdit().selectAll()
    qtbot.keyClicks(c.temperature.lineEdit(), "-1")
    assert "temperature: got '-1'; allowed: 0.00 to 5.00" in c.input_note.text()


def test_compare_puts_each_unit_on_its_own_axis_with_a_1x_line(window):
    plots = window.compare.plots
    assert len(plots) == 3
    speed = plots["compare_speedup"].getPlotItem()
    assert speed.getAxis("left").labelText == "speed-up (×)"
    assert any(isinstance(i, pg.InfiniteLine) and i.value() == 1.0 for i in speed.items)
    assert plots["compare_alpha"].getPlotItem().getAxis("left").labelText == "α"


def test_errors_are_titled_and_shown_whole(qtbot, window):
    window.controls.target.setText("/no/such/model/" + "/".join(["folder"] * 60))
    _run(qtbot, window)
    title, message = window.errors[-1]
    assert title == "Run failed" and "hfspec — hfspec" not in title
    bar = window.statusBar()
    assert bar.currentMessage().endswith("…") and bar.toolTip().endswith(message.splitlines()[0])
    # a sweep's bad draft names the Sweep tab's field, not the form's draft
    window.sweep.drafts.setText("rtn4, rtnx")
    assert window.start_sweep() is False
    assert window.errors[-1][1].startswith("Sweep γ tab, drafts: ") and "'rtnx'" in window.errors[-1][1]


@pytest.mark.slow
def test_ctrl_c_in_the_terminal_quits_hfspec_gui(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT), HFSPEC_GUI_SETTINGS=str(tmp_path / "s.ini"))
    proc = subprocess.Popen([sys.executable, "-m", "gui.app"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    ready = threading.Event()

    def read():
        for line in proc.stderr:  # the window is up once it says how to quit
            if "Ctrl+C here quits" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(timeout=240), "hfspec gui never said that Ctrl+C quits it"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------------------------------- new features
def test_a_saved_run_opens_again(qtbot, window, tmp_path):
    window.controls.baseline.setChecked(True)
    _run(qtbot, window)
    cards = {k: m.value_text for k, m in window.live.metrics.items()}
    text, xs = window.live.plain_text(), list(window.live.alpha_curve.xData)
    path = window.export_statistics(str(tmp_path / "run.json"))
    window.live.clear()
    assert window.open_saved(path) and window.errors == []
    assert {k: m.value_text for k, m in window.live.metrics.items()} == cards
    assert window.live.plain_text() == text and list(window.live.alpha_curve.xData) == xs
    assert "opened from run.json" in window.live.origin.text()
    (tmp_path / "bad.json").write_text("{\"nothing\": 1}")
    assert not window.open_saved(str(tmp_path / "bad.json"))
    assert window.errors[-1][0] == "Open failed" and "no run, sweep or compare section" in window.errors[-1][1]


def test_compile_progress_counts_against_the_last_compile(qtbot, window):
    status = window.controller.worker.status
    window.clock.set_job(window.controls.settings())
    window.store.setValue(f"compile/{window.clock._safe(window.clock.key)}", 40.0)
    status.emit("compiling the draft step (the first time takes a while; kept in /tmp for the next run)…")
    assert window.clock.running() and "s left" in window.controls.progress.format()
    assert window.controls.progress.maximum() == 400
    status.emit("compiled the draft step in 12.5 s")
    assert not window.clock.running() and window.clock.last_seconds() == 12.5


def test_the_dark_theme_follows_the_system(qtbot, window, monkeypatch):
    """The platform here reports no colour scheme, so the system's answer is given to `system_theme`; the change
    arrives through Qt's own colorSchemeChanged signal, as a desktop's switch would."""
    from gui import theme

    hints = QGuiApplication.styleHints()
    assert theme.system_theme() is (theme.DARK if hints.colorScheme() == Qt.ColorScheme.Dark else theme.LIGHT)
    monkeypatch.setattr(theme, "system_theme", lambda: theme.DARK)
    try:
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        assert theme.current() is theme.DARK
        assert window.live.alpha_plot.backgroundBrush().color().name() == theme.DARK.plot_bg
        assert theme.DARK.card_bg in window.live.metrics["alpha"].styleSheet()
        assert QApplication.palette().window().color().lightness() < 100
        assert theme.DARK.muted in window.controls.preset_info.styleSheet()
    finally:
        monkeypatch.setattr(theme, "system_theme", lambda: theme.LIGHT)
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert theme.current() is theme.LIGHT and QApplication.palette().window().color().lightness() > 150


def test_a_bf16_target_says_what_exact_means(qtbot, window):
    exactness = pytest.importorskip("hfspec.audit.exactness")
    window.controls.dtype.setCurrentIndex(window.controls.dtype.findData("bfloat16"))
    window.controls.max_new_tokens.setValue(4)
    _run(qtbot, window)
    note = window.live.exactness
    assert window.errors == [] and note.isVisible()
    assert note.text() == exactness.exactness_note("bfloat16") != ""
    window.controls.dtype.setCurrentIndex(window.controls.dtype.findData("float32"))
    _run(qtbot, window)
    assert not note.isVisible() and note.text() == ""


def test_conditions_text():
    from gui.figures import Conditions

    assert Conditions(2, 1.234).text() == "2 threads · load 1.23" and Conditions(1, None).text() == "1 thread"


def test_saved_stats_come_back_with_their_cost_record():
    """A saved run's statistics are read back with their per-round cost records as records, not dicts: the ideal's
    note and the verify-cost ratio read their fields (a dict crashed `open_saved` once a run beat the ideal)."""
    import torch
    from tiny_models import build_family

    import hfspec
    from gui.figures import stats_from_dict
    from hfspec.decoding.costrecord import CostRecord
    from hfspec.measure.verify_cost import verify_ratio

    target = build_family("llama", seed=5, init=0.2)
    out = hfspec.generate(target, torch.tensor([[0, 5, 17]]), hfspec.make_draft(target, "rtn4"), gamma=3,
                          max_new_tokens=24, temperature=0)
    back = stats_from_dict(json.loads(json.dumps(out.stats.to_dict())))
    assert isinstance(back.costs, CostRecord) and back.costs.width_rounds == out.stats.costs.width_rounds
    assert verify_ratio(back, None) == verify_ratio(out.stats, None)
