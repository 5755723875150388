"""The command line on the embedded micro pair: run, sweep --json/--csv/--plot, compare, errors."""

import json

import pytest

from hfspec.cli import main
from hfspec.measure.sweep import FIELDS, parse_gammas


def test_sweep_json_has_every_field_for_every_gamma(capsys, tmp_path):
    csv_path, png = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    code = main(["sweep", "--preset", "micro-rtn4", "--gammas", "1-3", "--temperature", "1", "--prompt",
                 "The attention", "--max-new-tokens", "12", "--seed", "1", "--json", "--csv", str(csv_path),
                 "--plot", str(png)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["gamma"] for row in data["rows"]] == [1, 2, 3]
    for row in data["rows"]:
        assert set(FIELDS) <= set(row)
        assert row["greedy_identical"] == 1
        assert row["new_tokens"] == 12 and 0 <= row["alpha"] <= 1
        assert 0 < row["c_bytes"] <= 1.1  # the micro model is small: its lean rtn4 draft holds dense fp32
    assert csv_path.read_text().count("\n") == 4
    assert png.stat().st_size > 10_000


def test_run_prints_text_and_statistics(capsys):
    assert main(["run", "--preset", "micro-rtn4", "--max-new-tokens", "10", "--no-baseline", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "acceptance rate α" in out and "tokens per target pass" in out


def test_compare_two_drafts(capsys):
    code = main(["compare", "--preset", "micro-rtn4", "--drafts", "rtn4,rtn3", "--max-new-tokens", "8", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["draft"] for r in rows] == ["rtn4", "rtn3"]


@pytest.mark.parametrize(
    "argv, field",
    [
        (["sweep", "--gammas", "0-3"], "gammas"),
        (["sweep", "--gammas", "x"], "gammas"),
        (["run", "--preset", "no-such-preset"], "no-such-preset"),
        (["run", "--draft", "rtn9"], "draft: bits must be 2..8, got 9"),
        (["sweep", "--drafts", "rtn4,bnb-nf9"], "bnb-nf9"),
        (["run", "--temperature", "-1"], "temperature"),
        (["run", "--target", "/no/such/folder"], "target"),
    ],
)
def test_bad_input_is_a_clear_error(capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "hfspec: error:" in err and field in err and "Traceback" not in err
    if field != "target":
        assert "loading" not in err, "the mistake must be caught before any model loads"


def test_parse_gammas():
    assert parse_gammas("1-4,auto") == [1, 2, 3, 4, "auto"]
    assert parse_gammas("2,5") == [2, 5]


def test_bench_compares_three_methods(capsys):
    code = main(["bench", "--preset", "micro-nano", "--max-new-tokens", "8", "--repeats", "1", "--temperature", "0",
                 "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["tokens_per_second"]) == {"plain generate", "HF assisted", "hfspec"}
    assert result["speedup_vs_plain"]["plain generate"] == 1.0
    assert 0 <= result["alpha"] <= 1 and 0 <= result["hfspec_time_split"]["other"] <= 1
