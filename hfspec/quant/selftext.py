"""Text a model writes itself, for calibrating its drafts: `self_samples` draws it at temperature 1 from the model's
BOS, seeded, without touching the caller's random state; `GumbelMax` is the draw (no data set is downloaded)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList


def bos_id(model: nn.Module) -> int:
    for config in (getattr(model, "generation_config", None), model.config):
        token = getattr(config, "bos_token_id", None) if config is not None else None
        if isinstance(token, list | tuple):
            token = token[0] if token else None
        if token is not None:
            return int(token)
    return 0


@torch.no_grad()
def self_samples(model: nn.Module, sequences: int, tokens: int, seed: int) -> torch.Tensor:
    """[sequences, 1 + tokens]: texts the model writes from its BOS at temperature 1 (full length, seeded).

    Each token is argmax(logits + g), g i.i.d. Gumbel(0, 1) from a generator of its own (`GumbelMax`): a draw from
    softmax(logits), the model's own law, with the caller's random state untouched. Not `generate(do_sample=True)`:
    its CPU draw (`exponential_`) took 94 ms a step over SmolLM2's 49k tokens × 64 texts, a fifth of writing the
    calibration text, and uniforms turned into Gumbel noise take about a fifth of that."""
    device = next(model.parameters()).device
    start = torch.full((sequences, 1), bos_id(model), dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(int(seed))
    return model.generate(start, do_sample=False, logits_processor=LogitsProcessorList([GumbelMax(generator)]),
                          max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=bos_id(model),
                          attention_mask=torch.ones_like(start))


class GumbelMax(LogitsProcessor):
    """Greedy decoding turned into sampling at temperature 1: the scores plus Gumbel(0, 1) noise from `generator`
    (Gumbel-max: the argmax is distributed as softmax(scores)). Tokens the processors before it set to −inf stay so."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        u = torch.rand(scores.shape, generator=self.generator, device=scores.device, dtype=torch.float32)
        return u.clamp_(min=torch.finfo(torch.float32).tiny).log_().neg_().log_().neg_().add_(scores)  # + Gumbel
