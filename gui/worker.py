"""Model work off the GUI thread: a Worker QObject on a QThread, and the controller that owns both.

The worker never touches a widget: it reports through signals (queued to the GUI thread) and pushes live
snapshots into a lock-protected `LiveBuffer`, which the controller drains with a QTimer at ~20 Hz (data rate
and redraw rate are independent, as in pglive). Stop is a `threading.Event` the engine polls every round.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from gui.figures import Conditions, exactness_line
from hfspec.errors import HfspecError
from hfspec.session import Cancelled, LiveBuffer, RunSettings, Session

REDRAW_MS = 50  # ~20 Hz
SETTLE_MS = 200  # after drawing the run, the GUI stays idle this long before the speed-up is timed
SETTLE_TIMEOUT_S = 3.0  # the worker never waits longer than this for the display
GC_EVERY_MS = 1000  # while a worker thread exists, Python's cyclic GC runs on the GUI thread this often, never on the worker
FAILED_TITLES = {"run": "Run failed", "sweep": "Sweep failed", "compare": "Compare failed",
                 "sensitivity": "Sensitivity failed"}


class GuiThreadGC:
    """Python's cyclic garbage collector only on the GUI thread while a controller's worker thread exists.

    An automatic collection runs on whichever thread allocates past the threshold; on the worker thread (a
    torch.compile of the draft step allocates a great deal) it can free Qt wrappers there, and Qt then crashed the
    process (a segmentation fault inside a collection on the worker thread, in the dashboard's tests on
    3 December 2026). Automatic collection is turned off while any controller lives, and a timer on the GUI thread
    collects each generation whose count is past its threshold (as pyqtgraph's `GarbageCollector`); it is turned
    back on, as it was, when the last controller shuts down."""

    live = 0
    was_enabled = True

    def __init__(self, parent: QObject):
        if GuiThreadGC.live == 0:
            GuiThreadGC.was_enabled = gc.isenabled()
            gc.disable()
        GuiThreadGC.live += 1
        self.closed = False
        self.timer = QTimer(parent)
        self.timer.setInterval(GC_EVERY_MS)
        self.timer.timeout.connect(self.collect)
        self.timer.start()

    @staticmethod
    def collect() -> None:
        counts, thresholds = gc.get_count(), gc.get_threshold()
        for generation in (2, 1, 0):  # the oldest generation due (collecting it collects the younger ones)
            if counts[generation] > thresholds[generation]:
                gc.collect(generation)
                return

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.timer.stop()
        GuiThreadGC.live -= 1
        if GuiThreadGC.live == 0 and GuiThreadGC.was_enabled:
            gc.enable()


@dataclass
class Job:
    """kind: "run" | "sweep" | "compare" | "sensitivity" (`options`: hfspec.drafts.sensitivity's arguments)."""

    kind: str
    settings: RunSettings
    gammas: list[int] = field(default_factory=list)
    drafts: list[str] = field(default_factory=list)
    repeats: int = 1
    options: dict = field(default_factory=dict)


class Worker(QObject):
    """Runs jobs from hfspec.session in its own thread; results only as signals."""

    status = Signal(str)            # a line for the status bar
    generating = Signal()           # models are loaded, decoding started
    step = Signal(int, int)         # sweep / compare: point i (from 1) of n starts
    item = Signal(object)           # a SweepRow or CompareRow as it completes
    result = Signal(object)         # RunResult | SweepResult | list[CompareRow] | SensitivityReport
    failed = Signal(str, str)       # title, message
    cancelled = Signal()
    finished = Signal()             # after every job, whatever the outcome
    settle = Signal()               # before timing the speed-up: the GUI sets `settled` once it has drawn the run

    def __init__(self, session: Session, buffer: LiveBuffer, stop: threading.Event):
        super().__init__()
        self.session = session
        self.buffer = buffer
        self.stop_event = stop
        self.settled = threading.Event()
        self.conditions: Conditions | None = None  # threads and load when the last job measured
        self.exactness = ""  # what "exact" means for the last run's target (its dtype), "" for float32

    def _wait_for_display(self) -> None:
        """Called on this thread before the speed-up is timed: wait until the GUI has taken every snapshot and
        drawn them (a busy GUI thread takes CPU time from the runs being timed, on a machine with few cores)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while len(self.buffer) and time.monotonic() < deadline:
            time.sleep(REDRAW_MS / 1000)
        self.settled.clear()
        self.settle.emit()
        self.settled.wait(max(0.0, deadline - time.monotonic()))
        self.conditions = Conditions.now()

    def _target(self, settings: RunSettings):
        """The run's target model (already loaded: the session keeps it)."""
        model, _ = self.session.load_target(settings.target, dtype=settings.dtype or None,
                                            device=settings.device or None, prepack=settings.prepack or None)
        return model

    def _sensitivity(self, job: Job, should_stop):
        """Which units cost the target's quantised draft its acceptance (`hfspec.drafts.sensitivity`)."""
        from hfspec.drafts.sensitivity import check_arguments, sensitivity

        o = job.options
        check_arguments(o.get("bits"), o.get("group_size"), o.get("method"), o.get("by"), o.get("tokens"))
        target, _ = self.session.load_target(job.settings.target, self.status.emit, should_stop,
                                             job.settings.dtype or None, job.settings.device or None,
                                             job.settings.prepack or None)

        def say(message: str) -> None:
            if should_stop():
                raise Cancelled("stopped")
            self.status.emit(message)

        return sensitivity(target, **o, progress=say, on_step=self.step.emit)

    @Slot(object)
    def start(self, job: Job) -> None:
        started = {"yes": False}
        should_stop = self.stop_event.is_set

        def on_live(snapshot):
            if not started["yes"]:
                started["yes"] = True
                self.generating.emit()
            self.buffer.push(snapshot)

        self.conditions = Conditions.now()  # sweep and compare measure from the start
        try:
            if job.kind == "run":
                out = self.session.run(job.settings, on_live=on_live, should_stop=should_stop,
                                       progress=self.status.emit, before_measure=self._wait_for_display)
                self.exactness = exactness_line(self._target(job.settings))
            elif job.kind == "sweep":
                out = self.session.sweep(job.settings, job.gammas, job.drafts or None, repeats=job.repeats,
                                         on_point=self.item.emit, should_stop=should_stop,
                                         progress=self.status.emit, on_step=self.step.emit)
            elif job.kind == "compare":
                out = self.session.compare(job.settings, job.drafts, repeats=job.repeats, on_row=self.item.emit,
                                           should_stop=should_stop, progress=self.status.emit,
                                           on_step=self.step.emit)
            elif job.kind == "sensitivity":
                out = self._sensitivity(job, should_stop)
            else:
                raise HfspecError(f"job kind: got {job.kind!r}; allowed: run, sweep, compare, sensitivity")
        except Cancelled:
            self.cancelled.emit()
        except HfspecError as exc:
            self.failed.emit(FAILED_TITLES.get(job.kind, "Failed"), str(exc))
        except Exception as exc:  # noqa: BLE001 - any failure is reported; the app keeps running
            self.failed.emit(f"{FAILED_TITLES.get(job.kind, 'Failed')}: {type(exc).__name__}",
                             f"{exc}\n\n{traceback.format_exc(limit=6)}")
        else:
            self.result.emit(out)
        finally:
            self.finished.emit()


class RunController(QObject):
    """Owns the worker thread, the live buffer and the redraw timer. Used from the GUI thread only."""

    busy_changed = Signal(bool)
    live = Signal(list)             # LiveSnapshots since the last tick
    result = Signal(object)         # the worker's result, after the last live snapshots
    done = Signal()                 # a job ended (result, failure or cancel), no longer busy
    _request = Signal(object)

    def __init__(self, session: Session | None = None, parent=None):
        super().__init__(parent)
        self.session = session or Session()
        self.buffer = LiveBuffer()
        self.stop_event = threading.Event()
        self.thread = QThread()
        self.thread.setObjectName("hfspec-worker")
        self.worker = Worker(self.session, self.buffer, self.stop_event)
        self.worker.moveToThread(self.thread)
        self._request.connect(self.worker.start)
        self.worker.result.connect(self._result)
        self.worker.finished.connect(self._finished)
        self.worker.settle.connect(self._settle)
        self.timer = QTimer(self)
        self.timer.setInterval(REDRAW_MS)
        self.timer.timeout.connect(self._tick)
        self.gc = GuiThreadGC(self)
        self.thread.start()
        self.busy = False
        self.job: Job | None = None

    def start(self, job: Job) -> bool:
        if self.busy:
            return False
        self.busy = True
        self.job = job
        self.stop_event.clear()
        self.buffer.clear()
        self.timer.start()
        self.busy_changed.emit(True)
        self._request.emit(job)
        return True

    def stop(self) -> None:
        self.stop_event.set()

    def shutdown(self, timeout_ms: int = 30_000) -> None:
        """Stop any job and end the thread (call before the window goes away)."""
        self.stop_event.set()
        self.timer.stop()
        if self.thread.isRunning():
            self.thread.quit()
            self.thread.wait(timeout_ms)
        self.gc.close()

    def _tick(self) -> None:
        items = self.buffer.drain()
        if items:
            self.live.emit(items)

    def _settle(self) -> None:
        """The worker is about to time the speed-up: draw what is left, then tell it after a quiet moment."""
        self._tick()
        QTimer.singleShot(SETTLE_MS, self.worker.settled.set)

    def _result(self, out) -> None:
        self._tick()  # whatever arrived after the last tick comes before the result
        self.result.emit(out)

    def _finished(self) -> None:
        self._tick()
        self.timer.stop()
        self.busy = False
        self.busy_changed.emit(False)
        self.done.emit()


def warm_imports() -> None:
    """Resolve transformers' lazy Auto classes now, on the GUI thread at start-up: the first resolution scans
    transformers' model folders with regexes (GIL held for ~0.4 s), which would otherwise freeze the window
    during the first Run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    try:  # the RTN draft's one-time kernel check, for the same reason
        from hfspec.quant import packing

        packing.int4_cpu_kernel_ok()
    except Exception:  # noqa: BLE001 - only a warm-up
        pass
