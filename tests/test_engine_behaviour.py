"""EOS, max_new_tokens, streamer order, seeds, cache accounting and bad input."""

import pytest
import torch
from tiny_models import Collect, build, perturbed

import hfspec
from hfspec.attrs import LEAN_STEP, set_attr
from hfspec.errors import HfspecError

PROMPT = torch.tensor([[0, 5, 17, 33]])


@pytest.fixture(scope="module")
def pair():
    target = build("llama", init=0.2)
    return target, perturbed(target, scale=0.5)


def greedy(target, **kwargs):
    return target.generate(PROMPT, do_sample=False, **kwargs)


def test_eos_stops_exactly_like_generate(pair):
    target, draft = pair
    free = greedy(target, max_new_tokens=60, min_new_tokens=60)[0, 4:].tolist()
    for k in (0, 3, 11, 25):
        eos = free[k]
        expected = greedy(target, max_new_tokens=60, eos_token_id=eos)
        out = hfspec.generate(target, PROMPT, draft=draft, gamma=8, temperature=0, max_new_tokens=60,
                              eos_token_id=eos)
        assert torch.equal(out.sequences, expected)
        assert out.sequences[0, -1].item() == eos and out.sequences.shape[1] == 4 + free.index(eos) + 1


def test_several_eos_ids(pair):
    target, draft = pair
    free = greedy(target, max_new_tokens=40, min_new_tokens=40)[0, 4:].tolist()
    eos = [free[20], free[7]]
    expected = greedy(target, max_new_tokens=40, eos_token_id=eos)
    out = hfspec.generate(target, PROMPT, draft=draft, gamma=5, temperature=0, max_new_tokens=40, eos_token_id=eos)
    assert torch.equal(out.sequences, expected)


@pytest.mark.parametrize("max_new", [1, 2, 5, 9, 17])
def test_never_more_than_max_new_tokens(pair, max_new):
    target, draft = pair
    expected = greedy(target, max_new_tokens=max_new, min_new_tokens=max_new)
    out = hfspec.generate(target, PROMPT, draft=draft, gamma=8, temperature=0, max_new_tokens=max_new,
                          min_new_tokens=max_new)
    assert torch.equal(out.sequences, expected)
    sampled = hfspec.generate(target, PROMPT, draft=draft, gamma=8, temperature=1, max_new_tokens=max_new, seed=0)
    assert sampled.sequences.shape[1] <= 4 + max_new


def test_streamer_receives_prompt_then_tokens_in_order(pair):
    target, draft = pair
    streamer = Collect()
    out = hfspec.generate(target, PROMPT, draft=draft, gamma=4, temperature=1, max_new_tokens=30, seed=3,
                          streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == PROMPT[0].tolist()
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    assert streamed == out.sequences[0, 4:].tolist()
    assert len(streamer.chunks) - 1 == out.stats.target_passes


def test_seed_makes_runs_reproducible(pair):
    target, draft = pair
    runs = [hfspec.generate(target, PROMPT, draft=draft, gamma=3, temperature=1.0, max_new_tokens=40, seed=s)
            for s in (7, 7, 8)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert not torch.equal(runs[0].sequences, runs[2].sequences)


class CountingForward(torch.nn.Module):
    """Wraps a model's forward to count the positions it is fed (independently of hfspec's own counters)."""

    def __init__(self, model):
        super().__init__()
        self.fed = 0
        self.calls = 0
        self._orig = model.forward

        def forward(*args, **kwargs):
            ids = kwargs["input_ids"]
            self.fed += ids.shape[1]
            self.calls += 1
            return self._orig(*args, **kwargs)

        model.forward = forward


@pytest.mark.parametrize("gamma", [2, 6])
def test_each_position_fed_about_once(gamma):
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.5)
    set_attr(draft, LEAN_STEP, False)  # count the draft's HF forwards (a Llama sibling would run the lean step)
    t_count, d_count = CountingForward(target), CountingForward(draft)
    out = hfspec.generate(target, PROMPT, draft=draft, gamma=gamma, temperature=1.0, max_new_tokens=120, seed=1,
                          min_new_tokens=120)
    stats = out.stats
    rounds, new, prompt = stats.target_passes, stats.new_tokens, PROMPT.shape[1]
    # the cost model's one-token timing passes after the run (none when two rounds were one position wide)
    assert t_count.calls == rounds + stats.costs.steps
    t_count.fed -= stats.costs.steps
    assert d_count.calls == stats.draft_forwards
    # Every kept position is fed once; rejected drafts are fed at most once more each round (≤ γ per round).
    assert prompt + new - 1 <= t_count.fed <= prompt + new + gamma * rounds
    assert prompt + new - 2 <= d_count.fed <= prompt + new + gamma * rounds
    rejected_fed = t_count.fed - (prompt + new - 1)
    assert rejected_fed <= stats.proposed - stats.accepted + rounds
    assert stats.positions_fed_target == t_count.fed


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(gamma=0), "gamma"),
        (dict(gamma=2.5), "gamma"),
        (dict(gamma="fast"), "gamma"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(max_new_tokens=5000), "max_new_tokens"),
    ],
)
def test_bad_input_names_the_field(pair, kwargs, field):
    target, draft = pair
    args = dict(draft=draft, gamma=4, max_new_tokens=5) | kwargs
    with pytest.raises(HfspecError, match=field):
        hfspec.generate(target, PROMPT, **args)


def test_bad_draft_and_shapes(pair):
    target, draft = pair
    other_vocab = build("llama", vocab=50)
    with pytest.raises(HfspecError, match="draft: vocabulary size 50"):
        hfspec.generate(target, PROMPT, draft=other_vocab, max_new_tokens=5)
    with pytest.raises(HfspecError, match="draft"):
        hfspec.generate(target, PROMPT, draft=None, max_new_tokens=5)
    with pytest.raises(HfspecError, match="input_ids"):
        hfspec.generate(target, PROMPT[0], draft=draft, max_new_tokens=5)
    with pytest.raises(HfspecError, match="right padding"):
        hfspec.generate(target, torch.tensor([[3, 4, 5], [3, 4, 5]]), attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
                        draft=draft, max_new_tokens=5)


def test_max_new_tokens_zero_returns_prompt(pair):
    target, draft = pair
    out = hfspec.generate(target, PROMPT, draft=draft, max_new_tokens=0)
    assert torch.equal(out.sequences, PROMPT) and out.stats.target_passes == 0


def test_stats_formulas_and_consistency(pair):
    target, draft = pair
    out = hfspec.generate(target, PROMPT, draft=draft, gamma=4, temperature=1.0, max_new_tokens=80, seed=2)
    s = out.stats
    assert s.checked == sum(s.checked_by_position) and s.accepted == sum(s.accepted_by_position)
    assert sum(s.accepted_length_hist) == s.target_passes
    assert s.new_tokens == out.sequences.shape[1] - 4
    assert s.c_bytes == pytest.approx(1.0)
    assert s.draft_bytes == s.target_bytes > 0
    assert hfspec.expected_tokens_per_pass(0.0, 4) == 1.0
    assert hfspec.expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    assert hfspec.paper_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)
    kinds = out.token_kinds[0]
    assert len(kinds) == s.new_tokens and kinds.count("accepted") <= s.accepted
    d = s.to_dict()
    for key in ("alpha", "tokens_per_pass", "c_bytes", "c_time", "expected_tokens_per_pass", "predicted_speedup"):
        assert key in d


def test_auto_gamma_keeps_proposing_when_lookup_finds_no_match_for_a_round(monkeypatch):
    """A round where prompt lookup has no match proposes nothing; that is not the policy choosing plain decoding,
    so the adaptive γ must not learn from it (learning would drop it to γ = 0, decoding plainly until a probe)."""
    import hfspec.api
    from hfspec.decoding.gamma import AdaptiveGamma

    class Spy(AdaptiveGamma):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.asked, self.told = [], []

        def next(self):
            self.asked.append(super().next())
            return self.asked[-1]

        def update(self, gamma, *rest):
            self.told.append((self.asked[-1], gamma))
            super().update(gamma, *rest)

    spies = []
    monkeypatch.setattr(hfspec.api, "_policy", lambda gamma, stats, *_: spies.append(Spy(c_prior=stats.c_bytes)) or spies[-1])
    target = build("llama", init=0.2)
    prompt = torch.tensor([[0] + [5, 6, 7, 8] * 6 + [9]])  # repetitive, but its last token never occurred before
    out = hfspec.generate(target, prompt, draft=hfspec.make_draft(target, "lookup"), gamma="auto", temperature=0,
                          max_new_tokens=40, min_new_tokens=40)
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40, min_new_tokens=40)
    assert torch.equal(out.sequences, expected)
    assert [pair for pair in spies[0].told if pair[0] > 0 and pair[1] == 0] == []
    rounds = out.stats.gamma_per_round
    assert rounds[0] == 0 and out.stats.accepted > 20, "the first round has no match; later rounds copy"
    # γ is timed, so where the rounds end varies: a last round with room for one token proposes nothing
    start = next(i for i, g in enumerate(rounds) if g)
    assert 0 not in rounds[start:-1], f"it must keep proposing once matches exist: {rounds}"


def test_one_constant_bounds_auto_gamma():
    import inspect

    from hfspec.decoding.gamma import AdaptiveGamma
    from hfspec.decoding.stats import optimal_gamma
    from hfspec.validate import AUTO_GAMMA_MAX, GAMMA_MAX

    assert AdaptiveGamma().gamma_max == AUTO_GAMMA_MAX <= GAMMA_MAX
    assert inspect.signature(optimal_gamma).parameters["gamma_max"].default == AUTO_GAMMA_MAX
    assert optimal_gamma(0.999, 0.0) == AUTO_GAMMA_MAX  # free drafts that are always accepted: the cap binds


def test_a_round_the_length_budget_cuts_to_no_draft_is_not_taught_to_the_gamma_policy(monkeypatch):
    """When one token is left, the loop runs a plain round whatever γ the policy chose; the policy must not learn
    it as its own choice of plain decoding (a timed γ "auto" then counted it as a plain round: CI saw γ 16 told 0).
    Lengths are swept so that some runs end on such a round (checked, so the test cannot pass vacuously)."""
    import hfspec.api
    from hfspec.decoding.gamma import FixedGamma

    class Spy(FixedGamma):
        def __init__(self, gamma):
            super().__init__(gamma)
            self.told = []

        def update(self, gamma, *rest):
            self.told.append(gamma)

    spies = []
    monkeypatch.setattr(hfspec.api, "_policy", lambda gamma, stats, *_: spies.append(Spy(4)) or spies[-1])
    target = build("llama", init=0.2)
    draft = hfspec.make_draft(target, "rtn8")  # (close to the target: most rounds keep all four)
    prompt = torch.tensor([[0, 5, 17, 33]])
    capped = 0
    for tokens in range(6, 16):
        out = hfspec.generate(target, prompt, draft=draft, gamma=4, temperature=0, max_new_tokens=tokens,
                              min_new_tokens=tokens)
        capped += out.stats.gamma_per_round[-1] == 0
        assert 0 not in spies[-1].told, (tokens, out.stats.gamma_per_round, spies[-1].told)
    assert capped > 0, "no run ended on a round the budget cut to plain decoding"
