"""The main window: layout and wiring only (the model work is hfspec.session, run by gui.worker)."""

from __future__ import annotations

import csv
import json
import os

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QTabWidget,
)

from gui import settings as store
from gui.controls import ControlPanel
from gui.plots import CompareView, LiveView, SweepView, configure_pyqtgraph, export_png
from gui.worker import Job, RunController
from hfspec.errors import HfspecError
from hfspec.session import CompareRow, RunResult, Session, SweepPoint, SweepResult


class MainWindow(QMainWindow):
    def __init__(self, session: Session | None = None, settings_store=None):
        super().__init__()
        configure_pyqtgraph()
        _warm_imports()
        self.setWindowTitle("hfspec — speculative decoding dashboard")
        self.store = settings_store if settings_store is not None else store.open_settings()
        self.controller = RunController(session)

        self.controls = ControlPanel()
        scroll = QScrollArea()
        scroll.setWidget(self.controls)
        scroll.setWidgetResizable(True)
        scroll.setMinimumWidth(340)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.live = LiveView()
        self.sweep = SweepView()
        self.compare = CompareView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.live, "Live")
        self.tabs.addTab(self.sweep, "Sweep γ")
        self.tabs.addTab(self.compare, "Compare drafts")
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(scroll)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([360, 1040])
        self.setCentralWidget(splitter)
        self.statusBar().showMessage("Ready")
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
        self.live.clear(settings.prompt)
        return self.controller.start(Job("run", settings))

    def start_sweep(self) -> bool:
        settings = self._settings()
        if settings is None:
            return False
        from hfspec.session import parse_list

        self.tabs.setCurrentWidget(self.sweep)
        self.sweep.clear()
        return self.controller.start(Job("sweep", settings, gammas=self.sweep.gammas(),
                                         drafts=parse_list(self.sweep.drafts.text())))

    def start_compare(self) -> bool:
        settings = self._settings()
        if settings is None:
            return False
        entries = self.compare.entries() or [settings.draft]
        self.tabs.setCurrentWidget(self.compare)
        self.compare.clear()
        return self.controller.start(Job("compare", settings, drafts=entries))

    def show_error(self, title: str, message: str) -> None:
        self.last_error = (title, message)
        self._status(f"Error: {message.splitlines()[0] if message else title}")
        QMessageBox.critical(self, f"hfspec — {title}", message)

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
        """The statistics on show: the last run, sweep and compare (JSON-ready)."""
        out = {}
        if self.live.result is not None:
            out["run"] = self.live.result.to_dict()
        if self.sweep.points:
            out["sweep"] = [vars(p) for p in self.sweep.points]
        if self.compare.rows:
            out["compare"] = [vars(r) for r in self.compare.rows]
        return out

    def export_statistics(self, path: str | None = None) -> str | None:
        """Write statistics as .json (everything) or .csv (one table: the current tab's)."""
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export statistics", "hfspec-stats.json",
                                                  "JSON (*.json);;CSV (*.csv)")
            if not path:
                return None
        data = self.statistics()
        if path.lower().endswith(".csv"):
            rows = self._csv_rows(data)
            with open(path, "w", newline="", encoding="utf-8") as fh:
                if rows:
                    writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                    writer.writeheader()
                    writer.writerows(rows)
        else:
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2, default=str)
        self._status(f"Saved statistics to {path}")
        return path

    def _csv_rows(self, data: dict) -> list[dict]:
        current = self.tabs.currentWidget()
        if current is self.sweep and "sweep" in data:
            return data["sweep"]
        if current is self.compare and "compare" in data:
            return data["compare"]
        if "run" in data:
            summary = data["run"]["summary"]
            stats = data["run"]["stats"]
            rows = [{"quantity": k, "value": v} for k, v in summary.items()]
            for i, (a, k) in enumerate(zip(stats["accepted_by_position"], stats["checked_by_position"], strict=True)):
                rows.append({"quantity": f"accepted_by_position[{i + 1}]", "value": f"{a}/{k}"})
            return rows
        return []

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
        if busy:
            self._status("Loading models…")
        elif not self.statusBar().currentMessage().startswith(("Run ", "Sweep ", "Compare ", "Error", "Stopped")):
            self._status("Ready")

    def _generating(self) -> None:
        job = self.controller.job
        if job is not None and job.kind == "run":
            self.controls.set_progress(0, job.settings.max_new_tokens)
            self._status("Generating…")

    def _live(self, snapshots) -> None:
        self.live.add(snapshots)
        job = self.controller.job
        if job is not None and job.kind == "run":
            self.controls.set_progress(snapshots[-1].new_tokens, job.settings.max_new_tokens)

    def _item(self, item) -> None:
        if isinstance(item, SweepPoint):
            self.sweep.add_point(item)
        elif isinstance(item, CompareRow):
            self.compare.add_row(item)

    def _result(self, out) -> None:
        if isinstance(out, RunResult):
            self.live.finish(out)
            s = out.summary()
            how = "stopped" if s["stopped"] else "done"
            self._status(f"Run {how}: {s['new_tokens']} tokens in {s['target_passes']} target passes, "
                         f"α = {s['alpha']:.3f}, {s['tokens_per_second']:.1f} tokens/s")
        elif isinstance(out, SweepResult):
            self.sweep.show_result(out)
            self._status(f"Sweep {'stopped' if out.stopped else 'done'}: {len(out.points)} points")
        elif isinstance(out, list):
            self.compare.show_rows(out)
            self._status(f"Compare done: {len(out)} rows")

    def _status(self, text: str) -> None:
        self.statusBar().showMessage(text)

    # ------------------------------------------------------------------ persistence and lifetime
    def _menus(self) -> None:
        menu = self.menuBar().addMenu("&File")
        for text, slot, key in (("Export plots as &PNG…", self.export_plots, "Ctrl+E"),
                                ("Export &statistics (CSV/JSON)…", self.export_statistics, "Ctrl+S"),
                                ("&Quit", self.close, QKeySequence.StandardKey.Quit)):
            action = QAction(text, self)
            action.setShortcut(QKeySequence(key))
            action.triggered.connect(lambda _=False, s=slot: s())
            menu.addAction(action)
        run = self.menuBar().addMenu("&Run")
        for text, slot, key in (("&Run", self.start_run, "Ctrl+R"), ("S&top", self.controller.stop, "Esc"),
                                ("&Sweep γ", self.start_sweep, ""), ("&Compare drafts", self.start_compare, "")):
            action = QAction(text, self)
            if key:
                action.setShortcut(QKeySequence(key))
            action.triggered.connect(lambda _=False, s=slot: s())
            run.addAction(action)

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
            self.resize(1400, 900)
        self.sweep.drafts.setText(store.load_value(self.store, "sweep/drafts", self.sweep.drafts.text()))
        self.sweep.gamma_from.setValue(store.load_value(self.store, "sweep/gamma_from", 1))
        self.sweep.gamma_to.setValue(store.load_value(self.store, "sweep/gamma_to", 8))
        self.compare.items.setPlainText(store.load_value(self.store, "compare/items",
                                                         self.compare.items.toPlainText()))

    def save_state(self) -> None:
        try:
            store.save_run_settings(self.store, self.controls.settings())
        except HfspecError:
            pass
        self.store.setValue("window/geometry", self.saveGeometry())
        store.save_value(self.store, "sweep/drafts", self.sweep.drafts.text())
        store.save_value(self.store, "sweep/gamma_from", self.sweep.gamma_from.value())
        store.save_value(self.store, "sweep/gamma_to", self.sweep.gamma_to.value())
        store.save_value(self.store, "compare/items", self.compare.items.toPlainText())
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
