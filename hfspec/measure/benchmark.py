"""Side-by-side speed of plain `generate`, HF assisted generation and hfspec on one pair, in one process.

Timed by the one ruler (`hfspec.measure.interleaved`): rounds in rotating order (same prompt, same length, same
seeds), a warm-up round not counted, medians of per-round ratios with their intervals, outliers re-measured and a
stability verdict; reported as tokens/s and as ratios.
"""

from __future__ import annotations

import functools
import statistics
import time
from contextlib import contextmanager

import torch

from hfspec.api import generate
from hfspec.attrs import DRAFT_SPEC, get_attr
from hfspec.decoding.stats import SpecStats
from hfspec.drafts import registry
from hfspec.errors import HfspecError
from hfspec.measure.plausible import implausible
from hfspec.measure.ruler import Sample, interleaved


def hf_assisted(target, draft, gamma: int, assistant=None) -> tuple[dict, str]:
    """Keyword arguments for transformers' own assisted generation that match hfspec's `draft`, and a label.

    assistant: a model to use instead (an HF model with `generate`). Otherwise the draft's kind says how
    (`DraftKind.assisted`: prompt lookup as `prompt_lookup_num_tokens=γ`, a lean draft as its HF-forward copy),
    or a draft that is an HF model with `generate` is the assistant itself.
    """
    if assistant is not None:
        if not callable(getattr(assistant, "generate", None)):
            raise HfspecError(f"assistant: got {type(assistant).__name__}; allowed: a model with transformers' "
                              "generate (the HF assisted baseline runs it), or None to derive one from the draft")
        return {"assistant_model": assistant}, f"the given {type(assistant).__name__}"
    spec = get_attr(draft, DRAFT_SPEC)
    parsed = registry.parse(spec) if spec else None
    kind = registry.KINDS.get(parsed.kind) if parsed is not None else None
    found = kind.assisted(target, draft, parsed, gamma) if kind is not None and kind.assisted else None
    if found is not None:
        return found
    if callable(getattr(draft, "generate", None)):
        return {"assistant_model": draft}, f"the draft itself ({spec or type(draft).__name__})"
    raise HfspecError(f"draft: {spec or type(draft).__name__} has no HF counterpart for the assisted baseline; "
                      "allowed: pass assistant=<an HF model>, or a draft made by hfspec.make_draft")


@contextmanager
def _assistant_settings(kwargs: dict, gamma: int):
    """A constant γ for an assistant model (transformers reads it from the assistant's generation config),
    restored afterwards so a user's sibling model is left as it was."""
    model = kwargs.get("assistant_model")
    if model is None:
        yield
        return
    config = model.generation_config
    wanted = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0}
    saved = {name: getattr(config, name, None) for name in wanted}
    for name, value in wanted.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def compare_methods(target, draft, input_ids, gamma: int = 4, temperature: float = 0.0, max_new_tokens: int = 128,
                    repeats: int = 3, seed: int = 1, warmup: bool = True, assistant=None) -> dict:
    """tokens/s of plain HF, HF assisted (constant γ) and hfspec; their ratios; hfspec's time split.

    HF assisted runs the draft's HF counterpart (see `hf_assisted`; `assistant` overrides it)."""
    mask = torch.ones_like(input_ids)
    sample = temperature > 0
    hf_kwargs = dict(attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                     do_sample=sample, **({"temperature": temperature} if sample else {}))
    assisted_kwargs, assistant_label = hf_assisted(target, draft, gamma, assistant)

    def plain():
        return target.generate(input_ids, **hf_kwargs)

    def assisted():
        with _assistant_settings(assisted_kwargs, gamma):
            return target.generate(input_ids, **assisted_kwargs, **hf_kwargs)

    def ours():
        return generate(target, input_ids, draft=draft, gamma=gamma, temperature=temperature,
                               max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, seed=seed)

    methods = {"plain generate": plain, "HF assisted": assisted, "hfspec": ours}

    def timed(name, fn):
        def run(r: int) -> Sample:
            torch.manual_seed(seed + r)
            began = time.perf_counter()
            out = fn()
            took = time.perf_counter() - began
            seqs = out.sequences if hasattr(out, "sequences") else out
            return Sample(took, seqs.shape[1] - input_ids.shape[1], out)
        return run

    # the one ruler (hfspec.measure): rotating order per round, warm-up not counted, medians with intervals,
    # outliers re-measured, a stability verdict
    timings = interleaved({name: timed(name, fn) for name, fn in methods.items()}, "plain generate", repeats,
                          warmup=1 if warmup else 0)
    ratios = {name: timings.ratio(name) for name in methods}
    spec_stats = functools.reduce(SpecStats.merge, [r["hfspec"].out.stats for r in timings.kept])
    stable, warnings = timings.verdict()
    tps = {name: ratios[name].tokens_per_second if name != "plain generate"
           else ratios["hfspec"].baseline_tokens_per_second for name in methods}
    speedups = {name: ratios[name].median if name != "plain generate" else 1.0 for name in methods}
    hf_vs = interleaved_ratio(timings, "hfspec", "HF assisted")
    return {
        "tokens_per_second": tps,
        "speedup_vs_plain": speedups,
        "speedup_interval": {name: (ratios[name].low, ratios[name].high) if name != "plain generate" else (1.0, 1.0)
                             for name in methods},
        "hfspec_vs_assisted": hf_vs,
        "pairs": timings.pairs, "outliers": timings.outliers, "stable": stable, "warnings": warnings,
        "flags": implausible(speedups["hfspec"], spec_stats),
        "hf_assistant": assistant_label,
        "alpha": spec_stats.alpha,
        "tokens_per_pass": spec_stats.tokens_per_pass,
        "c_bytes": spec_stats.c_bytes,
        "c_time": spec_stats.c_time,
        "hfspec_time_split": {
            "draft": spec_stats.time_draft / spec_stats.time_total,
            "target": spec_stats.time_target / spec_stats.time_total,
            "other": spec_stats.time_other / spec_stats.time_total,
        },
    }


def interleaved_ratio(timings, name: str, over: str) -> float:
    """The median per-round ratio of two methods' tokens/s in the same interleaved rounds."""
    ratios = [r[name].rate / r[over].rate for r in timings.kept if r[over].rate]
    return statistics.median(ratios) if ratios else 0.0
