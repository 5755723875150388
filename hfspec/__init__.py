"""hfspec: exact speculative decoding for Hugging Face causal LMs."""

from hfspec.api import SpeculativeOutput, generate, make_draft, plain_generate, speculative_generate
from hfspec.compat import estimated_speedup  # deprecated: paper_speedup (hfspec.compat)
from hfspec.decoding.stats import SpecStats, expected_tokens_per_pass, optimal_gamma, paper_speedup
from hfspec.decoding.tree_shape import TreeShape
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

