"""The one measured speed-up rule: alternating pairs, medians, rough under three pairs, machine state."""

from __future__ import annotations

import torch

from hfspec import report
from hfspec.measure import measure_speedup
from hfspec.stats import SpecStats


def _runs(times, order, name):
    def run(i):
        order.append((name, i))
        return SpecStats(new_tokens=10, time_total=times[i])
    return run


def test_pairs_alternate_and_the_speedup_is_the_ratio_of_medians():
    order = []
    m = measure_speedup(_runs([1.0, 9.0, 2.0], order, "spec"), _runs([2.0, 4.0, 3.0], order, "plain"), pairs=3)
    assert [n for n, _ in order] == ["spec", "plain", "plain", "spec", "spec", "plain"]
    assert m.pairs == 3 and not m.rough
    assert m.speculative_tokens_per_second == 5.0 and abs(m.plain_tokens_per_second - 10 / 3) < 1e-9
    assert abs(m.measured_speedup - 1.5) < 1e-9  # median 2 s against median 3 s, not the mean
    assert m.threads == torch.get_num_threads() and (m.load_avg is None or m.load_avg >= 0)


def test_a_stop_keeps_finished_pairs_and_marks_the_measurement_rough():
    def plain(i):
        return SpecStats(new_tokens=10, time_total=2.0, stopped=i == 1)

    m = measure_speedup(lambda i: SpecStats(new_tokens=10, time_total=1.0), plain, pairs=3)
    assert m.pairs == 1 and m.rough and m.measured_speedup == 2.0
    assert measure_speedup(lambda i: SpecStats(stopped=True), plain) is None


def test_the_budget_ends_after_one_pair_at_least():
    m = measure_speedup(lambda i: SpecStats(new_tokens=4, time_total=1.0),
                        lambda i: SpecStats(new_tokens=4, time_total=1.0), pairs=3, budget_s=0.0)
    assert m.pairs == 1


def test_the_run_report_says_rough_threads_and_load():
    m = measure_speedup(lambda i: SpecStats(new_tokens=10, time_total=1.0),
                        lambda i: SpecStats(new_tokens=10, time_total=2.0), pairs=1)
    from hfspec.session import Baseline

    line = report.stats_lines(SpecStats(new_tokens=10, time_total=1.0), Baseline.of(m), m.measured_speedup, m)[-1]
    assert "2.00× (rough: 1 pair)" in line and "torch thread" in line
    m3 = measure_speedup(lambda i: SpecStats(new_tokens=10, time_total=1.0),
                         lambda i: SpecStats(new_tokens=10, time_total=2.0), pairs=3)
    line = report.stats_lines(SpecStats(new_tokens=10, time_total=1.0), Baseline.of(m3), m3.measured_speedup, m3)[-1]
    assert "rough" not in line and "median of 3" in line
