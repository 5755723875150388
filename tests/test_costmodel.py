"""The cost model's maths on hand-made numbers, and what a real run records for it."""

import time

import pytest
import torch
from tiny_models import build, perturbed

import hfspec
from hfspec.decoding.costmodel import (
    Acceptance,
    CostModel,
    CostRecord,
    RoundSeconds,
    best_gamma,
    expected_tokens,
    predict,
    predict_from,
)
from hfspec.decoding.gamma import AdaptiveGamma
from hfspec.decoding.stats import SpecStats, expected_tokens_per_pass, paper_speedup

MS = 1e-3


def record(rounds_by_k: dict[int, int], verify_ms, draft_ms_per_token: float, other_ms, pick_ms: float = 0.0,
           score_ms=lambda n: 0.0, prefill=None, steps: int = 0, step_ms: float = 0.0) -> CostRecord:
    """A CostRecord of rounds proposing k tokens, each with exactly the given costs (milliseconds)."""
    r = CostRecord()
    for k, count in rounds_by_k.items():
        for _ in range(count):
            pick, score = pick_ms * k, score_ms(k + 1)
            r.record(k, k + 1, 1, RoundSeconds(draft_ms_per_token * k * MS, verify_ms(k + 1) * MS,
                                               (other_ms(k) + pick + score) * MS, pick * MS, score * MS),
                     prefill=False)
    if prefill is not None:
        k, target_ms, draft_ms, other_ms0 = prefill
        r.record(k, 40, 1, RoundSeconds(draft_ms * MS, target_ms * MS, other_ms0 * MS), prefill=True)
    r.step_seconds, r.steps = step_ms * steps * MS, steps
    return r


def test_expected_tokens_is_the_papers_formula_for_one_alpha_and_positional_otherwise():
    for alpha in (0.0, 0.3, 0.8, 0.95):
        for k in range(0, 9):
            assert expected_tokens(k, lambda j, a=alpha: a) == pytest.approx(expected_tokens_per_pass(alpha, k))
    # positions 1, 2, 3 accepted at 0.9, 0.5, 0.2 given reached: 1 + .9 + .45 + .09
    assert expected_tokens(3, Acceptance(0.5, [0.9, 0.5, 0.2])) == pytest.approx(2.44)
    # beyond the measured positions the pooled α applies
    assert Acceptance(0.5, [0.9])(4) == 0.5
    # shrinkage: 1 accepted of 1 checked at position 2 is pulled toward the pooled α
    acc = Acceptance.from_counts([8, 1], [10, 1], shrink=4.0)
    assert acc.alpha == pytest.approx(9 / 11)
    assert acc(2) == pytest.approx((1 + 4 * 9 / 11) / 5)


def test_fit_recovers_hand_made_costs():
    # verify t(n) = 50 + 8 n ms, draft 6 ms per token, rest outside forwards 1 ms + 0.5 ms per k, picks 0.25 ms
    # per token, scoring 0.2 + 0.1 n ms; rounds at k = 2 and 5; a plain run beside it (k = 0, n = 1)
    spec = record({2: 10, 5: 30}, lambda n: 50 + 8 * n, 6.0, lambda k: 1 + 0.5 * k, pick_ms=0.25,
                  score_ms=lambda n: 0.2 + 0.1 * n)
    plain = record({0: 50}, lambda n: 50 + 8 * n, 0.0, lambda k: 1.0, score_ms=lambda n: 0.2 + 0.1 * n)
    m = CostModel.fit(spec, plain)
    assert m.source == "plain run timed beside it"
    assert m.step == pytest.approx(58 * MS)
    assert m.verify_a == pytest.approx(50 * MS) and m.verify_b == pytest.approx(8 * MS)
    assert m.draft(5) == pytest.approx(30 * MS) and m.draft(0) == 0.0
    assert m.plain_other == pytest.approx(1.3 * MS)
    for k in (0, 2, 5, 9):  # extrapolates linearly in k
        assert m.other(k) == pytest.approx((1 + 0.5 * k + 0.25 * k + 0.2 + 0.1 * (k + 1)) * MS)
        assert m.round_seconds(k) == pytest.approx(m.draft(k) + (50 + 8 * (k + 1)) * MS + m.other(k))


def test_prediction_by_hand_with_a_gamma_histogram():
    spec = record({2: 10, 5: 30}, lambda n: 50 + 8 * n, 6.0, lambda k: 2.0)
    plain = record({0: 50}, lambda n: 50 + 8 * n, 0.0, lambda k: 2.0)
    m = CostModel.fit(spec, plain)
    acc = Acceptance(0.8)
    got = predict_from(m, acc, {2: 10, 5: 30}, new_tokens=1e9)
    tokens = (10 * expected_tokens_per_pass(0.8, 2) + 30 * expected_tokens_per_pass(0.8, 5)) / 40
    seconds = (10 * (12 + 74 + 2) + 30 * (30 + 98 + 2)) / 40 * MS
    assert got.tokens_per_round == pytest.approx(tokens)
    assert got.seconds_per_round == pytest.approx(seconds)
    assert got.plain_tokens_per_second == pytest.approx(1 / (60 * MS), rel=1e-6)
    assert got.speedup == pytest.approx(tokens / seconds * 60 * MS, rel=1e-6)
    # not the paper's formula at round(mean γ) = 4
    c = 6 / 58
    assert got.speedup < 0.8 * paper_speedup(0.8, 4, c)


def test_prefill_is_paid_once_by_both_sides():
    spec = record({4: 20}, lambda n: 10.0 + n, 2.0, lambda k: 0.0, prefill=(4, 100.0, 20.0, 5.0))
    plain = record({0: 20}, lambda n: 10.0 + n, 0.0, lambda k: 0.0)
    m = CostModel.fit(spec, plain)
    # round 0 took 125 ms, a normal γ = 4 round 8 + 15 = 23 ms: 102 ms more; the plain side's prefill extra is
    # the target's part, 100 - 15
    assert m.prefill_spec == pytest.approx(102 * MS) and m.prefill_plain == pytest.approx(85 * MS)
    short = predict_from(m, Acceptance(0.9), {4: 1}, new_tokens=8).speedup
    long = predict_from(m, Acceptance(0.9), {4: 1}, new_tokens=10_000).speedup
    assert short < long


def test_one_token_step_sources_in_order():
    spec = record({4: 20}, lambda n: 10.0 + 2 * n, 2.0, lambda k: 1.0, steps=2, step_ms=11.0)
    assert CostModel.fit(spec).source == "one-token passes timed after the run"
    assert CostModel.fit(spec).step == pytest.approx(11 * MS)
    assert CostModel.fit(spec).verify_b == pytest.approx((20 - 11) / 4 * MS)
    flat = record({4: 20}, lambda n: 10.0 + 2 * n, 2.0, lambda k: 1.0)
    m = CostModel.fit(flat)
    assert "assumed" in m.source and m.verify_b == 0 and m.step == pytest.approx(20 * MS)
    with_plain_rounds = record({0: 5, 4: 20}, lambda n: 10.0 + 2 * n, 2.0, lambda k: 1.0)
    m = CostModel.fit(with_plain_rounds)
    assert m.source == "the run's one-position rounds" and m.step == pytest.approx(12 * MS)
    # a γ seen in one clipped round does not set a slope against 20 rounds at another
    clipped = record({4: 20, 1: 1}, lambda n: 10.0 + 2 * n + (30 if n == 2 else 0), 2.0, lambda k: 1.0)
    assert CostModel.fit(clipped).verify_b == 0


def stats_with(costs: CostRecord, plain: CostRecord | None, gammas: list[int], alpha: float) -> SpecStats:
    s = SpecStats(gamma=4, costs=costs, plain_costs=plain, draft_bytes=1, target_bytes=10)
    for g in gammas:
        n = min(g, round(alpha * g))
        s.record_round(g, [n], [min(n + 1, g)], [n + 1], [0])
    s.time_draft, s.draft_forwards = sum(gammas) * 6 * MS, sum(gammas)
    s.time_target = len(gammas) * 58 * MS
    return s


def test_stats_estimate_is_the_cost_model_not_the_papers_formula():
    spec = record({4: 40}, lambda n: 50 + 8 * n, 6.0, lambda k: 2.0)
    plain = record({0: 40}, lambda n: 50 + 8 * n, 0.0, lambda k: 2.0)
    s = stats_with(spec, plain, [4] * 40, 1.0)  # every draft token accepted: 5 tokens a round either way
    assert s.predicted_speedup == pytest.approx(predict(s).speedup)
    assert s.paper_speedup == pytest.approx(paper_speedup(s.alpha, 4, s.c_time))
    assert s.predicted_speedup < 0.85 * s.paper_speedup  # the verify width and overhead cost something
    assert hfspec.paper_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)  # the public formula still works
    d = s.to_dict()
    assert d["predicted_speedup"] == s.predicted_speedup and d["estimate_source"] == "plain run timed beside it"
    assert d["costs"]["gamma_rounds"][4] == 40
    # auto γ: the histogram, not round(mean γ)
    costs = record({1: 20, 7: 20}, lambda n: 50 + 8 * n, 6.0, lambda k: 2.0)
    costs.gamma_accepted = [0, 20 * 1, 0, 0, 0, 0, 0, 20 * 5]  # as stats_with's rounds: 1 of 1, 5 of 7 kept
    mixed = stats_with(costs, plain, [1, 7] * 20, 0.75)
    acc = Acceptance.from_counts(mixed.accepted_by_position, mixed.checked_by_position)
    # each length: its own rounds' mean (1 + kept) shrunk (4 pseudo-rounds) toward the positional model
    by_length = [(20 * (1 + kept) + 4 * acc.expected(k)) / 24 for k, kept in ((1, 1), (7, 5))]
    assert mixed.prediction.tokens_per_round == pytest.approx(sum(by_length) / 2)
    assert mixed.prediction.tokens_per_round == pytest.approx(mixed.tokens_per_pass, rel=0.02)
    assert mixed.prediction.tokens_per_round != pytest.approx(acc.expected(4), rel=0.05)
    # at a fixed γ the positional model alone
    assert predict(mixed, gamma=3).tokens_per_round == pytest.approx(acc.expected(3))


def test_merge_adds_costs():
    a = record({4: 3}, lambda n: 10.0, 1.0, lambda k: 1.0, steps=1, step_ms=5)
    b = record({2: 2, 6: 1}, lambda n: 10.0, 1.0, lambda k: 1.0)
    m = a.merge(b)
    assert m.gamma_rounds[2] == 2 and m.gamma_rounds[4] == 3 and m.gamma_rounds[6] == 1 and m.steps == 1
    assert sum(m.width_seconds) == pytest.approx(sum(a.width_seconds) + sum(b.width_seconds))
    assert CostRecord.from_dict(m.to_dict()) == m


def test_best_gamma_follows_the_verify_cost():
    acc = Acceptance(0.85)
    cheap = CostModel(step=50 * MS, verify_a=49 * MS, verify_b=1 * MS, draft_a=0, draft_b=5 * MS, draft_zero=0,
                      other_a=0, other_b=0, plain_other=0)
    steep = CostModel(step=50 * MS, verify_a=25 * MS, verify_b=25 * MS, draft_a=0, draft_b=5 * MS, draft_zero=0,
                      other_a=0, other_b=0, plain_other=0)
    g_cheap, g_steep = best_gamma(cheap, acc, 16)[0], best_gamma(steep, acc, 16)[0]
    assert g_steep < g_cheap
    # a verify pass costing a full step per position never pays: plain decoding (γ = 0)
    costly = CostModel(step=50 * MS, verify_a=0, verify_b=50 * MS, draft_a=0, draft_b=5 * MS, draft_zero=0,
                       other_a=0, other_b=0, plain_other=0)
    assert best_gamma(costly, acc, 16)[0] == 0


def test_adaptive_gamma_maximises_the_models_rate():
    alpha = 0.85
    costs = record({3: 5, 6: 5}, lambda n: 25 + 25 * n, 5.0, lambda k: 0.0, steps=2, step_ms=50)
    policy = AdaptiveGamma(gamma_max=16, c_prior=0.1, costs=costs)
    for _ in range(30):
        g = policy.next()
        policy.update(g, round(alpha * g), g, 5 * MS, (25 + 25 * (g + 1)) * MS)
    model = CostModel.fit(costs)
    assert policy.next() == best_gamma(model, Acceptance(policy.alpha), 16)[0]
    assert policy.next() < hfspec.optimal_gamma(policy.alpha, 0.1, 16)


def test_a_run_records_its_rounds():
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.3)
    ids = torch.tensor([[0, 5, 17, 33]])
    seen = []
    out = hfspec.generate(target, ids, draft=draft, gamma=3, temperature=1.0, seed=3, max_new_tokens=40,
                          min_new_tokens=40, on_round=lambda e: (seen.append(e), time.sleep(0.2)))
    s, c = out.stats, out.stats.costs
    assert c.prefill_rounds == 1 and c.rounds == s.target_passes - 1
    assert sum(c.width_rounds) == c.rounds and sum(c.gamma_rows) == s.row_passes - 1
    assert sum(k * r for k, r in enumerate(c.gamma_rounds)) + c.prefill_gamma == s.proposed
    # the live callback's sleep is not part of any round's time outside forwards
    assert max(o / r for o, r in zip(c.gamma_other_seconds, c.gamma_rounds, strict=False) if r) < 0.2
    # the one-token timing passes happen only when fewer than two rounds were one position wide, outside the
    # run's time
    if len(c.width_rounds) > 1 and c.width_rounds[1] >= 2:
        assert c.steps == 0
    else:
        assert c.steps == 2 and c.step_seconds > 0
    assert s.positions_fed_target == sum(n * r for n, r in enumerate(c.width_rounds)) + 4 + c.prefill_gamma
    assert s.predicted_speedup > 0 and s.prediction.source
    plain = hfspec.plain_generate(target, ids, temperature=1.0, seed=3, max_new_tokens=40, min_new_tokens=40).stats
    assert plain.costs.steps == 0 and plain.costs.gamma_rounds == [plain.target_passes - 1]
    s.attach_baseline(plain)
    assert s.prediction.source == "plain run timed beside it"


def test_one_token_timings_are_reused_after_a_targets_first_runs():
    """Only a target's first TIMED_RUNS runs pay for the cost model's one-token passes: later runs make no extra
    forward and record the mean of those timings; another thread count times again."""
    from hfspec.decoding.costrecord import TIMED_RUNS

    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.3)
    ids = torch.tensor([[0, 5, 17, 33]])
    calls = []
    target.register_forward_hook(lambda *a: calls.append(1))

    def run():
        calls.clear()
        stats = hfspec.generate(target, ids, draft=draft, gamma=3, max_new_tokens=24).stats
        c = stats.costs
        assert len(calls) == stats.target_passes + c.steps - c.steps_reused  # the reused timings cost no forward
        return c, stats

    timed = [run()[0] for _ in range(TIMED_RUNS)]
    assert all(c.steps == 2 and c.steps_reused == 0 for c in timed)
    later, stats = run()
    assert later.steps == later.steps_reused == 2
    assert later.step_seconds == pytest.approx(sum(c.step_seconds for c in timed) / TIMED_RUNS)
    assert CostModel.fit(later).step == pytest.approx(  # pooled with the run's own one-position rounds
        (later.step_seconds + later.width_seconds[1]) / (2 + later.width_rounds[1]))
    assert stats.prediction.source.endswith("one-token passes timed after earlier runs of this target")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert run()[0].steps_reused == 0
    finally:
        torch.set_num_threads(threads)
