"""hfspec: exact speculative decoding for Hugging Face causal LMs."""

from hfspec.api import SpeculativeOutput, generate, plain_generate, speculative_generate
from hfspec.compat import estimated_speedup  # deprecated: paper_speedup (hfspec.compat)
from hfspec.decoding.stats import SpecStats, expected_tokens_per_pass, optimal_gamma, paper_speedup
from hfspec.decoding.trees import TreeShape
from hfspec.errors import HfspecError

__all__ = [
    "HfspecError",
    "SpecStats",
    "SpeculativeOutput",
    "TreeShape",
    "estimated_speedup",  # deprecated
    "expected_tokens_per_pass",
    "generate",
    "make_draft",
    "optimal_gamma",
    "paper_speedup",
    "plain_generate",
    "speculative_generate",
]


def make_draft(target, spec, **options):
    """Build a draft for `target`: "rtn4", "rtn3-g64", "bnb-int8", a sibling folder / hub id, or a model."""
    from hfspec.drafts import make_draft as _make_draft

    return _make_draft(target, spec, **options)
