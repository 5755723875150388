"""Which weight layers a quantised copy may replace, and with what, so that each keeps its forward's meaning.

A replacement is only made when hfspec knows the layer's forward exactly:
  * `nn.Linear`, transformers' `Conv1D` (x @ W + b, W stored [in, out]) and nn.Linear subclasses whose forward
    is still x @ W.T + b (`LINEAR_ALIKE`)                         -> QuantLinear
  * `nn.Embedding` (no max_norm)                                  -> QuantEmbedding
  * nn.Embedding subclasses whose forward is W[ids] * embed_scale (`SCALED_EMBEDDINGS`, e.g. Gemma's
    `*TextScaledWordEmbedding`)                                   -> QuantEmbedding keeping embed_scale
  * embedding subclasses with another forward that hfspec leaves in float (`KEEP_FLOAT`, e.g. OPT's learned
    positions, which take an attention mask rather than ids)
Any other subclass of nn.Linear / nn.Embedding / Conv1D is refused with an HfspecError naming the layer.
The subclasses are matched by class name, then their forward is checked once per class on a small probe.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hfspec.errors import HfspecError

try:  # GPT-2 style layers: y = x @ W + b with W stored [in, out]
    from transformers.pytorch_utils import Conv1D
except ImportError:  # pragma: no cover
    Conv1D = ()

LINEAR, EMBEDDING, SCALED_EMBEDDING, KEEP = "linear", "embedding", "scaled embedding", "keep"

LINEAR_ALIKE = frozenset({"FalconLinear"})  # forward: input @ W.T (+ b)
SCALED_EMBEDDINGS = frozenset({  # forward: nn.Embedding.forward(ids) * embed_scale (cast to the weight's dtype)
    "GemmaTextScaledWordEmbedding", "Gemma2TextScaledWordEmbedding", "Gemma3TextScaledWordEmbedding",
    "Gemma3nTextScaledWordEmbedding", "Gemma4TextScaledWordEmbedding", "VaultGemmaTextScaledWordEmbedding",
    "MiniCPM3ScaledWordEmbedding", "XGLMScaledWordEmbedding", "BioGptScaledWordEmbedding",
})
KEEP_FLOAT = frozenset({"OPTLearnedPositionalEmbedding"})


def layer_kind(name: str, module: nn.Module) -> str:
    """LINEAR, EMBEDDING, SCALED_EMBEDDING or KEEP for a Linear / Conv1D / Embedding layer; HfspecError otherwise."""
    cls = type(module)
    if cls is nn.Linear or (Conv1D and cls is Conv1D):
        return LINEAR
    if cls is nn.Embedding or (cls.__name__ in SCALED_EMBEDDINGS and isinstance(module, nn.Embedding)):
        if module.max_norm is not None:
            raise HfspecError(f"draft: cannot quantise layer {name!r}: its embedding renormalises rows "
                              f"(max_norm={module.max_norm}); allowed: embeddings without max_norm")
        return EMBEDDING if cls is nn.Embedding else SCALED_EMBEDDING
    if cls.__name__ in LINEAR_ALIKE and isinstance(module, nn.Linear):
        return LINEAR
    if cls.__name__ in KEEP_FLOAT and isinstance(module, nn.Embedding):
        return KEEP
    base = "nn.Embedding" if isinstance(module, nn.Embedding) else "nn.Linear" if isinstance(
        module, nn.Linear) else "Conv1D"
    known = sorted(LINEAR_ALIKE | SCALED_EMBEDDINGS | KEEP_FLOAT)
    raise HfspecError(
        f"draft: cannot quantise layer {name!r}: {cls.__module__}.{cls.__qualname__} is a {base} subclass whose "
        "forward hfspec does not know, and replacing it could silently change the model; allowed: targets whose "
        f"weight layers are plain nn.Linear / nn.Embedding / Conv1D or one of {', '.join(known)} (an already "
        "quantised or adapter-wrapped target is not supported: load it in float, or use a sibling draft)")


def embed_scale(module: nn.Module) -> torch.Tensor:
    """The factor a scaled embedding multiplies its rows by."""
    return torch.as_tensor(module.embed_scale, device=module.weight.device)


def check_forward(name: str, module: nn.Module, kind: str) -> None:
    """Check on a probe that a subclass's forward computes what `kind` reproduces (HfspecError if not)."""
    if type(module) in (nn.Linear, nn.Embedding) or kind == KEEP or (Conv1D and type(module) is Conv1D):
        return
    weight = module.weight
    if weight.device.type == "meta":
        return
    with torch.no_grad():
        if kind == SCALED_EMBEDDING:
            ids = torch.tensor([0, weight.shape[0] - 1], device=weight.device)
            want = F.embedding(ids, weight) * embed_scale(module).to(weight.dtype)
            what = "rows * embed_scale"
            got = module(ids)
        else:
            gen = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(2, weight.shape[1], generator=gen).to(weight.device, weight.dtype)
            want, what = F.linear(x, weight, module.bias), "x @ W.T + b"
            got = module(x)
    eps = torch.finfo(want.dtype).eps if want.is_floating_point() else 0.0
    tol = 64 * eps * float(want.abs().max().clamp_min(1.0))
    if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=0.0, atol=tol):
        raise HfspecError(f"draft: cannot quantise layer {name!r}: {type(module).__qualname__}.forward no longer "
                          f"computes {what} (checked on a probe); allowed: layers whose forward hfspec knows")
