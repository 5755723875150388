"""A sibling draft (an HF model of its own) runs hfspec's lean step of its float weights where its family allows:
the same logits as its HF forward, rebuilt when its weights change, the HF forward elsewhere."""

import pytest
import torch
from tiny_models import build_family

import hfspec
from hfspec.attrs import LEAN_STEP, set_attr
from hfspec.drafts.base import as_draft
from hfspec.kernels.kv_model import CachedModel
from hfspec.kernels.lean import LeanRunner, lean_step_of
from hfspec.kernels.slots import Slots

LEAN_FAMILIES = ["llama", "qwen2", "qwen3", "gemma", "gemma3", "phi3"]


def _logits_through(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the draft's runner over a prompt fed in two pieces (prefill, then one token at a time)."""
    runner = as_draft(model).runner
    slots = Slots(ids, torch.ones_like(ids))
    out = [runner.feed(slots.tokens, slots.positions, slots.valid, ids.shape[1] - 3, 1, slots.all_valid)]
    for end in range(ids.shape[1] - 3, ids.shape[1]):
        out.append(runner.feed(slots.tokens, slots.positions, slots.valid, end + 1, 1, slots.all_valid))
    return torch.cat([o[:, -1:] for o in out], dim=1), runner


@pytest.mark.parametrize("family", LEAN_FAMILIES)
def test_a_sibling_runs_the_lean_step_with_its_hf_logits(family):
    sibling = build_family(family, seed=3, init=0.2, layers=1)
    ids = torch.tensor([[0, 5, 17, 33, 9, 41, 7, 60]])
    got, runner = _logits_through(sibling, ids)
    assert isinstance(runner, LeanRunner)
    with torch.no_grad():
        full = sibling(ids).logits
    want = full[:, [ids.shape[1] - 4, ids.shape[1] - 3, ids.shape[1] - 2, ids.shape[1] - 1]]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_other_families_and_opt_out_keep_the_hf_forward():
    gpt2 = build_family("gpt2", seed=3, layers=1)
    assert lean_step_of(gpt2) is None and type(as_draft(gpt2).runner) is CachedModel
    llama = build_family("llama", seed=3, layers=1)
    set_attr(llama, LEAN_STEP, False)
    assert lean_step_of(llama) is None and type(as_draft(llama).runner) is CachedModel


def test_the_lean_step_is_built_once_and_rebuilt_when_the_weights_change():
    sibling = build_family("llama", seed=3, init=0.2, layers=1)
    first = lean_step_of(sibling)
    assert first is not None and lean_step_of(sibling) is first
    ids = torch.tensor([[0, 5, 17, 33, 9, 41, 7, 60]])
    with torch.no_grad():
        sibling.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # in place: same storage, new version
        want = sibling(ids).logits[:, -1]
    assert lean_step_of(sibling) is not first
    got, _ = _logits_through(sibling, ids)
    torch.testing.assert_close(got[:, -1], want, atol=2e-4, rtol=2e-4)


def test_greedy_with_a_lean_sibling_is_the_targets_greedy_text():
    target = build_family("llama", seed=0, init=0.2, layers=2)
    sibling = build_family("llama", seed=5, init=0.2, layers=1)
    ids = torch.tensor([[0, 5, 17, 33]])
    out = hfspec.generate(target, ids, draft=sibling, gamma=3, max_new_tokens=24)
    plain = target.generate(ids, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    assert torch.equal(out.sequences, plain[:, : out.sequences.shape[1]])
    assert out.stats.checked > out.stats.accepted > 0  # a real pair: some kept, some not
