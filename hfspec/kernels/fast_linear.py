"""An fp32 verify pass at nearer the price of a one-token step: oneDNN-prepacked weights for multi-row linears.

On CPUs torch's fp32 `F.linear` runs MKL: sgemv for one row, sgemm for more, and sgemm over the 2-16 rows of a
verify pass costs 2-2.7x the one-row call at the shapes of 1-2B models (it repacks the weight every call). A
weight reordered once into oneDNN's blocked layout (what inductor's freezing does) skips that repacking
(`benchmarks/bench_fp32_linear.py` measures both). `prepack(model)` gives each plain fp32 `nn.Linear` of the
model such a copy and sends every call through it, one row too: on the 2-core AVX-512 EPYC VM (3 December 2026)
oneDNN's one-row product took 0.72-0.79x MKL's sgemv at SmolLM2-1.7B's MLP shapes, and a whole SmolLM2-135M step
0.87x, so plain decoding of a prepacked model is faster too, and its 5-position verify pass costs about one of
its own steps (`benchmarks/bench_verify_width.py --dtypes float32+prepack`). Until then one-row calls had kept
`F.linear` (MIN_ROWS 2). On an Intel AMX CPU it is the other way round (oneDNN's one-row product 1.3x sgemv, MKL's
2-3-row sgemm about one row), so there only calls of 4 rows or more take the prepacked weight (`min_rows`), and
prepacking gains little. What the model computes changes only by float rounding (another summation order).

The price is memory: a second fp32 copy of every linear weight (`prepack` returns the bytes it added), which is
why it is opt-in: `hfspec.kernels.fast_linear.prepack(target)`, undone by `unprepack(target)`. bf16 / fp16 models are
left alone (oneDNN's half-precision matmul over a few rows already costs about one row).
"""

from __future__ import annotations

import types
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import nn

from hfspec.attrs import NAMESPACE, PACKED, del_attr, get_attr, has_attr, set_attr
from hfspec.kernels.cpu import cpu_kind

MIN_ROWS = 1  # calls with at least this many rows use the prepacked weight
# ...except on an Intel AMX CPU ("cpu-amx"; 5 December 2026, benchmarks/results/xeon-2c-2026-12-05-verify-width.md):
# there oneDNN's one-row product is 1.3x MKL's sgemv and MKL's 2-3-row sgemm costs 1.02-1.07x one row, so prepacked
# weights pay only from 4 rows (5 positions 1.51x the one-token step against 1.54x unpacked: little gained there)
MIN_ROWS_BY_KIND = {"cpu-amx": 4}


def min_rows() -> int:
    """The fewest rows a call needs to use the prepacked weight on this CPU (`MIN_ROWS`, `MIN_ROWS_BY_KIND`)."""
    return MIN_ROWS_BY_KIND.get(cpu_kind(), MIN_ROWS)


def available() -> bool:
    """True when this torch has oneDNN's prepacked fp32 linear and it computes F.linear on a probe."""
    try:
        w = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
        x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.backends.mkldnn.is_available() and torch.allclose(got, F.linear(x, w), atol=1e-5))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


class _Packed:
    """A linear weight in oneDNN's layout, with the version of the weight it was made from. A deep copy of the
    module (e.g. a quantised draft's skeleton) gets no packed weight and runs F.linear: the copy's weights may
    change, and an opaque oneDNN tensor cannot be copied anyway."""

    def __init__(self, weight: torch.Tensor):
        self.version = weight._version
        self.min_rows = min_rows()
        self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)

    def __deepcopy__(self, memo):
        return None


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    space = self.__dict__[NAMESPACE]  # `get_attr(self, PACKED)`, read directly: this runs on every call
    packed = space[PACKED]
    rows = x.numel() // self.in_features if x.dim() else 0
    if (packed is None or rows < packed.min_rows or x.dtype != torch.float32 or x.device.type != "cpu"
            or torch.is_grad_enabled()):
        return F.linear(x, self.weight, self.bias)
    if packed.version != self.weight._version:  # the weight changed in place since: pack it again
        packed = space[PACKED] = _Packed(self.weight)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, self.in_features), packed.tensor, self.bias,
                                           "none", [], "")
    return y.view(*x.shape[:-1], self.out_features)


def _packable(module: nn.Module) -> bool:
    """A plain fp32 CPU `nn.Linear` not yet prepacked: what `prepack` gives a copy."""
    return (type(module) is nn.Linear and not has_attr(module, PACKED) and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu")


def unpacked_bytes(model: nn.Module) -> int:
    """Bytes `prepack(model)` would add (its weights that qualify and are not yet prepacked)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if _packable(m))


def prepack(model: nn.Module) -> int:
    """Give every plain fp32 CPU `nn.Linear` of `model` a oneDNN-prepacked copy used for calls of MIN_ROWS rows
    or more; returns the bytes added (0 when oneDNN is unavailable or nothing qualifies). Idempotent."""
    if not available():
        return 0
    modules = [module for module in model.modules() if _packable(module)]
    with torch.no_grad(), ThreadPoolExecutor(max(1, min(2, torch.get_num_threads()))) as pool:
        packed = list(pool.map(lambda module: _Packed(module.weight), modules))  # (2 at a time: 2.6x faster here)
    added = 0
    for module, copy in zip(modules, packed, strict=True):
        set_attr(module, PACKED, copy)
        module.forward = types.MethodType(_forward, module)
        added += module.weight.numel() * module.weight.element_size()
    return added


def unprepack(model: nn.Module) -> None:
    """Drop the prepacked copies: every linear runs `F.linear` again."""
    for module in model.modules():
        if has_attr(module, PACKED):
            del_attr(module, PACKED)
            del module.forward  # the instance attribute: nn.Linear.forward again


def prepacked_bytes(model: nn.Module) -> int:
    """Bytes of the prepacked copies `model` holds (they are not parameters, so `weight_bytes` leaves them out)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
               if get_attr(m, PACKED) is not None)
