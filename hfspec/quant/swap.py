"""Module swapping: build an RTN-quantised copy of a model, layer by layer, without a second float copy."""

from __future__ import annotations

import copy
from collections import Counter

import torch
from torch import nn

from hfspec.attrs import LAYER_PATH, get_attr
from hfspec.errors import HfspecError
from hfspec.quant.known_layers import KEEP, SCALED_EMBEDDING, Conv1D, check_forward, embed_scale, layer_kind
from hfspec.quant.modules import QuantEmbedding, QuantLinear, QuantWeight, fused_int4_reason


def weight_matrices(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every Linear, Conv1D and Embedding module of `model`, by name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear | nn.Embedding | Conv1D)]


def replaceable_layers(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, kind) of every weight layer a quantised copy replaces (see `known_layers`); kept layers
    are left out, and an unknown Linear / Embedding subclass raises HfspecError naming it."""
    layers, checked = [], set()
    for name, module in weight_matrices(model):
        kind = layer_kind(name, module)
        if type(module) not in checked:
            check_forward(name, module, kind)
            checked.add(type(module))
        layers.append((name, module, kind))
    kept = {id(m.weight) for _, m, kind in layers if kind == KEEP}
    for name, module, kind in layers:
        if kind != KEEP and id(module.weight) in kept:
            raise HfspecError(f"draft: cannot quantise layer {name!r}: its weight is tied to a layer kept in float; "
                              "allowed: untied weights for such layers")
    return [(name, module, kind) for name, module, kind in layers if kind != KEEP]


def as_linear_weight(module: nn.Module) -> torch.Tensor:
    """The module's weight as [out, in] (Conv1D stores it transposed)."""
    return module.weight.t() if isinstance(module, Conv1D) else module.weight


def copy_skeleton(model: nn.Module, replace: dict[int, nn.Parameter | None]) -> nn.Module:
    """Deep copy of `model` in which each parameter whose id is a key of `replace` becomes the mapped value
    (None: an empty tensor on the meta device, to be swapped out). Everything else (norms, biases) is copied."""
    params = {id(p): p for p in model.parameters()}
    memo = {key: value if value is not None else _meta_like(params[key]) for key, value in replace.items()}
    return copy.deepcopy(model, memo)


def _meta_like(p: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)


def quantize_model(model: nn.Module, bits: int, group_size: int = 32, fused: bool | None = None,
                   codes: dict | None = None) -> nn.Module:
    """RTN copy of `model`: every Linear / Conv1D / Embedding weight packed at `bits` with groups along K.

    Each replacement keeps its layer's forward (biases, Conv1D's transposed weight, scaled embeddings); layers
    it cannot reproduce are refused or kept in float (see `known_layers`).
    fused: use the CPU int4 kernel where a layer allows it (default: when the weights are on the CPU).
    Tied weights (one Parameter used by several modules) get one shared `QuantWeight`. `model` is not changed.
    codes: id(float weight) -> `hfspec.quant.calibrate.Coded` at `bits` / `group_size` (a calibrated draft's),
    stored instead of the weight's RTN codes.
    """
    layers = replaceable_layers(model)
    users: dict[int, list[nn.Module]] = {}
    for _, module, _ in layers:
        users.setdefault(id(module.weight), []).append(module)
    draft = copy_skeleton(model, dict.fromkeys(users))
    storages: dict[int, QuantWeight] = {}
    for name, module, kind in layers:
        key = id(module.weight)
        if key not in storages:
            storages[key] = _quantize_weight(users[key], bits, group_size, fused, (codes or {}).get(key))
        qweight = storages[key]
        if isinstance(module, nn.Embedding):
            scale = embed_scale(module) if kind == SCALED_EMBEDDING else None
            new = QuantEmbedding(qweight, module.padding_idx, scale)
        else:
            new = QuantLinear(qweight, module.bias)
        draft.set_submodule(name, new)
    leftovers = [n for n, p in draft.named_parameters() if p.device.type == "meta"]
    if leftovers:
        raise RuntimeError(f"quantize_model: weights left unquantised: {leftovers}")
    draft.eval()
    return draft


def _quantize_weight(modules: list[nn.Module], bits: int, group_size: int, fused: bool | None,
                     coded=None) -> QuantWeight:
    """Quantise the weight shared by `modules` (or store its given `coded` codes), in the fused layout when a
    matmul uses it and its shape fits."""
    w = as_linear_weight(modules[0]).detach()
    with torch.no_grad():
        use_fused = fused is not False and any(not isinstance(m, nn.Embedding) for m in modules)
        use_fused = use_fused and fused_int4_reason(bits, group_size, *w.shape, w.device) is None
        if coded is not None:
            return QuantWeight.from_codes(coded.q, coded.scale, coded.zero, bits, group_size, w.dtype, use_fused)
        return QuantWeight.from_float(w, bits, group_size, fused=use_fused)


def describe(model: nn.Module) -> list[dict]:
    """One entry per weight-holding layer: name, kind, shape and the path its forward takes."""
    rows = []
    for name, module in model.named_modules():
        entry = _describe_module(module)
        if entry is not None:
            rows.append({"name": name, **entry})
    return rows


def summary(model: nn.Module) -> dict[str, int]:
    """Count of layers per path."""
    return dict(Counter(row["path"] for row in describe(model)))


def _describe_module(module: nn.Module) -> dict | None:
    lean_path = getattr(module, "path", None) if type(module).__name__ == "LeanLinear" else None
    if lean_path is not None:  # a lean draft's weight (hfspec.kernels.lean)
        return {"kind": "linear", "shape": (module.out_features, module.in_features), "path": f"lean: {lean_path}"}
    if isinstance(module, QuantLinear | QuantEmbedding):
        q = module.qweight
        kind = "embedding" if isinstance(module, QuantEmbedding) else "linear"
        if kind == "embedding":
            path = f"rtn{q.bits} row lookup ({q.layout} layout)"
        elif q.layout == "int4_cpu":
            path = f"rtn{q.bits} {q.path}"
        else:
            why = fused_int4_reason(q.bits, q.group_size, q.out_features, q.in_features, q.packed.device)
            path = f"rtn{q.bits} {q.path}" + (f" (no fused kernel: {why})" if q.bits == 4 and why else "")
        return {"kind": kind, "shape": (q.out_features, q.in_features), "path": path}
    bnb_path = get_attr(module, LAYER_PATH)
    if bnb_path is not None:
        return {"kind": "linear", "shape": (module.out_features, module.in_features), "path": bnb_path}
    if isinstance(module, nn.Linear | nn.Embedding | Conv1D):
        kind = "embedding" if isinstance(module, nn.Embedding) else "linear"
        return {"kind": kind, "shape": tuple(as_linear_weight(module).shape), "path": f"{module.weight.dtype} float"}
    return None
