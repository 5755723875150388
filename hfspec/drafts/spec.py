"""Parse draft specs: "rtn4", "rtn3-g64", "bnb-nf4" | "bnb-fp4" | "bnb-int8", a folder or hub id, or a model."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from torch import nn

from hfspec.errors import HfspecError

ALLOWED = "rtn2..rtn8[-gN], bnb-nf4, bnb-fp4, bnb-int8, or a model folder / hub id"
BNB_KINDS = ("nf4", "fp4", "int8")
DEFAULT_GROUP_SIZE = 32
_RTN = re.compile(r"rtn(\d+)(?:-g(\d+))?")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name


@dataclass(frozen=True)
class DraftSpec:
    """What kind of draft to build. kind: "rtn" | "bnb" | "sibling" | "model"."""

    kind: str
    bits: int | None = None
    group_size: int | None = None
    bnb_type: str | None = None
    source: object = None

    @property
    def label(self) -> str:
        """Canonical spelling, e.g. "rtn4-g32", "bnb-nf4", or the sibling's source."""
        if self.kind == "rtn":
            return f"rtn{self.bits}-g{self.group_size}"
        if self.kind == "bnb":
            return f"bnb-{self.bnb_type}"
        return str(self.source) if self.kind == "sibling" else type(self.source).__name__


def _fail(why: str) -> HfspecError:
    return HfspecError(f"draft: {why}; allowed specs: {ALLOWED}")


def parse_draft_spec(spec) -> DraftSpec:
    """Read a draft spec; raise HfspecError naming the field and the allowed specs on a bad one."""
    if isinstance(spec, DraftSpec):
        return spec
    if isinstance(spec, nn.Module):
        return DraftSpec("model", source=spec)
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise _fail(f"expected a spec string or a model, got {spec!r}")
    text = spec.strip()
    low = text.lower()
    if low.startswith("rtn"):
        return _parse_rtn(text, low)
    if low.startswith("bnb"):
        kind = low[4:] if low[3:4] in "-_" else ""
        if kind not in BNB_KINDS:
            raise _fail(f"unknown bitsandbytes type {text!r} (allowed: bnb-nf4, bnb-fp4, bnb-int8)")
        return DraftSpec("bnb", bnb_type=kind)
    path = os.path.expanduser(text)
    if os.path.exists(path):
        return DraftSpec("sibling", source=path)
    if _HUB_ID.fullmatch(text):
        return DraftSpec("sibling", source=text)
    if text.startswith((".", "/", "~")) or "/" in text or os.sep in text:
        raise _fail(f"folder {text!r} not found")
    raise _fail(f"unknown spec {text!r}")


def _parse_rtn(text: str, low: str) -> DraftSpec:
    match = _RTN.fullmatch(low)
    if not match:
        raise _fail(f"cannot read {text!r} (write rtnB or rtnB-gN, e.g. rtn4, rtn3-g64)")
    bits = int(match.group(1))
    if not 2 <= bits <= 8:
        raise _fail(f"bits must be 2..8, got {bits}")
    group = int(match.group(2)) if match.group(2) else DEFAULT_GROUP_SIZE
    if not 8 <= group <= 8192:
        raise _fail(f"group size must be 8..8192, got {group}")
    return DraftSpec("rtn", bits=bits, group_size=group)
