"""The import path `hfspec.exactness` that hfspec 0.1's docs showed (`from hfspec.exactness import check_greedy`);
the module is `hfspec.audit.exactness`. Kept for code written against those docs."""

from hfspec.audit.exactness import check_greedy, exactness_note, use_bitwise_verify

__all__ = ["check_greedy", "exactness_note", "use_bitwise_verify"]
