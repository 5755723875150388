"""The lean draft step: same function as the HF forward (float), as close as the HF-forward draft of the same
bits (quantised), exact decoding through it, and the families it refuses fall back to the HF forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_family, sharpen
from transformers import AutoModelForCausalLM

import hfspec
from hfspec.drafts import make_draft
from hfspec.kernels.lean import LeanDecoder, lean_reason

LEAN_FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3"]
MICRO = Path(__file__).resolve().parents[1] / "presets" / "models" / "micro"


def _target(family: str):
    return sharpen(build_family(family, init=0.1), 6.0)


def _ids(n: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def _overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over positions of Σ min(p, q)."""
    return float(torch.minimum(a.softmax(-1), b.softmax(-1)).sum(-1).mean())


def _hf_reference(target, spec: str):
    """The HF-forward RTN draft with the lean draft's input embedding (the target's own table, which a lean draft
    reads rows from instead of holding a quantised copy)."""
    hf = make_draft(target, spec, lean=False)
    hf.model.embed_tokens = target.model.embed_tokens
    return hf


@pytest.mark.parametrize("family", LEAN_FAMILIES)
def test_float_lean_step_computes_the_hf_forward(family):
    target = _target(family)
    assert lean_reason(target) is None
    ids = _ids()
    with torch.no_grad():
        ref = target(ids).logits
    got = LeanDecoder(target, bits=None)(ids).logits
    assert (got - ref).abs().max() <= 1e-4 * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("family", LEAN_FAMILIES)
def test_lean_rtn4_as_close_as_the_hf_forward_rtn4(family):
    target = _target(family)
    ids = _ids()
    lean = make_draft(target, "rtn4", head_top=0)  # the HF path quantises its head too
    hf = _hf_reference(target, "rtn4")
    assert isinstance(lean, LeanDecoder) and not isinstance(hf, LeanDecoder)
    with torch.no_grad():
        q_lean, q_hf, p = lean(ids).logits, hf(ids).logits, target(ids).logits
    assert _overlap(q_lean, q_hf) >= 0.95
    # a proposal as good as the HF-forward one (within noise); negative control: a random model of the same
    # family is clearly further from the target (0.1 less overlap, or 3 times the total variation)
    lean_p = _overlap(q_lean, p)
    assert lean_p >= _overlap(q_hf, p) - 0.02
    other = sharpen(build_family(family, init=0.1, seed=7), 6.0)
    with torch.no_grad():
        other_p = _overlap(other(ids).logits, p)
    assert other_p < lean_p - 0.1 or 1 - other_p >= 3 * (1 - lean_p)


@pytest.mark.parametrize("family", LEAN_FAMILIES)
def test_incremental_steps_and_rollback_match_one_pass(family):
    draft = LeanDecoder(_target(family), bits=4)
    ids = _ids(20)
    full = draft(ids).logits
    cache = draft.hfspec_new_cache()
    draft(ids[:, :12], cache=cache)
    draft(ids[:, 12:16], cache=cache)
    cache.crop(-3)  # forget slots 13..15, then feed them again one at a time
    steps = [draft(ids[:, i:i + 1], cache=cache).logits[:, -1] for i in range(13, 20)]
    assert torch.allclose(torch.stack(steps, 1), full[:, 13:20], atol=1e-4)


@pytest.mark.parametrize("family", LEAN_FAMILIES)
def test_greedy_output_equals_plain_with_the_lean_draft(family):
    target = _target(family)
    draft = make_draft(target, "rtn4")
    prompt = _ids(6, seed=3)
    spec = hfspec.generate(target, prompt, draft=draft, gamma=4, temperature=0, max_new_tokens=20)
    plain = hfspec.plain_generate(target, prompt, temperature=0, max_new_tokens=20)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.draft_forwards > 0


def test_batch_with_holes_is_exact():
    target = _target("llama")
    draft = make_draft(target, "rtn3")
    ids = torch.tensor([[2, 2, 5, 9, 11], [4, 8, 15, 16, 23]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    spec = hfspec.generate(target, ids, attention_mask=mask, draft=draft, gamma=3, temperature=0, max_new_tokens=16)
    for row in range(2):
        kept = ids[row][mask[row].bool()][None]
        plain = hfspec.plain_generate(target, kept, temperature=0, max_new_tokens=16)
        got = spec.sequences[row, ids.shape[1]:]
        want = plain.sequences[0, kept.shape[1]:]
        assert torch.equal(got[: want.shape[0]], want)


def test_micro_lean_rtn4_is_close():
    target = AutoModelForCausalLM.from_pretrained(MICRO, dtype=torch.float32).eval()
    ids = torch.randint(3, 2000, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        p = target(ids).logits
        assert _overlap(make_draft(target, "rtn4")(ids).logits, p) >= 0.85
        assert _overlap(make_draft(target, "rtn8")(ids).logits, p) >= 0.97


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_other_families_keep_the_hf_forward(family):
    target = build_family(family)
    assert lean_reason(target) is not None
    draft = make_draft(target, "rtn4")
    assert not isinstance(draft, LeanDecoder)
    with pytest.raises(hfspec.HfspecError, match="lean=True"):
        make_draft(target, "rtn4", lean=True)


def test_describe_names_the_step():
    target = _target("llama")
    assert "lean decode step" in hfspec.drafts.describe(make_draft(target, "rtn4"))["step"]
    assert hfspec.drafts.describe(make_draft(target, "rtn4", lean=False))["step"] == "Hugging Face forward"


def test_quant_describe_lists_every_lean_matrix():
    from hfspec.quant import describe

    target = _target("llama")
    rows = describe(make_draft(target, "rtn4"))
    assert len(rows) == 2 * 4 + 1  # per layer: fused QKV, O, fused gate/up, down; plus the head
    assert all(row["path"].startswith("lean: ") for row in rows)
