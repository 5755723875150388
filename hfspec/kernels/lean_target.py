"""The target's own passes through the lean decoder: a float32 Llama-style target on the CPU scores a round (and
its prompt) with `LeanDecoder(target, bits=None, shared=True)` instead of the HF forward.

Why: an HF forward spends much of a small model's pass outside its matrix products (a module call, norms, rotary,
cache bookkeeping per layer). SmolLM2-135M in fp32 on the 2-core Intel Xeon VM: a 5-position verify pass took
42 ms through the lean decoder against 55 ms through the HF forward, both with the few-row kernel; one position 32
against 40 (medians of 6, `benchmarks/bench_lean_target.py` times it on your machine).

What it computes: the same function up to float rounding (RMSNorm in one call, rotary as a rotation of pairs, one
SDPA per layer), as any change of BLAS or the few-row kernel already does; the weights are the target's own
tensors (no copy: `hfspec.kernels.shared_linear`), norms and rotary tables small copies. Before first use on a set
of weights the lean logits are checked against the HF forward's on a fixed text (`CHECK_TOKENS` positions,
within `CHECK_TOLERANCE` of the logits' scale); where they differ, or the model is not one it reproduces, the HF
forward runs and `why_not` says why. Only where the function is the target's: float32 (the lean step computes in
fp32, so a bf16 target would be scored at a precision `generate` does not use), CPU, plain `nn.Linear` weights
(not prepacked, quantised or offloaded), full attention (no sliding window, no attention logit soft-capping), a
batch of one row, and not under `use_bitwise_verify` (generate's own rounding, bit for bit).

`$HFSPEC_LEAN_TARGET`: "auto" (default) where the few-row kernel runs (measured faster there; with `F.linear` a
5-position lean pass was slower than the HF one), "on" also without it, "off" never.
"""

from __future__ import annotations

import os
import weakref

import torch
from torch import nn

from hfspec.attrs import BITWISE_VERIFY, get_attr
from hfspec.errors import bad_value
from hfspec.kernels import cache as kv
from hfspec.kernels import verify_linear
from hfspec.kernels.lean import LeanDecoder, LeanRunner, lean_reason
from hfspec.kernels.lean_layers import _Unsupported

MODE_ENV = "HFSPEC_LEAN_TARGET"
MODES = ("auto", "on", "off")
CHECK_TOKENS = 12
CHECK_TOLERANCE = 1e-4  # of max(1, the largest |logit|): fp32 rounding differs by ~1e-6 of it, a wrong layer by far more
PATH = "lean decoder over the target's own weights"

_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> (weights key, LeanDecoder | None, why)


def mode() -> str:
    """`$HFSPEC_LEAN_TARGET`: "auto" when unset; another value is refused by name."""
    value = os.environ.get(MODE_ENV, "") or "auto"
    if value not in MODES:
        raise bad_value(MODE_ENV, value, "auto, on or off")
    return value


def why_not(target: nn.Module, batch: int = 1) -> str:
    """'' where the target's passes may take the lean decoder (before the numerical check), else why not."""
    chosen = mode()
    if chosen == "off":
        return f"{MODE_ENV}=off"
    if get_attr(target, BITWISE_VERIFY):
        return "bit-for-bit verify (generate's own rounding)"
    if batch != 1:
        return f"a batch of {batch} rows (one row only)"
    params = list(target.parameters())
    if not params or any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params):
        return "not a float32 CPU target"
    if chosen == "auto" and not (verify_linear.wanted() and verify_linear.kernel() is not None):
        return f"the few-row kernel is not running ({verify_linear.status()}); {MODE_ENV}=on takes it anyway"
    if any(isinstance(m, nn.Linear) and not verify_linear.plain(m) for m in target.modules()):
        return "linears that are not plain nn.Linear (prepacked, quantised or hooked)"
    config = getattr(target, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if kv.has_sliding_layers(target) or getattr(text, "attn_logit_softcapping", None):
        return "sliding-window attention or attention logit soft-capping"
    return lean_reason(target) or ""


def runner_for(target: nn.Module, batch: int = 1) -> tuple[LeanRunner | None, str]:
    """(a runner of the lean decoder over the target's weights, PATH), or (None, why not)."""
    why = why_not(target, batch)
    if why:
        return None, why
    decoder, why = built(target)
    return (LeanRunner(decoder), PATH) if decoder is not None else (None, why)


def built(target: nn.Module) -> tuple[LeanDecoder | None, str]:
    """The target's lean decoder, checked against its HF forward; built once per weights (storage and in-place
    version), like `hfspec.kernels.lean.lean_step_of`."""
    key = tuple((p.data_ptr(), p._version) for p in target.parameters())
    known = _BUILT.get(target)
    if known is not None and known[0] == key:
        return known[1], known[2]
    try:
        decoder = LeanDecoder(target, bits=None, shared=True)
        why = _check(target, decoder)
    except (ValueError, RuntimeError, _Unsupported) as error:  # a layer the lean decoder does not read
        decoder, why = None, f"cannot build it: {error}"
    decoder = decoder if not why else None
    _BUILT[target] = (key, decoder, why)
    return decoder, why


@torch.no_grad()
def _check(target: nn.Module, decoder: LeanDecoder) -> str:
    """'' when the lean logits match the HF forward's on a fixed text, else by how much they do not."""
    vocab = decoder.vocab
    ids = ((torch.arange(CHECK_TOKENS) * 7919 + 11) % vocab)[None]
    want = target(input_ids=ids, use_cache=False).logits.float()
    got = decoder.logits(ids, None, None, decoder.hfspec_new_cache(), 0).float()
    error, scale = float((got - want).abs().max()), max(1.0, float(want.abs().max()))
    if not error <= CHECK_TOLERANCE * scale:  # (also NaN)
        return f"its logits differ from the HF forward's by {error:.3g} (largest logit {scale:.3g})"
    return ""
