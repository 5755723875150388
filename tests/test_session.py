"""hfspec.session (the dashboard's model side, no Qt): settings, draft specs, live data, runs, sweep, compare."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

import hfspec
from hfspec.drafts import parse_draft_spec
from hfspec.errors import HfspecError
from hfspec.session import (
    Cancelled,
    IncrementalDecoder,
    LiveBuffer,
    RunSettings,
    Session,
    draft_spec,
    parse_list,
    split_draft_spec,
)

presets = pytest.importorskip("hfspec.presets")
NANO = Path(__file__).resolve().parents[1] / "presets" / "models" / "nano"


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
    (("bnb", 4, 0, "nf4"), "bnb-nf4"), (("sibling", 4, 0, "nf4", " models/nano "), "models/nano"),
])
def test_draft_spec_round_trip(args, spec):
    assert draft_spec(*args) == spec
    parts = split_draft_spec(spec)
    assert draft_spec(parts["kind"], parts["bits"], parts["group"], parts["bnb_type"], parts["source"]) == spec
    if parts["kind"] != "sibling":
        assert parse_draft_spec(spec).kind == parts["kind"]


@pytest.mark.parametrize(("args", "field"), [
    (("rtn", 9), "bits"), (("rtn", 4, 3), "group"), (("bnb", 4, 0, "int4"), "bitsandbytes"),
    (("sibling", 4, 0, "nf4", ""), "sibling"), (("awq",), "kind"),
])
def test_draft_spec_errors_name_the_field(args, field):
    with pytest.raises(HfspecError, match=field):
        draft_spec(*args)


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
    s = RunSettings(target="t", draft="rtn3-g64", gamma="auto", top_k=0, top_p=1.0, prompt="p")
    assert RunSettings.from_dict(s.to_dict() | {"unknown": 1}) == s
    assert s.sampling_kwargs()["top_k"] is None and s.sampling_kwargs()["top_p"] is None
    assert s.generate_kwargs()["gamma"] == "auto"
    assert parse_list("rtn4, rtn3-g64\n\n a | b ") == ["rtn4", "rtn3-g64", "a | b"]


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
    assert len(snapshots) == result.stats.target_passes
    last = snapshots[-1]
    assert last.alpha == result.stats.alpha and last.new_tokens == 10
    assert sum(s.committed for s in snapshots) == 10
    assert 0 <= last.rolling_alpha <= 1 and last.c == pytest.approx(result.stats.c_bytes)
    assert result.summary()["measured_speedup"] is None


def test_baseline_is_cached_and_gives_a_measured_speedup(session, micro):
    result = session.run(replace(micro, measure_baseline=True, max_new_tokens=6))
    assert result.baseline is not None and result.baseline.new_tokens == 6
    assert result.measured_speedup and result.measured_speedup > 0
    again = session.run(replace(micro, measure_baseline=True, max_new_tokens=6, gamma=2))
    assert again.baseline is result.baseline  # same prompt, sampling and length: not run twice


def test_stop_ends_the_run_within_a_round(session, micro):
    passes = []
    result = session.run(replace(micro, max_new_tokens=200), on_live=passes.append,
                         should_stop=lambda: len(passes) >= 2)
    assert result.stats.stopped and result.stats.target_passes == 2
    assert result.baseline is None


def test_stop_while_loading_raises_cancelled(micro):
    with pytest.raises(Cancelled):
        Session().run(micro, should_stop=lambda: True)


def test_bad_target_is_a_user_error(session, micro):
    with pytest.raises(HfspecError, match="target"):
        session.run(replace(micro, target="/no/such/model"))


def test_sweep_and_compare(session, micro):
    points = []
    sweep = session.sweep(replace(micro, max_new_tokens=8), gammas=[1, 3], drafts=["rtn4", str(NANO)],
                          on_point=points.append)
    assert [(p.draft, p.gamma) for p in sweep.points] == [("rtn4", 1), ("rtn4", 3), (str(NANO), 1), (str(NANO), 3)]
    assert points == sweep.points
    curve = sweep.curve("rtn4")
    assert curve["gamma"] == [1, 2, 3] and curve["tokens_per_pass"][0] >= 1
    alpha, c = sweep.pooled(str(NANO))
    assert 0 <= alpha <= 1 and c > 0
    rows = session.compare(replace(micro, max_new_tokens=8), ["rtn4", f"{micro.target} | {NANO}"])
    assert [r.draft for r in rows] == ["rtn4", str(NANO)]
    assert rows[0].c < 0.5 and all(r.new_tokens == 8 for r in rows)
    with pytest.raises(HfspecError, match="gammas"):
        session.sweep(micro, gammas=[0])
