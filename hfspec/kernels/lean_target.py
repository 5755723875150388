"""The target's own passes through the lean decoder: a float32 Llama-style target on the CPU scores a round (and
its prompt) with `LeanDecoder(target, bits=None, shared=True)` instead of the HF forward.

Why: an HF forward spends much of a small model's pass outside its matrix products (a module call, norms, rotary,
cache bookkeeping per layer). SmolLM2-135M in fp32 on the 2-core Intel Xeon VM without AMX, in the HF forward's
one-token steps: a 5-position verify pass 0.98 through the lean decoder against 1.21 through the HF forward, both
with the few-row kernel; one position 0.82 (`benchmarks/bench_verify_width.py --dtypes float32+rows,float32+lean`
times it on your machine).

What it computes: the same function up to float rounding (RMSNorm in one call, rotary as a rotation of pairs, one
SDPA per layer), as any change of BLAS or the few-row kernel already does; the weights are the target's own
tensors (no copy: `hfspec.kernels.shared_linear`), norms and rotary tables small copies. Before first use on a set
of weights the lean logits are checked against the HF forward's on a fixed text (`CHECK_TOKENS` positions,
within `CHECK_TOLERANCE` of the logits' scale); where they differ, or the model is not one it reproduces, the HF
forward runs and `why_not` says why. Only where the function is the target's: float32 (the lean step computes in
fp32, so a bf16 target would be scored at a precision `generate` does not use), CPU, plain `nn.Linear` weights
(not prepacked, quantised or offloaded), full attention (no sliding window, no attention logit soft-capping), a
rotary table fixed per position (not "longrope" or "dynamic", which choose their factors per forward), no forward
hooks (the lean decoder would skip them), weights with a version counter (not made under `torch.inference_mode`),
a batch of one row, and not under `use_bitwise_verify` (generate's own rounding, bit for bit). The decoder is rebuilt
when any parameter or buffer is replaced or changed in place, or a small tensor it copies (norms) changes even
through `.data`.

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

MODE_ENV = "HFSPEC_LEAN_TARGET"
MODES = ("auto", "on", "off")
CHECK_TOKENS = 12
CHECK_TOLERANCE = 1e-4  # of max(1, the largest |logit|): fp32 rounding differs by ~1e-6 of it, a wrong layer by far more
PATH = "lean decoder over the target's own weights"

PREFILL_CHUNK = 512  # prompt positions a lean prefill feeds at once: its mask is [chunk, cache], not [T, T]
SMALL = 1 << 16  # elements: tensors the decoder copies (norms) or reads at build (rotary) are compared each decode

# target -> (key, structural reason why not, LeanDecoder | None, why not after the check, small tensors' snapshot)
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mode() -> str:
    """`$HFSPEC_LEAN_TARGET`: "auto" when unset; another value is refused by name."""
    value = os.environ.get(MODE_ENV, "") or "auto"
    if value not in MODES:
        raise bad_value(MODE_ENV, value, "auto, on or off")
    return value


def why_not(target: nn.Module, batch: int = 1) -> str:
    """'' where the target's passes may take the lean decoder (before the numerical check), else why not. What can
    change between decodes (the mode, hooks, the batch, the weights' dtype) is read each time; what the model's
    structure decides, once per weights (`_entry`)."""
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
    if any(p.is_inference() for p in params):
        return "weights made under torch.inference_mode (no version counter to see them change)"
    if chosen == "auto" and not verify_linear.running():
        return f"the few-row kernel is not running ({verify_linear.status()}); {MODE_ENV}=on takes it anyway"
    if _hooked(target):
        return "forward hooks on the model or its modules (the lean decoder would skip them)"
    return _entry(target)[1]


def runner_for(target: nn.Module, batch: int = 1) -> tuple[LeanRunner | None, str]:
    """(a runner of the lean decoder over the target's weights, PATH), or (None, why not)."""
    why = why_not(target, batch)
    if why:
        return None, why
    decoder, why = built(target)
    return (LeanTargetRunner(decoder), PATH) if decoder is not None else (None, why)


def built(target: nn.Module) -> tuple[LeanDecoder | None, str]:
    """The target's lean decoder, checked against its HF forward; built once per weights (storage and in-place
    version of every parameter and buffer, the rotary module, and the values of the small tensors it copies), like
    `hfspec.kernels.lean.lean_step_of`. (None, why) where `why_not` says no or the check fails."""
    entry = _entry(target)
    if entry[1]:
        return None, entry[1]
    if entry[2] is None and not entry[3]:
        try:
            decoder = LeanDecoder(target, bits=None, shared=True)
            why = _check(target, decoder)
        except Exception as error:  # noqa: BLE001 - any model the lean decoder misreads keeps the HF forward
            decoder, why = None, f"cannot build it: {type(error).__name__}: {error}"
        _BUILT[target] = entry = (*entry[:2], decoder if not why else None, why or "", entry[4])
    return entry[2], entry[3]


def takes(target: nn.Module, batch: int = 1) -> bool:
    """Whether a chain or token-tree decode of `batch` rows scores the target through the lean decoder."""
    return runner_for(target, batch)[0] is not None


class LeanTargetRunner(LeanRunner):
    """The lean decoder as the target's runner: a long prompt goes in chunks of `PREFILL_CHUNK` positions, so its
    attention mask stays [chunk, cache] (one [T, T] mask at 32k tokens would be 1 GiB)."""

    def _run(self, tokens, positions, valid, start: int, end: int, keep: int, all_valid: bool) -> torch.Tensor:
        while end - (start + PREFILL_CHUNK) >= max(keep, 1):
            mid = start + PREFILL_CHUNK
            self.model.logits(tokens[:, start:mid], positions[:, start:mid], None if all_valid else valid[:, :mid],
                              self.cache, 1)
            start = mid
        return super()._run(tokens, positions, valid, start, end, keep, all_valid)


def _entry(target: nn.Module) -> tuple:
    """This target's `_BUILT` entry for its current weights, made anew (decoder not built) where they changed."""
    tensors = list(target.parameters()) + list(target.buffers())
    key = (tuple((t.data_ptr(), t._version) for t in tensors if not t.is_inference()),
           id(getattr(getattr(target, "model", None), "rotary_emb", None)))
    known = _BUILT.get(target)
    if known is not None and known[0] == key and all(torch.equal(a, b) for a, b in known[4]):
        return known
    snapshot = [(t, t.detach().clone()) for t in tensors if t.numel() < SMALL]  # norms, biases, rotary inv_freq
    entry = (key, _structure(target), None, "", snapshot)
    _BUILT[target] = entry
    return entry


def _structure(target: nn.Module) -> str:
    """Why the model's structure keeps the HF forward ('' where the lean decoder may reproduce it)."""
    if any(isinstance(m, nn.Linear) and not verify_linear.plain(m) for m in target.modules()):
        return "linears that are not plain nn.Linear (prepacked, quantised or hooked)"
    config = getattr(target, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if kv.has_sliding_layers(target) or getattr(text, "attn_logit_softcapping", None):
        return "sliding-window attention or attention logit soft-capping"
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if kind in ("longrope", "dynamic"):  # factors chosen per forward from its length: one table cannot follow
        return f"{kind} rotary scaling"
    return lean_reason(target) or ""


def _hooked(target: nn.Module) -> bool:
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in target.modules())


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
