"""One meaning per name (issue 28): paper_speedup, predicted_speedup, measured_speedup, ideal_speedup. Every old
name of `hfspec.compat` gives the new one's value and warns, naming it; files are written with the new names only
and old files still read; the CLI and the dashboard say the new words."""

from __future__ import annotations

import csv
import json
import warnings

import pytest
from test_costmodel import MS, record, stats_with

import hfspec
from hfspec import compat, report
from hfspec.decoding.stats import SpecStats, expected_tokens_per_pass, paper_speedup
from hfspec.live import LiveSnapshot
from hfspec.measure import Measurement, predicted_speedup
from hfspec.measure.results import CompareRow, RunResult, SweepResult
from hfspec.measure.sweep import FIELDS, SweepRow
from hfspec.settings import RunSettings

OLD_WORDS = ("estimated", "est.", "weight-bound ideal")  # the words the four names replaced


def _stats() -> SpecStats:
    spec = record({4: 30, 2: 10}, lambda n: 50 + 8 * n, 6.0, lambda k: 2.0)
    plain = record({0: 40}, lambda n: 50 + 8 * n, 0.0, lambda k: 2.0)
    s = stats_with(spec, plain, [4] * 30 + [2] * 10, 0.8)
    s.time_total = 40 * 70 * MS
    return s


def _plain() -> SpecStats:
    return SpecStats(gamma=0, costs=record({0: 40}, lambda n: 50 + 8 * n, 0.0, lambda k: 2.0), new_tokens=40,
                     target_passes=40, row_passes=40, time_target=40 * 58 * MS, time_total=40 * 60 * MS)


def _measurement(s: SpecStats) -> Measurement:
    return Measurement(new_tokens=s.new_tokens, speculative_tokens_per_second=300.0, plain_tokens_per_second=200.0,
                       pairs=3, threads=1, load_avg=None, speedup_sd=0.1, speculative_runs=[s],
                       plain_runs=[_plain()])


def _row(cls=SweepRow, **extra):
    return cls(draft="rtn4", gamma=4, repeats=2, alpha=0.8, alpha_sd=0.01, checked=40, accepted=32,
               target_passes=10, new_tokens=50, tokens_per_pass=5.0, tokens_per_pass_sd=0.1,
               expected_tokens_per_pass=3.36, c_bytes=0.25, c_time=0.2, predicted_speedup=1.7,
               predicted_speedup_sd=0.05, ideal_speedup=1.9, tokens_per_second=300.0,
               baseline_tokens_per_second=200.0, baseline_new_tokens=50, measured_speedup=1.5,
               measured_speedup_sd=0.04, paper_speedup=1.86, **extra)


def _old(expect_new: str):
    return pytest.warns(DeprecationWarning, match=expect_new)


# ------------------------------------------------------------------------------------------ old functions
@pytest.mark.parametrize("old", sorted(compat.FUNCTIONS))
def test_old_functions_give_the_papers_formula_and_warn(old):
    new = getattr(hfspec, compat.FUNCTIONS[old][2])
    assert new is paper_speedup
    for where in (hfspec.decoding.stats, compat) + ((hfspec,) if old == "estimated_speedup" else ()):
        for args in ((0.5, 2, 0.25), (0.9, 7, 0.1), (1.0, 3, 0.3), (0.7, [0, 2, 4, 4], 0.2)):
            with _old(r"use hfspec\.paper_speedup"):
                value = getattr(where, old)(*args)
            assert value == new(*args)


def test_estimated_speedup_still_imports_from_hfspec():
    from hfspec import estimated_speedup  # noqa: F401 - the import itself is the test
    from hfspec.decoding.stats import speedup_ignoring_verify_and_overhead  # noqa: F401

    assert "estimated_speedup" in hfspec.__all__ and "paper_speedup" in hfspec.__all__


def test_one_formula_for_tokens_per_pass_and_the_papers_speedup():
    gammas = [0, 1, 4, 4, 6]
    assert expected_tokens_per_pass(0.7, gammas) == pytest.approx(
        sum(expected_tokens_per_pass(0.7, g) for g in gammas) / len(gammas))
    assert paper_speedup(0.7, gammas, 0.2) == pytest.approx(
        sum(expected_tokens_per_pass(0.7, g) for g in gammas) / sum(1 + 0.2 * g for g in gammas))
    assert paper_speedup(0.7, [4], 0.2) == paper_speedup(0.7, 4, 0.2)
    assert expected_tokens_per_pass(0.7, []) == 0.0 and paper_speedup(0.7, [], 0.2) == 0.0
    s = _stats()
    assert s.expected_tokens_per_pass == expected_tokens_per_pass(s.alpha, s.gamma_per_round)
    assert s.paper_speedup == paper_speedup(s.alpha, s.gamma_per_round, s.c_time)
    assert s.ideal_speedup == paper_speedup(s.alpha, s.gamma_per_round, s.c_bytes)
    from gui import figures  # the dashboard calls the library's formulas, it has none of its own

    assert not hasattr(figures, "formula_tokens_per_pass") and not hasattr(figures, "mixed_speedup")


# ------------------------------------------------------------------------------------------ old attributes
def _holders():
    s = _stats()
    m = _measurement(s)
    result = RunResult(settings=RunSettings(), stats=s, prompt_text="", pieces=[], measurement=m)
    snapshot = LiveSnapshot(round_index=0, gamma=4, accepted=3, checked=4, committed=4, alpha=0.75,
                            rolling_alpha=0.75, tokens_per_pass=4.0, expected_tokens_per_pass=3.0,
                            predicted_speedup=1.4, measured_speedup=None, c=0.25, c_time=0.2, elapsed=0.1,
                            new_tokens=4, accepted_by_position=[1], checked_by_position=[1], pieces=[])
    return {"SpecStats": s, "Measurement": m, "RunResult": result, "SweepRow": _row(),
            "CompareRow": _row(CompareRow, label="rtn4", target="micro"), "LiveSnapshot": snapshot}


@pytest.mark.parametrize("holder", ["SpecStats", "Measurement", "RunResult", "SweepRow", "CompareRow",
                                    "LiveSnapshot"])
def test_old_attributes_give_the_new_value_and_warn(holder):
    obj = _holders()[holder]
    checked = 0
    for old, new in compat.ATTRIBUTES.items():
        if not hasattr(type(obj), old):
            continue
        with _old(rf"{holder}\.{old} is deprecated; use {holder}\.{new}"):
            value = getattr(obj, old)
        assert value == getattr(obj, new)
        checked += 1
    assert checked >= 1
    assert obj.predicted_speedup and obj.predicted_speedup > 0


def test_the_predicted_speedup_has_one_rule():
    s = _stats()
    m = _measurement(s)
    assert predicted_speedup(s) == s.predicted_speedup > 0
    assert predicted_speedup(s, m) == m.predicted_speedup > 0
    result = RunResult(settings=RunSettings(), stats=s, prompt_text="", pieces=[], measurement=m)
    assert result.predicted_speedup == m.predicted_speedup and result.measured_speedup == pytest.approx(1.5)


# ------------------------------------------------------------------------------------------ keys and files
def test_written_dicts_carry_new_keys_and_old_keys_still_read():
    s = _stats()
    result = RunResult(settings=RunSettings(), stats=s, prompt_text="", pieces=[], measurement=_measurement(s))
    sweep = SweepResult(settings=None, gammas=[1, 2, 4], points=[_row()])
    written = {"stats": s.to_dict(), "summary": result.summary(), "row": _row().to_dict(),
               "curve": sweep.curve("rtn4")}
    for name, d in written.items():
        assert not set(compat.KEYS) & set(d), name  # new names only
        assert {"predicted_speedup", "paper_speedup", "ideal_speedup"} <= set(d), name
        with _old("use 'predicted_speedup'"):
            assert d["estimated_speedup"] == d["predicted_speedup"]
        with _old("use 'predicted_speedup'"):
            assert d.get("estimated_speedup") == d["predicted_speedup"]
        assert d.get("no such key", 7) == 7
        with pytest.raises(KeyError):
            d["no such key"]
    json.loads(report.dumps(result.to_dict()))  # still plain JSON
    assert "predicted_speedup" in FIELDS and not set(compat.KEYS) & set(FIELDS)


def test_csv_is_written_with_the_new_names(tmp_path):
    path = tmp_path / "sweep.csv"
    report.write_csv([_row().to_dict()], path)
    header = next(csv.reader(path.open(encoding="utf-8")))
    assert {"predicted_speedup", "predicted_speedup_sd", "paper_speedup", "ideal_speedup",
            "measured_speedup"} <= set(header)
    assert not set(compat.KEYS) & set(header)


def test_sweep_and_compare_files_with_the_old_keys_open_in_the_dashboard():
    pytest.importorskip("PySide6")
    pytest.importorskip("pyqtgraph")
    from gui.compare_view import CompareView
    from gui.figures import measured_from_dict
    from gui.sweep_view import SweepView

    old = {k: v for k, v in _row().to_dict().items() if k not in ("predicted_speedup", "predicted_speedup_sd")}
    old |= {"estimated_speedup": 1.7, "estimated_speedup_sd": 0.05}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading a user's old file is not deprecated code: no warning
        points = SweepView.rows_from({"settings": {}, "rows": [old]}).points
        rows, _ = CompareView.rows_from({"settings": {}, "rows": [old | {"label": "rtn4"}]})
        measured = measured_from_dict({"measured_speedup": 1.5, "estimated_speedup": 1.6, "pairs": 3})
    for row in (points[0], rows[0]):
        assert row.predicted_speedup == 1.7 and row.predicted_speedup_sd == 0.05
    assert measured.predicted_speedup == 1.6 and measured.speedup == 1.5
    assert compat.new_keys({"estimated_speedup": 1.0, "predicted_speedup": 2.0}) == {"predicted_speedup": 2.0}


# ------------------------------------------------------------------------------------------ words
def test_the_cli_report_says_the_four_names():
    s = _stats()
    m = _measurement(s)
    from hfspec.measure.results import Baseline

    lines = report.stats_lines(s, Baseline.of(m), m.measured_speedup, m)
    by_name = {line.split("  ")[0]: line for line in lines}
    assert by_name["predicted speed-up"].split()[2] == f"{m.predicted_speedup:.2f}×"
    assert by_name["paper speed-up"].split()[2] == f"{s.paper_speedup:.2f}×"
    assert by_name["ideal speed-up"].split()[2] == f"{s.ideal_speedup:.2f}×"
    assert by_name["measured speed-up"].split()[2] == f"{m.measured_speedup:.2f}×"
    text = "\n".join(lines)
    assert not any(word in text for word in OLD_WORDS), text


def test_the_cli_says_the_new_names(capsys):
    pytest.importorskip("transformers")
    from hfspec.cli import main

    assert main(["run", "--preset", "micro-rtn4", "--max-new-tokens", "6", "--no-baseline", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "predicted speed-up" in out and "paper speed-up" in out and "ideal speed-up" in out
    assert not any(word in out for word in OLD_WORDS)


def test_the_dashboard_says_the_four_names(qtbot):
    pytest.importorskip("PySide6")
    pytest.importorskip("pyqtgraph")
    from gui.compare_view import PLOTS, CompareView
    from gui.glossary import GLOSSARY
    from gui.live_view import LiveView
    from gui.sweep_view import NOTE

    live = LiveView()
    qtbot.addWidget(live)
    captions = {key: metric.caption for key, metric in live.metrics.items()}
    assert captions["predicted"] == "predicted speed-up" and captions["ideal"] == "ideal speed-up"
    assert captions["measured"] == "measured speed-up" and "est" not in live.metrics
    assert set(live.speed_bars) == {"predicted", "measured", "ideal"}
    compare = CompareView()
    qtbot.addWidget(compare)
    headers = [compare.table.horizontalHeaderItem(i).text() for i in range(compare.table.columnCount())]
    assert "predicted ×" in headers and "ideal ×" in headers and "measured ×" in headers
    bars = {name for _, _, _, pairs, _ in PLOTS for _, name in pairs}
    assert {"predicted", "measured"} <= bars
    for name in ("predicted speed-up", "measured speed-up", "paper speed-up", "ideal speed-up"):
        assert name in GLOSSARY.replace("<b>", "").replace("</b>", "")
    assert "predicted speed-up" in NOTE and "ideal speed-up" in NOTE
    tips = " ".join(m.tip for m in live.metrics.values()) + " ".join(
        compare.table.horizontalHeaderItem(i).toolTip() for i in range(compare.table.columnCount()))
    for text in (" ".join(captions.values()), " ".join(headers), tips, NOTE, GLOSSARY):
        assert not any(word in text for word in OLD_WORDS), text
