"""bitsandbytes drafts (nf4 / fp4 / int8): the module replacement BitsAndBytesConfig does, done on a copy.

As with BitsAndBytesConfig's defaults, every Linear / Conv1D is replaced except the output layer; embeddings and
the output layer stay in float and are shared with the target (no copy).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from hfspec.attrs import LAYER_PATH, get_attr, set_attr
from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail
from hfspec.errors import HfspecError
from hfspec.extras import require_extra
from hfspec.quant.known_layers import LINEAR, check_forward, layer_kind
from hfspec.quant.swap import as_linear_weight, copy_skeleton, weight_matrices

BNB_KINDS = ("nf4", "fp4", "int8")
LLM_INT8_THRESHOLD = 6.0  # BitsAndBytesConfig's default


def _import_bnb():
    require_extra("bnb", "draft", "a bnb-* draft (bitsandbytes layers; without it: rtn2..rtn8[-gN], or a model "
                  "folder / hub id)")
    import bitsandbytes

    return bitsandbytes


class _OnceFilter(logging.Filter):
    """Let each distinct message through once: bitsandbytes logs its int8 cast warning on every forward."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def _quiet_repeated_bnb_warnings() -> None:
    logger = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _OnceFilter) for f in logger.filters):
        logger.addFilter(_OnceFilter())


def make_bnb_draft(target: nn.Module, bnb_type: str) -> nn.Module:
    """Copy of `target` with bitsandbytes `bnb_type` ("nf4" | "fp4" | "int8") layers; checked by one forward each."""
    bnb = _import_bnb()
    _quiet_repeated_bnb_warnings()
    output = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    layers = [(n, m) for n, m in weight_matrices(target)
              if not isinstance(m, nn.Embedding) and m is not output]
    _check_known(layers)
    replace = {id(p): p for p in target.parameters()}  # share what is not replaced
    replace.update({id(m.weight): None for _, m in layers})
    draft = copy_skeleton(target, replace)
    for name, module in layers:
        new = _bnb_linear(bnb, module, bnb_type)
        _check_layer(new, name, bnb_type, module.weight.dtype)
        draft.set_submodule(name, new)
    draft.eval()
    return draft


def _check_known(layers: list[tuple[str, nn.Module]]) -> None:
    """Only layers whose forward is x @ W.T + b may become bitsandbytes layers (HfspecError naming any other)."""
    checked = set()
    for name, module in layers:
        kind = layer_kind(name, module)  # raises for an unknown Linear / Conv1D subclass
        if kind != LINEAR:  # pragma: no cover - embeddings are filtered out before
            raise HfspecError(f"draft: bnb cannot replace layer {name!r} ({type(module).__qualname__})")
        if type(module) not in checked:
            check_forward(name, module, kind)
            checked.add(type(module))


def _bnb_linear(bnb, module: nn.Module, bnb_type: str) -> nn.Module:
    weight = as_linear_weight(module).detach()
    out_features, in_features = weight.shape
    bias = module.bias is not None
    if bnb_type == "int8":
        new = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias, has_fp16_weights=False,
                                  threshold=LLM_INT8_THRESHOLD)
        new.weight = bnb.nn.Int8Params(weight.clone(), requires_grad=False, has_fp16_weights=False)
    else:
        new = bnb.nn.Linear4bit(in_features, out_features, bias=bias, compute_dtype=weight.dtype, quant_type=bnb_type)
        new.weight = bnb.nn.Params4bit(weight.clone(), requires_grad=False, quant_type=bnb_type, module=new)
    if bias:
        new.bias = nn.Parameter(module.bias.detach().clone(), requires_grad=False)
    new = new.to(weight.device)  # quantises
    set_attr(new, LAYER_PATH, f"bnb {bnb_type}")
    block = getattr(new.weight, "blocksize", None) or 64
    if bnb_type != "int8" and getattr(new, "support_avx512bf16_for_cpu", False) and (
            out_features % 32 or in_features % block):
        # bnb's AVX512-BF16 CPU repack (done at the first no-grad eval forward) needs N % 32 == 0 ("N must be
        # divisible by block_n") and K % blocksize == 0 (it reshapes absmax to [N, K / blocksize]): use its
        # generic kernel instead
        new.support_avx512bf16_for_cpu = False
        why = f"N={out_features} not a multiple of 32" if out_features % 32 else f"K={in_features} not a " \
            f"multiple of {block}"
        set_attr(new, LAYER_PATH, get_attr(new, LAYER_PATH) + f" (generic CPU kernel: {why})")
    return new


def _check_layer(layer: nn.Module, name: str, bnb_type: str, dtype: torch.dtype) -> None:
    """One tiny forward, so an unsupported shape fails here with a clear message, not mid-generation."""
    weight = layer.weight
    x = torch.zeros(1, 2, layer.in_features, device=weight.device, dtype=dtype)
    layer.eval()  # as in generation: bnb picks its CPU kernel (and repacks) at the first no-grad eval forward
    try:
        with torch.no_grad():
            layer(x)
    except (AssertionError, RuntimeError, NotImplementedError, ValueError) as err:
        raise HfspecError(f"draft: bnb-{bnb_type} cannot run layer {name!r} ({layer.in_features}->"
                          f"{layer.out_features}) on {weight.device.type}: {err}; allowed here: rtn4 "
                          "(or rtn2..rtn8, bnb-int8)") from err



def _parse(text: str, low: str) -> DraftSpec | None:
    if not low.startswith("bnb"):
        return None
    kind = low[4:] if low[3:4] in "-_" else ""
    if kind not in BNB_KINDS:
        raise fail(f"unknown bitsandbytes type {text!r} (allowed: {', '.join('bnb-' + k for k in BNB_KINDS)})")
    return DraftSpec("bnb", bnb_type=kind)


KIND = DraftKind(
    name="bnb", title="quantised copy (bitsandbytes)", allowed=", ".join("bnb-" + k for k in BNB_KINDS),
    parse=_parse, build=lambda target, spec, options: make_bnb_draft(target, spec.bnb_type),
    label=lambda s: f"bnb-{s.bnb_type}",
    fields=(Field("bnb_type", "type", "nf4", choices=BNB_KINDS),),
    spec_of=lambda values: f"bnb-{values['bnb_type']}", values=lambda s: {"bnb_type": s.bnb_type},
    copies_target=True, examples=tuple("bnb-" + k for k in BNB_KINDS),
)
