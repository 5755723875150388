"""A compiled draft's token-tree level (`hfspec.kernels.compiled_tree`): compiled on the first tree run, it gives the
eager lean level's logits at every width (one node padded to two, across a cache growth), keeps the cache the eager
level keeps, decodes the target's greedy text, and falls back to the eager level, saying why, when it cannot
compile. One inductor folder per module (the `own_cache` fixture, tests/conftest.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_models import build, sharpen

import hfspec
from hfspec.decoding import priors
from hfspec.decoding.tree_forward import _lean_forward
from hfspec.decoding.tree_shape import TreeShape
from hfspec.drafts import make_draft
from hfspec.kernels import compiled, compiled_tree
from hfspec.kernels.lean_cache import CACHE_CHUNK


def _level_mask(start: int, parents: list[int]) -> torch.Tensor:
    """[W, start + W]: every node sees the `start` cached slots, itself and its parent among the level's nodes
    (−1: none), as a level of a tree whose ancestors were decoded into the cached slots."""
    width = len(parents)
    allowed = torch.zeros(width, start + width, dtype=torch.bool)
    allowed[:, :start] = True
    for i, parent in enumerate(parents):
        allowed[i, start + i] = True
        if parent >= 0:
            allowed[i, start + parent] = True
    return allowed


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got - want).abs().max() <= 2 ** -6 * max(1.0, float(want.abs().max()))


def test_a_compiled_tree_level_gives_the_eager_levels_logits_and_cache(own_cache):
    target = sharpen(build("llama", seed=4, init=0.1), 6.0)
    draft = make_draft(target, "rtn4-compiled")
    level = draft.compiled_step.tree_level
    assert level.path == "not compiled yet" and level.fn is None  # chain runs never compile it
    assert level.prepare() == "compiled" and level.fn is not None
    generator = torch.Generator().manual_seed(3)
    for prompt, parents in ((9, [-1]), (9, [-1, 0, 0]), (CACHE_CHUNK - 2, [-1, -1, 0, 1, 2])):
        ids = torch.randint(3, 96, (1, prompt + len(parents)), generator=generator)
        width = len(parents)
        positions = prompt + torch.tensor([1 if p < 0 else 2 for p in parents])
        allowed = _level_mask(prompt, parents)
        logits, caches = [], []
        for compiled_level in (True, False):
            cache = draft.hfspec_new_cache()
            draft.logits(ids[:, :prompt], None, None, cache, 1)
            with torch.no_grad():
                if compiled_level:
                    logits.append(level.level(ids[:, prompt:], positions, allowed, cache))
                else:
                    logits.append(_lean_forward(draft, cache, ids[:, prompt:], positions[None], allowed))
            assert cache.length == prompt + width
            caches.append(cache)
        assert logits[0].shape == (1, width, draft.vocab)
        _close(logits[0], logits[1])
        for got, want in zip(caches[0].keys, caches[1].keys, strict=True):
            assert torch.allclose(got[:, :, : prompt + width], want[:, :, : prompt + width], atol=1e-3)
        # negative control: nodes that see their parents differ from nodes that do not (not every node need:
        # the sharpened model's attention may put no weight at all on a parent)
        if width > 1:
            cache = draft.hfspec_new_cache()
            draft.logits(ids[:, :prompt], None, None, cache, 1)
            alone = _level_mask(prompt, [-1] * width)
            with torch.no_grad():
                other = level.level(ids[:, prompt:], positions, alone, cache)
            assert (other - logits[0]).abs().max() > 1e-2


def test_a_tree_run_grows_its_levels_through_the_compiled_level_and_keeps_the_greedy_text(own_cache):
    target = build("llama", seed=6, init=0.2)
    draft = make_draft(target, "rtn4-compiled")
    level = draft.compiled_step.tree_level
    widths = []
    real = level.level

    def spy(ids, *args):
        widths.append(ids.shape[1])
        return real(ids, *args)

    level.level = spy
    ids = torch.tensor([[0, 5, 9, 17]])
    kw = dict(temperature=0.0, max_new_tokens=40, min_new_tokens=40)
    out = hfspec.generate(target, ids, draft, tree=TreeShape(12, 4, 3, 3), **kw)
    assert torch.equal(out.sequences, hfspec.plain_generate(target, ids, **kw).sequences)
    assert level.path == "compiled" and widths and max(widths) > 1
    assert out.stats.time_total < level.seconds  # compiled on this first tree run, before its clock started
    assert out.stats.draft_forwards >= len(widths)


def test_a_tree_level_that_cannot_compile_keeps_the_eager_level(own_cache, monkeypatch):
    checked = compiled.CompiledStep._checked

    def broken(self, name, *args):
        if name == "level":
            raise RuntimeError("no tree levels today")
        return checked(self, name, *args)

    monkeypatch.setattr(compiled.CompiledStep, "_checked", broken)
    target = build("llama", seed=6, init=0.2)
    draft = make_draft(target, "rtn4-compiled")
    ids = torch.tensor([[0, 5, 9, 17]])
    kw = dict(temperature=0.0, max_new_tokens=24, min_new_tokens=24)
    with pytest.warns(RuntimeWarning, match="no tree levels today"):
        out = hfspec.generate(target, ids, draft, tree=TreeShape(12, 4, 3, 3), **kw)
    level = draft.compiled_step.tree_level
    assert level.fn is None and level.path.startswith("eager (compile failed: ") and "no tree levels" in level.path
    assert draft.compiled_step.fn is not None  # the one-token step stands
    assert torch.equal(out.sequences, hfspec.plain_generate(target, ids, **kw).sequences)


def test_a_tree_level_whose_first_compile_fails_is_compiled_again_without_the_caches(own_cache, monkeypatch):
    """A compile killed midway can leave a truncated artefact that breaks loading it: the second try bypasses
    inductor's caches (and succeeds); the warning path is not taken."""
    checked = compiled.CompiledStep._checked
    patches = []

    def once_broken(self, name, args, patch):
        if name == "level":
            patches.append(patch)
            if len(patches) == 1:
                raise RuntimeError("truncated artefact")
        return checked(self, name, args, patch)

    monkeypatch.setattr(compiled.CompiledStep, "_checked", once_broken)
    target = build("llama", seed=6, init=0.2)
    level = make_draft(target, "rtn4-compiled").compiled_step.tree_level
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert level.prepare() == "compiled"
    assert len(patches) == 2 and not patches[0].get("force_disable_caches") and patches[1]["force_disable_caches"]


def test_auto_prices_a_level_by_what_runs_it(own_cache, monkeypatch):
    """tree="auto" takes a level's prior from the draft it has: a compiled step with its compiled level, or an
    eager draft (before, a compiled step was never seen there: every draft was priced as an eager one)."""
    from hfspec.decoding import trees

    asked = []
    real = trees.tree_level_prior
    monkeypatch.setattr(trees, "tree_level_prior", lambda *a: asked.append(a) or real(*a))
    target = build("llama", seed=6, init=0.2)
    ids = torch.tensor([[0, 5, 9, 17]])
    for spec in ("rtn4-compiled", "rtn4"):
        hfspec.generate(target, ids, make_draft(target, spec), tree="auto", temperature=1.0, seed=1, max_new_tokens=8)
    assert asked == [(True, True), (False, False)]
    assert real(True, True) == priors.TREE_LEVEL_PRIOR["compiled"] < real(True, False)
    assert real(True, False) == priors.TREE_LEVEL_PRIOR["eager over compiled"]
    assert real(False) == priors.TREE_LEVEL_PRIOR["eager"]
    assert compiled_tree.LEVEL_MAX >= trees.AutoShape(timed=False, c_prior=0.2).limits.width
