"""RTN drafts: a lean decode step of their own where the family allows it, else the HF forward over swapped
quantised modules (any architecture)."""

from __future__ import annotations

from torch import nn

from hfspec.errors import HfspecError


def make_rtn_draft(target: nn.Module, bits: int, group_size: int, fused: bool | None = None,
                   lean: bool | None = None, compiled: bool = False, progress=None) -> nn.Module:
    """RTN copy of `target` at `bits` in groups of `group_size`.

    lean: None (default) takes the lean step (`hfspec.drafts.lean`) when the family is supported and the weights
    are on the CPU; True requires it (error naming why not); False keeps the HF forward. fused applies to the
    HF-forward path only (the int4 kernel where a layer allows it). compiled: also compile the lean one-token
    step (`hfspec.drafts.compiled`; needs the lean step), reporting through `progress(message)`.
    """
    from hfspec.drafts.lean import LeanDecoder, lean_reason
    from hfspec.quant.swap import quantize_model

    if compiled and (lean is False or fused is not None):
        raise HfspecError("draft options: a compiled step needs the lean step; allowed: compiled drafts without "
                          "lean=False or fused")
    if lean is not False and fused is None:
        why = lean_reason(target)
        if why is None:
            draft = LeanDecoder(target, bits, group_size)
            if compiled:
                draft.compile_step(progress)
            return draft
        if compiled:
            raise HfspecError(f"draft: a compiled step needs the lean step, which {type(target).__name__} cannot "
                              f"take ({why}); allowed: the eager draft (drop '-compiled')")
        if lean:
            raise HfspecError(f"draft option lean=True: {type(target).__name__} cannot take the lean step ({why}); "
                              "allowed: lean=None or lean=False (the Hugging Face forward)")
    elif lean and fused is not None:
        raise HfspecError("draft options: fused applies to the Hugging Face forward only; allowed: lean=True "
                          "without fused, or fused with lean=False")
    return quantize_model(target, bits, group_size, fused=fused)
