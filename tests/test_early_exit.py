"""Draft-side early exit (hfspec.decoding.early_exit): greedy text unchanged, the target's law unchanged (chi-square, with
a negative control that stops on the drawn token's own probability), costs and calibration as documented."""

import laws
import pytest
import torch
from test_distribution import V, exact_law, p_value, run
from test_distribution import pair as distribution_pair  # noqa: F401  (fixture)
from tiny_models import build, perturbed
from transformers import LogitsProcessorList
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

import hfspec
import hfspec.api
from hfspec.decoding.costmodel import CostRecord, RoundSeconds
from hfspec.decoding.early_exit import EarlyExit
from hfspec.decoding.gamma import FixedGamma
from hfspec.decoding.loop import DecodeJob, decode
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.stopping import Stopper
from hfspec.drafts import make_draft
from hfspec.drafts.base import as_draft
from hfspec.errors import HfspecError


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_identity_with_early_exit(arch):
    target = build(arch, init=0.2)
    draft = perturbed(target, scale=0.6)
    ids = torch.tensor([[0, 5, 17, 33]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=100, min_new_tokens=100)
    out = hfspec.generate(target, ids, draft=draft, gamma=8, early_exit=True, temperature=0, max_new_tokens=100,
                          min_new_tokens=100)
    assert torch.equal(out.sequences, expected)
    assert out.stats.gamma == "8+exit"


def test_greedy_identity_when_the_exit_stops_often():
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.6)
    ids = torch.tensor([[0, 5, 17, 33], [0, 9, 9, 4]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=60, min_new_tokens=60)
    policy = EarlyExit(FixedGamma(6), calibration=lambda m: m, token_costs=(0.3, 0.25))
    out = decode(target, as_draft(draft), ids, None,
                 DecodeJob(scorer=Scorer(None, False, 96), stopper=Stopper(None, 1, 64), policy=policy, pad_token_id=2))
    assert torch.equal(out.sequences, expected)
    rounds = out.stats.gamma_per_round
    assert policy.stopped_early > 0 and len(set(rounds)) > 1 and max(rounds) <= 6


def forced(c_propose: float, c_go_on: float, cls=EarlyExit):
    """An early exit active from the first round: g(m) = m and fixed costs in tokens."""
    return lambda policy, stats: cls(policy, stats.costs, calibration=lambda m: m, token_costs=(c_propose, c_go_on))


def test_batch_law_with_early_exit(distribution_pair, monkeypatch):  # noqa: F811
    target, draft = distribution_pair
    monkeypatch.setattr(hfspec.api, "with_early_exit", forced(0.3, 0.2))
    prompt = [0, 3]
    (samples,), stats = run(target, draft, [prompt], gamma=4, seed=11, temperature=1.0, early_exit=True)
    assert len(set(stats.gamma_per_round)) > 1 and max(stats.gamma_per_round) < 4, "the exit must cut rounds"
    assert p_value(samples, exact_law(target, prompt, temperature=1.0)) > 1e-3


class DrawnTokenExit(EarlyExit):
    """Wrong on purpose: stops on the probability of the token it drew, so a kept token is no longer a draw
    from q (the verification's ratio p/q is then wrong)."""

    def confidence(self, logits, x_j, q_j):
        return q_j.gather(-1, x_j[:, None])[:, 0].tolist()


RUNS = 2500


def single_runs(target, draft, prompt, exit_cls):
    """Two tokens from RUNS separate batch-1 runs (each round's exit decided by its one row)."""
    procs = LogitsProcessorList([MinNewTokensLengthLogitsProcessor(len(prompt), 2, 1)])
    ids = torch.tensor([prompt])
    out, gammas = [], []
    for seed in range(RUNS):
        policy = exit_cls(FixedGamma(3), CostRecord(), calibration=lambda m: m, token_costs=(0.3, 0.15))
        job = DecodeJob(scorer=Scorer(procs, True, V), stopper=Stopper(None, 1, len(prompt) + 2), policy=policy,
                        pad_token_id=2, generator=torch.Generator().manual_seed(seed))
        result = decode(target, as_draft(draft), ids, None, job)
        out.append(tuple(result.sequences[0, len(prompt):].tolist()))
        gammas += result.stats.gamma_per_round
    return out, gammas


def two_token_p_value(samples, law3) -> float:
    """χ² of the two-token outcomes against the first two tokens' marginal of the three-token law (`laws`)."""
    law = {}
    for cell, p in law3.items():
        law[cell[:2]] = law.get(cell[:2], 0.0) + p
    return laws.p_value(torch.tensor(samples), law, V, 2)


@pytest.mark.slow
def test_single_run_law_with_early_exit_and_the_drawn_token_control(distribution_pair):  # noqa: F811
    target, draft = distribution_pair
    prompt = [0, 3]
    law = exact_law(target, prompt, temperature=1.0)
    samples, gammas = single_runs(target, draft, prompt, EarlyExit)
    assert 0 in gammas and any(g > 0 for g in gammas), "the exit must both cut and keep proposals"
    assert two_token_p_value(samples, law) > 1e-3
    wrong, _ = single_runs(target, draft, prompt, DrawnTokenExit)
    assert two_token_p_value(wrong, law) < 1e-6


def test_costs_and_calibration_from_the_run():
    costs = CostRecord()
    for _ in range(5):  # verify 50 + 10 n ms, draft 5 ms a token, 1 ms outside forwards per round
        costs.record(4, 5, 1, RoundSeconds(0.020, 0.100, 0.001), prefill=False)
        costs.record(2, 3, 1, RoundSeconds(0.010, 0.080, 0.001), prefill=False)
    policy = EarlyExit(FixedGamma(4), costs)
    assert policy._token_costs() is None  # nothing observed yet: the full γ
    policy._confidence = [[0.95], [0.95], [0.15], [0.15]]
    policy.observe([2], [3])  # positions 0, 1 accepted at m 0.95; position 2 rejected at m 0.15
    assert policy.g(0.95) > policy.alpha > policy.g(0.15)
    propose_cost, go_on_cost = policy._token_costs()
    # a position costs the verify slope (10 ms), a draft step 5 ms more, both at the same rate (tokens / s)
    rate = propose_cost / 0.010
    assert go_on_cost == pytest.approx(rate * 0.015)
    tokens = (policy.alpha ** 5 - 1) / (policy.alpha - 1) + (policy.alpha ** 3 - 1) / (policy.alpha - 1)
    assert rate == pytest.approx(tokens / (0.121 + 0.091))


def test_early_exit_needs_a_model_draft_and_a_bool():
    target = build("llama", init=0.2)
    ids = torch.tensor([[0, 5, 17, 33, 5, 17]])
    with pytest.raises(HfspecError, match="early_exit"):
        hfspec.generate(target, ids, draft=make_draft(target, "lookup"), early_exit=True, max_new_tokens=4)
    with pytest.raises(HfspecError, match="early_exit"):
        hfspec.generate(target, ids, draft=perturbed(target, 0.1), early_exit="yes", max_new_tokens=4)
