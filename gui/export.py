"""Exports of what the dashboard shows: JSON (everything, with the settings that produced it and the live
per-pass series; File → Open reads it back) and CSV (the current tab's table, each row carrying the settings;
written by hfspec.report's writer, the CLI's)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gui.figures import number, row_conditions, row_is_rough, row_pairs
from hfspec.report import write_csv  # noqa: F401 - the one CSV writer, re-exported for the window

SETTING_COLUMNS = ("target", "draft", "gamma", "prompt", "seed", "temperature", "top_k", "top_p",
                   "max_new_tokens", "chat", "device", "dtype", "prepack")


def statistics(shown_run, sweep_result, sweep_points, compare_rows, compare_settings, compare_drafts=None,
               conditions=None) -> dict:
    """The statistics on show: the last run, sweep and compare (JSON-ready), each with the settings that
    produced it: a sweep's drafts and γ values, a compare's drafts, not the form's single draft and γ."""
    out = {}
    if shown_run is not None:
        out["run"] = shown_run.data
    if sweep_points:
        settings = sweep_result.settings.to_dict() if sweep_result and sweep_result.settings else {}
        drafts = list(dict.fromkeys(p.draft for p in sweep_points))
        gammas = list(sweep_result.gammas) if sweep_result else sorted({p.gamma for p in sweep_points})
        out["sweep"] = {"settings": settings | {"draft": drafts, "gamma": gammas},
                        "repeats": sweep_result.repeats if sweep_result else None,
                        "rows": [row_dict(p, conditions) for p in sweep_points]}
    if compare_rows:
        settings = compare_settings.to_dict() if compare_settings else {}
        drafts = list(compare_drafts) if compare_drafts else [r.label for r in compare_rows]
        out["compare"] = {"settings": settings | {"draft": drafts},
                          "rows": [row_dict(r, conditions) for r in compare_rows]}
    return out


def row_dict(row, conditions=None) -> dict:
    """A sweep / compare row with the conditions it was measured under; no predicted speed-up and no c (time)
    where none exists (e.g. prompt lookup times no draft forward): empty, never 0."""
    out = asdict(row)
    for key in ("c_time", "predicted_speedup"):
        if not number(out.get(key)):
            out[key] = None
    if out.get("predicted_speedup") is None:
        out["predicted_speedup_sd"] = None
    measured_with = row_conditions(row, conditions)
    out.setdefault("pairs", row_pairs(row))
    out.setdefault("rough", row_is_rough(row))
    if measured_with is not None:
        out.setdefault("threads", measured_with.threads)
        out.setdefault("load_avg", measured_with.load_avg)
    return out


def write_json(data: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str, ensure_ascii=False)


def read_json(path: str) -> dict:
    """A file written by `write_json`; HfspecError naming the file when it is not one."""
    from hfspec.errors import HfspecError

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise HfspecError(f"open: {path}: {exc}; allowed: a JSON file exported by the dashboard") from exc
    if not isinstance(data, dict) or not {"run", "sweep", "compare"} & set(data):
        raise HfspecError(f"open: {path} has no run, sweep or compare section; allowed: a JSON file exported by "
                          "the dashboard (File → Export statistics)")
    return data


def table_rows(section: dict) -> list[dict]:
    """Sweep / compare rows, each with the settings they ran with."""
    settings = section.get("settings") or {}
    extra = {f"setting_{k}": _cell(settings.get(k)) for k in SETTING_COLUMNS if k in settings}
    return [row | extra for row in section["rows"]]


def run_rows(run: dict) -> list[dict]:
    """A run as quantity,value rows: settings, summary, the measurement, acceptance by position."""
    rows = [{"quantity": f"setting_{k}", "value": v} for k, v in run["settings"].items()]
    rows += [{"quantity": k, "value": v} for k, v in run["summary"].items()]
    rows += [{"quantity": f"measured_{k}", "value": v} for k, v in (run.get("measurement") or {}).items()
             if k != "stats"]
    stats = run["stats"]
    for i, (a, k) in enumerate(zip(stats["accepted_by_position"], stats["checked_by_position"], strict=True)):
        rows.append({"quantity": f"accepted_by_position[{i + 1}]", "value": f"{a}/{k}"})
    return rows


def series_path(path: str) -> str:
    """Where a run's per-pass series goes beside a CSV export: name-passes.csv."""
    p = Path(path)
    return str(p.with_name(p.stem + "-passes.csv"))


def _cell(value):
    return " ".join(map(str, value)) if isinstance(value, list) else value
