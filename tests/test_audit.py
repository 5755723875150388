"""`hfspec audit` on the embedded micro pair: it passes with hfspec's verify, fails with a broken one (greedy or
sampling), fails when its control cannot fail (no power), and exits 2 on bad input before loading anything."""

import copy
import json
from pathlib import Path

import pytest
import torch
from scipy.stats import chi2

import hfspec.decoding.sampling as sampling
import hfspec.decoding.scoring as scoring
from hfspec.audit.command import Cells, audit, chi2_isf, chi2_sf
from hfspec.cli import main
from hfspec.io.loading import load_model, load_tokenizer

MICRO = str(Path(__file__).resolve().parents[1] / "presets" / "models" / "micro")
SMALL = ["--target", MICRO, "--draft", "rtn4", "--tokens", "24", "--samples", "2000", "--seed", "3"]


def test_passes_on_micro_bf16_through_the_cli(capsys):
    auto = [a for a in SMALL if a not in ("--samples", "2000")]  # the sample size chosen for the control's power
    code = main(["audit", *auto, "--dtype", "bfloat16", "--temperature", "0.8", "--top-k", "40"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out and "bfloat16 target" in out
    assert out.count("control") == 2 and "your settings (T=0.8, top-k 40)" in out


def test_json_output(capsys):
    assert main(["audit", *SMALL, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["dtype"] == "float32"
    assert [t["control"] for t in data["sampling"]] == [False, True]
    assert all(t["passed"] for t in data["sampling"])


def test_fails_on_a_verify_that_accepts_the_second_choice(monkeypatch, capsys):
    original = scoring.Scorer.greedy

    def wrong(self, history, extra, logits):
        tokens = original(self, history, extra, logits)
        if logits.shape[1] != extra.shape[1] + 1:
            return tokens
        second = logits.float().topk(2, dim=-1).indices[..., 1]
        take = extra == second[:, : extra.shape[1]]
        tokens = tokens.clone()
        tokens[:, : extra.shape[1]] = torch.where(take, extra, tokens[:, : extra.shape[1]])
        return tokens

    monkeypatch.setattr(scoring.Scorer, "greedy", wrong)
    code = main(["audit", *SMALL, "--tokens", "48", "--draft", "rtn3"])  # rtn3 proposes second choices at real margins
    out = capsys.readouterr().out
    assert code == 1, out
    assert "FAIL  greedy" in out and "UNEXPLAINED" in out and "FAILED" in out


def test_fails_on_a_verify_that_accepts_every_draft_token(monkeypatch, capsys):
    monkeypatch.setattr(sampling, "accept_draft", lambda p_x, q_x, r: torch.ones_like(p_x, dtype=torch.bool))
    code = main(["audit", *SMALL])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "PASS  greedy" in out  # greedy never calls the sampling rule: the χ² test is what catches it
    assert "FAIL  hfspec T=1" in out


@pytest.fixture(scope="module")
def micro():
    return load_model(MICRO, progress=False), load_tokenizer(MICRO)


def test_an_audit_whose_control_cannot_fail_fails(micro):
    """A draft identical to the target: the draft-only sampler is the target, so nothing could be detected."""
    target, tokenizer = micro
    result = audit(target, copy.deepcopy(target), ["Return the"], tokenizer=tokenizer, tokens=8, samples=400)
    control = next(t for t in result.sampling if t.control)
    assert not control.passed and control.predicted_power < 0.1
    assert not result.passed


@pytest.mark.parametrize("argv, field", [
    (["--samples", "10"], "samples"),
    (["--tokens", "0"], "tokens"),
    (["--temperature", "-1"], "temperature"),
    (["--draft", "rtn1"], "draft"),
    (["--dtype", "float64"], "dtype"),
    (["--prompts", " "], "prompts"),
])
def test_bad_input_exits_2_before_loading(monkeypatch, capsys, argv, field):
    import hfspec.session

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(hfspec.session.Session, "load_target", no_loading)
    assert main(["audit", "--target", MICRO, *argv]) == 2
    assert field in capsys.readouterr().err


def test_chi2_tail_matches_scipy():
    for df, x in [(1, 0.5), (10, 25.0), (74, 70.4), (300, 420.0)]:
        assert chi2_sf(x, df) == pytest.approx(chi2.sf(x, df), rel=1e-6)
        assert chi2_isf(1e-3, df) == pytest.approx(chi2.isf(1e-3, df), rel=1e-6)


def test_cells_cover_the_law_and_pool_rare_outcomes():
    p1 = torch.tensor([0.5, 0.3, 0.15, 0.04, 0.01])
    p2 = {0: torch.tensor([0.9, 0.05, 0.05, 0.0, 0.0]), 1: torch.tensor([0.2] * 5)}
    cells = Cells(p1, p2, samples=100)
    assert sum(cells.probs.values()) == pytest.approx(1.0)
    assert all(100 * p >= 5 for p in cells.probs.values())
    assert cells.key(4, 0) == cells.key(3, 2)  # rare first tokens share a cell
    assert cells.key(0, 0) == (0, 0) and cells.key(0, 3) != (0, 3)
