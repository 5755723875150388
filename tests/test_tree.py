"""Tree speculation end to end: greedy text identical to `generate`, samples distributed as the target's own
(chi-square, with negative controls), and the target's cache holding exactly the accepted path."""

import laws
import pytest
import torch
from tiny_models import build, perturbed
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

import hfspec
import hfspec.decoding.sampling as sampling
import hfspec.decoding.siblings as tree_module
from hfspec.decoding.gamma import FixedGamma
from hfspec.decoding.loop import DecodeJob, decode
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.siblings import Tree, feed_tree
from hfspec.decoding.stopping import Stopper
from hfspec.drafts.base import as_draft
from hfspec.errors import HfspecError
from hfspec.kernels import cache as kv
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.slots import Slots

IDS = torch.tensor([[0, 5, 17, 33, 9]])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "opt"])
def test_greedy_identity_with_tree(arch):
    target = build(arch, init=0.2)
    draft = perturbed(target, scale=0.5)
    expected = target.generate(IDS, do_sample=False, max_new_tokens=120, min_new_tokens=120)
    chain = hfspec.generate(target, IDS, draft=draft, gamma=3, temperature=0, max_new_tokens=120, min_new_tokens=120)
    out = hfspec.generate(target, IDS, draft=draft, gamma=3, temperature=0, max_new_tokens=120, min_new_tokens=120,
                          tree=3)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tree_kept > 0, "a sibling must be kept sometimes for this test to mean anything"
    assert out.stats.target_passes <= chain.stats.target_passes
    assert chain.stats.tree_leaves == 0


def test_slots_hold_the_accepted_text_after_every_tree_round():
    """The loop's invariant with a tree: after settling, the slots hold exactly prompt + output (the draft catches
    up from them), including rounds that kept a sibling."""
    from transformers.generation import LogitsProcessorList as Processors

    from hfspec.decoding.loop import Run, commit, settle

    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.5)
    job = DecodeJob(scorer=Scorer(Processors(), False, target.config.vocab_size),
                    stopper=Stopper(None, None, IDS.shape[1] + 80), policy=FixedGamma(3), pad_token_id=2,
                    verifier=Tree(3, below=1.01, always=True))
    kept = 0
    with torch.no_grad():
        run = Run(target, as_draft(draft), IDS, None, job)
        while run.active:
            run.meter.begin(len(run.active))  # the loop's round timer (hfspec.decoding.costrecord), as decode drives it
            proposal, verdict = job.verifier.propose_and_verify(run)
            kept += verdict.from_leaf
            done = commit(run, proposal, verdict)
            settle(run, proposal, verdict, done)
            run.meter.end(proposal.gamma, sum(done.accepted))
            if run.active:
                assert torch.equal(run.slots.tokens[0], run.history(0))
    assert kept > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tree_pass_scores_each_leaf_as_a_fresh_forward_and_cache_keeps_the_accepted_path(arch):
    """Chain and leaf logits of one tree forward equal full forwards of the texts they follow; after keeping a
    leaf, the next step from the cache equals a full forward of prefix + accepted chain + leaf + next token."""
    torch.manual_seed(0)
    model = build(arch, init=0.2)
    runner = CachedModel(model)
    prompt = [0, 5, 17, 33, 9]
    chain = [40, 41, 42]
    leaves = [(0, 50), (1, 51), (1, 52), (2, 53)]
    slots = Slots(torch.tensor([prompt]), None)
    runner.feed(slots.tokens, slots.positions, slots.valid, len(prompt) - 1, 1, True)  # the prefill
    start = slots.size
    slots.append(torch.tensor([chain]))
    logits = feed_tree(runner, slots, start, len(chain), leaves)

    def full(ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1]

    for j in range(len(chain) + 1):
        assert torch.allclose(logits[0, j], full(prompt + chain[:j]), atol=1e-5)
    for i, (j, token) in enumerate(leaves):
        assert torch.allclose(logits[0, len(chain) + 1 + i], full(prompt + chain[:j] + [token]), atol=1e-5)
    # keep chain[:1] + leaf (1, 52): slots start, then the leaf's cache index
    kv.keep_positions(runner.cache, list(range(start + 1)) + [start + len(chain) + 2])
    runner.cached = start + 2
    accepted = prompt + chain[:1] + [52]
    after = Slots(torch.tensor([accepted + [7]]), None)
    step = runner.feed(after.tokens, after.positions, after.valid, after.size, 1, True)
    assert kv.seq_length(runner.cache) == len(accepted) + 1
    assert torch.allclose(step[0, 0], full(accepted + [7]), atol=1e-5)


def test_bad_tree_values_are_refused_before_any_model_runs():
    target = build("llama")
    draft = perturbed(target, scale=0.5)
    for bad in (-1, 9, 2.5, True):
        with pytest.raises(HfspecError, match="tree"):
            hfspec.generate(target, IDS, draft=draft, tree=bad, max_new_tokens=4)
    with pytest.raises(HfspecError, match="batch"):
        hfspec.generate(target, IDS.repeat(2, 1), draft=draft, tree=2, max_new_tokens=4)
    with pytest.raises(HfspecError, match="plain"):
        hfspec.plain_generate(target, IDS, tree=2, max_new_tokens=4)


# ---- T > 0: the first NEW tokens follow the target's exact law -------------------------------------------

V, NEW, RUNS = 8, 2, 2500


@pytest.fixture(scope="module")
def pair():
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16)
    draft = build("llama", vocab=V, layers=1, seed=5, init=0.6, hidden=16)
    return target, draft


def sample_runs(target, draft, prompt, seed, temperature=1.0, top_k=None, tree=3, runs=RUNS):
    """`runs` seeded tree decodes of NEW tokens straight through the loop (one generator for all, so the runs
    are independent draws); returns [runs, NEW] tokens and the pooled leaf counts."""
    processors = [lp.MinNewTokensLengthLogitsProcessor(len(prompt), NEW, laws.EOS),
                  lp.TemperatureLogitsWarper(temperature)]
    if top_k:
        processors.append(lp.TopKLogitsWarper(top_k))
    scorer = Scorer(LogitsProcessorList(processors), True, V)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt])
    out, leaves, kept = torch.empty(runs, NEW, dtype=torch.long), 0, 0
    for k in range(runs):
        job = DecodeJob(scorer=scorer, stopper=Stopper(None, None, len(prompt) + NEW), policy=FixedGamma(2),
                        pad_token_id=2, generator=generator, verifier=Tree(tree, below=1.01, always=True))
        with torch.no_grad():
            result = decode(target, as_draft(draft), ids, None, job)
        out[k] = result.sequences[0, len(prompt):]
        leaves, kept = leaves + result.stats.tree_leaves, kept + result.stats.tree_kept
    return out, leaves, kept


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5)]


@pytest.mark.slow
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_tree_samples_match_target_law(pair, settings):
    target, draft = pair
    prompt = [0, 3]
    samples, leaves, kept = sample_runs(target, draft, prompt, seed=11, **settings)
    assert leaves > 0 and 0.05 * RUNS < kept, "siblings must be kept often for this test to mean anything"
    law = laws.exact_law(target, prompt, V, NEW, **settings)
    assert laws.p_value(samples, law, V, NEW) > 1e-3


WRONG = {
    "rejected-token-left-in-q": ("without", lambda q, token: q),
    "sibling-always-kept": ("sibling_chances", lambda p, q, first, siblings: ([1.0] * len(siblings), p)),
}


@pytest.mark.slow
@pytest.mark.parametrize("rule", list(WRONG))
def test_negative_control_wrong_tree_rule_fails(pair, monkeypatch, rule):
    target, draft = pair
    name, wrong = WRONG[rule]
    monkeypatch.setattr(sampling, name, wrong)
    monkeypatch.setattr(tree_module, name, wrong, raising=False)
    prompt = [0, 3]
    samples, _, _ = sample_runs(target, draft, prompt, seed=11)
    assert laws.p_value(samples, laws.exact_law(target, prompt, V, NEW), V, NEW) < 1e-6


class _Runner:
    """The counters a `CachedModel` keeps, set by hand."""

    def __init__(self):
        self.seconds, self.positions_fed, self.forwards = 0.0, 0, 0

    def step(self, width: int, seconds: float):
        self.seconds, self.positions_fed, self.forwards = self.seconds + seconds, self.positions_fed + width, \
            self.forwards + 1


@pytest.mark.parametrize("per_position, pays", [(0.001, True), (0.05, False)])
def test_leaf_cost_fits_the_verify_slope_and_decides(per_position, pays):
    """Verify passes cost 0.02 s + b · width; half the leaves keep their sibling; 0.01 s per token. Leaves pay
    when 0.5 × 0.01 > b."""
    cost, runner = tree_module.LeafCost(), _Runner()
    for r in range(40):
        width = 5 if r % 2 else 9
        cost.observe_runner(runner, 0.0, 0)
        runner.step(width, 0.02 + per_position * width)
        cost.leaves, cost.kept = cost.leaves + 4, cost.kept + 2
        cost.seconds, cost.tokens = 1.0, 100
    assert cost.per_position() == pytest.approx(per_position, rel=1e-6)
    cost.rounds = 4 * cost.EXPLORE + 1  # not a warm-up or exploring round
    assert cost.pays() is pays


def test_the_run_report_shows_the_trees_leaves():
    from hfspec import report

    target = build("llama", init=0.2)
    draft = perturbed(target, scale=1.0)
    out = hfspec.generate(target, torch.tensor([[0, 5, 17, 33]]), draft=draft, gamma=3, temperature=1.0, seed=0,
                          max_new_tokens=40, tree=3)
    s = out.stats
    assert s.tree_leaves > 0
    line = next(row for row in report.stats_lines(s) if row.startswith("tree leaves"))
    assert f"{s.tree_leaves} scored, {s.tree_kept} siblings kept" in line
    chain = hfspec.generate(target, torch.tensor([[0, 5, 17, 33]]), draft=draft, gamma=3, max_new_tokens=8).stats
    assert not any(row.startswith("tree leaves") for row in report.stats_lines(chain))
