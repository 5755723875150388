"""The main window: layout and wiring only (the model work is hfspec.session, run by gui.worker)."""

from __future__ import annotations

import os

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMessageBox, QSplitter, QTabWidget

from gui import export
from gui import settings as store
from gui.compare_view import CompareView
from gui.controls import ControlPanel
from gui.glossary import GlossaryDialog
from gui.live_view import LiveView
from gui.plots import configure_pyqtgraph, export_png
from gui.sweep_view import SweepView
from gui.worker import Job, RunController
from hfspec.errors import HfspecError
from hfspec.session import CompareRow, RunResult, Session, SweepResult, SweepRow, parse_list

DEFAULT_SIZE = (1400, 900)


class MainWindow(QMainWindow):
    def __init__(self, session: Session | None = None, settings_store=None):
        super().__init__()
        configure_pyqtgraph()
        _warm_imports()
        self.setWindowTitle("hfspec — speculative decoding dashboard")
        self.store = settings_store if settings_store is not None else store.open_settings()
        self.controller = RunController(session)

        self.controls = ControlPanel()
        self.controls.setMinimumWidth(300)
        self.live = LiveView()
        self.sweep = SweepView()
        self.compare = CompareView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.live, "Live")
        self.tabs.addTab(self.sweep, "Sweep γ")
        self.tabs.addTab(self.compare, "Compare drafts")
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.controls)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(1, 1)
        splitter.setChildrenCollapsible(False)
        splitter.setSizes([350, 1050])
        self.setCentralWidget(splitter)
        self.statusBar().showMessage("Ready")
        self.glossary: GlossaryDialog | None = None
        self.compare_settings = None
        self._fresh = False  # the running job has not shown data yet: the previous results stay until it does
        self._menus()

        c, w = self.controller, self.controller.worker
        self.controls.run_requested.connect(self.start_run)
        self.controls.stop_requested.connect(c.stop)
        self.sweep.run_requested.connect(self.start_sweep)
        self.compare.run_requested.connect(self.start_compare)
        c.busy_changed.connect(self._busy)
        c.live.connect(self._live)
        c.result.connect(self._result)
        w.status.connect(self._status)
        w.generating.connect(self._generating)
        w.step.connect(self.controls.set_point)
        w.item.connect(self._item)
        w.failed.connect(self.show_error)
        w.cancelled.connect(lambda: self._status("Stopped while loading"))
        self.last_error: tuple[str, str] | None = None
        self._restore()

    # ------------------------------------------------------------------ actions
    def start_run(self) -> bool:
        settings = self._settings()
        if settings is None:
            return False
        self.tabs.setCurrentWidget(self.live)
        return self._start(Job("run", settings))

    def start_sweep(self) -> bool:
        settings = self._settings()
        if settings is None:
            return False
        self.tabs.setCurrentWidget(self.sweep)
        return self._start(Job("sweep", settings, gammas=self.sweep.gammas(),
                               drafts=parse_list(self.sweep.drafts.text()), repeats=self.sweep.repeats.value()))

    def start_compare(self) -> bool:
        settings = self._settings()
        if settings is None:
            return False
        self.tabs.setCurrentWidget(self.compare)
        return self._start(Job("compare", settings, drafts=self.compare.entries() or [settings.draft],
                               repeats=self.compare.repeats.value()))

    def _start(self, job: Job) -> bool:
        self._fresh = True
        return self.controller.start(job)

    def show_error(self, title: str, message: str) -> None:
        self.last_error = (title, message)
        self._status(f"Error: {message.splitlines()[0] if message else title}")
        QMessageBox.critical(self, f"hfspec — {title}", message)

    def show_glossary(self) -> GlossaryDialog:
        if self.glossary is None:
            self.glossary = GlossaryDialog(self)
        self.glossary.show()
        self.glossary.raise_()
        return self.glossary

    # ------------------------------------------------------------------ export
    def export_plots(self, folder: str | None = None) -> list[str]:
        """Every plot of the current tab as PNG into `folder` (asked for when None); returns the paths."""
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self, "Export plots to folder")
            if not folder:
                return []
        paths = []
        for name, plot in self.tabs.currentWidget().plots.items():
            path = os.path.join(folder, f"hfspec-{name}.png")
            export_png(plot, path)
            paths.append(path)
        self._status(f"Saved {len(paths)} plot(s) to {folder}")
        return paths

    def statistics(self) -> dict:
        """The statistics on show (the last run, sweep and compare), with their settings; JSON-ready."""
        return export.statistics(self.live.result, self.sweep.result, self.sweep.points, self.compare.rows,
                                 self.compare_settings)

    def export_statistics(self, path: str | None = None) -> str | None:
        """Write statistics as .json (everything) or .csv (the current tab's table; on the Live tab also the
        per-pass series as name-passes.csv)."""
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export statistics", "hfspec-stats.json",
                                                  "JSON (*.json);;CSV (*.csv)")
            if not path:
                return None
        data = self.statistics()
        if not path.lower().endswith(".csv"):
            export.write_json(data, path)
        elif self.tabs.currentWidget() is self.sweep and "sweep" in data:
            export.write_csv(export.table_rows(data["sweep"]), path)
        elif self.tabs.currentWidget() is self.compare and "compare" in data:
            export.write_csv(export.table_rows(data["compare"]), path)
        elif "run" in data:
            export.write_csv(export.run_rows(data["run"]), path)
            export.write_csv(data["run"]["series"], export.series_path(path))
        else:
            export.write_csv([], path)
        self._status(f"Saved statistics to {path}")
        return path

    # ------------------------------------------------------------------ slots
    def _settings(self):
        try:
            settings = self.controls.settings().validated()
        except HfspecError as exc:
            self.show_error("settings", str(exc))
            return None
        store.save_run_settings(self.store, settings)
        return settings

    def _busy(self, busy: bool) -> None:
        self.controls.set_busy(busy, loading=busy)
        self.sweep.run_button.setEnabled(not busy)
        self.compare.run_button.setEnabled(not busy)
        self.stop_action.setEnabled(busy)
        for action in self.start_actions:
            action.setEnabled(not busy)
        if busy:
            self._status("Loading models…")
        elif not self.statusBar().currentMessage().startswith(("Run ", "Sweep ", "Compare ", "Error", "Stopped")):
            self._status("Ready")

    def _take_fresh(self) -> bool:
        """True once per job, when its first data arrives (then the previous results are cleared)."""
        fresh, self._fresh = self._fresh, False
        return fresh

    def _generating(self) -> None:
        job = self.controller.job
        if job is not None and job.kind == "run":
            if self._take_fresh():
                self.live.clear(job.settings.prompt)
            self.controls.set_progress(0, job.settings.max_new_tokens)
            self._status("Generating…")

    def _live(self, snapshots) -> None:
        job = self.controller.job
        if job is None or job.kind != "run":
            return
        if self._take_fresh():
            self.live.clear(job.settings.prompt)
        self.live.add(snapshots)
        self.controls.set_progress(snapshots[-1].new_tokens, job.settings.max_new_tokens)

    def _item(self, item) -> None:
        fresh = self._take_fresh()
        if isinstance(item, CompareRow):
            if fresh:
                self.compare.clear()
                self.compare_settings = self.controller.job.settings if self.controller.job else None
            self.compare.add_row(item)
        elif isinstance(item, SweepRow):
            if fresh:
                self.sweep.clear()
            self.sweep.add_point(item)

    def _result(self, out) -> None:
        if isinstance(out, RunResult):
            if self._take_fresh():
                self.live.clear(out.settings.prompt)
            self.live.finish(out)
            s = out.stats
            how = "stopped" if s.stopped else "done"
            ended = f", ended by {out.stop_reason}" if out.stop_reason else ""
            self._status(f"Run {how}: {s.new_tokens} tokens in {s.target_passes} target passes{ended}, "
                         f"α = {s.alpha:.3f}, {s.tokens_per_second:.1f} tokens/s")
        elif isinstance(out, SweepResult):
            if out.points:
                self.sweep.show_result(out)
            self._status(f"Sweep {'stopped' if out.stopped else 'done'}: {len(out.points)} points")
        elif isinstance(out, list):
            if out:
                self.compare.show_rows(out)
            self._status(f"Compare done: {len(out)} rows")

    def _status(self, text: str) -> None:
        self.statusBar().showMessage(text)

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
        self.start_actions += [add(run, "&Sweep γ", self.start_sweep), add(run, "&Compare drafts", self.start_compare)]
        help_menu = self.menuBar().addMenu("&Help")
        add(help_menu, "&Glossary (α, γ, c, the formula)", self.show_glossary, "F1")

    # ------------------------------------------------------------------ persistence and lifetime
    def _restore(self) -> None:
        saved = store.load_run_settings(self.store)
        if saved is not None:
            self.controls.set_settings(saved)
        else:
            from hfspec.presets import DEFAULT_PRESET

            self.controls.choose_preset(DEFAULT_PRESET)
        geometry = self.store.value("window/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        else:
            self.resize(*DEFAULT_SIZE)
        self.sweep.drafts.setText(store.load_value(self.store, "sweep/drafts", self.sweep.drafts.text()))
        self.sweep.gamma_from.setValue(store.load_value(self.store, "sweep/gamma_from", 1))
        self.sweep.gamma_to.setValue(store.load_value(self.store, "sweep/gamma_to", 8))
        self.sweep.repeats.setValue(store.load_value(self.store, "sweep/repeats", 3))
        self.compare.items.setPlainText(store.load_value(self.store, "compare/items",
                                                         self.compare.items.toPlainText()))
        self.compare.repeats.setValue(store.load_value(self.store, "compare/repeats", 3))

    def save_state(self) -> None:
        try:
            store.save_run_settings(self.store, self.controls.settings())
        except HfspecError:
            pass
        self.store.setValue("window/geometry", self.saveGeometry())
        store.save_value(self.store, "sweep/drafts", self.sweep.drafts.text())
        store.save_value(self.store, "sweep/gamma_from", self.sweep.gamma_from.value())
        store.save_value(self.store, "sweep/gamma_to", self.sweep.gamma_to.value())
        store.save_value(self.store, "sweep/repeats", self.sweep.repeats.value())
        store.save_value(self.store, "compare/items", self.compare.items.toPlainText())
        store.save_value(self.store, "compare/repeats", self.compare.repeats.value())
        self.store.sync()

    def shutdown(self) -> None:
        """Save settings and end the worker thread (also done on close)."""
        self.save_state()
        self.controller.shutdown()

    def closeEvent(self, event):  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)


def _warm_imports() -> None:
    """Resolve transformers' lazy Auto classes now, on the GUI thread at start-up: the first resolution scans
    transformers' model folders with regexes (GIL held for ~0.4 s), which would otherwise freeze the window
    during the first Run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    try:  # the RTN draft's one-time kernel check, for the same reason
        from hfspec.quant import packing

        packing.int4_cpu_kernel_ok()
    except Exception:  # noqa: BLE001 - only a warm-up
        pass
