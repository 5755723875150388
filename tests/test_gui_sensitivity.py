"""The dashboard's Sensitivity tab, driven for real (offscreen, waiting on the worker's signals): the job runs on
the worker thread, the bars are the report's losses (largest first), exports work, the target is unchanged."""

from __future__ import annotations

import csv

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

import pyqtgraph as pg  # noqa: E402
import torch  # noqa: E402
from PySide6.QtCore import QSettings, Qt  # noqa: E402

from gui.main_window import MainWindow  # noqa: E402
from gui.sensitivity_view import GUI_GPTQ, short_name  # noqa: E402
from hfspec.errors import HfspecError  # noqa: E402
from hfspec.session import Session  # noqa: E402

TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def session():
    return Session()


@pytest.fixture
def window(qtbot, session, tmp_path, monkeypatch):
    monkeypatch.setenv("HFSPEC_GUI_SETTINGS", str(tmp_path / "env.ini"))
    store = QSettings(str(tmp_path / "gui.ini"), QSettings.Format.IniFormat)
    win = MainWindow(session=session, settings_store=store)
    qtbot.addWidget(win)
    win.show()
    errors = []
    monkeypatch.setattr("gui.main_window.QMessageBox.critical", lambda *args: errors.append(args[1:]))
    win.errors = errors
    assert win.controls.choose_preset("micro-rtn4")
    yield win
    win.shutdown()


def _sensitivity(qtbot, win):
    view = win.sensitivity
    with qtbot.waitSignal(win.controller.done, timeout=TIMEOUT_MS):
        qtbot.mouseClick(view.run_button, Qt.MouseButton.LeftButton)
        assert not view.run_button.isEnabled()  # busy: one job at a time
    assert not win.errors, win.errors
    return view.report


def _heights(view) -> list[tuple[float, float]]:
    bars = [i for i in view.plot.getPlotItem().items if isinstance(i, pg.BarGraphItem)]
    return sorted((float(x), float(h)) for b in bars for x, h in zip(b.opts["x"], b.opts["height"], strict=True))


def test_the_tab_shows_a_bar_per_unit_largest_first(qtbot, window, session):
    view = window.sensitivity
    view.tokens.setValue(64)
    view.bits.setValue(3)
    target, _ = session.load_target(window.controls.settings().target)
    ids = torch.tensor([[0, 7, 300, 42]])
    with torch.no_grad():
        before = target(input_ids=ids).logits
    report = _sensitivity(qtbot, window)
    assert window.tabs.currentWidget() is view
    assert report.bits == 3 and report.method == "rtn" and report.tokens == 64 and len(report.units) == 9
    heights = _heights(view)
    assert [x for x, _ in heights] == list(range(9))
    assert [h for _, h in heights] == pytest.approx([u.loss for u in report.units])
    assert [h for _, h in heights] == sorted((h for _, h in heights), reverse=True)
    ticks = view.plot.getPlotItem().getAxis("bottom")._tickLevels[0]
    shown = {x: label for x, label in ticks}  # elided on the right ("L3 at…") where the plot is narrow: the layer stays
    assert all(short_name(report.units[int(x)].name).startswith(label.rstrip("…")) for x, label in shown.items())
    assert shown[0] == "head" == short_name(report.units[0].name)
    assert short_name("layer 2 attention") == "L2 attn" and short_name("model.layers.3.mlp.up_proj") == "L3 up_proj"
    assert report.advice(gptq=GUI_GPTQ) in view.note.text().replace("&#x27;", "'")
    assert "Sensitivity done: 9 units" in window.status_text
    assert view.run_button.isEnabled()
    with torch.no_grad():
        assert torch.equal(target(input_ids=ids).logits, before)  # the session's target is left as it was


def test_matrix_units_with_gptq_and_exports(qtbot, window, tmp_path):
    view = window.sensitivity
    view.tokens.setValue(32)
    view.by.setCurrentText("matrix")
    view.method.setCurrentText("gptq")
    view.group.setCurrentText("64")
    report = _sensitivity(qtbot, window)
    assert report.method == "gptq" and report.by == "matrix" and report.group_size == 64
    assert len(report.units) == 4 * 7 + 1 and len(_heights(view)) == 29
    paths = window.export_plots(str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["hfspec-sensitivity.png"]
    out = window.export_statistics(str(tmp_path / "sens.csv"))
    with open(out, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["unit"] for r in rows] == [u.name for u in report.units]
    assert window.statistics()["sensitivity"]["method"] == "gptq"


def test_bad_settings_do_not_start_a_job(window, monkeypatch):
    def bad():
        raise HfspecError("target: got ''; allowed: a model folder")

    monkeypatch.setattr(window.controls, "settings", bad)
    assert window.start_sensitivity() is False
    assert window.errors[-1][0] == "Settings" and not window.controller.busy and window.sensitivity.report is None
