"""Draft cost: bytes of weights held, and measured time of one decode step against the target."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from hfspec.kernels import cache as kv


def _held_tensors(model: nn.Module):
    for tensor in list(model.parameters()) + list(model.buffers()):
        yield tensor
        state = getattr(tensor, "quant_state", None)  # bitsandbytes 4-bit: absmax, code, nested state
        if state is not None:
            yield from (v for v in state.as_dict().values() if isinstance(v, torch.Tensor))
        scb = getattr(tensor, "SCB", None)  # bitsandbytes int8: per-row scales
        if isinstance(scb, torch.Tensor):
            yield scb


def weight_bytes(model: nn.Module | None) -> int:
    """Bytes of every parameter and buffer a model holds (packed storage as stored; shared storage once)."""
    if model is None:
        return 0
    seen, total = set(), 0
    for tensor in _held_tensors(model):
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


@dataclass
class CostReport:
    """Measured cost of a draft relative to its target (times in milliseconds, median of `repeats`)."""

    c_time: float
    c_bytes: float
    target_ms: float
    draft_ms: float
    target_bytes: int
    draft_bytes: int
    prompt_len: int
    repeats: int

    def to_dict(self) -> dict:
        return asdict(self)


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu"))


def _decode_timer(model: nn.Module, prompt: torch.Tensor):
    """Prefill `prompt`, then return a function timing one single-token forward on the warm cache."""
    device = _device(model)
    ids = prompt.to(device)
    key = kv.cache_kwarg(model)
    cache = kv.new_cache(model)
    with torch.no_grad():
        cache = kv.cache_of(model(input_ids=ids, use_cache=True, **{key: cache}))
    length = ids.shape[1]
    step = ids[:, -1:]

    def time_one() -> float:
        with torch.no_grad():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            model(input_ids=step, use_cache=True, **{key: cache})
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - began
        kv.crop_to(cache, length)
        return elapsed

    return time_one


def measure_cost(target: nn.Module, draft: nn.Module, prompt_len: int = 32, repeats: int = 20,
                 warmup: int = 3, seed: int = 0) -> CostReport:
    """Median single-token decode forward of target and draft (batch 1, warm KV cache of `prompt_len`)."""
    vocab = min(target.config.vocab_size, draft.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen)
    timers = {"target": _decode_timer(target, prompt), "draft": _decode_timer(draft, prompt)}
    samples = {"target": [], "draft": []}
    for i in range(warmup + repeats):
        for name, timer in timers.items():  # interleaved, so drifting machine load hits both alike
            elapsed = timer()
            if i >= warmup:
                samples[name].append(elapsed)
    target_s, draft_s = statistics.median(samples["target"]), statistics.median(samples["draft"])
    t_bytes, d_bytes = weight_bytes(target), weight_bytes(draft)
    return CostReport(c_time=draft_s / target_s, c_bytes=d_bytes / t_bytes, target_ms=target_s * 1e3,
                      draft_ms=draft_s * 1e3, target_bytes=t_bytes, draft_bytes=d_bytes,
                      prompt_len=prompt_len, repeats=repeats)
