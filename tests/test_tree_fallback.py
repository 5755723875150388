"""tree="auto" falls back to the chain where a tree does not pay (`hfspec.decoding.tree_choice`): with costs where no
tree can pay it runs exactly the chain's rounds (same text, same γ per round, same tokens per pass); with costs
where trees pay it grows them and keeps the target's greedy text; a seeded run's choices and text do not depend on
the clock; a timed run follows the faster path and probes the slower one ever more rarely."""

import random
import time

import pytest
import torch
from tiny_models import build, build_family, perturbed

import hfspec
import hfspec.decoding.priors as priors
import hfspec.decoding.tree_choice as tree_choice
from hfspec.decoding.tree_choice import ChainOrTree
from hfspec.decoding.tree_shape import AutoShape

IDS = torch.tensor([[0, 5, 17, 33, 9]])


@pytest.fixture(scope="module")
def pair():
    target = build("llama", init=0.2)
    return target, perturbed(target, scale=0.3)


def _run(pair, **kwargs):
    target, draft = pair
    return hfspec.generate(target, IDS, draft=draft, max_new_tokens=48, min_new_tokens=48, **kwargs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("gamma", [3, "auto"])
def test_where_no_tree_pays_auto_runs_the_chains_rounds(pair, monkeypatch, temperature, gamma):
    monkeypatch.setattr(tree_choice, "TREE_ROUND_PRIOR", 1e6)  # a tree round costs a million target passes
    chain = _run(pair, gamma=gamma, temperature=temperature, seed=4)
    auto = _run(pair, gamma=gamma, temperature=temperature, seed=4, tree="auto")
    assert torch.equal(auto.sequences, chain.sequences)
    s, c = auto.stats, chain.stats
    assert s.tree_rounds == 0 and s.chain_rounds == s.target_passes == c.target_passes
    assert s.gamma_per_round == c.gamma_per_round
    assert s.tokens_per_pass == c.tokens_per_pass and s.accepted == c.accepted and s.checked == c.checked
    assert s.tree_leaves == 0 and s.gamma == c.gamma


def test_where_trees_pay_auto_grows_them_and_keeps_the_greedy_text(pair, monkeypatch):
    monkeypatch.setattr(tree_choice, "TREE_ROUND_PRIOR", 0.0)
    monkeypatch.setitem(priors.TREE_LEVEL_PRIOR, "eager", 0.0)  # free tree levels
    monkeypatch.setitem(priors.TREE_LEVEL_PRIOR, "compiled", 0.0)
    target, _ = pair
    close = (target, perturbed(target, scale=0.05))  # a draft the target mostly agrees with
    expected = target.generate(IDS, do_sample=False, max_new_tokens=48, min_new_tokens=48)
    out = _run(close, gamma=1, temperature=0.0, seed=4, tree="auto")
    assert torch.equal(out.sequences, expected)
    s = out.stats
    assert s.tree_rounds > s.chain_rounds and s.tree_rounds + s.chain_rounds == s.target_passes
    assert s.tree_leaves > s.tree_rounds  # more than a one-node tree per round


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_seeded_choices_and_text_do_not_depend_on_the_clock(monkeypatch, temperature):
    target = build_family("llama", init=0.2)
    lean = (target, hfspec.make_draft(target, "rtn4"))  # its bytes ratio makes both kinds of round pay at times
    real = time.perf_counter
    runs = []
    for clock_seed in (0, 1, 2):
        rng = random.Random(clock_seed)
        monkeypatch.setattr(time, "perf_counter", lambda rng=rng: real() + rng.random() * 10)
        runs.append(_run(lean, gamma=3, temperature=temperature, seed=5, tree="auto"))
    monkeypatch.setattr(time, "perf_counter", real)
    first = runs[0]
    assert first.stats.tree_rounds > 0 and first.stats.chain_rounds > 0  # both kinds of round occur here
    for other in runs[1:]:
        assert torch.equal(other.sequences, first.sequences)
        assert (other.stats.tree_rounds, other.stats.chain_rounds) == (first.stats.tree_rounds,
                                                                        first.stats.chain_rounds)
        assert other.stats.gamma_per_round == first.stats.gamma_per_round


def test_chain_rounds_carry_a_one_branch_tree_for_live_displays(pair, monkeypatch):
    monkeypatch.setattr(tree_choice, "TREE_ROUND_PRIOR", 1e6)
    events = []
    _run(pair, gamma=3, temperature=1.0, seed=2, tree="auto", on_round=events.append)
    assert events and all(e.tree is not None and e.tree.chain for e in events)
    for e in events:
        tree = e.tree
        assert tree.parents == tuple(range(-1, len(tree.tokens) - 1)) and tree.path == tuple(range(e.accepted[0]))
        assert ([tree.tokens[k] for k in tree.path] + [tree.token])[:len(e.new_tokens[0])] == e.new_tokens[0]


@pytest.mark.parametrize("tree_faster", [False, True])
def test_timed_choice_follows_the_faster_path_and_probes_the_slower_ever_more_rarely(monkeypatch, tree_faster):
    clock = [0.0]
    monkeypatch.setattr(tree_choice.time, "perf_counter", lambda: clock[0])
    choice = ChainOrTree(AutoShape(timed=True, c_prior=0.2))
    # chain: 3 tokens a second; tree: 4 tokens in 2 s (slower) or 8 tokens in 2 s (faster)
    tokens, seconds = {False: 3, True: 8 if tree_faster else 4}, {False: 1.0, True: 2.0}
    picks = []
    for _ in range(200):
        tree = choice.use_tree(None)  # timed: the run is not read
        picks.append(tree)
        clock[0] += seconds[tree]
        choice.ran(tree, tokens[tree])
    slower = sum(p != tree_faster for p in picks[10:])
    assert slower <= 6  # probes at gaps 8, 16, 32, 64, 64, …
    assert picks[-1] == tree_faster or picks[-2] == tree_faster


def test_with_gamma_auto_a_tree_is_weighed_against_the_best_chain():
    shape = AutoShape(timed=False, c_prior=0.2)
    best = tree_choice.chain_rate(shape, 8, best=True)
    assert best == max(tree_choice.chain_rate(shape, g) for g in range(0, 9))
    dear = AutoShape(timed=False, c_prior=5.0)  # a draft step dearer than the target's: plain decoding is best
    assert tree_choice.chain_rate(dear, 8, best=True) == tree_choice.chain_rate(dear, 0) == 1.0


def _confident(shape: AutoShape) -> AutoShape:
    """A seeded shape whose acceptance model has seen, at every depth, 90 % of first children accepted and 30 % of
    second ones (an int8 draft at T = 1)."""
    for depth in range(1, 13):
        for i in range(40):
            shape._count(depth, 0, i % 10 != 0)
            shape._count(depth, 1, i % 10 < 3)
    return shape


def test_a_seeded_level_costs_more_with_each_node_where_the_draft_runs_packed_kernels():
    """A level of w nodes costs (1 + row × (w − 1)) one-node levels: with the int4 kernel's row prior the planned
    tree expands fewer nodes per level and is worth less per unit of cost than priced as one node a level
    (the int8-in-bf16 tree that lost to the chain); with row 0 the plan is the one-node-per-level pricing."""
    flat = _confident(AutoShape(timed=False, c_prior=0.3, dtype="bfloat16"))
    rowed = _confident(AutoShape(timed=False, c_prior=0.3, dtype="bfloat16"))
    rowed.row_factor = priors.tree_row_prior("int4")
    assert rowed.level_cost(8) == pytest.approx(flat.level_cost(1) * (1 + 0.33 * 7))
    assert flat.level_cost(8) == flat.level_cost(1)
    _, _, wide = tree_choice.plan(flat, 12)
    _, _, narrow = tree_choice.plan(rowed, 12)
    assert sum(wide) > sum(narrow), (wide, narrow)
    assert tree_choice.tree_rate(rowed, 12) < tree_choice.tree_rate(flat, 12)
    timed = AutoShape(timed=True, c_prior=0.3)
    timed.row_factor = 0.33  # timed: the measured level holds the run's usual widths
    assert timed.row_floor() == 0.0 and timed.level_cost(8) == timed.level_cost(1)


def test_draft_storage_names_what_holds_most_of_the_drafts_weights():
    from torch import nn

    from hfspec.decoding.trees import draft_storage
    from hfspec.kernels.lean_layers import LeanLinear
    from hfspec.quant import int8

    w = torch.randn(256, 512) * 0.02
    packed4 = nn.ModuleList([LeanLinear(w, None, 4, 32), LeanLinear(torch.randn(8, 64), None, None, 32)])
    packed8 = nn.ModuleList([LeanLinear(w, None, 8, int8.PER_CHANNEL)])
    dense = nn.ModuleList([LeanLinear(w.to(torch.bfloat16), None, None, 32)])
    assert packed4[0].int4 and packed8[0].int8, "the CPU kernels run here"
    assert (draft_storage(packed4), draft_storage(packed8), draft_storage(dense)) == ("int4", "int8", "bfloat16")
    assert draft_storage(build("llama")) == "float32"  # a Hugging Face draft: its parameters' dtype
