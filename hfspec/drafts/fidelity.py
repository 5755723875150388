"""How close a draft's next-token distributions are to the target's: mean Σ_v min(p, q) over positions.

At temperature 1 this overlap is the probability that speculative sampling accepts the draft's token at that
position (β in Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
section 3.3, with α its expectation), so it predicts α without running the decoding loop. Exactness never
depends on it; speed does. A copy that changed a layer's meaning (e.g. a dropped embedding scale) shows up here
as a number near 0.
"""

from __future__ import annotations

import itertools
import warnings
import weakref

import torch
from torch import nn
from torch.nn import functional as F

from hfspec.attrs import DRAFT_SPEC, FIDELITY, SHARED_VOCAB, get_attr, set_attr
from hfspec.errors import bad_value
from hfspec.kernels import cache
from hfspec.validate import vocab_size

PROBE_TOKENS = 16  # tokens the target writes greedily from its BOS for `warn_if_unfaithful`
LOW_FIDELITY = 0.5  # below this mean overlap, `warn_if_unfaithful` warns
_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> its probe ids (built once)


def fidelity(target: nn.Module, draft: nn.Module, ids) -> float:
    """Mean over the positions of `ids` of Σ_v min(p, q), p and q the softmax (T = 1) of the raw next-token
    logits of target and draft. Compared over the target's vocabulary: draft rows beyond it (or beyond the
    sibling's shared vocabulary, `hfspec.attrs.SHARED_VOCAB`) are dropped, target rows the draft lacks get q = 0.

    ids: token ids, a list, a [L] or a [B, L] LongTensor. Returns a number in [0, 1] (1: identical).
    """
    ids = _as_batch(ids)
    if not callable(getattr(draft, "forward", None)):
        raise bad_value("draft", type(draft).__name__, "a draft model with a forward returning logits")
    p_logits = _logits(target, ids)
    q_logits = _logits(draft, ids).to(p_logits.device)
    vocab = p_logits.shape[-1]
    usable = min(q_logits.shape[-1], vocab, int(get_attr(draft, SHARED_VOCAB) or vocab))
    p = F.softmax(p_logits, dim=-1)
    q = F.softmax(q_logits[..., :usable], dim=-1)
    overlap = torch.minimum(p[..., :usable], q).sum(dim=-1)
    return float(overlap.mean())


def try_fidelity(target: nn.Module, draft, ids) -> float | None:
    """`fidelity`, or None for a draft that is not a model (e.g. prompt lookup: no logits to compare)."""
    if not isinstance(draft, nn.Module):
        return None
    return fidelity(target, draft, ids)


def probe_ids(target: nn.Module, tokens: int = PROBE_TOKENS) -> torch.Tensor:
    """[1, 1 + tokens]: the target's BOS (token 0 without one) and the `tokens` it then writes greedily (EOS
    masked, so the probe is always full length). Built once per target and remembered."""
    cached = _PROBES.get(target)
    if cached is not None and cached.shape[1] == tokens + 1:
        return cached
    config = getattr(target, "config", None)
    bos = getattr(config, "bos_token_id", None)
    bos = bos[0] if isinstance(bos, list | tuple) else bos
    eos = getattr(config, "eos_token_id", None)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    rows = vocab_size(target)
    ids = torch.tensor([[int(bos) if bos is not None and 0 <= int(bos) < rows else 0]], device=_device(target))
    kwarg, past = cache.cache_kwarg(target), cache.new_cache(target)
    with torch.no_grad():
        for step in range(tokens):
            out = target(input_ids=ids if step == 0 else ids[:, -1:], use_cache=True, **{kwarg: past})
            past = cache.cache_of(out)
            logits = out.logits[:, -1].float()
            logits[:, [e for e in eos if 0 <= e < logits.shape[-1]]] = -float("inf")
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    _PROBES[target] = ids
    return ids


def warn_if_unfaithful(target: nn.Module, draft, label: str | None = None, threshold: float | None = None,
                       tokens: int = PROBE_TOKENS) -> float | None:
    """Measure `fidelity` on the target's own greedy text (`probe_ids`) and warn when it is below `threshold`
    (default `LOW_FIDELITY`).

    Costs `tokens` cached target steps once per target, then one forward of each model over the probe. Returns
    the number (also recorded as `get_attr(draft, FIDELITY)`, `hfspec.attrs`), or None for a draft that is not a model.
    """
    if not isinstance(draft, nn.Module):
        return None
    threshold = LOW_FIDELITY if threshold is None else threshold
    value = fidelity(target, draft, probe_ids(target, tokens))
    set_attr(draft, FIDELITY, value)
    if value < threshold:
        name = label or get_attr(draft, DRAFT_SPEC) or type(draft).__name__
        warnings.warn(
            f"hfspec: draft {name!r} is far from its target: mean Σmin(p, q) = {value:.3f} over the target's own "
            f"{tokens}-token greedy text (1.0 = identical, expected acceptance at T=1 ≈ this; below {threshold} "
            "speculation rarely pays). Try more bits (rtn8) or a sibling; for a quantised copy of a standard "
            "model this may be a bug in hfspec (a layer whose meaning changed): please report it.",
            UserWarning, stacklevel=3)
    return value


def _as_batch(ids) -> torch.Tensor:
    if isinstance(ids, list | tuple):
        ids = torch.tensor(ids, dtype=torch.long)
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.long, torch.int, torch.int32):
        raise bad_value("ids", type(ids).__name__, "token ids: a list, or a LongTensor [L] or [B, L]")
    ids = ids.long()
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.numel() == 0:
        raise bad_value("ids", tuple(ids.shape), "a non-empty [L] or [B, L] tensor")
    return ids


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids.to(_device(model)), attention_mask=torch.ones_like(ids).to(_device(model)),
                    use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out
    return logits.float()


def _device(model: nn.Module) -> torch.device:
    tensors = itertools.chain(model.parameters(), model.buffers())
    return next((t.device for t in tensors if t.device.type != "meta"), torch.device("cpu"))
