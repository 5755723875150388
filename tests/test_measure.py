"""The one ruler (`hfspec.measure`): interleaved pairs, medians with an interval, outliers re-measured, a
stability verdict naming the machine's cause, and flags for figures a run's own passes cannot produce."""

from __future__ import annotations

import random
import re
import statistics

import pytest
import torch

from hfspec import report
from hfspec.decoding.stats import SpecStats
from hfspec.measure import (
    MachineState,
    implausible,
    machine_causes,
    measure_speedup,
    median_interval,
    outliers,
    speedup_bound,
)

QUIET = MachineState(cores=2, load_avg=0.3, freq_mhz=2400.0, cpu_seconds={}, at=0.0)


def quiet():
    return QUIET


def _runs(times, order, name):
    def run(i):
        order.append((name, i))
        return SpecStats(new_tokens=10, time_total=times[i])
    return run


def _series(seconds, tokens=10):
    """A Timed returning fixed-length stats whose time_total is seconds[i] (the engine's own clock)."""
    return lambda i: SpecStats(new_tokens=tokens, time_total=seconds[i])


def _noisy(n, base, spread, seed):
    rng = random.Random(seed)
    return [base * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_pairs_alternate_and_the_speedup_is_the_median_per_pair_ratio():
    order = []
    m = measure_speedup(_runs([1.0, 9.0, 2.0], order, "spec"), _runs([2.0, 4.0, 3.0], order, "plain"), pairs=3,
                        machine=quiet)
    assert [n for n, _ in order] == ["spec", "plain", "plain", "spec", "spec", "plain"]
    assert m.pairs == 3 and not m.rough
    assert m.speculative_tokens_per_second == 5.0 and abs(m.plain_tokens_per_second - 10 / 3) < 1e-9
    assert m.measured_speedup == pytest.approx(1.5)  # ratios 2, 0.44, 1.5: the median
    assert (m.low, m.high) == pytest.approx((4 / 9, 2.0)) and m.coverage == pytest.approx(0.75)
    assert m.threads == torch.get_num_threads()


def test_warm_up_pairs_are_run_first_and_not_counted():
    order = []

    def spec(i):  # the first call is slow (allocation, compilation): the warm-up takes it
        order.append(("spec", i))
        return SpecStats(new_tokens=10, time_total=50.0 if len(order) == 1 else 1.0)

    m = measure_speedup(spec, _runs([2.0, 2.0], order, "plain"), pairs=2, warmup=1, machine=quiet)
    assert order[:2] == [("spec", 0), ("plain", 0)] and len(order) == 6
    assert m.warmup == 1 and m.pairs == 2 and m.measured_speedup == pytest.approx(2.0)


def test_a_stop_keeps_finished_pairs_and_marks_the_measurement_rough():
    def plain(i):
        return SpecStats(new_tokens=10, time_total=2.0, stopped=i == 1)

    m = measure_speedup(lambda i: SpecStats(new_tokens=10, time_total=1.0), plain, pairs=3, machine=quiet)
    assert m.pairs == 1 and m.rough and m.measured_speedup == 2.0 and m.verdict == "rough"
    assert measure_speedup(lambda i: SpecStats(stopped=True), plain) is None


def test_the_budget_ends_after_one_pair_at_least():
    m = measure_speedup(lambda i: SpecStats(new_tokens=4, time_total=1.0),
                        lambda i: SpecStats(new_tokens=4, time_total=1.0), pairs=3, budget_s=0.0)
    assert m.pairs == 1


def test_median_interval_from_order_statistics():
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, pytest.approx(0.75))  # under six: the range
    low, high, coverage = median_interval(list(range(1, 21)))
    assert (low, high) == (6, 15) and 0.95 <= coverage < 0.99  # ranks 6 and 15 of 20
    assert median_interval([]) [2] == 0.0


def test_mad_outliers_on_a_log_scale():
    values = [1.0, 1.02, 0.98, 1.01, 10.0, 0.99, 0.1]
    assert outliers(values) == [False, False, False, False, True, False, True]
    assert outliers([1.0, 1.0, 1.0, 1.001]) == [False] * 4  # the MAD floor: no outliers out of equal values
    assert outliers([1.0, 10.0]) == [False, False]  # no majority to judge by
    # a quiet machine's jitter is not an outlier out of three rounds; a round 25 % off is (negative control)
    assert outliers([1.50, 1.51, 1.58]) == [False] * 3
    assert outliers([1.50, 1.51, 1.90]) == [False, False, True]


def _prompt_rounds(levels, n, seed, spoiled=()):
    """interleaved() runs for rounds taking len(levels) prompts in turn: plain at 2 s, spec at 2 s / the prompt's
    speed-up, each ±2 %; a round in `spoiled` has its spec run 10× slower."""
    spec = [2.0 / levels[i % len(levels)] * (10 if i in spoiled else 1) for i in range(n)]
    return {"spec": _series([x * f for x, f in zip(spec, _noisy(n, 1.0, 0.02, seed), strict=True)]),
            "plain": _series(_noisy(n, 2.0, 0.02, seed + 1))}


def test_rounds_over_several_prompts_are_judged_within_each_prompt():
    from hfspec.measure import interleaved
    from hfspec.measure.stability import stratified_median, within_strata

    levels = [1.5, 1.8, 2.4, 1.6]  # four prompts that really differ in speed-up
    t = interleaved(_prompt_rounds(levels, 40, 11), "plain", 12, machine=quiet, strata=lambda i: i % 4)
    r = t.ratio("spec")
    stable, warnings = t.verdict()
    assert t.outliers == 0 and stable and not warnings
    geo = (1.5 * 1.8 * 2.4 * 1.6) ** 0.25
    assert r.median == pytest.approx(geo, rel=0.03) and r.low < geo < r.high and r.width < 0.1
    # the negative control: the same rounds as one stratum read the prompts' spread as noise and as outliers
    blind = interleaved(_prompt_rounds(levels, 40, 11), "plain", 12, machine=quiet)
    assert not blind.verdict()[0] and blind.ratio("spec").width > 0.3
    # a round spoiled by the machine is still an outlier within its prompt, and re-measured
    spoiled = interleaved(_prompt_rounds(levels, 40, 11, spoiled={5}), "plain", 12, machine=quiet,
                          strata=lambda i: i % 4)
    assert spoiled.outlier[5] and spoiled.outliers == 1 and spoiled.pairs == 12
    # each prompt timed once: nothing measures the noise, so the interval is the prompts' own spread (wider, never
    # the figure alone), and the verdict says so; the replicated rounds above are the control (no such warning)
    once = interleaved(_prompt_rounds(levels, 40, 11), "plain", 4, machine=quiet, strata=lambda i: i % 4)
    lone = once.ratio("spec")
    assert lone.low < lone.median < lone.high and lone.width > 0.2 and lone.coverage > 0
    assert lone.low <= min(levels) * 1.05 and lone.high >= max(levels) * 0.95
    assert any("timed once" in w for w in once.verdict()[1]) and not any("timed once" in w for w in warnings)
    # the statistics themselves: one stratum is the plain median interval; a lone value says nothing of noise
    assert stratified_median([1.0, 2.0, 3.0], None) == (2.0, *median_interval([1.0, 2.0, 3.0]))
    assert within_strata([2.0, 4.0, 3.0], ["a", "a", "b"])[2] == 1.0
    # two values of a stratum: their spread about its median, widened by √2 (each pulled the median its way)
    assert within_strata([2.0, 4.0, 3.0, 3.0], ["a", "a", "b", "b"]) == pytest.approx(
        [2 ** (-0.5 * 2 ** 0.5), 2 ** (0.5 * 2 ** 0.5), 1.0, 1.0])


def test_a_quiet_sequence_is_stable():
    spec, plain = _noisy(12, 1.0, 0.03, 1), _noisy(12, 2.0, 0.03, 2)
    m = measure_speedup(_series(spec), _series(plain), pairs=9, machine=quiet)
    assert m.stable and m.verdict == "stable" and m.reliable and not m.warnings and not m.flags
    assert m.outliers == 0 and m.remeasured == 0 and m.pairs == 9
    assert m.low <= 2.0 <= m.high and m.high - m.low < 0.2 and m.coverage >= 0.95


def test_injected_10x_outliers_are_re_measured():
    spec, plain = _noisy(20, 1.0, 0.03, 3), _noisy(20, 2.0, 0.03, 4)
    plain[2] *= 10  # two plain runs hit by something else on the machine
    spec[5] *= 10
    calls = []
    m = measure_speedup(lambda i: calls.append(i) or _series(spec)(i), _series(plain), pairs=9, machine=quiet)
    assert m.outliers == 2 and m.remeasured == 2 and m.pairs == 9  # dropped, and two more pairs taken
    assert calls == list(range(11))
    assert m.stable and m.measured_speedup == pytest.approx(2.0, rel=0.05)
    assert m.low > 1.8 and m.high < 2.2  # the 20× and 0.2× pairs are not in the interval


def test_outliers_that_keep_coming_are_flagged_unstable_naming_load():
    spec = _noisy(40, 1.0, 0.03, 5)
    plain = [p * (10 if i % 2 else 1) for i, p in enumerate(_noisy(40, 2.0, 0.03, 6))]  # every other pair
    busy = MachineState(cores=2, load_avg=5.7, freq_mhz=None, cpu_seconds=None, at=0.0)
    m = measure_speedup(_series(spec), _series(plain), pairs=6, machine=lambda: busy)
    assert m.stable is False and m.verdict == "unstable" and not m.reliable
    assert m.warnings and m.warnings[0].startswith("unstable:") and "load 5.7 on 2 cores" in m.warnings[0]


def test_a_high_load_reading_produces_a_warning_naming_load():
    spec, plain = _noisy(9, 1.0, 0.03, 7), _noisy(9, 2.0, 0.03, 8)
    busy = MachineState(cores=2, load_avg=6.0, cpu_seconds=None, at=0.0)
    m = measure_speedup(_series(spec), _series(plain), pairs=9, machine=lambda: busy)
    assert any("load 6.0 on 2 cores" in w for w in m.warnings)
    assert m.load_avg == 6.0 and m.cores == 2


def test_machine_causes_name_busy_processes_and_frequency_changes():
    before = MachineState(4, 1.0, 3000.0, {10: ("stress", 5.0), 11: ("idle", 1.0)}, at=0.0)
    after = MachineState(4, 1.0, 1500.0, {10: ("stress", 9.0), 11: ("idle", 1.1)}, at=4.0)
    causes = machine_causes(before, after, threads=1)
    assert any("stress (pid 10, 100% of a core)" in c for c in causes) and not any("idle" in c for c in causes)
    assert any("CPU frequency changed from 3000 to 1500 MHz" in c for c in causes)
    assert machine_causes(QUIET, QUIET, threads=2) == []


def _passes(tokens_per_pass=2.5, gamma=2, c_time=0.2, c_bytes=0.25, passes=40):
    """Stats of a speculative run with the given tokens per pass, γ, c_time and c_bytes (target pass 10 ms)."""
    step = 0.01
    return SpecStats(gamma=gamma, target_passes=passes, row_passes=passes, new_tokens=int(tokens_per_pass * passes),
                     draft_forwards=gamma * passes, gamma_per_round=[gamma] * passes, time_target=step * passes,
                     time_draft=c_time * step * gamma * passes, time_total=step * passes * (1 + gamma * c_time) * 1.1,
                     draft_bytes=int(c_bytes * 1e6), target_bytes=int(1e6))


def _plain(passes=100):
    return SpecStats(target_passes=passes, row_passes=passes, new_tokens=passes, time_target=0.01 * passes, time_total=0.011 * passes)


def test_a_speedup_its_passes_cannot_produce_is_flagged():
    spec = _passes(tokens_per_pass=2.9, gamma=2, c_time=0.3)
    bound = speedup_bound(spec, _plain())
    assert bound == pytest.approx(2.9 * 1.1 / 1.6)
    flags = implausible(20.1, spec, _plain())  # the demo's rtn3 at γ 2
    assert len(flags) == 1 and flags[0].startswith("implausible: measured 20.10×") and "2.90 tokens per pass" in flags[0]
    # a c_time no smaller draft can have
    flags = implausible(None, _passes(c_time=9.7, c_bytes=0.2))
    assert len(flags) == 1 and flags[0].startswith("implausible: c_time 9.7")


def test_a_plausible_speedup_is_not_flagged():  # the negative control
    spec = _passes(tokens_per_pass=2.9, gamma=2, c_time=0.3)
    assert implausible(1.6, spec, _plain()) == []
    assert implausible(speedup_bound(spec, _plain()) * 1.1, spec, _plain()) == []  # within the timer slack
    assert implausible(0.6, _passes(c_time=1.5)) == []  # a slow draft, but possible
    assert implausible(None, _passes(c_time=9.7, c_bytes=1.2)) == []  # a draft bigger than its target may be slow


def test_a_verify_pass_cheaper_than_a_step_lifts_the_bound():
    """Through the few-row kernel a verify pass may cost less than plain decoding's one-token step (SmolLM2 fp32 on
    the AVX-512 EPYC: 0.64 at 5 positions), so the bound divides by that floor; the control: F.linear's floor 1."""
    from hfspec.decoding.priors import verify_floor

    spec = _passes(tokens_per_pass=3.8, gamma=4, c_time=0.2)
    assert implausible(3.2, spec, _plain()), "F.linear: 3.2x is above what these passes allow"  # the control
    spec.verify_floor = verify_floor("float32")  # the AVX-512 kind's kernel curve (tests pin the kind)
    assert 0.5 < spec.verify_floor < 0.7
    assert speedup_bound(spec, _plain()) == pytest.approx(3.8 * 1.1 / 1.8 / spec.verify_floor)
    assert implausible(3.2, spec, _plain()) == []
    flags = implausible(6.0, spec, _plain())  # still flagged past the lifted bound, naming the floor
    assert len(flags) == 1 and "a verify pass ≥ 0.56 of a step" in flags[0]
    assert verify_floor("float16") == 1.0  # no kernel curve: no floor below a step
    merged = spec.merge(_passes())
    assert merged.verify_floor == spec.verify_floor


def test_a_measurement_with_impossible_pairs_is_flagged_not_presented():
    spec = _passes(tokens_per_pass=2.9, gamma=2, c_time=0.3)
    plain = _plain(116)  # the same 116 tokens
    plain.time_total *= 20  # plain slowed 20× by the machine, every pair alike: stable, but impossible
    plain.time_target *= 20
    m = measure_speedup(lambda i: spec, lambda i: plain, pairs=5, machine=quiet)
    assert m.stable and m.verdict == "implausible" and not m.reliable
    lines = report.measurement_lines(m, spec)
    assert "IMPLAUSIBLE, not a fact" in lines[0] and lines[1].startswith("  ! implausible: measured")


def test_the_run_report_says_interval_pairs_threads_and_load():
    m = measure_speedup(lambda i: SpecStats(new_tokens=10, time_total=1.0),
                        lambda i: SpecStats(new_tokens=10, time_total=2.0), pairs=1, machine=quiet)
    line = report.stats_lines(SpecStats(new_tokens=10, time_total=1.0), None, m.measured_speedup, m)[-2]
    assert line.startswith("measured speed-up        2.00× (rough)") and "torch thread" in line and "load 0.30" in line
    spec, plain = _noisy(9, 1.0, 0.02, 9), _noisy(9, 2.0, 0.02, 10)
    m3 = measure_speedup(_series(spec), _series(plain), pairs=5, machine=quiet)
    line = report.stats_lines(SpecStats(new_tokens=10, time_total=1.0), None, m3.measured_speedup, m3)[-1]
    assert "rough" not in line and "median of 5 alternating pairs" in line and "94% interval]" in line
    assert statistics.median([p / s for s, p in zip(spec, plain, strict=False)][:5]) == pytest.approx(
        m3.measured_speedup)


def _row(gamma, measured, low, high, flags="", stable=True, pairs=5, draft="rtn3"):
    return {"draft": draft, "gamma": gamma, "repeats": pairs, "pairs": pairs, "alpha": 0.7, "checked": 100,
            "accepted": 70, "tokens_per_pass": 2.0, "tokens_per_pass_sd": 0.1, "c_bytes": 0.3, "c_time": 0.3,
            "predicted_speedup": 1.3, "paper_speedup": 1.4, "ideal_speedup": 1.35, "measured_speedup": measured,
            "measured_speedup_low": low, "measured_speedup_high": high, "flags": flags, "stable": stable,
            "speedup_bound": 2.0, "warnings": "", "disagreement": ""}


def test_a_sweep_plot_with_an_injected_20x_point_keeps_its_axis_and_marks_the_point(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [_row(1, 1.2, 1.1, 1.3), _row(2, 20.1, -4.0, 44.0, flags="implausible: measured 20.10× is above …"),
            _row(3, 1.25, 1.0, 1.6, stable=False), _row(4, 1.1, 1.0, 1.2, pairs=1)]
    drawn = report.plot_sweep(rows, tmp_path / "sweep.png")
    low, top = drawn["ylim"]
    assert low == 0.0 and 1.6 < top < 3.0  # set by the plausible values, not stretched to 20× or its ±24 bars
    assert drawn["off_scale"] == [("rtn3", 2, 20.1)]
    assert [(g, why) for _, g, why in drawn["unreliable"]] == [(2, "implausible"), (3, "unstable"), (4, "rough")]
    assert (tmp_path / "sweep.png").stat().st_size > 0
    # the CLI's table cell says the same
    assert report.measured_cell(rows[1]).endswith("IMPLAUSIBLE") and report.measured_cell(rows[0]) == "1.20× [1.10–1.30]"
    assert any(line.startswith("rtn3 γ 2: implausible") for line in report.row_notes(rows))


def test_the_plot_legend_says_predicted_and_paper_formula(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    labels = []
    real = plt.Axes.legend

    def spy(self, *args, **kwargs):
        labels.extend(h.get_label() for h in kwargs.get("handles", []))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(plt.Axes, "legend", spy)
    report.plot_sweep([_row(1, 1.2, 1.1, 1.3), _row(2, 1.1, 1.0, 1.2, pairs=1)], tmp_path / "s.png")
    assert "rtn3 predicted (cost model, as in the CSV)" in labels
    assert any("paper formula, c_time" in x for x in labels) and any("(ideal)" in x for x in labels)
    assert any(x.startswith("hollow: rough") for x in labels)


def test_the_ideal_note_names_a_verify_pass_cheaper_than_a_step():
    """A measured speed-up above the ideal is explained by what the run's own costs show: a verify pass that
    costs less than a one-token step (the few-row kernel in bf16) is named first; a run whose verify pass costs
    more than a step gets the draft's cheaper-than-bytes explanation instead (control)."""
    from test_costmodel import record

    from hfspec.decoding.stats import SpecStats
    from hfspec.measure.plausible import ideal_note

    def stats(verify_ms):
        s = SpecStats()
        s.gamma, s.proposed, s.checked, s.accepted, s.target_passes = 5, 50, 45, 40, 10
        s.gamma_per_round = [5] * 10
        s.draft_bytes, s.target_bytes, s.time_draft, s.draft_forwards, s.time_target = 31, 100, 0.5, 50, 1.0
        s.costs = record({5: 10}, verify_ms, 5.0, lambda k: 0.0, steps=4, step_ms=40)
        return s

    cheap = stats(lambda n: 28 + 0.5 * n)
    assert cheap.ideal_speedup > 0
    note = ideal_note(cheap, cheap.ideal_speedup * 1.2)
    assert re.search(r"verify pass costs 0\.[0-9]{2} of its one-token step", note) and "few-row" in note, note
    dear = stats(lambda n: 40 + 2 * n)
    note = ideal_note(dear, dear.ideal_speedup * 1.2)
    assert note and "verify pass" not in note, note
