"""The loop's extension points: a draft is handed the target's runner before the first round, and `decode`
runs on one DecodeJob."""

from __future__ import annotations

import torch
from tiny_models import build
from transformers import StoppingCriteriaList

from hfspec.decoding.gamma import FixedGamma
from hfspec.decoding.loop import DecodeJob, decode
from hfspec.decoding.scoring import Scorer
from hfspec.decoding.stopping import Stopper
from hfspec.drafts.base import NoDraft
from hfspec.kernels.kv_model import CachedModel


class WatchingDraft(NoDraft):
    """Proposes nothing; remembers the runner it was attached to and what it held then."""

    runner = None

    def attach(self, target_runner) -> None:
        self.runner = target_runner
        self.cached_then = target_runner.cached


def test_a_draft_is_attached_to_the_targets_runner_before_the_first_round():
    target = build("llama")
    prompt = torch.tensor([[0, 5, 6, 7]])
    draft = WatchingDraft()
    job = DecodeJob(scorer=Scorer(None, False, target.config.vocab_size),
                    stopper=Stopper(StoppingCriteriaList(), 1, prompt.shape[1] + 6),
                    policy=FixedGamma(0), pad_token_id=2)
    out = decode(target, draft, prompt, None, job)
    assert isinstance(draft.runner, CachedModel) and draft.runner.model is target
    assert draft.cached_then == 0 and draft.runner.cached > 0  # attached before the target saw anything
    expected = target.generate(prompt, do_sample=False, max_new_tokens=6, eos_token_id=1)
    assert torch.equal(out.sequences, expected)
