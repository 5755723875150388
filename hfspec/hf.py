"""Hugging Face drop-in: a `custom_generate` callable and `hfspec.generate` around it.

`target.generate(ids, custom_generate=speculative_generate, draft_model=draft, gamma=4, ...)` lets transformers
prepare everything (generation config, logits processors, stopping criteria, streamer), then runs our loop.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfspec import validate
from hfspec.decoding import decode
from hfspec.drafts.base import NoDraft, as_draft
from hfspec.gamma import AdaptiveGamma, FixedGamma
from hfspec.options import check_generate_kwargs, check_speculative_options
from hfspec.scoring import Scorer
from hfspec.stats import SpecStats
from hfspec.stopping import Stopper


@dataclass
class SpeculativeOutput(GenerateDecoderOnlyOutput):
    """`generate`'s output plus `stats` (SpecStats) and `token_kinds` (per row: accepted/resampled/bonus)."""

    stats: SpecStats | None = None
    token_kinds: list[list[str]] | None = None


def speculative_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    draft_model=None,
    gamma: int | str = 4,
    seed: int | None = None,
    on_round=None,
    should_stop=None,
    plain: bool = False,
    stop_strings: str | list[str] | None = None,
    **model_kwargs,
):
    """The decoding loop transformers calls after its input preparation (pass as `custom_generate=`)."""
    stopping_criteria = check_speculative_options(model, draft_model, input_ids, generation_config, stopping_criteria,
                                                  streamer, seed, stop_strings)
    if not plain:
        validate.check_gamma(gamma)
        if draft_model is None:
            raise validate.bad_value("draft_model", None, "a draft model (hfspec.make_draft(target, 'rtn4'), or a sibling)")
    draft_vocab = validate.check_pair(model, draft_model) if not plain else None
    if input_ids.shape[0] > 1 and not validate.accepts_positions(model, draft_model):
        raise validate.bad_value("input_ids", tuple(input_ids.shape), "batch size 1 for models without position_ids")
    streamer = streamer if streamer is not None else _streamer_given_to_generate()
    generator = None
    if seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(int(seed))
    stats = SpecStats(target_bytes=weight_bytes(model), draft_bytes=weight_bytes(draft_model) if not plain else 0)
    pad = generation_config._pad_token_tensor
    eos = generation_config._eos_token_tensor
    pad_id = int(pad.flatten()[0]) if pad is not None else (int(eos.flatten()[0]) if eos is not None else 0)
    result = decode(
        model,
        NoDraft() if plain else as_draft(draft_model, vocab=draft_vocab),
        input_ids,
        model_kwargs.get("attention_mask"),
        scorer=Scorer(logits_processor, bool(generation_config.do_sample), validate.vocab_size(model)),
        stopper=Stopper(stopping_criteria, eos, generation_config.max_length),
        policy=_policy(gamma, stats) if not plain else FixedGamma(0),
        pad_token_id=pad_id,
        generator=generator,
        streamer=streamer,
        on_round=on_round,
        should_stop=should_stop,
        stats=stats,
    )
    if generation_config.return_dict_in_generate:
        return SpeculativeOutput(sequences=result.sequences, stats=result.stats, token_kinds=result.kinds)
    return result.sequences


def generate(
    target,
    input_ids: torch.LongTensor,
    draft=None,
    gamma: int | str = 4,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    attention_mask: torch.Tensor | None = None,
    on_round=None,
    should_stop=None,
    **generation_kwargs,
) -> SpeculativeOutput:
    """Speculative decoding of `target` with `draft`; returns `.sequences`, `.stats` and `.token_kinds`.

    temperature 0 means greedy (the target's greedy text, token for token); > 0 samples exactly from the
    target's distribution. Other keyword arguments go to `target.generate` (e.g. `eos_token_id`, `min_p`,
    `repetition_penalty`, `stopping_criteria`, `streamer`, `logits_processor`).
    """
    generation_kwargs = check_generate_kwargs(input_ids, temperature, seed, generation_kwargs)
    validate.check_gamma(gamma)
    return _run(target, input_ids, draft, gamma, temperature, top_k, top_p, max_new_tokens, seed, attention_mask,
                on_round, should_stop, generation_kwargs, plain=False)


def plain_generate(
    target,
    input_ids: torch.LongTensor,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    attention_mask: torch.Tensor | None = None,
    on_round=None,
    should_stop=None,
    **generation_kwargs,
) -> SpeculativeOutput:
    """The baseline: one target pass per token through the same loop (same sampling, same statistics)."""
    generation_kwargs = check_generate_kwargs(input_ids, temperature, seed, generation_kwargs)
    return _run(target, input_ids, None, 1, temperature, top_k, top_p, max_new_tokens, seed, attention_mask,
                on_round, should_stop, generation_kwargs, plain=True)


def _run(target, input_ids, draft, gamma, temperature, top_k, top_p, max_new_tokens, seed, attention_mask,
         on_round, should_stop, generation_kwargs, plain):
    validate.check_sampling(temperature, top_k, top_p, generation_kwargs.get("min_p"), max_new_tokens)
    validate.check_input_ids(input_ids, attention_mask)
    if not plain:
        if draft is None:
            raise validate.bad_value("draft", None, "a draft model (hfspec.make_draft(target, 'rtn4'), or a sibling)")
        validate.check_pair(target, draft)
    validate.check_length(target, input_ids.shape[1], max_new_tokens)
    kwargs = dict(generation_kwargs)
    if temperature is not None:
        if temperature == 0:
            kwargs.setdefault("do_sample", False)
        else:
            kwargs.setdefault("do_sample", True)
            kwargs["temperature"] = float(temperature)
    if kwargs.get("do_sample") is False:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    else:
        if top_k is not None:
            kwargs["top_k"] = top_k
        if top_p is not None:
            kwargs["top_p"] = top_p
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens
    if max_new_tokens == 0:
        return SpeculativeOutput(sequences=input_ids.clone(), stats=SpecStats(gamma=gamma if not plain else 0),
                                 token_kinds=[[] for _ in range(input_ids.shape[0])])
    return target.generate(
        input_ids,
        attention_mask=attention_mask if attention_mask is not None else torch.ones_like(input_ids),
        custom_generate=speculative_generate,
        draft_model=draft,
        gamma=gamma,
        seed=seed,
        on_round=on_round,
        should_stop=should_stop,
        plain=plain,
        return_dict_in_generate=True,
        **kwargs,
    )


def _streamer_given_to_generate():
    """The `streamer` passed to `generate`, which transformers 5.x does not forward to a callable
    `custom_generate` (it rebuilds the mode kwargs from the callable's extra parameters only). It has already
    put the prompt into it; we stream the new tokens and end it."""
    frame = inspect.currentframe()
    for _ in range(4):
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        if frame.f_code.co_name == "generate" and "streamer" in frame.f_locals:
            return frame.f_locals["streamer"]
    return None


def _policy(gamma, stats: SpecStats):
    if gamma == "auto":
        return AdaptiveGamma(c_prior=stats.c_bytes)
    return FixedGamma(int(gamma))


def weight_bytes(model) -> int:
    """Bytes of a model's weights (packed storage counted as stored; shared tensors once); 0 for no model."""
    from hfspec.drafts import weight_bytes as draft_weight_bytes

    return 0 if model is None else int(draft_weight_bytes(model))
