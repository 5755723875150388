"""The main window: layout and wiring only (the model work is hfspec.session, run by gui.worker)."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QLabel, QMainWindow, QMessageBox, QSplitter, QTabWidget

from gui import settings as store
from gui import theme
from gui.compare_view import CompareView
from gui.compile_clock import CompileClock
from gui.controls import ControlPanel
from gui.figures import Conditions, describe
from gui.files import FileActions
from gui.glossary import GlossaryDialog
from gui.live_view import LiveView
from gui.plots import configure_pyqtgraph
from gui.sensitivity_view import SensitivityActions, SensitivityView
from gui.sweep_view import SweepView
from gui.worker import Job, RunController, warm_imports
from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.measure import verify_cost
from hfspec.session import Session, SweepResult, parse_list

DEFAULT_SIZE = (1400, 900)
GUI_BF16 = "choosing bfloat16 in the Precision box on the left (or ticking fp32: prepack weights under it)"  # in the form's words
FRAME_ROOM = (16, 48)  # a window manager's borders and title bar, before the frame is known


def first_size(available: QRect) -> QSize:
    """The first window's size: the default, shrunk to the screen's available area (frame included)."""
    return QSize(min(DEFAULT_SIZE[0], available.width() - FRAME_ROOM[0]),
                 min(DEFAULT_SIZE[1], available.height() - FRAME_ROOM[1]))


class MainWindow(FileActions, SensitivityActions, QMainWindow):
    def __init__(self, session: Session | None = None, settings_store=None):
        super().__init__()
        theme.apply(theme.system_theme())
        configure_pyqtgraph()
        warm_imports()
        self.setWindowTitle("hfspec — speculative decoding dashboard")
        self.store = settings_store if settings_store is not None else store.open_settings()
        self.controller = RunController(session)

        self.controls = ControlPanel()
        self.live = LiveView()
        self.sweep = SweepView()
        self.compare = CompareView()
        self.sensitivity = SensitivityView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.live, "Live")
        self.tabs.addTab(self.sweep, "Sweep γ")
        self.tabs.addTab(self.compare, "Compare drafts")
        self.tabs.addTab(self.sensitivity, "Sensitivity")
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.controls)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(1, 1)
        splitter.setChildrenCollapsible(False)
        splitter.setSizes([self.controls.minimumSizeHint().width(), DEFAULT_SIZE[0]])
        self.setCentralWidget(splitter)
        self.status_text = ""
        self._reported = False  # the running job's outcome is in the status bar
        self.threads_label = QLabel()
        self.statusBar().addPermanentWidget(self.threads_label)
        self._status("Ready")
        self.glossary: GlossaryDialog | None = None
        self.compare_settings = None
        self.compare_drafts: list[str] = []
        self._fresh = False  # the running job has not shown data yet: the previous results stay until it does
        self._menus()
        self.setTabOrder(self.controls.prompt, self.controls.run_button)
        self.setTabOrder(self.controls.run_button, self.controls.stop_button)
        self.setTabOrder(self.controls.stop_button, self.tabs.tabBar())
        self.clock = CompileClock(self.store, self)
        self.clock.tick.connect(self.controls.set_compiling)
        self.clock.ended.connect(lambda _: self.controls.set_busy(True, loading=True))

        c, w = self.controller, self.controller.worker
        self.controls.run_requested.connect(self.start_run)
        self.controls.stop_requested.connect(c.stop)
        self.controls.edited.connect(self._form_edited)
        self.sweep.run_requested.connect(self.start_sweep)
        self.sweep.drafts.textChanged.connect(self._recheck_input)
        self.compare.items.textChanged.connect(self._recheck_input)
        self.compare.run_requested.connect(self.start_compare)
        self.sensitivity.run_requested.connect(self.start_sensitivity)
        c.busy_changed.connect(self._busy)
        c.live.connect(self._live)
        c.result.connect(self._result)
        w.status.connect(self._progress)
        w.generating.connect(self._generating)
        w.step.connect(self.controls.set_point)
        w.item.connect(self._item)
        w.failed.connect(self._job_failed)
        w.cancelled.connect(self._cancelled)
        self.last_error: tuple[str, str] | None = None
        self._input_error = False  # the status bar shows an error (cleared once an edit leaves the input valid)
        hints = QGuiApplication.styleHints()
        self._follows_theme = hasattr(hints, "colorSchemeChanged")
        if self._follows_theme:
            hints.colorSchemeChanged.connect(self._system_theme_changed)
        self._restore()
        self._show_threads()

    # ------------------------------------------------------------------ actions
    def start_run(self) -> bool:
        settings = self._settings()
        if settings is None:
            return False
        self.tabs.setCurrentWidget(self.live)
        return self._start(Job("run", settings))

    def start_sweep(self) -> bool:
        settings = self._settings()
        drafts = self._drafts("Sweep γ tab, drafts", parse_list(self.sweep.drafts.text()))
        if settings is None or drafts is None:
            return False
        self.tabs.setCurrentWidget(self.sweep)
        return self._start(Job("sweep", settings, gammas=self.sweep.gammas(), drafts=drafts,
                               repeats=self.sweep.repeats.value()))

    def start_compare(self) -> bool:
        settings = self._settings()
        entries = self.compare.entries() or ([settings.draft] if settings else [])
        drafts = self._drafts("Compare drafts tab, drafts", [e.rpartition("|")[2].strip() for e in entries])
        if settings is None or drafts is None:
            return False
        self.tabs.setCurrentWidget(self.compare)
        return self._start(Job("compare", settings, drafts=entries, repeats=self.compare.repeats.value()))

    def _start(self, job: Job) -> bool:
        self._fresh = True
        self.clock.set_job(job.settings)
        if job.kind == "run" and self.live.shown_settings is not None:
            self.live.set_pending(describe(job.settings))
        return self.controller.start(job)

    def show_error(self, title: str, message: str) -> None:
        self.last_error = (title, message)
        self._input_error = True  # a refused input, or a job that failed on it (a missing model folder, say)
        self._reported = True
        self.clock.stop()
        self._status(f"Error: {message.splitlines()[0] if message else title}")
        QMessageBox.critical(self, title, message)

    def show_glossary(self) -> GlossaryDialog:
        if self.glossary is None:
            self.glossary = GlossaryDialog(self)
        self.glossary.show()
        self.glossary.raise_()
        return self.glossary

    def _job_failed(self, title: str, message: str) -> None:
        """The worker's job failed: the progress bar says so (not blank), then the error as any other."""
        self.controls.set_failed(title.split(":")[0].lower())
        self.show_error(title, message)

    def _input_valid(self) -> bool:
        """The form, and the Sweep and Compare tabs' drafts, as a Run, Sweep or Compare would check them."""
        try:
            self.controls.settings().validated()
            for spec in [*parse_list(self.sweep.drafts.text()),
                         *(e.rpartition("|")[2].strip() for e in self.compare.entries())]:
                registry.parse(spec)
        except HfspecError:
            return False
        return True

    def _recheck_input(self) -> None:
        """After an edit: an error in the status bar (a refused input, or a job that failed, e.g. on a model folder
        that does not exist) leaves it once the input validates."""
        if self._input_error and not self.controller.busy and self._input_valid():
            self._input_error = False
            self._status("Ready")

    def _system_theme_changed(self, _scheme) -> None:
        self.follow_system_theme()

    def follow_system_theme(self) -> None:
        """Restyle everything in the system's colour scheme (called when it changes)."""
        theme.apply(theme.system_theme())
        for view in (self.live, self.sweep, self.compare, self.sensitivity, self.controls):
            view.retheme()

    # ------------------------------------------------------------------ slots
    def _settings(self):
        try:
            settings = self.controls.settings().validated()
        except HfspecError as exc:
            self.show_error("Settings", str(exc))
            return None
        store.save_run_settings(self.store, settings)
        return settings

    def _form_settings(self):
        try:
            return self.controls.settings()
        except HfspecError:
            return None

    def _drafts(self, where: str, specs: list[str]) -> list[str] | None:
        """`specs` checked before anything runs; an error names the tab's field, not the form's draft."""
        for spec in specs:
            try:
                registry.parse(spec)
            except HfspecError as exc:
                why = str(exc).removeprefix("draft: ")
                self.show_error("Settings", f"{where}: {why}")
                return None
        return specs

    def _busy(self, busy: bool) -> None:
        self.controls.set_busy(busy, loading=busy)
        self.sweep.run_button.setEnabled(not busy)
        self.compare.run_button.setEnabled(not busy)
        self.sensitivity.run_button.setEnabled(not busy)
        self.stop_action.setEnabled(busy)
        for action in self.start_actions:
            action.setEnabled(not busy)
        if busy:
            self._status("Loading models…")
            self._reported = False
            self._input_error = False  # the error left the status bar: a later edit must not blank this job's line
        else:
            self.clock.stop()
            if self.live._pending:  # the job ended without data (failed or stopped): the results stay current
                self.live.set_pending("")
            if self.controller.job and self.controller.job.kind in ("sweep", "compare"):
                done = len(self.sweep.points) if self.controller.job.kind == "sweep" else len(self.compare.rows)
                total = self.controls.progress.maximum()
                if done:
                    self.controls.set_points_done(done, max(total, done))
            if not self._reported:
                self._status("Ready")
            self._show_threads()

    def _take_fresh(self) -> bool:
        """True once per job, when its first data arrives (then the previous results are cleared)."""
        fresh, self._fresh = self._fresh, False
        return fresh

    def _progress(self, message: str) -> None:
        self.clock.feed(message)
        self._status(message)

    def _generating(self) -> None:
        job = self.controller.job
        if job is not None and job.kind == "run":
            if self._take_fresh():
                self.live.clear(job.settings.prompt, job.settings)
            self.controls.set_progress(0, job.settings.max_new_tokens)
            self._status("Generating…")

    def _live(self, snapshots) -> None:
        job = self.controller.job
        if job is None or job.kind != "run":
            return
        if self._take_fresh():
            self.live.clear(job.settings.prompt, job.settings)
        self.live.add(snapshots)
        self.controls.set_progress(snapshots[-1].new_tokens, job.settings.max_new_tokens)

    def _item(self, item) -> None:
        """A sweep point or compare row as it completes (the job's kind says which)."""
        job = self.controller.job
        fresh = self._take_fresh()
        if job is None:
            return
        view = self.compare if job.kind == "compare" else self.sweep
        if fresh:
            view.clear()
            if job.kind == "compare":
                self.compare_settings, self.compare_drafts = job.settings, list(job.drafts)
        (view.add_row if job.kind == "compare" else view.add_point)(item)
        self.controls.set_points_done(len(self.compare.rows if job.kind == "compare" else self.sweep.points),
                                      self.controls.progress.maximum())

    def _result(self, out) -> None:
        """The job's result, shown by the view of the job's kind."""
        job = self.controller.job
        {"run": self._show_run, "sweep": self._show_sweep, "compare": self._show_compare,
         "sensitivity": self._show_sensitivity}[job.kind](out)
        self._reported = True

    def _show_run(self, out) -> None:
        if self._take_fresh():
            self.live.clear(out.settings.prompt, out.settings)
        self.live.finish(out, self.controller.worker.conditions)
        advice = verify_cost.advice(out.stats, out.baseline, switch=GUI_BF16) or ""
        self.live.set_exactness("\n".join(line for line in (self.controller.worker.exactness, advice) if line))
        self.live.form_changed(self._form_settings())
        shown = self.live.result
        s, m = shown.stats, shown.measured
        self.controls.set_finished(s.new_tokens, out.settings.max_new_tokens, shown.stop_reason, s.stopped)
        how = "stopped" if s.stopped else "done"
        ended = f", ended by {shown.stop_reason}" if shown.stop_reason else ""
        speed = f", measured {m.speedup:.2f}×{' (rough)' if m.rough else ''}" if m and m.speedup else ""
        self._status(f"Run {how}: {s.new_tokens} tokens in {s.target_passes} target passes{ended}, "
                     f"α = {s.alpha:.3f}{speed}")

    def _show_sweep(self, out: SweepResult) -> None:
        if out.points:
            self.sweep.show_result(out, self.controller.worker.conditions)
        self._status(f"Sweep {'stopped' if out.stopped else 'done'}: {len(out.points)} points")

    def _show_compare(self, rows) -> None:
        if rows:
            self.compare.show_rows(rows, self.controller.worker.conditions)
        self._status(f"Compare done: {len(rows)} rows")

    def _cancelled(self) -> None:
        self._reported = True
        self._status("Stopped while loading")

    def _form_edited(self) -> None:
        self.live.form_changed(self._form_settings())
        if not self.controller.busy:
            self.controls.reset_progress()  # the last job's progress is not of these settings
            self._recheck_input()

    def _status(self, text: str) -> None:
        """A line in the status bar, shortened with "…" to fit; the whole of it in the bar's tooltip."""
        self.status_text = text
        bar = self.statusBar()
        room = max(80, bar.width() - self.threads_label.sizeHint().width() - 40)
        shown = bar.fontMetrics().elidedText(text.replace("\n", " "), Qt.TextElideMode.ElideRight, room)
        bar.showMessage(shown)
        bar.setToolTip(text if shown != text else "")

    def _show_threads(self) -> None:
        c = Conditions.now()
        self.threads_label.setText(f"torch: {c.text()}")
        self.threads_label.setToolTip("torch's CPU threads (the same default as `hfspec run`; `hfspec gui "
                                      "--threads N` sets them) and the 1-minute load average, now. Measured "
                                      "figures show the values while they were measured.")

    def resizeEvent(self, event):  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if self.status_text:
            self._status(self.status_text)

    # ------------------------------------------------------------------ menus
    def _menus(self) -> None:
        def add(menu, text, slot, key=None):
            action = QAction(text, self)
            if key:
                action.setShortcut(QKeySequence(key))
            action.triggered.connect(lambda _=False, s=slot: s())
            menu.addAction(action)
            return action

        file = self.menuBar().addMenu("&File")
        add(file, "&Open saved run (JSON)…", self.open_saved, QKeySequence.StandardKey.Open)
        add(file, "Export plots as &PNG…", self.export_plots, "Ctrl+E")
        add(file, "Export &statistics (CSV/JSON)…", self.export_statistics, "Ctrl+S")
        add(file, "Save generated &text…", self.live.save_text)
        add(file, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit = self.menuBar().addMenu("&Edit")
        add(edit, "&Copy generated text", self.live.copy_text)
        run = self.menuBar().addMenu("&Run")
        self.start_actions = [add(run, "&Run", self.start_run, "Ctrl+R")]
        self.stop_action = add(run, "S&top", self.controller.stop, "Esc")
        self.stop_action.setEnabled(False)
        self.start_actions += [add(run, "&Sweep γ", self.start_sweep), add(run, "&Compare drafts", self.start_compare),
                               add(run, "Se&nsitivity of the draft", self.start_sensitivity)]
        help_menu = self.menuBar().addMenu("&Help")
        add(help_menu, "&Glossary (α, γ, c, the formula)", self.show_glossary, "F1")

    # ------------------------------------------------------------------ persistence and lifetime
    def _restore(self) -> None:
        store.restore_window(self)

    def fit_to_screen(self) -> None:
        """First launch: the default size, shrunk to the screen's available area, placed inside it."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        available = screen.availableGeometry()
        size = first_size(available)
        self.resize(size)
        self.move(available.x() + max(0, (available.width() - size.width() - FRAME_ROOM[0]) // 2),
                  available.y() + max(0, (available.height() - size.height() - FRAME_ROOM[1]) // 2))

    def save_state(self) -> None:
        store.save_window(self)

    def shutdown(self) -> None:
        """Save settings and end the worker thread (also done on close)."""
        self.save_state()
        self.controller.shutdown()
        if self._follows_theme:
            QGuiApplication.styleHints().colorSchemeChanged.disconnect(self._system_theme_changed)
            self._follows_theme = False

    def closeEvent(self, event):  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

