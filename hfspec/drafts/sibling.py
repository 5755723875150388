"""Sibling drafts: a smaller model that must share the target's tokenizer."""

from __future__ import annotations

import os
import re

from torch import nn

from hfspec.attrs import SHARED_VOCAB, set_attr
from hfspec.drafts.registry import DraftKind, DraftSpec, Field, fail
from hfspec.errors import HfspecError
from hfspec.io.loading import load_model, load_tokenizer

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name


def check_same_tokenizer(tok_a, tok_b) -> None:
    """Raise HfspecError unless both tokenizers have the same size and the same token string for every id."""
    size_a, size_b = len(tok_a), len(tok_b)
    if size_a != size_b:
        raise HfspecError(f"draft: tokenizer has {size_b} tokens but the target's has {size_a}; allowed: a draft "
                          "sharing the target's tokenizer (same vocabulary), or a quantised copy such as rtn4")
    tokens_a = tok_a.convert_ids_to_tokens(list(range(size_a)))
    tokens_b = tok_b.convert_ids_to_tokens(list(range(size_b)))
    for i, (a, b) in enumerate(zip(tokens_a, tokens_b, strict=True)):
        if a != b:
            raise HfspecError(f"draft: tokenizer differs from the target's at id {i} ({b!r} vs {a!r}); allowed: "
                              "a draft sharing the target's tokenizer, or a quantised copy such as rtn4")


def check_sibling(target: nn.Module, draft: nn.Module, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Check a sibling draft can propose tokens for `target` (tokenizers, embedding rows).

    When the tokenizers match but the models have different numbers of vocabulary rows (padding on either
    side), the draft is marked with `SHARED_VOCAB` (`hfspec.attrs`) = the tokenizer's size: decoding then never proposes
    a draft row beyond it, and target rows beyond the draft's get q = 0 (`validate.check_pair`).
    """
    t_rows, d_rows = _vocab_rows(target), _vocab_rows(draft)
    if target_tokenizer is not None and draft_tokenizer is not None:
        check_same_tokenizer(target_tokenizer, draft_tokenizer)
        needed = len(target_tokenizer)
        for role, rows in (("target", t_rows), ("draft", d_rows)):
            if rows is not None and rows < needed:
                raise HfspecError(f"draft: the {role} model has {rows} vocabulary rows, fewer than the "
                                  f"tokenizer's {needed} tokens; allowed: models covering the whole tokenizer")
        if t_rows is not None and d_rows is not None and t_rows != d_rows:
            set_attr(draft, SHARED_VOCAB, needed)
    elif t_rows is not None and d_rows is not None and t_rows != d_rows:
        raise HfspecError(f"draft: vocab_size {d_rows} differs from the target's {t_rows} and no tokenizers were "
                          "given to check them; pass target_tokenizer= and draft_tokenizer= (padded vocabularies "
                          "are allowed when the tokenizers match)")


def _vocab_rows(model: nn.Module) -> int | None:
    """Rows of the output layer (what decoding sees), else the config's vocab_size."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None and weight.dim() == 2:
        return int(weight.shape[0])
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(config, "vocab_size", None)


def _local_tokenizer(model: nn.Module):
    """The tokenizer saved next to a model loaded from a local folder, else None."""
    path = getattr(model, "name_or_path", "") or ""
    if not path or not os.path.isdir(path):
        return None
    try:
        return _load_tokenizer(path, role="target")
    except (HfspecError, OSError, ValueError):
        return None


def _load_tokenizer(source, role: str):
    return load_tokenizer(source, role=role)


def load_sibling(target: nn.Module, source, target_tokenizer=None, draft_tokenizer=None, **load_options) -> nn.Module:
    """Load a sibling draft (folder or hub id) onto the target's device and check it against the target."""
    options = {"dtype": _float_dtype(target), "device": _device_name(target), **load_options}
    draft = load_model(source, role="draft", **options)
    if draft_tokenizer is None:
        draft_tokenizer = _load_tokenizer(source, role="draft")
    if target_tokenizer is None:
        target_tokenizer = _local_tokenizer(target)
    check_sibling(target, draft, target_tokenizer, draft_tokenizer if target_tokenizer is not None else None)
    return draft


def _float_dtype(model: nn.Module):
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _device_name(model: nn.Module) -> str:
    device = next((p.device for p in model.parameters() if p.device.type != "meta"), None)
    return str(device) if device is not None else "cpu"


def _parse(text: str, low: str) -> DraftSpec | None:
    path = os.path.expanduser(text)
    if os.path.exists(path):
        return DraftSpec("sibling", source=path)
    if _HUB_ID.fullmatch(text):
        return DraftSpec("sibling", source=text)
    if text.startswith((".", "/", "~")) or "/" in text or os.sep in text:
        raise fail(f"folder {text!r} not found")
    return None


KIND = DraftKind(
    name="sibling", title="smaller sibling model", allowed="a model folder / hub id",
    parse=_parse, build=lambda target, spec, options: load_sibling(target, spec.source, **options),
    label=lambda s: str(s.source),
    fields=(Field("source", "folder or hub id", "", text=True),),
    spec_of=lambda values: str(values.get("source", "")).strip(), values=lambda s: {"source": str(s.source)},
    options=None, names_model=True,
)
