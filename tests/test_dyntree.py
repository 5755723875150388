"""Token trees (`hfspec.decoding.trees`): the recursive rule over children drawn without replacement keeps the target's law
(exact enumeration over a two-level tree, with wrong-rule controls that must fail), samples through the loop match
the target's law (chi-square, with a wrong-tree control), greedy output is the target's on four families, both
caches hold the accepted path, seeded "auto" does not depend on timing, and what cannot run a tree is refused."""

import itertools
import random
import time

import laws
import pytest
import torch
from tiny_models import build, build_family, perturbed
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

import hfspec
import hfspec.decoding.trees as dyntree
from hfspec.decoding.gamma import FixedGamma
from hfspec.decoding.loop import DecodeJob, Run, commit, decode, settle
from hfspec.decoding.sampling import children_chances, residual
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.stopping import Stopper
from hfspec.decoding.tree_forward import feed_token_tree, keep_cached
from hfspec.decoding.trees import (
    AutoShape,
    DynamicTree,
    TreeShape,
    dynamic_round,
)
from hfspec.drafts.base import as_draft
from hfspec.errors import HfspecError
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.slots import Slots

IDS = torch.tensor([[0, 5, 17, 33, 9]])


# ---- exact enumeration: a two-level tree on a vocabulary of 4 ------------------------------------------------

def _dist(g, v=4, zeros=()):
    t = torch.rand(v, generator=g, dtype=torch.float64) + 0.05
    t[list(zeros)] = 0
    return t / t.sum()


def _tables(seed):
    """p and q for the root context and for every one-token context (some zeros, as top-k leaves)."""
    g = torch.Generator().manual_seed(seed)
    p = {(): _dist(g)} | {(a,): _dist(g, zeros=[(a + 1) % 4]) for a in range(4)}
    q = {(): _dist(g, zeros=[3])} | {(a,): _dist(g) for a in range(4)}
    return p, q


def without_replacement(q, k):
    """[(probability, ordered children)] of k sequential draws from q without replacement (fewer if q runs out)."""
    support = [t for t in range(q.shape[0]) if q[t] > 0]
    out = []
    for seq in itertools.permutations(support, min(k, len(support))):
        prob, left = 1.0, 1.0
        for y in seq:
            prob *= float(q[y]) / left
            left -= float(q[y])
        out.append((prob, seq))
    return out


def top_k_fixed(q, k):
    """A wrong tree at T > 0: the k most probable tokens, always."""
    return [(1.0, tuple(torch.argsort(q, descending=True)[:k].tolist()))]


def drop_unlikely(q, k):
    """A wrong tree at T > 0: draw k without replacement, then keep only children whose own q is large (the
    decision looks at the children themselves)."""
    return [(prob, tuple(c for c in seq if float(q[c]) >= 0.2) or seq[:1]) for prob, seq in without_replacement(q, k)]


def node_law(p, q, draws, then):
    """Law over (token, rest) at one node: children from `draws`, tried by `children_chances`; `then(token,
    accepted)` gives the law of what follows the token (a dict)."""
    law = {}
    for prob, seq in draws:
        chances, rest = children_chances(p, q, torch.tensor(seq, dtype=torch.long))
        reach = prob
        for c, chance in zip(seq, chances, strict=True):
            for tail, w in then(c, True).items():
                law[(c, *tail)] = law.get((c, *tail), 0.0) + reach * chance * w
            reach *= 1 - chance
        for t in range(p.shape[0]):
            if rest[t] > 0:
                for tail, w in then(t, False).items():
                    law[(t, *tail)] = law.get((t, *tail), 0.0) + reach * float(rest[t]) * w
    return law


def tree_law(p, q, k1, k2, draw=without_replacement):
    """Law of the first two tokens of a round whose tree gives the root k1 children and each child c k2(c)
    children (the count may depend on c itself: it is decided before c's children are drawn)."""

    def after_root(c, accepted):
        if not accepted:  # the round ended at the root: the next token is the target's, next round
            return {(t,): float(p[(c,)][t]) for t in range(4)}
        return node_law(p[(c,)], q[(c,)], draw(q[(c,)], k2(c)), lambda t, _: {(): 1.0})

    return node_law(p[()], q[()], draw(q[()], k1), after_root)


def target_law(p):
    return {(a, b): float(p[()][a] * p[(a,)][b]) for a in range(4) for b in range(4)}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k1, k2", [(1, 1), (2, 1), (2, 3), (3, 2), (4, 4)])
def test_recursive_rule_over_a_two_level_tree_keeps_the_target_law_exactly(seed, k1, k2):
    p, q = _tables(seed)
    law = tree_law(p, q, k1, lambda c: k2 if c % 2 else max(1, k2 - 1))
    want = target_law(p)
    assert set(law) <= set(want)
    for cell, w in want.items():
        assert law.get(cell, 0.0) == pytest.approx(w, abs=1e-12)


@pytest.mark.parametrize("wrong", [top_k_fixed, drop_unlikely])
def test_negative_control_children_not_drawn_without_replacement_break_the_law(wrong):
    p, q = _tables(0)
    law = tree_law(p, q, 2, lambda c: 2, draw=wrong)
    want = target_law(p)
    assert max(abs(law.get(cell, 0.0) - w) for cell, w in want.items()) > 1e-3


def test_negative_control_rejected_child_left_in_q_breaks_the_law(monkeypatch):
    import hfspec.decoding.sampling as sampling

    monkeypatch.setattr(sampling, "without", lambda q, token: q)
    p, q = _tables(0)
    law = tree_law(p, q, 3, lambda c: 2)
    assert max(abs(law.get(cell, 0.0) - w) for cell, w in target_law(p).items()) > 1e-3


# ---- T > 0 through the decoding loop: chi-square against the target's law ---------------------------------

V, NEW, RUNS = 8, 3, 2500
SHAPE = TreeShape(nodes=8, depth=3, branch=3, width=3)


@pytest.fixture(scope="module")
def pair():
    target = build("llama", vocab=V, layers=1, seed=0, init=0.6, hidden=16)
    draft = build("llama", vocab=V, layers=1, seed=5, init=0.6, hidden=16)
    return target, draft


def sample_runs(target, draft, prompt, seed, temperature=1.0, top_k=None, runs=RUNS):
    processors = [lp.MinNewTokensLengthLogitsProcessor(len(prompt), NEW, laws.EOS),
                  lp.TemperatureLogitsWarper(temperature)]
    if top_k:
        processors.append(lp.TopKLogitsWarper(top_k))
    scorer = Scorer(LogitsProcessorList(processors), True, V)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt])
    out, deep, side = torch.empty(runs, NEW, dtype=torch.long), 0, 0
    for k in range(runs):
        job = DecodeJob(scorer=scorer, stopper=Stopper(None, None, len(prompt) + NEW), policy=FixedGamma(2),
                        pad_token_id=2, generator=generator, verifier=DynamicTree(SHAPE))
        with torch.no_grad():
            result = decode(target, as_draft(draft), ids, None, job)
        out[k] = result.sequences[0, len(prompt):]
        deep += result.stats.accepted_length_hist[2:].count(0) < len(result.stats.accepted_length_hist[2:])
        side += result.stats.tree_kept
    return out, deep, side


SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=5)]


@pytest.mark.slow
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_token_tree_samples_match_target_law(pair, settings):
    target, draft = pair
    prompt = [0, 3]
    samples, deep, side = sample_runs(target, draft, prompt, seed=11, **settings)
    assert deep > 0.05 * RUNS and side > 0.05 * RUNS, "paths of 2+ nodes and non-first children must be kept"
    law = laws.exact_law(target, prompt, V, NEW, **settings)
    assert laws.p_value(samples, law, V, NEW) > 1e-3


@pytest.mark.slow
def test_negative_control_top_k_children_at_t1_fail_chi_square(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(dyntree, "draw_without_replacement", lambda q, k, generator=None: torch.topk(q, k).indices)
    prompt = [0, 3]
    samples, _, _ = sample_runs(target, draft, prompt, seed=11)
    assert laws.p_value(samples, laws.exact_law(target, prompt, V, NEW), V, NEW) < 1e-6


def test_negative_control_wrong_residual_fails_chi_square_quickly(pair, monkeypatch):
    """A short run (not slow): a tree verified without subtracting q must already be far off the target's law."""
    import hfspec.decoding.sampling as sampling

    target, draft = pair
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    prompt = [0, 3]
    samples, _, _ = sample_runs(target, draft, prompt, seed=3, runs=800)
    assert laws.p_value(samples, laws.exact_law(target, prompt, V, NEW), V, NEW) < 1e-6
    monkeypatch.setattr(sampling, "residual", residual)


# ---- greedy identity, caches ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gpt_neox"])
def test_greedy_identity_with_token_trees(arch):
    target = build(arch, init=0.2)
    draft = perturbed(target, scale=0.3)
    expected = target.generate(IDS, do_sample=False, max_new_tokens=80, min_new_tokens=80)
    for tree in (TreeShape(16, 5, 3, 4), "auto"):
        out = hfspec.generate(target, IDS, draft=draft, temperature=0, max_new_tokens=80, min_new_tokens=80,
                              tree=tree)
        assert torch.equal(out.sequences, expected), tree
        assert out.stats.tree_leaves > 0


def test_greedy_identity_with_a_quantised_lean_draft():
    target = build_family("llama", init=0.2)
    draft = hfspec.make_draft(target, "rtn4")
    expected = target.generate(IDS, do_sample=False, max_new_tokens=60, min_new_tokens=60)
    out = hfspec.generate(target, IDS, draft=draft, temperature=0, max_new_tokens=60, min_new_tokens=60,
                          tree=TreeShape(12, 4, 3, 3))
    assert torch.equal(out.sequences, expected)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tree_pass_equals_fresh_forwards_and_cache_keeps_the_path(arch):
    """Every node's logits equal a full forward of the text it follows; after keeping a path (through a
    non-first child), the next step from the cache equals a full forward (HF runner, and the lean runner for
    the Llama draft side)."""
    from hfspec.kernels.lean import LeanDecoder, LeanRunner

    model = build(arch, init=0.2)
    runners = [CachedModel(model)] + ([LeanRunner(LeanDecoder(model, bits=None))] if arch == "llama" else [])
    prompt = [0, 5, 17, 33, 9]
    # tree: 40 -> (41 -> 43, 44), 42 -> 45 ; parents index nodes (−1: the root)
    tokens, parents, depths = [40, 41, 42, 43, 44, 45], [-1, 0, -1, 1, 1, 2], [1, 2, 1, 3, 3, 2]
    texts = [[40], [40, 41], [42], [40, 41, 43], [40, 41, 44], [42, 45]]

    def full(ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1]

    for runner in runners:
        slots = Slots(torch.tensor([prompt[:-1]]), None)
        runner.feed(slots.tokens, slots.positions, slots.valid, slots.size, 1, True)  # prefill all but the last
        slots = Slots(torch.tensor([prompt]), None)
        start = slots.size
        with torch.no_grad():
            logits = feed_token_tree(runner, slots.tokens, slots.positions, start, tokens, parents, depths)
        assert torch.allclose(logits[0, 0], full(prompt), atol=1e-4)
        for k, text in enumerate(texts):
            assert torch.allclose(logits[0, 1 + k], full(prompt + text), atol=1e-4), (type(runner), k)
        keep_cached(runner, list(range(start)) + [start + 0, start + 1, start + 4])  # path 40, 41, 44
        accepted = prompt + [40, 41, 44]
        after = Slots(torch.tensor([accepted + [7]]), None)
        step = runner.feed(after.tokens, after.positions, after.valid, after.size, 1, True)
        assert torch.allclose(step[0, 0], full(accepted + [7]), atol=1e-4)


@pytest.mark.parametrize("sample", [False, True])
def test_after_every_round_slots_and_both_caches_hold_the_accepted_text(sample):
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.3)
    processors = LogitsProcessorList([lp.TemperatureLogitsWarper(1.0)] if sample else [])
    job = DecodeJob(scorer=Scorer(processors, sample, target.config.vocab_size),
                    stopper=Stopper(None, None, IDS.shape[1] + 60), policy=FixedGamma(3), pad_token_id=2,
                    generator=torch.Generator().manual_seed(0), verifier=DynamicTree(TreeShape(12, 4, 3, 3)))
    deep = 0
    with torch.no_grad():
        run = Run(target, as_draft(draft), IDS, None, job)
        while run.active:
            run.meter.begin(1)
            proposal, verdict = dynamic_round(run, job.verifier)
            deep += int(verdict.n[0]) >= 2
            done = commit(run, proposal, verdict)
            settle(run, proposal, verdict, done)
            run.meter.end(proposal.gamma, sum(done.accepted))
            if not run.active:
                break
            history = run.history(0)
            assert torch.equal(run.slots.tokens[0], history)
            for runner, model in ((run.target, target), (run.draft.runner, draft)):
                cached = runner.cached
                assert cached <= history.shape[0] - 1
                step = runner.feed(run.slots.tokens, run.slots.positions, run.slots.valid, run.slots.size, 1, True)
                fresh = model(history[None]).logits[0, -1]
                assert torch.allclose(step[0, 0], fresh, atol=1e-4)
                runner.rollback(cached)
    assert deep > 0


# ---- auto: costs decide, a seed freezes them ---------------------------------------------------------------

def test_auto_falls_back_to_a_chain_when_verify_positions_are_expensive_and_branches_when_cheap(monkeypatch):
    """Seeded tree "auto" with a verify pass whose positions cost `slope` target steps each (the tree's shape and
    the chain-or-tree choice both priced so, not by the measured CPU curve): at 5 a round grows about one node a
    level, at 0 it branches."""
    from hfspec.decoding import tree_choice

    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.6)
    counts = {}
    for slope in (5.0, 0.0):
        monkeypatch.setattr(tree_choice, "verify_prior", lambda n, device, dtype, slope=slope: 1.0 + slope * (n - 1))
        shape = AutoShape(timed=False, c_prior=0.05)
        shape.slope_prior = slope
        job = DecodeJob(scorer=Scorer(LogitsProcessorList([lp.TemperatureLogitsWarper(1.0)]), True, 96),
                        stopper=Stopper(None, None, IDS.shape[1] + 60), policy=FixedGamma(3), pad_token_id=2,
                        generator=torch.Generator().manual_seed(0), verifier=DynamicTree(shape))
        with torch.no_grad():
            stats = decode(target, as_draft(draft), IDS, None, job).stats
        counts[slope] = stats.tree_leaves / stats.target_passes
    assert counts[0.0] > 2 * counts[5.0]
    assert counts[5.0] <= 2.0  # a chain-like tree: about one node per level


def test_seeded_auto_tree_gives_one_text_whatever_the_clock(monkeypatch):
    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.6)
    real = time.perf_counter
    outs = []
    for clock_seed in (0, 1, 2):
        rng = random.Random(clock_seed)
        monkeypatch.setattr(time, "perf_counter", lambda rng=rng: real() + rng.random() * 10)
        outs.append(hfspec.generate(target, IDS, draft=draft, tree="auto", temperature=1.0, seed=5,
                                    max_new_tokens=40, min_new_tokens=40).sequences)
    monkeypatch.setattr(time, "perf_counter", real)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    other = hfspec.generate(target, IDS, draft=draft, tree="auto", temperature=1.0, seed=6, max_new_tokens=40,
                            min_new_tokens=40).sequences
    assert not torch.equal(outs[0], other)


# ---- the round's tree, as data for live displays ----------------------------------------------------------

def _well_formed(tree, committed: list[int]) -> None:
    """Parents precede children, depths follow parents, the path is a chain down from the root, and the path's
    tokens then the final token are what the round committed (cut where a stop cut it)."""
    n = len(tree.tokens)
    assert len(tree.parents) == len(tree.depths) == n  # 0 where no node was worth its cost
    for k, (parent, depth) in enumerate(zip(tree.parents, tree.depths, strict=True)):
        assert -1 <= parent < k and depth == (1 if parent < 0 else tree.depths[parent] + 1)
    assert [tree.parents[k] for k in tree.path] == [-1, *tree.path][:len(tree.path)]
    assert tree.kind in ("bonus", "resampled")
    assert ([tree.tokens[k] for k in tree.path] + [tree.token])[:len(committed)] == committed


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_round_and_the_last_live_snapshot_carry_the_tree_it_grew(temperature):
    from hfspec.live import IncrementalDecoder, LiveRecorder

    target = build("llama", init=0.2)
    draft = perturbed(target, scale=0.3)  # close enough that some greedy rounds keep a path (rounds may be chains)
    snapshots, events = [], []
    recorder = LiveRecorder(IncrementalDecoder(None, IDS[0].tolist()), snapshots.append)

    def on_round(event):
        events.append(event)
        recorder(event)

    out = hfspec.generate(target, IDS, draft=draft, tree="auto", temperature=temperature, seed=3,
                          max_new_tokens=40, min_new_tokens=40, on_round=on_round)
    assert len(events) == len(snapshots) == out.stats.target_passes
    for event in events:
        _well_formed(event.tree, event.new_tokens[0])
    assert any(len(e.tree.path) > 0 for e in events) and any(len(e.tree.tokens) > len(e.tree.path) for e in events)
    last = snapshots[-1]
    assert last.tree is not None and last.tree.tokens == events[-1].tree.tokens
    _well_formed(last.tree, events[-1].new_tokens[0])
    assert last.committed == len(events[-1].new_tokens[0]) <= len(last.tree.path) + 1
    assert last.tree.texts == tuple(str(t) for t in last.tree.tokens) and last.tree.token_text == str(last.tree.token)
    chain = []
    hfspec.generate(target, IDS, draft=draft, temperature=temperature, seed=3, max_new_tokens=8, on_round=chain.append)
    assert chain and all(e.tree is None for e in chain)  # a chain has no tree


# ---- refusals ---------------------------------------------------------------------------------------------

def test_what_cannot_run_a_token_tree_is_refused_by_name_before_any_model_runs(monkeypatch):
    target = build("llama")
    draft = perturbed(target, scale=0.5)
    calls = []
    monkeypatch.setattr(type(target), "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(HfspecError, match="tree.*batch"):
        hfspec.generate(target, IDS.repeat(2, 1), draft=draft, tree="auto", max_new_tokens=4)
    for bad in ("wide", "AUTO ", 3.5):
        with pytest.raises(HfspecError, match="tree"):
            hfspec.generate(target, IDS, draft=draft, tree=bad, max_new_tokens=4)
    with pytest.raises(HfspecError, match="tree.nodes"):
        TreeShape(nodes=0)
    with pytest.raises(HfspecError, match="tree.*plain"):
        hfspec.plain_generate(target, IDS, tree="auto", max_new_tokens=4)
    assert not calls
    sliding = build_family("gemma2")
    with pytest.raises(HfspecError, match="tree.*sliding"):
        hfspec.generate(sliding, IDS, draft=perturbed(sliding, 0.5), tree="auto", max_new_tokens=4)


def test_prompt_lookup_draft_is_refused_by_name():
    from hfspec.drafts.lookup import LookupDraft

    target = build("llama")
    job = DecodeJob(scorer=Scorer(LogitsProcessorList(), False, 96), stopper=Stopper(None, None, 20),
                    policy=FixedGamma(3), pad_token_id=2, verifier=DynamicTree(TreeShape()))
    with pytest.raises(HfspecError, match="tree"):
        decode(target, LookupDraft(), IDS, None, job)


def test_settings_and_cli_take_auto():
    from hfspec.cli import _tree_arg
    from hfspec.session import RunSettings

    assert _tree_arg("auto") == "auto" and _tree_arg("3") == 3
    settings = RunSettings(target="x", draft="rtn4", prompt="hi", tree="auto")
    assert settings.generate_kwargs()["tree"] == "auto"
    with pytest.raises(HfspecError, match="tree"):
        RunSettings(target="x", draft="rtn4", prompt="hi", tree="wide").validated()
