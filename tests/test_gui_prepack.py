# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""The dashboard's "fp32: prepack weights" box (under Precision): bound to RunSettings.prepack, kept like the
precision when a preset is chosen, and a run with it ticked decodes on a prepacked target (driven for real,
offscreen, waiting on the worker's signals)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from test_gui import _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

from hfspec.kernels import fast_linear  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


def test_the_prepack_box_round_trips_through_run_settings(window):
    c = window.controls
    assert c.prepack.isChecked() is False and c.settings().prepack is False
    assert c.prepack.text() == "fp32: prepack weights" and "second fp32 copy" in c.prepack.toolTip()
    c.prepack.setChecked(True)
    assert c.settings().prepack is True
    c.set_settings(replace(c.settings(), prepack=False))
    assert not c.prepack.isChecked()
    c.set_settings(replace(c.settings(), prepack=True))
    assert c.prepack.isChecked()
    # like the precision, not a preset's value: choosing a preset keeps it, ticking it keeps the preset
    assert c.choose_preset("micro-rtn4") and c.prepack.isChecked() and c.settings().prepack is True
    c.prepack.setChecked(False)
    assert c.preset.currentText() == "micro-rtn4" and c.settings().prepack is False


@pytest.mark.skipif(not fast_linear.available(), reason="no oneDNN prepacked linear in this torch")
def test_a_run_with_the_box_ticked_decodes_on_a_prepacked_target(qtbot, window, session):
    said = []
    window.controller.worker.status.connect(said.append)
    window.controls.prepack.setChecked(True)
    _run(qtbot, window)
    assert not window.errors
    assert any(line.startswith("prepacked the target's linear weights") for line in said)
    target = window.controls.settings().target
    packed, _ = session.load_target(target, prepack=True)
    assert fast_linear.prepacked_bytes(packed) > 0
    # the run (and its exactness line) used only the prepacked target: the unpacked one still has to load
    later = []
    plain, _ = session.load_target(target, progress=later.append)
    assert any(line.startswith("loading target") for line in later) and fast_linear.prepacked_bytes(plain) == 0
