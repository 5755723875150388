"""The RTN builder lives with its kind in `hfspec.drafts.rtn`; this name stays importable."""

from hfspec.drafts.rtn import make_rtn_draft

__all__ = ["make_rtn_draft"]
