"""A greedy run's γ choices replayed away from the clock (`hfspec.measure.replay`) are the real run's, round by round."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hfspec
from hfspec.api import seeded_gamma_policy
from hfspec.decoding.costmodel import CostModel
from hfspec.decoding.gamma import FixedGamma
from hfspec.measure.replay import draft_matches, replay, run_lengths

MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"
TOKENS = 96
COSTS = CostModel(step=1.0, verify_a=0.9, verify_b=0.05, draft_a=0.02, draft_b=0.1, draft_zero=0.0, other_a=0.01,
                  other_b=0.005, plain_other=0.0)


@pytest.fixture(scope="module")
def pair():
    target = AutoModelForCausalLM.from_pretrained(MICRO, local_files_only=True).eval()
    return target, hfspec.make_draft(target, "rtn3")


def real_rounds(target, draft, ids, gamma):
    events = []
    out = hfspec.generate(target, ids, draft=draft, gamma=gamma, temperature=0, seed=5, max_new_tokens=TOKENS,
                          min_new_tokens=TOKENS, on_round=lambda e: events.append((e.gamma, e.accepted[0])))
    return out, events


@pytest.mark.parametrize("gamma", ["auto", 3])
def test_replay_makes_the_real_runs_choices(pair, gamma):
    target, draft = pair
    ids = torch.tensor([[1, 310, 47, 900, 12]])
    out, events = real_rounds(target, draft, ids, gamma)
    matches = draft_matches(target, draft, ids, TOKENS)
    assert 0.2 < sum(matches) / TOKENS < 1.0, "the pair should both keep and reject draft tokens"
    policy = seeded_gamma_policy(target, draft, gamma)
    got = replay(matches, policy, COSTS)
    assert list(zip(got.gammas, got.accepted, strict=True)) == events
    assert got.tokens == TOKENS == out.sequences.shape[1] - ids.shape[1]
    if gamma == "auto":
        assert len(set(got.gammas)) > 1, "γ auto should move on this pair"
    # negative control: the same policy on a text whose first kept run is one token shorter chooses otherwise
    flipped = list(matches)
    flipped[next(i for i, m in enumerate(flipped) if m)] = False
    other = replay(flipped, seeded_gamma_policy(target, draft, gamma), COSTS)
    assert list(zip(other.gammas, other.accepted, strict=True)) != events


class Recording(FixedGamma):
    """A fixed γ that records what the loop (or the replay) tells it."""

    def __init__(self, gamma):
        super().__init__(gamma)
        self.updates, self.observed = [], []

    def update(self, gamma, accepted, checked, draft_seconds, target_seconds):
        self.updates.append((gamma, accepted, checked))

    def observe(self, accepted, checked):
        self.observed.append((accepted[0], checked[0]))


def test_replay_tells_the_policy_what_the_loop_tells_it():
    matches = [True, False, True, True, True, True, True, False, True]
    policy = Recording(5)
    got = replay(matches, policy, COSTS)
    assert got.gammas == [5, 5, 0] and got.accepted == [1, 5, 0]
    # every round is observed; the last one, capped to γ 0 by the length where the policy chose 5, is not learned
    # from (as hfspec.decoding.loop's _report): it says nothing of α or c
    assert policy.observed == [(1, 2), (5, 5), (0, 0)]
    assert policy.updates == [(5, 1, 2), (5, 5, 5)]


def test_replay_prices_rounds_by_the_cost_model():
    matches = [True, True, False, True, True, True, False, True]
    assert run_lengths(matches) == [2, 1, 0, 3, 2, 1, 0, 1]
    got = replay(matches, FixedGamma(2), COSTS)
    # rounds at 0 (keeps 2, commits 3), 3 (keeps 2), 6 (keeps 0, commits 1), 7 (γ capped to 0: the last token)
    assert got.gammas == [2, 2, 1, 0] and got.accepted == [2, 2, 0, 0] and got.tokens == 8
    expected = 2 * COSTS.round_seconds(2) + COSTS.round_seconds(1) + COSTS.round_seconds(0)
    assert got.seconds == pytest.approx(expected) and got.rate == pytest.approx(8 / expected)


def test_replay_refuses_what_it_cannot_replay(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="draft"):
        draft_matches(target, hfspec.make_draft(target, "lookup"), torch.tensor([[1, 2, 3]]), 8)
    with pytest.raises(ValueError, match="draft"):
        draft_matches(target, target, torch.tensor([[1, 2, 3]]), 8)  # the target itself, as generate refuses
    target.generation_config.repetition_penalty = 1.3  # a processor the replay does not apply: refused by name
    try:
        with pytest.raises(ValueError, match="generation_config.repetition_penalty"):
            draft_matches(target, draft, torch.tensor([[1, 2, 3]]), 8)
    finally:
        target.generation_config.repetition_penalty = 1.0
    with pytest.raises(ValueError, match="new_tokens"):
        draft_matches(target, target, torch.tensor([[1, 2, 3]]), 0)
