# ruff: noqa: F811 - tests take test_gui's fixtures (imported below) as parameters of the same names
"""The dashboard's garbage collection runs on the GUI thread only (`gui.worker.GuiThreadGC`): while a window's
worker thread exists automatic collection is off, a GUI-thread timer collects, and closing the window turns
automatic collection back on."""

from __future__ import annotations

import gc
import threading

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")
pytest.importorskip("pytestqt")

from test_gui import TIMEOUT_MS, _has_preset, _run, session, window  # noqa: E402, F401 - test_gui's fixtures

from gui import worker  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_preset("micro-rtn4"), reason="micro-rtn4 preset absent")


class _Cycle:
    """An object in a reference cycle that records the thread that frees it."""

    freed_on: list = []

    def __init__(self):
        self.me = self

    def __del__(self):
        _Cycle.freed_on.append(threading.current_thread())


def test_cycles_are_collected_on_the_gui_thread_and_automatic_collection_returns(qtbot, window):
    assert not gc.isenabled()  # a worker thread exists: no automatic collection on whichever thread allocates
    _run(qtbot, window)  # a whole run on the worker thread meanwhile
    _Cycle.freed_on.clear()
    for _ in range(3 * gc.get_threshold()[0]):  # past generation 0's threshold
        _Cycle()
    assert _Cycle.freed_on == []  # nothing collected them automatically
    with qtbot.waitSignal(window.controller.gc.timer.timeout, timeout=TIMEOUT_MS):
        pass  # the collector's slot was connected first: it has run when the signal returns here
    assert _Cycle.freed_on and set(_Cycle.freed_on) == {threading.main_thread()}
    window.shutdown()
    assert gc.isenabled() and worker.GuiThreadGC.live == 0  # as it was before the window


def test_two_controllers_turn_collection_back_on_when_the_last_closes(qtbot, session):
    assert gc.isenabled()
    first, second = worker.RunController(session), worker.RunController(session)
    try:
        assert not gc.isenabled() and worker.GuiThreadGC.live == 2
        first.shutdown()
        first.shutdown()  # twice: counted once
        assert not gc.isenabled() and worker.GuiThreadGC.live == 1  # the second one's worker still runs
    finally:
        second.shutdown()
        first.shutdown()
    assert gc.isenabled() and worker.GuiThreadGC.live == 0
