"""Draft spec strings (kept for imports that predate the registry): see `hfspec.drafts.registry`."""

from __future__ import annotations

from hfspec.drafts.kinds import BNB_KINDS, DEFAULT_GROUP_SIZE
from hfspec.drafts.registry import DraftSpec, allowed
from hfspec.drafts.registry import parse as parse_draft_spec

__all__ = ["BNB_KINDS", "DEFAULT_GROUP_SIZE", "DraftSpec", "parse_draft_spec"]


def __getattr__(name: str):
    if name == "ALLOWED":
        return allowed()
    raise AttributeError(name)
