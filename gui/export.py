"""Exports of what the dashboard shows: JSON (everything, with the settings and the live per-pass series) and
CSV (the current tab's table, each row carrying the settings)."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

SETTING_COLUMNS = ("target", "prompt", "seed", "temperature", "top_k", "top_p", "max_new_tokens", "chat",
                   "device", "dtype")


def statistics(live_result, sweep_result, sweep_points, compare_rows, compare_settings) -> dict:
    """The statistics on show: the last run, sweep and compare (JSON-ready)."""
    out = {}
    if live_result is not None:
        out["run"] = live_result.to_dict()
    if sweep_points:
        settings = sweep_result.settings.to_dict() if sweep_result and sweep_result.settings else None
        out["sweep"] = {"settings": settings, "repeats": sweep_result.repeats if sweep_result else None,
                        "rows": [asdict(p) for p in sweep_points]}
    if compare_rows:
        out["compare"] = {"settings": compare_settings.to_dict() if compare_settings else None,
                          "rows": [asdict(r) for r in compare_rows]}
    return out


def write_json(data: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str, ensure_ascii=False)


def write_csv(rows: list[dict], path: str | Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def table_rows(section: dict) -> list[dict]:
    """Sweep / compare rows, each with the settings they ran with."""
    settings = section.get("settings") or {}
    extra = {f"setting_{k}": settings.get(k) for k in SETTING_COLUMNS if k in settings}
    return [row | extra for row in section["rows"]]


def run_rows(run: dict) -> list[dict]:
    """A run as quantity,value rows: settings, summary, acceptance by position."""
    rows = [{"quantity": f"setting_{k}", "value": v} for k, v in run["settings"].items()]
    rows += [{"quantity": k, "value": v} for k, v in run["summary"].items()]
    stats = run["stats"]
    for i, (a, k) in enumerate(zip(stats["accepted_by_position"], stats["checked_by_position"], strict=True)):
        rows.append({"quantity": f"accepted_by_position[{i + 1}]", "value": f"{a}/{k}"})
    return rows


def series_path(path: str) -> str:
    """Where a run's per-pass series goes beside a CSV export: name-passes.csv."""
    p = Path(path)
    return str(p.with_name(p.stem + "-passes.csv"))
