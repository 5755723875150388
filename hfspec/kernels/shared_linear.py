"""The target's own float linears as the lean decoder's matrices, shared: what the lean *target* path runs
(`hfspec.kernels.lean_target`).

A lean draft of float weights (a smaller sibling) fuses Q/K/V and gate/up into one matrix and permutes the rows
of W_q and W_k for its rotary (`hfspec.kernels.lean_layers._Block`): copies of about two thirds of a layer's
weights. For the target that would double most of its memory, so here each part stays the target's own tensor
(no copy, no fusion), each product goes through `hfspec.kernels.verify_linear.linear` (the few-row kernel for a
verify pass's rows, `F.linear` for one row and for a prompt), and the block permutes the few output columns
instead of the weight rows (`pair_columns`).
"""

from __future__ import annotations

import torch

from hfspec.kernels import verify_linear


class SharedLinear:
    """y = [x W_1ᵀ + b_1, x W_2ᵀ + b_2, ...] over weight parts [N_i, K] that stay the target's own tensors."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor | None]]):
        self.parts = [(w.detach(), None if b is None else b.detach()) for w, b in parts]
        self.out_features = sum(w.shape[0] for w, _ in self.parts)
        self.in_features = self.parts[0][0].shape[1]
        self.path = f"the target's own {self.parts[0][0].dtype} weights, shared ({verify_linear.status()})"

    def matmul(self):
        """A function x [M, K] -> [M, N] in the weights' dtype: the few-row kernel where it takes the rows."""
        parts = self.parts
        linear = verify_linear.linear if verify_linear.running() else torch.nn.functional.linear
        if len(parts) == 1:
            (w, b), = parts
            return lambda x: linear(x, w, b)
        return lambda x: torch.cat([linear(x, w, b) for w, b in parts], dim=-1)

    def tensors(self) -> list[torch.Tensor]:
        """The tensors read (the target's own): a test checks that nothing was copied."""
        return [t for pair in self.parts for t in pair if t is not None]


def head_order(head_dim: int, rot: int) -> torch.Tensor:
    """Within one head: its first `rot` dimensions from (0..R/2-1, R/2..R-1) to interleaved (0, R/2, 1, R/2+1, ...),
    so that HF's rotate-half pairs sit side by side for the lean step's rotary of pairs."""
    half = rot // 2
    order = torch.arange(head_dim)
    order[:rot] = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return order


def pair_columns(heads: int, kv_heads: int, head_dim: int, rot: int) -> torch.Tensor:
    """Column order of a QKV product [q heads | k heads | v heads] with `head_order` in each q and k head, as
    `pair_rotary_rows` orders a draft's copy of the weight rows: these columns of x Wᵀ equal x (W permuted)ᵀ."""
    qk = _rows_in_head_order(heads + kv_heads, head_dim, rot)
    return torch.cat([qk, torch.arange((heads + kv_heads) * head_dim, (heads + 2 * kv_heads) * head_dim)])


def pair_rotary_rows(w: torch.Tensor | None, heads: int, head_dim: int, rot: int) -> torch.Tensor | None:
    """A draft's copy of W_q or W_k (or their biases; a per-head norm weight) with each head's rows in
    `head_order`."""
    if w is None:
        return None
    if w.dim() >= 1 and w.shape[0] == heads * head_dim:
        return w[_rows_in_head_order(heads, head_dim, rot)]
    return w[head_order(head_dim, rot)]


def _rows_in_head_order(heads: int, head_dim: int, rot: int) -> torch.Tensor:
    """Indices of `heads` consecutive heads' rows, each head's in `head_order`."""
    return (torch.arange(heads)[:, None] * head_dim + head_order(head_dim, rot)[None]).flatten()
