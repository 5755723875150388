"""Cost profiles (`hfspec.decoding.profile`, `hfspec profile`): a pair's costs measured on this machine, which a
seeded γ "auto" prices rounds with instead of the priors where its key matches, and never otherwise."""

import json
import os
import warnings

import pytest
import torch
from tiny_models import build, perturbed

import hfspec
import hfspec.api
from hfspec.cli import main
from hfspec.decoding import profile as cost_profile
from hfspec.decoding.costrecord import CostRecord, RoundSeconds
from hfspec.errors import HfspecError
from hfspec.measure.profile import check_profile_arguments, measure_profile

STEP = 0.01  # seconds of one target step in the made-up records


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    folder = tmp_path / "profiles"
    monkeypatch.setenv(cost_profile.DIR_ENV, str(folder))
    monkeypatch.delenv(cost_profile.MODE_ENV, raising=False)
    cost_profile._warned.clear()
    return folder


@pytest.fixture
def pair(monkeypatch):
    """A tiny target and a perturbed copy priced at a tenth of its bytes, so the priors draft long rounds."""
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.05)
    monkeypatch.setattr(hfspec.api, "weight_bytes", lambda model: 0 if model is None else 10 if model is draft else 100)
    return target, draft, torch.tensor([[0, 5, 17, 33]])


def made_up(c: float, verify: float = 1.0) -> cost_profile.CostProfile:
    """Records of a draft whose step costs `c` target steps and a flat verify pass of `verify` steps."""
    record, plain = CostRecord(), CostRecord()
    for k in (2, 3, 4, 5):
        for _ in range(6):
            record.record(k, k + 1, 1, RoundSeconds(draft=c * k * STEP, target=verify * STEP, other=0.0),
                          prefill=False)
    for _ in range(20):
        plain.record(0, 1, 1, RoundSeconds(draft=0.0, target=STEP, other=0.0), prefill=False)
    return cost_profile.CostProfile({}, record, plain, [2, 3, 4, 5])


def save_for(target, draft, profile, sampled=True):
    profile.key = hfspec.api.profile_key(target, draft, sampled)
    return cost_profile.save(profile)


def run(target, draft, ids, seed=3, temperature=1.0):
    return hfspec.generate(target, ids, draft=draft, gamma="auto", temperature=temperature, max_new_tokens=40,
                           min_new_tokens=40, seed=seed)


def test_a_saved_profile_prices_seeded_auto_gamma(profiles, pair, monkeypatch):
    """The priors (draft at a tenth of the bytes) draft long rounds; a profile measured here saying the draft's step
    costs 1.5 target steps makes the same seeded run draft short or none, reproducibly; "off" is the priors again."""
    target, draft, ids = pair
    priors = run(target, draft, ids)
    assert priors.stats.cost_profile == ""
    path = save_for(target, draft, made_up(c=1.5))
    first, second = run(target, draft, ids), run(target, draft, ids)
    assert first.stats.cost_profile == path.name
    assert torch.equal(first.sequences, second.sequences)
    assert first.stats.gamma_per_round == second.stats.gamma_per_round
    mean = lambda stats: sum(stats.gamma_per_round) / len(stats.gamma_per_round)  # noqa: E731
    assert mean(priors.stats) >= 3 and mean(first.stats) <= 1, (priors.stats.gamma_per_round,
                                                                 first.stats.gamma_per_round)
    monkeypatch.setenv(cost_profile.MODE_ENV, "off")
    off = run(target, draft, ids)
    assert off.stats.cost_profile == "" and off.stats.gamma_per_round == priors.stats.gamma_per_round
    assert torch.equal(off.sequences, priors.sequences)


def test_a_profile_for_other_settings_is_never_used(profiles, pair):
    """A greedy run does not take the sampled rounds' profile; a file at the key's path holding another key (other
    threads) or unreadable JSON is skipped with a warning naming it, and the run prices from the priors."""
    target, draft, ids = pair
    path = save_for(target, draft, made_up(c=1.5), sampled=True)
    assert run(target, draft, ids, temperature=0.0).stats.cost_profile == ""
    data = json.loads(path.read_text())
    data["key"]["threads"] += 1
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="other settings"):
        assert run(target, draft, ids).stats.cost_profile == ""
    cost_profile._warned.clear()
    path.write_text("{not json")
    with pytest.warns(UserWarning, match=str(path.name)):
        assert run(target, draft, ids).stats.cost_profile == ""


def test_measure_profile_saves_what_a_seeded_run_then_uses(profiles, pair):
    target, draft, ids = pair
    said = []
    (profile, path), = measure_profile(target, draft, ids, gammas=(2, 3), temperatures=(1.0,), max_new_tokens=12,
                                       repeats=1, progress=said.append)
    assert os.path.isfile(path) and any("saved" in line for line in said)
    assert profile.record.gamma_rounds[2] > 0 and profile.record.gamma_rounds[3] > 0 and profile.plain.rounds > 0
    loaded, found_at = cost_profile.find(hfspec.api.profile_key(target, draft, True))
    assert loaded is not None and str(found_at) == path and loaded.record == profile.record
    model = loaded.model()
    # the draft's line is a fit of timed rounds: its slope may be 0 on a noisy micro run (the fit clamps a negative
    # one), but a round that drafts costs time and a longer one never less
    assert model.verify(1) == model.step > 0 and model.draft_b >= 0 and model.draft(3) >= model.draft(2) > 0
    assert run(target, draft, ids).stats.cost_profile == os.path.basename(path)
    assert not [p for p in os.listdir(profiles) if p.endswith(".tmp")]


def test_a_profile_that_cannot_be_saved_is_a_clear_error(tmp_path, monkeypatch, pair):
    target, draft, _ = pair
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cost_profile.DIR_ENV, str(blocker / "profiles"))
    with pytest.raises(HfspecError, match="HFSPEC_PROFILE_DIR"):
        save_for(target, draft, made_up(c=1.0))


def test_bad_profile_settings_are_refused_by_name(profiles, pair, monkeypatch):
    target, draft, ids = pair
    for gammas, temperatures, field in [((0, 2), (1.0,), "gammas"), (("auto",), (1.0,), "gammas"),
                                        ((2,), (), "temperatures"), ((2,), (0.5, 1.0), "temperatures"),
                                        ((2,), (-1.0,), "temperatures")]:
        with pytest.raises(HfspecError, match=field):
            check_profile_arguments(gammas, temperatures, 16, 1)
    monkeypatch.setenv(cost_profile.MODE_ENV, "maybe")
    with pytest.raises(HfspecError, match="HFSPEC_COST_PROFILE"):
        run(target, draft, ids)


def test_cli_profile_measures_shows_and_refuses_before_loading(profiles, capsys, monkeypatch):
    small = ["--preset", "micro-rtn4", "--gammas", "2-3", "--max-new-tokens", "12", "--repeats", "1"]
    assert main(["profile", *small, "--temperatures", "0"]) == 0
    out = capsys.readouterr().out
    assert "greedy rounds" in out and "draft step c" in out and len(list(profiles.glob("*.json"))) == 1
    assert main(["profile", *small, "--temperatures", "0", "--show"]) == 0
    assert "greedy rounds" in capsys.readouterr().out
    assert main(["profile", *small, "--temperatures", "1", "--show"]) == 1  # nothing saved for sampled rounds
    assert "no sampled profile" in capsys.readouterr().err

    def no_loading(*args, **kwargs):
        raise AssertionError("a model loaded before the arguments were checked")

    monkeypatch.setattr("hfspec.session.Session.load", no_loading)
    for bad, field in [(["--temperatures", "0,0.5,1"], "temperatures"), (["--temperatures", "x"], "temperatures"),
                       (["--gammas", "2-3,auto"], "gammas")]:
        with warnings.catch_warnings():
            assert main(["profile", *small, *bad]) == 2
        assert field in capsys.readouterr().err


def test_greedy_and_sampled_profiles_share_their_forwards_lines(profiles, pair):
    """Measured together, both modes price the draft and the verify pass from the pooled rounds (forwards cost the
    same either way) and keep their own time outside forwards."""
    target, draft, ids = pair
    (greedy, _), (sampled, _) = measure_profile(target, draft, ids, gammas=(2, 3), temperatures=(0.0, 1.0),
                                                max_new_tokens=12, repeats=1)
    assert greedy.forwards is not None and greedy.forwards == sampled.forwards
    assert greedy.forwards.rounds == greedy.record.rounds + sampled.record.rounds
    g, s = greedy.model(), sampled.model()
    assert (g.step, g.draft_b, g.verify_a, g.verify_b) == (s.step, s.draft_b, s.verify_a, s.verify_b)
    assert g.other_a != s.other_a or g.other_b != s.other_b
    alone = cost_profile.CostProfile(greedy.key, greedy.record, greedy.plain).model()
    assert (alone.verify_a, alone.verify_b, alone.draft_b) != (g.verify_a, g.verify_b, g.draft_b)
    loaded, _ = cost_profile.find(greedy.key)
    assert loaded.forwards == greedy.forwards and loaded.model().verify(5) == g.verify(5)


def test_the_verify_curve_keeps_a_real_step_and_averages_a_dip():
    """Widths 3-8 as a bf16 profile measured them through the few-row kernel (ms, rounds): flat with a noisy dip,
    then a step at 7. The monotone fit averages the dip and keeps the step; a line through them (the control)
    smears the step over every width."""
    from hfspec.decoding.costmodel import _line

    points = [(3, 34.5, 44), (4, 30.5, 38), (5, 31.3, 30), (6, 32.7, 24), (7, 39.1, 18), (8, 41.4, 20)]
    fitted = cost_profile.monotone(points)
    values = [t for _, t in fitted]
    assert values == sorted(values) and [n for n, _ in fitted] == [3, 4, 5, 6, 7, 8]
    assert values[0] == pytest.approx((34.5 * 44 + 30.5 * 38 + 31.3 * 30) / 112)  # the dip, pooled
    model = cost_profile.ProfileModel(step=44.0, verify_a=0.0, verify_b=0.0, draft_a=0.0, draft_b=0.0,
                                      draft_zero=0.0, other_a=0.0, other_b=0.0, plain_other=0.0, points=tuple(fitted))
    assert model.verify(1) == 44.0 and model.verify(2) == values[0]
    assert model.verify(7) - model.verify(6) > 5.0
    assert model.verify(10) > model.verify(8) > model.verify(7)  # past the last width it keeps rising
    a, b = _line(points)
    assert b < 2.0  # the line's step from 6 to 7 positions: under 2 ms where the passes stepped up 6
