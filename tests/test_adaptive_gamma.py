"""γ = "auto": chosen from live α and c before each round, so exactness is untouched."""

import random
import time
from pathlib import Path

import pytest
import torch
from test_distribution import exact_law, p_value, run
from test_distribution import pair as distribution_pair  # noqa: F401  (fixture)
from tiny_models import build, perturbed

import hfspec
from hfspec.decoding.costmodel import Acceptance, CostModel, best_gamma
from hfspec.decoding.costrecord import CostRecord, RoundSeconds
from hfspec.decoding.gamma import AdaptiveGamma


def test_greedy_identity_with_auto_gamma():
    target = build("qwen2", init=0.2)
    draft = perturbed(target, scale=0.5)
    ids = torch.tensor([[0, 5, 17, 33]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=120, min_new_tokens=120)
    out = hfspec.generate(target, ids, draft=draft, gamma="auto", temperature=0, max_new_tokens=120,
                          min_new_tokens=120)
    assert torch.equal(out.sequences, expected)
    assert out.stats.gamma == "auto"
    assert len(out.stats.gamma_per_round) == out.stats.target_passes
    assert len(set(out.stats.gamma_per_round)) > 1, "γ should move with the live estimates"


@pytest.mark.slow
def test_distribution_with_auto_gamma(distribution_pair):  # noqa: F811
    target, draft = distribution_pair
    prompt = [0, 3, 5]
    (samples,), stats = run(target, draft, [prompt], gamma="auto", seed=21, temperature=1.0)
    assert p_value(samples, exact_law(target, prompt, temperature=1.0)) > 1e-3


def feed(policy, alpha_true, c, rounds=60, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        g = policy.next()
        kept = (torch.rand(g, generator=gen) < alpha_true).long().cumprod(0)
        n = int(kept.sum())
        policy.update(g, n, min(n + 1, g), c * 1.0, 1.0)
    return policy


@pytest.mark.parametrize("alpha, c, lo, hi", [(0.9, 0.05, 6, 16), (0.6, 0.3, 1, 2), (0.7, 0.15, 2, 5)])
def test_policy_converges_to_the_formula_optimum(alpha, c, lo, hi):
    policy = feed(AdaptiveGamma(gamma_max=16, c_prior=c), alpha, c)
    assert abs(policy.alpha - alpha) < 0.2
    assert lo <= policy.next() <= hi
    assert hfspec.optimal_gamma(alpha, c) in range(lo, hi + 1)


def test_optimal_gamma_is_the_argmax_of_the_formula():
    for alpha in (0.2, 0.5, 0.8, 0.95):
        for c in (0.01, 0.1, 0.5):
            best = hfspec.optimal_gamma(alpha, c, 16)
            values = [hfspec.paper_speedup(alpha, g, c) for g in range(1, 17)]
            assert values[best - 1] == max(values)


def test_policy_falls_back_to_plain_decoding_when_drafting_cannot_pay():
    policy = feed(AdaptiveGamma(gamma_max=16, c_prior=2.0), alpha_true=0.9, c=2.0, rounds=40)
    chosen = []
    for _ in range(32):
        g = policy.next()
        chosen.append(g)
        policy.update(g, g, g, 2.0, 1.0)
    assert chosen.count(0) >= 24 and 1 in chosen, "mostly plain rounds, with periodic γ = 1 probes"


def test_auto_with_a_costly_draft_is_still_exact_and_labels_plain_tokens():
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.5)
    ids = torch.tensor([[0, 5, 17, 33]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=60, min_new_tokens=60)
    out = hfspec.generate(target, ids, draft=draft, gamma="auto", temperature=0, max_new_tokens=60,
                          min_new_tokens=60)
    assert torch.equal(out.sequences, expected)
    rounds = out.stats.gamma_per_round
    if 0 in rounds:
        assert "target" in out.token_kinds[0]


def test_first_clean_measurement_replaces_the_prior():
    """A lean draft's bytes ratio can be far from its time ratio: the prior must not linger."""
    policy = AdaptiveGamma(c_prior=0.95)
    policy.update(4, 4, 4, 0.5, 1.0)  # round 1 includes the prompt: not a clean measurement
    assert policy.c == 0.95
    policy.update(4, 4, 4, 0.2, 1.0)
    assert policy.c == pytest.approx(0.2)
    assert policy.next() >= 2  # with α high and c = 0.2, speculation pays


# ------------------------------------------------------------------ robust to timing noise (issue 30, item 1)
def lockstep(alpha, c, slow=(), slow_target=(), rounds=80, costs=False, seed=0, **kw):
    """A live policy fed timings with 10x outliers (draft and time outside forwards slow in `slow` rounds, the
    target in `slow_target`) beside a twin fed the same rounds without them; (noisy γ, twin's γ) per round.
    Seconds: a draft step c, a verify pass 1 + 0.05 per position, 0.02 outside forwards."""
    gen = torch.Generator().manual_seed(seed)
    noisy, twin = (AdaptiveGamma(gamma_max=16, c_prior=c, costs=CostRecord() if costs else None, **kw)
                   for _ in range(2))
    chosen = []
    for r in range(rounds):
        g = noisy.next()
        chosen.append((g, twin.next()))
        n = int((torch.rand(g, generator=gen) < alpha).long().cumprod(0).sum())
        for policy, f, ft in ((noisy, 10.0 if r in slow else 1.0, 10.0 if r in slow_target else 1.0),
                              (twin, 1.0, 1.0)):
            target = (1.0 + 0.05 * (g + 1)) * ft
            policy.update(g, n, min(n + 1, g), c * f, target)  # the loop's order: update, then the record
            if policy.costs is not None:
                policy.costs.record(g, g + 1, 1, RoundSeconds(g * c * f, target, 0.02 * f), prefill=r == 0,
                                    accepted=n)
    return chosen


SLOW, SLOW_TARGET = (9, 10, 31, 52, 53), (40,)


@pytest.mark.parametrize("costs", [False, True], ids=["formula", "cost-model"])
def test_a_few_slow_passes_do_not_move_gamma(costs):
    """α 0.94, a cheap draft, five 10x slow draft rounds and one slow target pass: never plain decoding, and
    every round's γ within 1 of what the same rounds without the outliers give."""
    chosen = lockstep(0.94, 0.16, SLOW, SLOW_TARGET, costs=costs)
    noisy = [g for g, _ in chosen]
    assert 0 not in noisy, noisy
    assert all(abs(g - t) <= 1 for g, t in chosen), chosen
    assert min(noisy[20:]) >= 3, "α 0.94 and c 0.16: speculation pays well"


@pytest.mark.parametrize("costs", [False, True], ids=["formula", "cost-model"])
def test_a_draft_as_slow_as_the_target_still_backs_off(costs):
    """Negative control: the same outliers, but every draft step costs a target pass: plain decoding (with its
    γ 1 probes) wins, and the robust policy must still find that out."""
    chosen = lockstep(0.94, 1.1, SLOW, SLOW_TARGET, costs=costs)
    later = [g for g, _ in chosen[30:]]
    assert later.count(0) >= 0.75 * len(later) and 1 in later, later


def test_plain_decoding_needs_several_clean_measurements():
    """One slow measurement (the only one so far) may lower γ but not stop drafting."""
    policy = AdaptiveGamma(gamma_max=16, c_prior=0.16)
    policy.update(4, 4, 4, 0.16, 1.0)  # round 1: the prompt
    policy.update(4, 4, 4, 1.6, 1.0)  # a 10x slow draft pass
    assert policy.c == pytest.approx(1.6)
    assert policy.next() >= 1


# ------------------------------------------------------------------ reproducible by seed (issue 30, item 2)
def test_frozen_policy_never_reads_timings():
    """Frozen (what a seed selects): the same rounds with any timings give the same γ sequence."""
    runs = []
    for noise in range(3):
        gen = torch.Generator().manual_seed(noise)
        policy, outcomes, chosen = AdaptiveGamma(c_prior=0.3, timed=False), torch.Generator().manual_seed(7), []
        for _ in range(60):
            g = policy.next()
            chosen.append(g)
            n = int((torch.rand(g, generator=outcomes) < 0.8).long().cumprod(0).sum())
            d, t = (float(v) for v in torch.rand(2, generator=gen) * 10)
            policy.update(g, n, min(n + 1, g), d, t)
        runs.append(chosen)
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) > 1, "γ still follows α"


def test_frozen_policy_decides_from_a_given_cost_model():
    """A profile fitted before the run (here: a verify pass far dearer than a step) decides, not c."""
    profile = CostModel(step=1.0, verify_a=1.0, verify_b=3.0, draft_a=0.0, draft_b=0.01, draft_zero=0.0,
                        other_a=0.0, other_b=0.0, plain_other=0.0)
    policy = AdaptiveGamma(c_prior=0.01, timed=False, profile=profile)
    for _ in range(10):
        policy.update(policy.next() or 1, 1, 1, 0.0, 0.0)
    assert policy.next() == 0  # every extra position costs 3 steps: never pays
    assert AdaptiveGamma(c_prior=0.01, timed=False).next() > 0


def test_seeded_prior_prices_the_verify_pass_by_dtype():
    """A seeded run's profile (`prior_model`) prices the verify pass by the target's dtype from a measured curve
    (`VERIFY_CURVE_PRIOR`): fp32's sgemm is dearest at 2–3 rows, so γ "auto" must not stop at γ 1–2 there; a
    straight line through the two narrowest passes would (the negative control). bf16's flat curve leaves the choice to
    α and c. The draft step's prior is the bytes ratio in fp32 and less than it in bf16."""
    from hfspec.decoding.priors import (
        VERIFY_CURVE_PRIOR,
        draft_step_prior,
        prior_model,
        verify_prior,
        verify_slope_prior,
    )

    for (n, t) in VERIFY_CURVE_PRIOR[("cpu", "float32")]:
        assert verify_prior(n, "cpu", "float32") == pytest.approx(t)  # through every measured point
    assert verify_prior(11, "cpu", "float32") == pytest.approx((1.58 + 1.72) / 2)  # linear between them
    assert verify_prior(3, "cuda", "float32") == pytest.approx(1 + 2 * verify_slope_prior("cuda", "float32"))
    alpha, c = Acceptance(0.82), 0.156
    curved = best_gamma(prior_model(c, "cpu", "float32"), alpha, 8)[0]
    s = verify_prior(2) - 1  # a straight line through the two narrowest passes, where sgemm is dearest
    line = CostModel(step=1.0, verify_a=1.0 - s, verify_b=s, draft_a=0.0, draft_b=c, draft_zero=0.0, other_a=0.0,
                     other_b=0.0, plain_other=0.0)
    assert curved >= 4 and best_gamma(line, alpha, 8)[0] <= 2
    assert draft_step_prior(0.3, "cpu", "float32") == 0.3
    assert draft_step_prior(0.3, "cpu", "bfloat16") < 0.3
    assert draft_step_prior(0.3, "cuda", "bfloat16") == 0.3



def test_seeded_gamma_follows_alpha_smoothly_in_bf16():
    """bf16's verify prior is a line up to 10 positions (its measured bumps lie inside their intervals), so a seeded
    γ "auto" rises with α a step at a time: between α 0.74 and 0.91 no 0.01 of α moves γ by more than 1, and γ 4
    and 5 are drafted on the way. Control: the measured points as they were (7 positions 1.15 below 6's 1.20) jump
    from γ 4 to γ 6 and never draft γ 5."""
    from hfspec.decoding import priors

    c = priors.draft_step_prior(0.312, "cpu", "bfloat16", "int4")  # gptq4-compiled on SmolLM2-135M

    def choices():
        model = priors.prior_model(c, "cpu", "bfloat16")
        return [best_gamma(model, Acceptance(a / 100), 12)[0] for a in range(74, 92)]

    smooth = choices()
    assert all(0 <= b - a <= 1 for a, b in zip(smooth, smooth[1:], strict=False)), smooth
    assert {4, 5} <= set(smooth)
    measured = ((1, 1.0), (2, 1.03), (3, 1.07), (4, 1.10), (5, 1.16), (6, 1.20), (7, 1.15), (8, 1.18), (9, 1.21),
                (10, 1.24), (16, 1.32), (24, 1.44), (32, 1.63))
    saved = priors.VERIFY_CURVE_PRIOR[("cpu", "bfloat16")]
    try:
        priors.VERIFY_CURVE_PRIOR[("cpu", "bfloat16")] = measured
        jumpy = choices()
    finally:
        priors.VERIFY_CURVE_PRIOR[("cpu", "bfloat16")] = saved
    assert max(b - a for a, b in zip(jumpy, jumpy[1:], strict=False)) >= 2 and 5 not in jumpy, jumpy

def test_seeded_gamma_through_the_bf16_kernel_follows_alpha_smoothly(monkeypatch):
    """Through the few-row kernel bf16's verify prior is the line its passes cost inside decoding, so between α 0.68
    and 0.90 no 0.02 of α moves a seeded γ "auto" by more than 1 and γ 3 and 4 are drafted on the way. Control: the
    points timed alone (3 positions 0.68, 4 positions 0.77) jump from γ 2 to γ 5 and never draft γ 3 or 4 there."""
    from hfspec.decoding import priors

    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx512")
    c = priors.draft_step_prior(0.312, "cpu", "bfloat16", "int4")  # gptq4-compiled on SmolLM2-135M

    def choices():
        model = priors.prior_model(c, "cpu", "bfloat16+rows")
        return [best_gamma(model, Acceptance(a / 100), 12)[0] for a in range(68, 92, 2)]

    smooth = choices()
    assert all(0 <= b - a <= 1 for a, b in zip(smooth, smooth[1:], strict=False)), smooth
    assert {3, 4} <= set(smooth)
    alone = ((1, 1.0), (2, 0.66), (3, 0.68), (4, 0.77), (5, 0.78), (6, 0.77), (8, 0.78), (12, 0.90), (16, 1.04),
             (24, 1.58), (32, 1.77))
    monkeypatch.setitem(priors.VERIFY_CURVE_PRIOR, ("cpu", "bfloat16+rows"), alone)
    jumpy = choices()
    assert max(b - a for a, b in zip(jumpy, jumpy[1:], strict=False)) >= 3 and not {3, 4} & set(jumpy), jumpy


def test_seeded_draft_step_prior_knows_the_drafts_kernel():
    """The draft step's prior is priced by the kernel holding most of its weights: a bf16 target's int4 step
    (gptq4-compiled: c 0.19–0.27 at bytes 0.312 on two days) is cheaper than its int8 one per byte. At α 0.85 the
    int4 price (its slope inside decoding, plus the round's intercept) drafts γ ≥ 6 at α 0.88 in bf16; the single
    per-dtype factor it replaced (0.85) drafts γ ≤ 5 there (the control; before the intercept it drafted γ 4, and
    with the measured verify points before they became a line γ 3 at α 0.85, where a fixed γ 5 ran 15 % faster)."""
    from hfspec.decoding.priors import DRAFT_STEP_PRIOR, draft_step_prior, prior_model

    c_bytes = 0.312
    int4 = draft_step_prior(c_bytes, "cpu", "bfloat16", "int4")
    assert int4 == pytest.approx(c_bytes * DRAFT_STEP_PRIOR[("cpu", "bfloat16")]["int4"])
    assert int4 < draft_step_prior(c_bytes, "cpu", "bfloat16", "int8")
    assert draft_step_prior(c_bytes, "cpu", "bfloat16", "bfloat16") == draft_step_prior(c_bytes, "cpu", "bfloat16")
    assert draft_step_prior(c_bytes, "cpu", "float32", "int4") == pytest.approx(0.74 * c_bytes)
    assert draft_step_prior(c_bytes, "cuda", "bfloat16", "int4") == c_bytes
    alpha = Acceptance(0.88)
    assert best_gamma(prior_model(int4, "cpu", "bfloat16"), alpha, 8)[0] >= 6
    assert best_gamma(prior_model(0.85 * c_bytes, "cpu", "bfloat16"), alpha, 8)[0] <= 5


def test_a_seeded_run_prices_its_draft_by_the_drafts_storage():
    from torch import nn

    from hfspec.api import _storage

    assert _storage(nn.Linear(4, 4)) == "float32"
    assert _storage(nn.Linear(4, 4).to(torch.bfloat16)) == "bfloat16"
    assert _storage("lookup") == ""


def noisy_clock(seed):
    """A time.perf_counter that advances by random amounts, with 10x spikes: a busy machine."""
    rng, now = random.Random(seed), [0.0]

    def clock():
        now[0] += rng.expovariate(1e3) * (10.0 if rng.random() < 0.1 else 1.0)
        return now[0]

    return clock


@pytest.mark.parametrize("arch, early_exit", [("qwen2", False), ("llama", True)])
def test_auto_gamma_text_depends_on_the_seed_not_on_timing(monkeypatch, arch, early_exit):
    """Three runs with seed 21 on three differently busy (random) clocks give one text; another seed another.
    The draft is priced at a tenth of the target's bytes so that γ ranges over several values. With the early
    exit too (a γ policy that also priced tokens from the run's timings)."""
    target = build(arch, init=0.2)
    draft = perturbed(target, scale=0.2)
    ids = torch.tensor([[0, 5, 17, 33]])
    monkeypatch.setattr(hfspec.api, "weight_bytes", lambda model: 0 if model is None else 10 if model is draft else 100)

    def generate(seed, clock_seed):
        with monkeypatch.context() as patch:
            patch.setattr(time, "perf_counter", noisy_clock(clock_seed))
            return hfspec.generate(target, ids, draft=draft, gamma="auto", temperature=1.0, max_new_tokens=60,
                                   min_new_tokens=60, seed=seed, early_exit=early_exit)

    runs = [generate(21, clock) for clock in (1, 2, 3)]
    assert all(torch.equal(r.sequences, runs[0].sequences) for r in runs)
    assert all(r.stats.gamma_per_round == runs[0].stats.gamma_per_round for r in runs)
    assert len(set(runs[0].stats.gamma_per_round)) > 2, "γ still moves with α"
    assert not torch.equal(generate(22, 1).sequences, runs[0].sequences), "another seed, another text"


@pytest.mark.parametrize("timed", [False, True])
def test_a_burst_of_rejections_does_not_stop_drafting_while_the_run_accepts(timed):
    """Greedy acceptance comes in bursts: after 20 rounds at α ≈ 0.85, six rounds with nothing accepted must not
    send a seeded (frozen) or live policy to plain decoding; a run whose whole α is low does stop (control)."""
    from hfspec.decoding.priors import prior_model

    def run(pattern):
        policy = AdaptiveGamma(c_prior=0.156, timed=timed, profile=prior_model(0.156, "cpu", "float32"))
        chosen = []
        for accepted_share in pattern:
            g = policy.next()
            chosen.append(g)
            n = round(g * accepted_share)
            policy.update(g, n, min(g, n + 1) if n < g else g, 0.156, 1.0)
        return chosen
    first = run([0.0] * 2 + [0.85] * 20)
    assert 0 not in first, first  # a rejected first round or two: no evidence yet
    dip = run([0.85] * 12 + [0.0] * 10 + [0.85] * 4)
    assert 0 not in dip, dip
    low = run([0.1] * 30)
    assert 0 in low, low


def test_the_drafts_fidelity_is_the_alpha_prior(monkeypatch):
    """γ "auto" starts its α estimate from the draft's measured fidelity (`make_draft` records it), worth
    `ALPHA_PRIOR_TOKENS` checked tokens, so one rejected first token does not take a good draft to γ 1. Control: the
    weak prior (α 0.5 worth 2 tokens, what a draft without a measured fidelity gets) drops to γ ≤ 1 on that round."""
    from hfspec import api
    from hfspec.attrs import FIDELITY, get_attr
    from hfspec.decoding import priors
    from hfspec.decoding.priors import prior_model
    from hfspec.decoding.stats import SpecStats
    from hfspec.errors import HfspecError
    from hfspec.io.loading import load_model

    # no round intercept: with one, γ 1 at α 0.33 no longer pays and THIN_ALPHA's guard, not the prior, keeps drafting
    monkeypatch.setattr(priors, "DRAFT_ROUND_PRIOR", {})
    c = 0.23
    kept = AdaptiveGamma(c_prior=c, timed=False, profile=prior_model(c, "cpu", "bfloat16"), alpha_prior=0.85)
    weak = AdaptiveGamma(c_prior=c, timed=False, profile=prior_model(c, "cpu", "bfloat16"))
    assert kept.alpha == pytest.approx(0.85) and weak.alpha == pytest.approx(0.5)
    for wrong in (0.0, 1.5, float("nan")):  # a prior that is not a fidelity is refused, not silently dropped
        with pytest.raises(HfspecError, match="alpha_prior"):
            AdaptiveGamma(alpha_prior=wrong)
    for policy in (kept, weak):
        policy.update(4, 0, 1, 0.0, 0.0)  # the first round: its first token rejected
    assert kept.next() >= 3 and weak.next() <= 1
    target = load_model(Path(__file__).resolve().parents[1] / "presets" / "models" / "micro", progress=False)
    draft = hfspec.make_draft(target, "rtn4")
    measured = get_attr(draft, FIDELITY)
    assert 0.5 < measured <= 1.0
    stats = SpecStats(target_dtype="float32")
    assert api._seeded_policy("auto", stats, draft=draft).alpha == pytest.approx(measured)
    assert api._policy("auto", stats, draft).alpha == pytest.approx(measured)
    assert api._seeded_policy("auto", stats, draft=target).alpha == pytest.approx(0.5)  # (no fidelity recorded)


def test_priors_follow_the_cpu_kind_and_avx2_bf16_drafts_short(monkeypatch):
    """An AVX2 CPU (no AVX-512, no bf16 instructions) has priors of its own: there a bf16 verify pass costs 0.44 of a
    step per position, so a seeded γ "auto" with an int8 draft (α 0.95) drafts at most γ 2 in bf16, where the
    AVX-512 priors (the control) draft γ ≥ 5. `HFSPEC_CPU_KIND` pins the kind; another value is refused by name."""
    from hfspec.decoding import priors
    from hfspec.errors import HfspecError

    def gamma_at(kind: str) -> int:
        monkeypatch.setenv("HFSPEC_CPU_KIND", kind)
        c = priors.draft_step_prior(0.5, "cpu", "bfloat16", "int8")
        return best_gamma(priors.prior_model(c, "cpu", "bfloat16"), Acceptance(0.95), 12)[0]

    assert gamma_at("avx2") <= 2 and gamma_at("avx512") >= 5
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx2")
    assert priors.cpu_kind() == "cpu-avx2"
    assert priors.verify_prior(5, "cpu", "bfloat16") == pytest.approx(2.77)
    assert priors.verify_prior(5, "cpu", "float32") == pytest.approx(1.70)
    assert priors.draft_step_prior(0.25, "cpu", "float32", "int8") == pytest.approx(0.25 * 1.13)
    assert priors.tree_row_prior("int8") == pytest.approx(0.19) and priors.tree_row_prior("int4") == pytest.approx(0.31)
    # a dtype without an AVX2 row takes the AVX-512 row (prepacked fp32 was not measured on AVX2)
    assert priors.verify_prior(5, "cpu", "float32+prepack") == pytest.approx(1.08)
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx512")
    assert priors.verify_prior(5, "cpu", "bfloat16") < 1.2 and priors.tree_row_prior("int8") == pytest.approx(0.23)
    monkeypatch.setenv("HFSPEC_CPU_KIND", "sse")
    with pytest.raises(HfspecError, match="HFSPEC_CPU_KIND: got 'sse'; allowed: avx512, avx2 or amx"):
        priors.cpu_kind()


def test_amx_priors_price_short_rounds_fully_and_bf16_steps_dear(monkeypatch):
    """An Intel AMX CPU has rows of its own: there MKL's fp32 sgemm over 3 rows costs 1.12 one-row steps in decoding
    and 4 rows 1.51, and a round's first draft call costs about one draft step more than the rest
    (`DRAFT_ROUND_PRIOR`). With that intercept a seeded γ "auto" with gptq4's AMX price in fp32 (α 0.877, greedy
    there) drafts γ 5, as the fastest fixed γ measured; without it (the control) the cheap 3-position pass made it
    draft γ 2, 7 % slower. bf16's flat verify pass lets it draft longer than fp32."""
    from hfspec.decoding import priors
    from hfspec.kernels import fast_linear

    monkeypatch.setenv("HFSPEC_CPU_KIND", "amx")
    assert priors.cpu_kind() == "cpu-amx"
    assert priors.verify_prior(3, "cpu", "float32") == pytest.approx(1.12)
    assert priors.verify_prior(4, "cpu", "float32") == pytest.approx(1.51)
    assert priors.verify_prior(16, "cpu", "bfloat16") == pytest.approx(1.18)
    c32 = priors.draft_step_prior(0.156, "cpu", "float32", "int4")
    assert c32 == pytest.approx(0.156 * 1.35)
    g32 = best_gamma(priors.prior_model(c32, "cpu", "float32"), Acceptance(0.877), 12)[0]
    c16 = priors.draft_step_prior(0.312, "cpu", "bfloat16", "int4")
    g16 = best_gamma(priors.prior_model(c16, "cpu", "bfloat16"), Acceptance(0.877), 12)[0]
    assert g32 == 5 and g16 > g32
    monkeypatch.setattr(priors, "DRAFT_ROUND_PRIOR", {})  # the control: no intercept
    assert best_gamma(priors.prior_model(c32, "cpu", "float32"), Acceptance(0.877), 12)[0] == 2
    monkeypatch.undo()
    monkeypatch.setenv("HFSPEC_CPU_KIND", "amx")
    assert priors.tree_row_prior("int4") == pytest.approx(0.36)
    assert fast_linear.min_rows() == 4
    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx512")  # the control: the EPYC rows
    assert priors.verify_prior(3, "cpu", "float32") == pytest.approx(1.91)
    assert priors.draft_step_prior(0.156, "cpu", "float32", "int4") == pytest.approx(0.156 * 0.74)
    assert fast_linear.min_rows() == 1


def test_the_cpu_kind_is_read_from_torchs_capability_and_amx_tiles(monkeypatch):
    """AVX2 dispatch gives "avx2" whatever else; AMX tiles on an AVX-512 CPU give "amx"; neither gives "avx512"
    (the control); a torch without the AMX probe, or one that raises, is taken as AVX-512."""
    from hfspec.kernels import cpu

    def kind(capability: str, amx) -> str:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        if amx is None:
            monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
        else:
            monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", amx, raising=False)
        cpu.detected_kind.cache_clear()
        try:
            return cpu.detected_kind()
        finally:
            cpu.detected_kind.cache_clear()

    def broken():
        raise RuntimeError("no cpuinfo")

    assert kind("AVX2", lambda: True) == "avx2"
    assert kind("AVX512", lambda: True) == "amx"
    assert kind("AVX512", lambda: False) == "avx512"
    assert kind("AVX512", None) == "avx512"
    assert kind("AVX512", broken) == "avx512"
    monkeypatch.delenv("HFSPEC_CPU_KIND", raising=False)
    monkeypatch.setattr(cpu, "detected_kind", lambda: "amx")
    assert cpu.cpu_kind() == "cpu-amx"


def test_acceptance_that_comes_in_runs_drafts_longer():
    """γ "auto" prices each draft position by its own acceptance given it was reached (`AdaptiveGamma.observe`):
    rounds of γ 3 that either reject their first token (30 %) or accept all three (a draft right for whole
    stretches) make long rounds worth more than one α (0.875 pooled) for every position says. Control: about the same
    pooled α with each position accepted independently chooses what the single-α policy chooses."""
    from hfspec.decoding.priors import prior_model

    def fed(rows):
        policy = AdaptiveGamma(c_prior=0.2, timed=False, profile=prior_model(0.2, "cpu", "bfloat16"),
                               alpha_prior=0.85)
        for accepted in rows:
            checked = 3 if accepted == 3 else accepted + 1
            policy.observe([accepted], [checked])
            policy.update(3, accepted, checked, 0.2, 1.0)
        single = best_gamma(policy.profile, Acceptance(policy.alpha), policy.gamma_max)[0]
        return policy, single

    bursty, single = fed([0, 3, 3, 0, 3, 3, 3, 0, 3, 3] * 6)
    assert bursty.alpha == pytest.approx(0.875, abs=0.02)
    assert bursty.acceptance(bursty.alpha)(1) < 0.8 < 0.95 < bursty.acceptance(bursty.alpha)(3)
    assert bursty.next() > single + 1, (bursty.next(), single)
    # independent: positions 1, 2 and 3 accepted 7 in 8, 6 in 7 and 5 in 6 times (0.86 pooled)
    control, single = fed([3, 3, 3, 3, 3, 0, 1, 2] * 8)
    assert 0.8 < control.alpha < 0.9
    assert abs(control.next() - single) <= 1, (control.next(), single)


def test_the_lean_targets_verify_passes_are_priced_by_their_own_curve_where_measured(monkeypatch):
    """"float32+lean" (the lean target through the native C step) takes its own curve on the AVX2 kind, where it was
    measured (a pass of 5 positions 0.42 of the HF forward's one-token step), and the few-row kernel's elsewhere;
    the control: neither is the plain fp32 curve."""
    from hfspec.decoding import priors

    monkeypatch.setenv("HFSPEC_CPU_KIND", "avx2")
    lean = [priors.verify_prior(n, "cpu", "float32+lean") for n in (1, 5, 16)]
    rows = [priors.verify_prior(n, "cpu", "float32+rows") for n in (1, 5, 16)]
    plain = [priors.verify_prior(n, "cpu", "float32") for n in (1, 5, 16)]
    assert lean[0] < 0.5 and lean[1] < 0.5 and lean != rows != plain
    # the AMX Xeon takes the AVX-512 kinds' lean curve (measured on the same Xeon with AMX hidden), not its "+rows"
    monkeypatch.setenv("HFSPEC_CPU_KIND", "amx")
    amx_lean = [priors.verify_prior(n, "cpu", "float32+lean") for n in (1, 5, 16)]
    assert amx_lean == [priors.VERIFY_CURVE_PRIOR[("cpu", "float32+lean")][i][1] for i in (0, 3, 6)]
    assert amx_lean != [priors.verify_prior(n, "cpu", "float32+rows") for n in (1, 5, 16)]
    # where no kind has a lean curve, the few-row kernel's
    monkeypatch.delitem(priors.VERIFY_CURVE_PRIOR, ("cpu", "float32+lean"))
    assert ([priors.verify_prior(n, "cpu", "float32+lean") for n in (1, 5, 16)]
            == [priors.verify_prior(n, "cpu", "float32+rows") for n in (1, 5, 16)]
            != [priors.verify_prior(n, "cpu", "float32") for n in (1, 5, 16)])
