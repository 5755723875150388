"""hfspec.session (the dashboard's model side, no Qt): draft specs through the registry, live data, runs with
equal-length baselines measured beside them, stop reasons, and sweep / compare through hfspec.measure.sweep."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import hfspec
import hfspec.session as session_module
from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.measure import ruler as measure  # `outliers` as the ruler reads it
from hfspec.session import (
    Cancelled,
    IncrementalDecoder,
    LiveBuffer,
    RunSettings,
    Session,
    context_length,
    draft_spec,
    parse_list,
    split_draft_spec,
)
from hfspec.validate import GAMMA_MAX

presets = pytest.importorskip("hfspec.io.presets")
NANO = Path(__file__).resolve().parents[1] / "presets" / "models" / "nano"
EOS_PROMPT = "Deprecated since version 3.4."  # the micro model's greedy next token here is </s>


@pytest.fixture(scope="module")
def session():
    return Session()


@pytest.fixture(scope="module")
def micro():
    if "micro-rtn4" not in presets.list_presets():
        pytest.skip("micro-rtn4 preset absent")
    # ignore_eos: fixed-length runs, whatever the sampled text (seed-independent lengths)
    return RunSettings.from_preset("micro-rtn4", max_new_tokens=10, seed=3, measure_baseline=False, ignore_eos=True)


@pytest.mark.parametrize(("args", "spec"), [
    (("rtn", 4, 0), "rtn4"), (("rtn", 3, 64), "rtn3-g64"), (("bnb", 4, 0, "int8"), "bnb-int8"),
    (("bnb", 4, 0, "nf4"), "bnb-nf4"), (("sibling", 4, 0, "nf4", f" {NANO} "), str(NANO)),
])
def test_draft_spec_round_trip_through_the_registry(args, spec):
    assert draft_spec(*args) == spec
    values = split_draft_spec(spec)
    assert draft_spec(**values) == spec
    assert values["kind"] == registry.parse(spec).kind


def test_every_registered_kind_round_trips_from_its_form_defaults():
    for kind in registry.choices():
        values = {f.name: (str(NANO) if f.text else f.default) for f in kind.fields}
        spec = draft_spec(kind.name, **values)
        back = split_draft_spec(spec)
        assert back["kind"] == kind.name and draft_spec(**back) == spec


@pytest.mark.parametrize(("args", "field"), [
    (("rtn", 9), "bits"), (("rtn", 4, 3), "group"), (("bnb", 4, 0, "int4"), "bitsandbytes"),
    (("sibling", 4, 0, "nf4", ""), "sibling"), (("awq",), "kind"),
])
def test_draft_spec_errors_name_the_field(args, field):
    with pytest.raises(HfspecError, match=field):
        draft_spec(*args)


def test_unreadable_spec_comes_back_as_a_sibling_source():
    assert split_draft_spec("/no/such/folder")["kind"] == "sibling"
    assert split_draft_spec("/no/such/folder")["source"] == "/no/such/folder"


def test_one_gamma_limit_and_context_length(session, micro):
    assert session_module.GAMMA_MAX is GAMMA_MAX
    with pytest.raises(HfspecError, match=str(GAMMA_MAX)):
        session.sweep(micro, gammas=[GAMMA_MAX + 1])
    assert context_length(micro.target) == 512  # the micro model's max_position_embeddings
    assert context_length("owner/hub-id") is None


@pytest.mark.parametrize(("change", "field"), [
    ({"gamma": 0}, "gamma"), ({"gamma": "fast"}, "gamma"), ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": ""}, "prompt"), ({"target": " "}, "target"), ({"seed": -1}, "seed"),
])
def test_settings_validation_names_the_field(change, field):
    good = RunSettings(target="x", prompt="hi")
    assert good.validated() is good
    with pytest.raises(HfspecError, match=field):
        replace(good, **change).validated()


def test_settings_dict_and_sampling_kwargs():
    s = RunSettings(target="t", draft="rtn3-g64", gamma="auto", top_k=0, top_p=1.0, prompt="p", device="cpu")
    assert RunSettings.from_dict(s.to_dict() | {"unknown": 1}) == s
    assert s.sampling_kwargs()["top_k"] == 0 and s.sampling_kwargs()["top_p"] == 1.0  # off, explicitly
    assert s.generate_kwargs()["gamma"] == "auto"
    assert parse_list("rtn4, rtn3-g64\n\n a | b ") == ["rtn4", "rtn3-g64", "a | b"]
    assert RunSettings.from_preset("micro-auto").ignore_eos  # the auto demo always runs its full length


def test_live_buffer_is_thread_safe():
    buffer = LiveBuffer()
    threads = [threading.Thread(target=lambda: [buffer.push(i) for i in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    got = []
    while any(t.is_alive() for t in threads):
        got.extend(buffer.drain())
    for t in threads:
        t.join()
    got.extend(buffer.drain())
    assert len(got) == 4000 and buffer.drain() == []


def test_incremental_decoder_pieces_join_to_the_full_decode(session, micro):
    _, tokenizer = session.load_target(micro.target)
    prompt = tokenizer(micro.prompt).input_ids
    new = tokenizer(" the value of a list").input_ids[1:]
    decoder = IncrementalDecoder(tokenizer, prompt)
    pieces = decoder.add(new[:3]) + decoder.add(new[3:])
    assert len(pieces) == len(new)
    full = tokenizer.decode(prompt + new, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert full.endswith("".join(pieces))


def test_run_matches_the_library_and_reports_live(session, micro):
    snapshots = []
    result = session.run(replace(micro, gamma=4), on_live=snapshots.append)
    target, draft, tokenizer = session.load(micro)
    ids = tokenizer(micro.prompt, return_tensors="pt").input_ids
    direct = hfspec.generate(target, ids, draft=draft, **replace(micro, gamma=4).generate_kwargs())
    assert result.stats.alpha == direct.stats.alpha
    assert result.stats.new_tokens == direct.stats.new_tokens == 10
    assert [k for _, k in result.pieces] == direct.token_kinds[0]
    assert result.prompt_text + result.text == tokenizer.decode(direct.sequences[0], skip_special_tokens=True)
    assert len(snapshots) == len(result.series) == result.stats.target_passes
    assert [row["gamma"] for row in result.series] == result.stats.gamma_per_round
    last = snapshots[-1]
    assert last.alpha == result.stats.alpha and last.new_tokens == 10
    assert sum(s.committed for s in snapshots) == 10
    assert 0 <= last.rolling_alpha <= 1 and last.c == pytest.approx(result.stats.c_bytes)
    summary = result.summary()
    assert summary["measured_speedup"] is None and summary["stop_reason"] == "max_tokens"
    assert result.stop_reason == "max tokens"
    # without a baseline the headline estimate is the cost model fitted to the run itself; the paper's formula
    # (c time) and the weight-bound ideal (c bytes) are kept beside it
    s = result.stats
    assert s.c_time > 0
    assert summary["predicted_speedup"] == pytest.approx(s.prediction.speedup) and s.prediction.speedup > 0
    assert summary["paper_speedup"] == pytest.approx(s.paper_speedup)
    assert summary["ideal_speedup"] == pytest.approx(s.ideal_speedup)
    assert result.to_dict()["series"] == result.series


def test_baseline_has_the_runs_length_and_is_measured_for_every_run(session, micro, monkeypatch):
    monkeypatch.setattr(measure, "outliers", lambda values, z=0: [False] * len(values))  # counted exactly
    lengths = []
    real = session_module.plain_run
    monkeypatch.setattr(session_module, "plain_run", lambda *a, **k: lengths.append(a[2]) or real(*a, **k))
    # greedy, a prompt after which the model writes </s>: the run ends at EOS after one token
    eos = replace(micro, prompt=EOS_PROMPT, temperature=0.0, ignore_eos=False, measure_baseline=True,
                  draft="rtn8", max_new_tokens=8)
    first = session.run(eos)
    assert first.stats.new_tokens == 1 and first.stop_reason == "EOS"
    assert first.baseline is not None and first.baseline.new_tokens == 1  # not max_new_tokens
    # α counts only positions really checked: nothing after the EOS
    assert first.stats.checked == 1 and sum(first.stats.checked_by_position) == 1
    second = session.run(replace(eos, ignore_eos=True))
    assert second.stats.new_tokens == second.baseline.new_tokens == 8
    pairs = session_module.MEASURE_PAIRS
    assert first.baseline.pairs == second.baseline.pairs == pairs  # a micro run fits the budget
    assert lengths == [1] * pairs + [8] * pairs  # plain runs per run, measured then, of exactly the run's length
    again = session.run(replace(eos, ignore_eos=True))
    assert again.baseline is not second.baseline and lengths == [1] * pairs + [8] * 2 * pairs
    assert again.summary()["baseline_new_tokens"] == 8 and again.measured_speedup > 0


def test_measuring_stops_adding_pairs_at_its_time_budget(session, micro, monkeypatch):
    monkeypatch.setattr(measure, "outliers", lambda values, z=0: [False] * len(values))
    monkeypatch.setattr(session_module, "MEASURE_BUDGET_S", 0.0)
    result = session.run(replace(micro, max_new_tokens=8, measure_baseline=True))
    assert result.baseline is not None and result.baseline.pairs == 1  # one pair at least, then the budget
    monkeypatch.setattr(session_module, "MEASURE_BUDGET_S", 60.0)
    assert session.run(replace(micro, max_new_tokens=8, measure_baseline=True)).baseline.pairs == \
        session_module.MEASURE_PAIRS


def test_a_long_run_is_timed_in_segments_of_its_own_text(session, micro, monkeypatch):
    """A run longer than 1.5 segments is timed in MEASURE_SEGMENT-token segments starting along its own text,
    so a slow target still gets several pairs within the budget (one pair of the whole run took all of it)."""
    monkeypatch.setattr(measure, "outliers", lambda values, z=0: [False] * len(values))
    seen = []
    real = session_module.plain_run
    monkeypatch.setattr(session_module, "plain_run",
                        lambda *a, **k: seen.append((a[1].shape[1], a[2])) or real(*a, **k))
    seg = session_module.MEASURE_SEGMENT
    result = session.run(replace(micro, max_new_tokens=3 * seg, ignore_eos=True, measure_baseline=True))
    m = result.measurement
    prompt = len(seen) and seen[0][0]
    assert m.new_tokens == seg and m.pairs == session_module.MEASURE_PAIRS and "segments" in m.segment
    assert {n for _, n in seen} == {seg}
    assert [c - prompt for c, _ in seen[:3]] == [0, seg, 2 * seg]  # contexts: the prompt plus the run's text
    assert m.low <= m.measured_speedup <= m.high and m.verdict in ("stable", "unstable", "implausible")


def test_segments_are_timed_after_their_first_round(session, micro, monkeypatch):
    """A segment's prefill of its context (the run decoding on never paid it again) is not counted on either side,
    nor are the tokens its first round committed (a speculative one drafts and verifies too): each segment is timed
    by its own clock less its first round, over its tokens less that round's (`_decoding`), and the measurement
    says so; a whole run keeps its prompt's prefill (the control: its label, and runs timed by their clocks as they
    are)."""
    monkeypatch.setattr(measure, "outliers", lambda values, z=0: [False] * len(values))
    seg = session_module.MEASURE_SEGMENT
    timed = []
    real = session_module._decoding
    monkeypatch.setattr(session_module, "_decoding", lambda stats: timed.append(stats) or real(stats))
    m = session.run(replace(micro, max_new_tokens=3 * seg, ignore_eos=True, measure_baseline=True)).measurement
    assert "prefill" in m.segment and len(timed) >= 2 * m.pairs
    for stats in timed:
        c = stats.costs
        prefill = c.prefill_target_seconds + c.prefill_draft_seconds + c.prefill_other_seconds
        assert c.prefill_seconds == pytest.approx(prefill)
        sample = real(stats)
        # every token is committed by exactly one round: the first, or a later one (its accepted draft tokens + 1)
        assert c.prefill_tokens + sum(c.gamma_accepted) + c.rounds == stats.new_tokens == seg
        if stats.gamma == 0:  # plain decoding: the prefill gives one token
            assert c.prefill_tokens == 1
        else:  # speculative: the prefill round also drafts γ₀ tokens and verifies them
            assert 1 <= c.prefill_tokens <= c.prefill_gamma + 1
        assert prefill > 0 and sample.out is stats and sample.tokens == seg - c.prefill_tokens
        assert sample.seconds == pytest.approx(stats.time_total - prefill)
    assert any(s.gamma != 0 and s.costs.prefill_tokens > 1 for s in timed)  # a first round that gave more than one
    stopped = replace(timed[0], stopped=True)
    assert real(stopped) is stopped and real(None) is None  # a stopped run stays one
    timed.clear()
    whole = session.run(replace(micro, max_new_tokens=8, ignore_eos=True, measure_baseline=True)).measurement
    assert "whole run" in whole.segment and not timed


def test_stop_ends_the_run_within_a_round(session, micro):
    passes = []
    result = session.run(replace(micro, max_new_tokens=200, measure_baseline=True), on_live=passes.append,
                         should_stop=lambda: len(passes) >= 2)
    assert result.stats.stopped and result.stats.target_passes == 2
    assert result.baseline is None and result.stop_reason == "user (Stop)"


def test_stop_while_loading_raises_cancelled(micro):
    with pytest.raises(Cancelled):
        Session().run(micro, should_stop=lambda: True)


def test_bad_target_is_a_user_error(session, micro):
    with pytest.raises(HfspecError, match="target"):
        session.run(replace(micro, target="/no/such/model"))


def test_sweep_and_compare_time_what_a_run_of_the_same_settings_times(session, micro, monkeypatch):
    """Issue 30: the dashboard's Sweep and Compare tabs and `hfspec sweep` / `compare` give the settings' tree and
    early exit to their speculative runs, as `hfspec run` does (they were dropped: a sweep of a tree preset timed
    the plain chain while the run timed the tree)."""
    from hfspec.cli import main
    from hfspec.measure import sweep as engine

    seen = []
    generate = engine.generate  # what the sweep engine calls (imported at module level)
    monkeypatch.setattr(engine, "generate", lambda *a, **k: seen.append((k.get("tree"), k.get("early_exit")))
                        or generate(*a, **k))
    settings = replace(micro, draft="rtn4", max_new_tokens=4)
    session.sweep(replace(settings, tree=2), gammas=[2], repeats=1)  # a warm-up pair and one pair
    session.compare(replace(settings, early_exit=True), ["rtn4"], repeats=1)
    assert seen == [(2, None)] * 2 + [(None, True)] * 2
    seen.clear()
    assert main(["sweep", "--preset", "micro-tree", "--draft", "rtn4", "--gammas", "2", "--max-new-tokens", "4",
                 "--no-greedy-check", "--json"]) == 0
    assert seen == [("auto", None)] * 2


def test_sweep_and_compare_run_the_cli_engine(session, micro, monkeypatch):
    calls = []
    real = session_module.run_sweep
    monkeypatch.setattr(session_module, "run_sweep", lambda *a, **k: calls.append(k["repeats"]) or real(*a, **k))
    points, steps = [], []
    settings = replace(micro, max_new_tokens=6, ignore_eos=False)  # the engine fixes the length anyway
    sweep = session.sweep(settings, gammas=[1, 3], drafts=["rtn4", str(NANO)], repeats=2,
                          on_point=points.append, on_step=lambda i, n: steps.append((i, n)))
    assert calls == [2]
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [(p.draft, p.gamma) for p in sweep.points] == [("rtn4", 1), ("rtn4", 3), (str(NANO), 1), (str(NANO), 3)]
    assert points == sweep.points and not sweep.stopped
    for p in sweep.points:
        assert p.repeats == 2 and p.new_tokens == p.baseline_new_tokens == 12 and p.alpha_sd is not None
    curve = sweep.curve("rtn4")
    assert curve["gamma"] == [1, 2, 3] and curve["tokens_per_pass"][0] >= 1
    pooled = sweep.pooled(str(NANO))
    assert 0 <= pooled["alpha"] <= 1 and pooled["c_bytes"] > 0 and pooled["c_time"] > 0

    steps.clear()
    rows = session.compare(settings, ["rtn4", f"{micro.target} | {NANO}"], repeats=1,
                           on_step=lambda i, n: steps.append((i, n)))
    assert calls == [2, 1, 1] and steps == [(1, 2), (2, 2)]
    assert [r.draft for r in rows] == ["rtn4", str(NANO)] and rows[1].label == f"{micro.target} | {NANO}"
    assert all(r.new_tokens == r.baseline_new_tokens == 6 for r in rows)
    with pytest.raises(HfspecError, match="gammas"):
        session.sweep(micro, gammas=[0])
    with pytest.raises(HfspecError, match="draft"):
        session.compare(micro, ["rtn99"])


def test_measured_speedup_times_both_runs_without_the_live_display(session, micro):
    """The live run pays for its callbacks and the plain baseline has none: the speed-up's numerator is the
    same speculative decoding of the same tokens, timed beside the baseline without callbacks."""
    slow = []

    def on_live(snapshot):  # a display that costs time every pass
        slow.append(snapshot.round_index)
        time.sleep(0.02)

    result = session.run(replace(micro, measure_baseline=True, max_new_tokens=12, ignore_eos=True), on_live=on_live)
    b = result.baseline
    assert slow and b is not None and b.speculative_time is not None
    assert b.speculative_time < result.stats.time_total - 0.015 * len(slow)  # the sleeps are not in it
    # the median of the per-pair ratios, inside its interval (the ratio of the median rates is close to it)
    m = result.measurement
    ratios = [p.time_total / s.time_total for s, p in zip(m.speculative_runs, m.plain_runs, strict=True)]
    assert result.measured_speedup == pytest.approx(statistics.median(ratios))
    assert m.low <= result.measured_speedup <= m.high
    assert result.summary()["speculative_tokens_per_second_measured"] == pytest.approx(b.new_tokens / b.speculative_time)
