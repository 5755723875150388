"""Side-by-side speed of plain `generate`, HF assisted generation and hfspec on one pair, in one process.

Methods run interleaved per repeat (same prompt, same length, same seeds), so drift in machine load hits all
three alike; results are reported as tokens/s and as ratios.
"""

from __future__ import annotations

import time

import torch

import hfspec


def _timed(fn) -> tuple[float, object]:
    began = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - began
    return seconds, out


def compare_methods(target, draft, input_ids, gamma: int = 4, temperature: float = 0.0, max_new_tokens: int = 128,
                    repeats: int = 3, seed: int = 1, warmup: bool = True) -> dict:
    """tokens/s of plain HF, HF assisted (constant γ) and hfspec; their ratios; hfspec's time split."""
    mask = torch.ones_like(input_ids)
    sample = temperature > 0
    hf_kwargs = dict(attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                     do_sample=sample, **({"temperature": temperature} if sample else {}))
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0

    def plain():
        return target.generate(input_ids, **hf_kwargs)

    def assisted():
        return target.generate(input_ids, assistant_model=draft, **hf_kwargs)

    def ours():
        return hfspec.generate(target, input_ids, draft=draft, gamma=gamma, temperature=temperature,
                               max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, seed=seed)

    methods = {"plain generate": plain, "HF assisted": assisted, "hfspec": ours}
    if warmup:
        for fn in methods.values():
            torch.manual_seed(seed)
            fn()
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    spec_stats = None
    for r in range(repeats):
        for name, fn in methods.items():
            torch.manual_seed(seed + r)
            took, out = _timed(fn)
            seqs = out.sequences if hasattr(out, "sequences") else out
            seconds[name] += took
            tokens[name] += seqs.shape[1] - input_ids.shape[1]
            if name == "hfspec":
                spec_stats = out.stats if spec_stats is None else spec_stats.merge(out.stats)
    tps = {name: tokens[name] / seconds[name] for name in methods}
    return {
        "tokens_per_second": tps,
        "speedup_vs_plain": {name: tps[name] / tps["plain generate"] for name in methods},
        "hfspec_vs_assisted": tps["hfspec"] / tps["HF assisted"],
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
