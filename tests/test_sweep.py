"""hfspec.measure.sweep, the one engine of the CLI's and the dashboard's sweeps: fixed length, baselines measured beside
each run (interleaved, never cached), statistics over repeats, the estimate from c_time, stop."""

from __future__ import annotations

import statistics

import pytest
import torch
from tiny_models import build, perturbed

import hfspec
from hfspec.decoding.costmodel import predict
from hfspec.decoding.stats import expected_tokens_per_pass, paper_speedup
from hfspec.measure import ruler as measure  # `outliers` as the ruler reads it
from hfspec.measure import sweep as engine
from hfspec.validate import GAMMA_MAX

N = 6  # new tokens per run


@pytest.fixture(scope="module")
def pair():
    target = build("llama", seed=0, init=0.3)
    return target, perturbed(target, 0.3)


@pytest.fixture
def ids():
    return torch.tensor([[0, 5, 9, 14, 3]])


@pytest.fixture
def calls(monkeypatch):
    """Every decoding call the engine makes, in order: ("spec" | "plain", seed, stats)."""
    log = []
    generate, plain = hfspec.generate, hfspec.plain_generate

    def spy_generate(*args, **kwargs):
        out = generate(*args, **kwargs)
        log.append(("spec", kwargs.get("seed"), out.stats))
        return out

    def spy_plain(*args, **kwargs):
        out = plain(*args, **kwargs)
        log.append(("plain", kwargs.get("seed"), out.stats))
        return out

    monkeypatch.setattr(engine, "generate", spy_generate)  # the name the sweep calls
    monkeypatch.setattr(engine, "plain_generate", spy_plain)
    # the calls are counted exactly: no outlier re-measurement on this shared machine (tests/test_measure.py
    # covers it with synthetic timings)
    monkeypatch.setattr(measure, "outliers", lambda values, z=0: [False] * len(values))
    return log


def _sampling(n=N):
    return {"temperature": 1.0, "top_k": None, "top_p": None, "max_new_tokens": n}


def test_baselines_are_interleaved_fixed_length_and_never_cached(pair, ids, calls):
    target, draft = pair
    rows = engine.sweep(target, {"noisy": draft}, [1, 3], ids, _sampling(), seed=7, repeats=2, check_greedy=False)
    # per point: (spec, plain) for repeat 0, (plain, spec) for repeat 1, each pair with its own seed; the draft's
    # first point starts with one uncounted warm-up pair
    kinds = [(k, seed) for k, seed, _ in calls]
    assert kinds == [("spec", 7), ("plain", 7)] + [("spec", 7), ("plain", 7), ("plain", 8), ("spec", 8)] * 2
    assert all(s.new_tokens == N for _, _, s in calls)  # EOS suppressed: every run, both kinds, is N long
    for row in rows:
        assert row.repeats == 2 and row.new_tokens == row.baseline_new_tokens == 2 * N


def test_statistics_over_repeats(pair, ids, calls):
    target, draft = pair
    (row,) = engine.sweep(target, {"noisy": draft}, [2], ids, _sampling(), seed=1, repeats=3, check_greedy=False)
    counted = calls[2:]  # after the warm-up pair
    runs = [s for k, _, s in counted if k == "spec"]
    bases = [s for k, _, s in counted if k == "plain"]
    assert row.alpha == sum(s.accepted for s in runs) / sum(s.checked for s in runs)
    assert row.alpha_sd == pytest.approx(statistics.stdev(s.alpha for s in runs))
    assert row.tokens_per_pass_sd == pytest.approx(statistics.stdev(s.tokens_per_pass for s in runs))
    ratios = [s.tokens_per_second / b.tokens_per_second for s, b in zip(runs, bases, strict=True)]
    assert row.measured_speedup_sd == pytest.approx(statistics.stdev(ratios))
    # the estimate is the cost model fitted to the runs and the plain runs beside them; the paper's formula
    # (measured c_time) and the weight-bound ideal (c_bytes) stay apart
    assert row.c_time > 0 and row.c_bytes > 0
    pooled = runs[0].merge(runs[1]).merge(runs[2])
    # for runs of one pair's length (the measured figure's), fitted to the pooled pairs
    assert row.predicted_speedup == pytest.approx(predict(pooled, bases[0].merge(bases[1]).merge(bases[2]),
                                                          new_tokens=N).speedup)
    assert row.measured_speedup_low <= row.measured_speedup <= row.measured_speedup_high and row.pairs == 3
    assert row.predicted_speedup != pytest.approx(row.paper_speedup)
    # the paper's formula over the rounds' γ (the last round of a run may propose fewer than 2)
    g = pooled.gamma_per_round
    for value, c in ((row.paper_speedup, row.c_time), (row.ideal_speedup, row.c_bytes)):
        formula = sum(expected_tokens_per_pass(row.alpha, k) for k in g) / sum(1 + k * c for k in g)
        assert value == pytest.approx(formula)
    assert 2 in g and row.paper_speedup == pytest.approx(paper_speedup(row.alpha, 2, row.c_time), rel=0.2)
    # one repeat: no spread to show
    (single,) = engine.sweep(target, {"noisy": draft}, [2], ids, _sampling(), repeats=1, check_greedy=False)
    assert single.alpha_sd is None and single.measured_speedup_sd is None


def test_progress_callbacks_and_stop(pair, ids):
    target, draft = pair
    started, done = [], []
    engine.sweep(target, {"a": draft, "b": draft}, [1, 2], ids, _sampling(3), check_greedy=False,
                 on_start=lambda i, n, label, g: started.append((i, n, label, g)), on_row=done.append)
    assert started == [(1, 4, "a", 1), (2, 4, "a", 2), (3, 4, "b", 1), (4, 4, "b", 2)]
    assert [(r.draft, r.gamma) for r in done] == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    finished: list = []
    rows = engine.sweep(target, {"a": draft}, [1, 2, 3], ids, _sampling(3), check_greedy=False,
                        on_row=finished.append, should_stop=lambda: bool(finished))
    assert len(rows) == 1  # stopped before the second point


def test_stop_inside_a_point_drops_the_unfinished_point(pair, ids):
    target, draft = pair
    passes = []

    def should_stop():
        passes.append(1)
        return len(passes) > 3

    rows = engine.sweep(target, {"a": draft}, [1, 2], ids, _sampling(40), repeats=2, check_greedy=False,
                        should_stop=should_stop)
    assert rows == []


def test_greedy_check_and_fidelity(pair, ids):
    target, draft = pair
    (row,) = engine.sweep(target, {"noisy": draft}, [3], ids, _sampling(), check_greedy=True)
    assert row.greedy_identical == 1
    try:
        from hfspec.drafts import fidelity  # noqa: F401
    except ImportError:
        assert row.fidelity is None
        return
    assert row.fidelity == engine.draft_fidelity(target, draft, ids)
    # negative control: a copy is faithful, a noisier draft less so than this one
    assert engine.draft_fidelity(target, perturbed(target, 0.0), ids) == pytest.approx(1.0, abs=1e-5)
    assert engine.draft_fidelity(target, perturbed(target, 3.0), ids) < row.fidelity < 1


def test_gamma_limit_is_the_one_constant():
    assert engine.parse_gammas(f"{GAMMA_MAX - 1}-{GAMMA_MAX}") == [GAMMA_MAX - 1, GAMMA_MAX]
    with pytest.raises(hfspec.HfspecError, match=str(GAMMA_MAX)):
        engine.parse_gammas(str(GAMMA_MAX + 1))
    with pytest.raises(hfspec.HfspecError, match="repeats"):
        engine.sweep(None, {}, [1], None, _sampling(), repeats=0)


def test_plain_run_has_exactly_the_asked_length(pair, ids):
    target, _ = pair
    for n in (1, 5):
        stats = engine.plain_run(target, ids, n, _sampling(99), seed=3)
        assert stats.new_tokens == n and stats.stop_reason == "max_tokens"
