"""Options of `generate` checked before hfspec decodes: those it cannot honour are refused by name, stop strings
get their tokenizer back.

transformers 5 hands a callable `custom_generate` only its own extra parameters: `streamer`, `tokenizer` and
`assistant_model` are dropped on the way. They are read back from the calling frames here (`given_to_generate`).
"""

from __future__ import annotations

import inspect

import torch

from hfspec import validate
from hfspec.errors import bad_value

# Generation modes other than greedy / sampling, and the option that selects each (hfspec would ignore it).
_MODE_OPTIONS = {
    "beam_search": "num_beams",
    "beam_sample": "num_beams",
    "group_beam_search": "num_beam_groups",
    "constrained_beam_search": "constraints",
    "contrastive_search": "penalty_alpha",
    "assisted_generation": "assistant_model",
    "dola_generation": "dola_layers",
}
_ASSISTED_OPTIONS = ("prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")
_OUTPUT_OPTIONS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


_LOOP_OWN = {"plain": "plain decoding is hfspec.plain_generate", "draft_model": "the draft is draft=",
             "hfspec_request": "hfspec builds it"}


def check_generate_kwargs(input_ids, temperature, generation_kwargs: dict) -> dict:
    """`hfspec.generate` / `plain_generate` keywords, checked before any model runs (`temperature` already checked
    by `validate.check_temperature`); returns them without `return_dict_in_generate` (the result is always a
    SpeculativeOutput)."""
    kwargs = dict(generation_kwargs)
    for name, instead in _LOOP_OWN.items():  # the loop's own parameters: passed on, `hfspec_request` would hide them
        if name in kwargs:
            raise bad_value(name, kwargs[name], f"left out of hfspec.generate / plain_generate ({instead})")
    if kwargs.pop("return_dict_in_generate", True) is not True:
        raise bad_value("return_dict_in_generate", generation_kwargs["return_dict_in_generate"],
                        "True or left out (hfspec.generate returns a SpeculativeOutput; use .sequences)")
    if temperature == 0 and kwargs.get("do_sample") is True:
        raise bad_value("do_sample", True, "False or left out with temperature=0 (greedy), or a temperature > 0")
    if temperature and kwargs.get("do_sample") is False:  # greedy would silently drop the temperature
        raise bad_value("do_sample", False, "True or left out with a temperature > 0, or temperature=0 (greedy)")
    batch = input_ids.shape[0] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 else 1
    if kwargs.get("streamer") is not None and batch > 1:
        raise bad_value("streamer", type(kwargs["streamer"]).__name__,
                        f"a streamer with a batch of one row (got {batch} rows)")
    return kwargs


def check_speculative_options(model, draft_model, input_ids, generation_config, stopping_criteria, streamer,
                              stop_strings):
    """What `speculative_generate` receives from transformers, checked before decoding. Returns the stopping
    criteria, with the stop strings added (transformers could not build them: it drops `tokenizer`)."""
    validate.check_token_ids(input_ids, model, draft_model)
    assistant = given_to_generate("assistant_model")
    mode = generation_config.get_generation_mode(assistant)
    mode = getattr(mode, "value", mode)
    if mode in _MODE_OPTIONS:
        option = _mode_option(mode, generation_config)
        value = type(assistant).__name__ if option == "assistant_model" else getattr(generation_config, option)
        raise bad_value(option, value, "greedy or sampling options only (hfspec decodes one sequence per row; "
                        "the draft is draft_model=)")
    for option in _OUTPUT_OPTIONS:
        if getattr(generation_config, option, False):
            raise bad_value(option, True, "False (hfspec returns sequences, stats and token_kinds)")
    streamer = streamer if streamer is not None else given_to_generate("streamer")
    if streamer is not None and input_ids.shape[0] > 1:
        raise bad_value("streamer", type(streamer).__name__,
                        f"a streamer with a batch of one row (got {input_ids.shape[0]} rows)")
    if not stop_strings:
        return stopping_criteria
    return _with_stop_strings(stopping_criteria, stop_strings, tokenizer_given_to_generate())


def _mode_option(mode: str, generation_config) -> str:
    if mode == "assisted_generation":
        return next((o for o in _ASSISTED_OPTIONS if getattr(generation_config, o, None)), "assistant_model")
    if mode == "constrained_beam_search" and getattr(generation_config, "constraints", None) is None:
        return "force_words_ids"
    return _MODE_OPTIONS[mode]


def _with_stop_strings(stopping_criteria, stop_strings, tokenizer):
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import StopStringCriteria

    if tokenizer is None:
        raise bad_value("stop_strings", stop_strings, "stop strings together with tokenizer=<the model's tokenizer>")
    strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)
    if not strings or not all(isinstance(s, str) and s for s in strings):
        raise bad_value("stop_strings", stop_strings, "a non-empty string or a list of non-empty strings")
    return StoppingCriteriaList([*(stopping_criteria or []), StopStringCriteria(tokenizer, strings)])


def given_to_generate(name: str):
    """A parameter of transformers' `generate` (it holds the ones it does not forward to `custom_generate`)."""
    for frame in _library_callers():
        if frame.f_code.co_name == "generate" and frame.f_globals.get("__name__", "").startswith("transformers"):
            return frame.f_locals.get(name)
    return None


def tokenizer_given_to_generate():
    """The `tokenizer=` passed to `generate`: transformers pops it into a dict it then discards, but the
    wrappers around its `generate` (and hfspec's own `generate`) still hold it in their keyword arguments.
    Only frames of transformers, torch and hfspec are read: a `tokenizer` the caller did not pass is not used."""
    for frame in _library_callers():
        for name in ("kwargs", "generation_kwargs"):
            value = frame.f_locals.get(name)
            if isinstance(value, dict) and value.get("tokenizer") is not None:
                return value["tokenizer"]
    return None


def _library_callers(limit: int = 16):
    """The frames above this call, nearest first, up to the first one outside transformers, torch and hfspec."""
    frame = inspect.currentframe()
    for _ in range(limit):
        frame = frame.f_back if frame is not None else None
        if frame is None or not frame.f_globals.get("__name__", "").startswith(("transformers", "torch", "hfspec")):
            return
        yield frame
