"""The main window's file actions: open a saved run, export plots (PNG with their settings) and statistics
(JSON, CSV). A mixin of MainWindow: it uses the window's views, controller and status bar."""

from __future__ import annotations

import json
import os

from PySide6.QtWidgets import QFileDialog

from gui import export
from gui.figures import ShownRun, describe, exactness_line
from gui.plots import export_png
from hfspec.errors import HfspecError


class FileActions:
    def open_saved(self, path: str | None = None) -> bool:
        """Show a run, sweep and compare saved by File → Export statistics (JSON) again."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open a saved run", "", "JSON (*.json)")
            if not path:
                return False
        try:
            data = export.read_json(path)
            shown = ShownRun.from_dict(data["run"], source=os.path.basename(path)) if "run" in data else None
            sweep = self.sweep.rows_from(data["sweep"]) if "sweep" in data else None
            compare = self.compare.rows_from(data["compare"]) if "compare" in data else None
        except (HfspecError, KeyError, TypeError, ValueError) as exc:
            self.show_error("Open failed", str(exc) if isinstance(exc, HfspecError)
                            else f"open: {path}: not a dashboard export ({type(exc).__name__}: {exc})")
            return False
        if shown is not None:
            self.live.clear(data["run"].get("prompt", ""), shown.settings)
            self.live.finish(shown)
            dtype = shown.settings.dtype
            self.live.set_exactness(exactness_line(dtype) if dtype and dtype != "auto" else "")
            self.live.form_changed(self._form_settings())
            s = shown.stats
            self.controls.set_finished(s.new_tokens, shown.settings.max_new_tokens, shown.stop_reason, s.stopped)
        if sweep is not None:
            self.sweep.show_result(sweep)
        if compare is not None:
            self.compare_settings, self.compare_drafts = compare[1], data["compare"]["settings"].get("draft")
            self.compare.show_rows(compare[0])
        self.tabs.setCurrentWidget(self.live if shown else self.sweep if sweep else self.compare)
        self._status(f"Opened {path}")
        return True

    def export_plots(self, folder: str | None = None) -> list[str]:
        """Every plot of the current tab as PNG into `folder` (asked for when None), each with the settings
        that produced it as a caption and as PNG text ("hfspec-settings"); returns the paths."""
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self, "Export plots to folder")
            if not folder:
                return []
        caption, settings = self._provenance()
        paths = []
        for name, plot in self.tabs.currentWidget().plots.items():
            path = os.path.join(folder, f"hfspec-{name}.png")
            export_png(plot, path, caption, {"hfspec-settings": json.dumps(settings, ensure_ascii=False),
                                             "Description": caption, "Software": "hfspec dashboard"})
            paths.append(path)
        self._status(f"Saved {len(paths)} plot(s) to {folder}")
        return paths

    def _provenance(self) -> tuple[str, dict]:
        """Caption and settings of the current tab's results: what produced them and how they were measured
        (repeats / pairs, torch threads, load, and whether the measured figures are rough, unstable or
        implausible: the ruler's verdict, `hfspec.measure`)."""
        if self.tabs.currentWidget() is self.sensitivity:
            return self.sensitivity.provenance()
        data = self.statistics()
        key = {id(self.live): "run", id(self.sweep): "sweep", id(self.compare): "compare"}[id(self.tabs.currentWidget())]
        section = data.get(key) or {}
        settings = section.get("settings") or {}
        if key == "run" and self.live.shown_settings is not None:
            return " · ".join(x for x in (describe(self.live.shown_settings),
                                          run_measurement_caption(section.get("measurement"))) if x), settings
        drafts = ", ".join(map(str, settings.get("draft") or []))
        gamma = settings.get("gamma")
        gammas = f"γ {gamma[0]}–{gamma[-1]}" if isinstance(gamma, list) and gamma else f"γ {gamma}"
        target = os.path.basename(str(settings.get("target", "")).rstrip("/"))
        head = (f"{target} · drafts {drafts} · {gammas} · T {settings.get('temperature')} · seed "
                f"{settings.get('seed')} · {settings.get('max_new_tokens')} tokens" if settings else "")
        rows = section.get("rows") or []
        return " · ".join(x for x in (head, rows_measurement_caption(rows, section.get("repeats"))) if x), settings

    def statistics(self) -> dict:
        """The statistics on show (the last run, sweep, compare and sensitivity), with their settings; JSON-ready."""
        data = export.statistics(self.live.result, self.sweep.result, self.sweep.points, self.compare.rows,
                                 self.compare_settings, self.compare_drafts, self.controller.worker.conditions)
        return data | ({"sensitivity": self.sensitivity.report.to_dict()} if self.sensitivity.report else {})

    def export_statistics(self, path: str | None = None) -> str | None:
        """Write statistics as .json (everything; File → Open shows it again) or .csv (the current tab's table;
        on the Live tab also the per-pass series as name-passes.csv)."""
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
        elif self.tabs.currentWidget() is self.sensitivity and "sensitivity" in data:
            export.write_csv(self.sensitivity.report.rows(), path)
        elif "run" in data:
            export.write_csv(export.run_rows(data["run"]), path)
            export.write_csv(data["run"]["series"], export.series_path(path))
        else:
            export.write_csv([], path)
        self._status(f"Saved statistics to {path}")
        return path


def run_measurement_caption(m: dict | None) -> str:
    """How a run's speed-up was measured, for a PNG's caption: pairs, threads, load, verdict."""
    if not m:
        return "not measured"
    parts = [f"{m.get('pairs')} pair{'s' if m.get('pairs') != 1 else ''}" if m.get("pairs") is not None else ""]
    parts.append(f"{m['threads']} threads" if m.get("threads") is not None else "")
    parts.append(f"load {m['load_avg']:.1f}" if m.get("load_avg") is not None else "")
    verdict = m.get("verdict") or ("rough" if m.get("rough") else "")
    parts.append(f"measured: {verdict}" if verdict else "")
    return " · ".join(p for p in parts if p)


def rows_measurement_caption(rows: list[dict], repeats) -> str:
    """How a sweep's / compare's points were measured: repeats, threads, the highest load, and how many points
    are rough, unstable or implausible."""
    if not rows:
        return ""
    from hfspec.report import row_problem

    threads = sorted({r.get("threads") for r in rows if r.get("threads") is not None})
    loads = [r["load_avg"] for r in rows if r.get("load_avg") is not None]
    problems = [row_problem(r) for r in rows]
    parts = [f"{repeats if repeats is not None else rows[0].get('repeats')} repeats",
             f"{'/'.join(map(str, threads))} threads" if threads else "",
             f"load up to {max(loads):.1f}" if loads else ""]
    counts = {w: problems.count(w) for w in ("rough", "unstable", "implausible") if problems.count(w)}
    parts.append(", ".join(f"{n} of {len(rows)} points {w}" for w, n in counts.items()) if counts
                 else "all points stable")
    return " · ".join(p for p in parts if p)
