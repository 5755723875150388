"""Error-compensating group quantisation (GPTQ: Frantar, Ashkboos, Hoefler & Alistarh, ICLR 2023, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers"), in hfspec's RTN format.

RTN rounds every weight to its nearest grid point on its own. GPTQ quantises a weight [N, K] one input column at a
time and spreads each column's rounding error over the columns not yet quantised, weighted by the inverse of the
layer's input Hessian H = Σ x xᵀ over calibration activations, so that the layer's *outputs* W x stay close
rather than its weights. The codes, scales and zeros it returns are exactly `groupwise.group_quantize`'s format
(asymmetric, groups of `group_size` along K, fp16 scale rounded up and zero rounded down), so every storage and
kernel that runs an RTN draft runs a GPTQ one at the same bytes.

Tensor functions first (`hessian_update`, `gptq_quantize`), each testable alone; `hfspec.quant.refit` moves the
grids GPTQ chose to where the layer's outputs are closest; `hfspec.quant.calibrate` collects Hessians from a model
and `hfspec.drafts.calibrated` builds drafts from the result.
"""

from __future__ import annotations

import torch

from hfspec.quant.groupwise import _qparams_of_groups
from hfspec.quant.refit import DAMP, refit_grid  # noqa: F401  (refit_grid: its home before hfspec.quant.refit)

BLOCK = 32  # columns whose errors are propagated lazily as one matrix product (the paper's "lazy batch")
OUTER = 256  # ... and blocks whose errors reach the columns beyond them as one product (long inner dimension)
SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8)  # candidate shrinks of a group's [min, max] range (the least squared error wins)
GRID_ROWS = 65536  # groups whose grids `group_grid` chooses at once


def hessian_update(h: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """H + xᵀx for activations x [..., K] (fp64 accumulation, so long calibrations do not lose precision)."""
    x = x.reshape(-1, x.shape[-1]).double()
    xtx = x.t() @ x
    return xtx if h is None else h.add_(xtx)


def group_grid(w: torch.Tensor, bits: int, shrink: tuple[float, ...] = SHRINK) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) fp16 [N] for a group of columns w [N, g]: RTN's min/max grid, or a shrunk range when that
    rounds the group with less squared error (outliers clipped; the format is the same). Rows are taken
    GRID_ROWS at a time, so that the candidates' passes over them stay in the CPU's cache (the same values; at
    SmolLM2-135M's 60 gate/up matrices 0.72 s instead of 1.60 on two cores)."""
    if w.shape[0] > GRID_ROWS:
        parts = [_group_grid(w[i:i + GRID_ROWS], bits, shrink) for i in range(0, w.shape[0], GRID_ROWS)]
        return torch.cat([s for s, _ in parts]), torch.cat([z for _, z in parts])
    return _group_grid(w, bits, shrink)


def _group_grid(w: torch.Tensor, bits: int, shrink: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    best_scale, best_zero, best_err = None, None, None
    top = 2**bits - 1
    for s in shrink:
        mid = (lo + hi) / 2
        g = torch.stack([mid + (lo - mid) * s, mid + (hi - mid) * s], dim=1)  # [N, 2]: the range's ends
        scale, zero = _qparams_of_groups(g[:, None, :], bits)
        scale, zero = scale[:, 0], zero[:, 0]
        err = _round(w, scale, zero, top).sub_(w).square_().sum(dim=1)
        if best_err is None:
            best_scale, best_zero, best_err = scale, zero, err
        else:
            better = err < best_err
            best_scale = torch.where(better, scale, best_scale)
            best_zero = torch.where(better, zero, best_zero)
            best_err = torch.where(better, err, best_err)
    return best_scale, best_zero


def _codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, top: int) -> torch.Tensor:
    """Codes of w [N, ...] on the grid (scale, zero) [N] (broadcast over trailing dims), clamped to 0..top."""
    s, z = scale.float(), zero.float()
    shape = (-1,) + (1,) * (w.dim() - 1)
    safe = torch.where(s > 0, s, torch.ones_like(s)).view(shape)
    return (w - z.view(shape)).div_(safe).round_().clamp_(0, top)  # (one new tensor; the rest in place)


def _round(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, top: int) -> torch.Tensor:
    shape = (-1,) + (1,) * (w.dim() - 1)
    return _codes(w, scale, zero, top).mul_(scale.float().view(shape)).add_(zero.float().view(shape))


def error_feedback(h: torch.Tensor, damp: float = DAMP, order: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [K, K] fp32 strictly upper, mask of dead columns) for H [K, K] (its rows and columns taken in the sweep's
    column `order`, default as they are) after dampening, where H = (I + A) D (I + A)ᵀ (its UDUᵀ factorisation, D
    diagonal): GPTQ's error feedback in "pull" form. Column j of the sweep is rounded from
    w_j + Σ_{i<j} (w_i − ŵ_i) A_ij, the original weights' rounding errors of the columns before it, which is the
    paper's update with the upper Cholesky factor U of H⁻¹ (A = (U / diag U)⁻¹ − I; Chee, Cai, Kuleshov & De Sa,
    NeurIPS 2023, "QuIP", show GPTQ is this LDL rounding). It costs one Cholesky factor of the reversed H and no
    inverse: at K = 8192, about 2 s instead of the inverse route's 18 s on two cores (the reversal and the order
    are one gather of the fp32 copy).
    A column no calibration activation reached (diag 0) gets H_ii = 1 so the factor exists; its weights are
    rounded plainly."""
    k = h.shape[0]
    reverse = torch.arange(k - 1, -1, -1) if order is None else torch.flip(order, (0,))
    flipped = h.float().index_select(0, reverse).index_select(1, reverse)  # (fp32 as the paper's code)
    diag = flipped.diagonal()
    dead_flipped = diag == 0
    dead = torch.flip(dead_flipped, (0,))  # in sweep order
    diag[dead_flipped] = 1.0
    jitter = damp * float(diag.double().mean())
    added = 0.0
    for _ in range(6):  # more dampening until the matrix is numerically positive definite
        diag += jitter - added
        added = jitter
        c, info = torch.linalg.cholesky_ex(flipped)
        # (a non-finite entry anywhere in the factor's row i reaches its diagonal L_ii: checking the diagonal is enough)
        if int(info) == 0 and bool(torch.isfinite(torch.diagonal(c)).all()):
            c /= torch.diagonal(c).clone()[None, :]  # J H J = unit · diag(c)² · unitᵀ, unit lower
            a = torch.flip(c, (0, 1))  # H = (J unit J) D (J unit J)ᵀ, J unit J upper
            a.diagonal().zero_()
            return a, dead
        jitter = max(jitter, 1e-12) * 10
    raise ValueError("gptq: the calibration Hessian is not positive definite even with strong dampening")


@torch.no_grad()
def gptq_quantize(w: torch.Tensor, h: torch.Tensor, bits: int, group_size: int, damp: float = DAMP,
                  shrink: tuple[float, ...] = SHRINK, act_order: bool = False,
                  grid: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] with input Hessian h [K, K] -> (codes uint8 [N, K], scale fp16 [N, G], zero fp16 [N, G]), the
    format of `groupwise.group_quantize` (G = ceil(K / group_size), the last group may be short).

    Batched: w [B, N, K] with h [B, K, K] quantises B independent matrices of one shape in one sweep (a model's
    layers), returning [B, ...] results; the sweep's Python loop then runs once per column for all of them.

    Each group's grid is chosen when the sweep reaches it, from the group's weights as the earlier columns'
    errors left them (`group_grid`, from `_compensated`); within a block of BLOCK columns errors move column by
    column, to the rest of an OUTER block as one product per block, beyond it as one product per OUTER block
    (a long inner dimension: at K = 8192 the sweep takes 3 s, not 9 s). The feedback is `error_feedback`'s:
    one Cholesky factor, no inverse.

    act_order: sweep the columns in order of decreasing H_ii (the inputs with the most energy first, while the
    most columns are left to absorb their errors; the paper's "act-order"). The groups stay contiguous along K,
    as the format requires, so their grids are then fixed before the sweep from the weights as they are
    ("static groups").

    grid: (scale, zero) fp16 [N, G] (or [B, N, G]) to sweep against instead of choosing them (static groups too):
    a second sweep against the grids `refit_grid` moved."""
    if w.dim() == 2:
        q, s, z = gptq_quantize(w[None], h[None], bits, group_size, damp, shrink, act_order,
                                None if grid is None else (grid[0][None], grid[1][None]))
        return q[0], s[0], z[0]
    batch, n, k = w.shape
    top = 2**bits - 1
    groups = -(-k // group_size)
    w = w.detach().float()
    order = [torch.argsort(torch.diagonal(hb), descending=True) if act_order else torch.arange(k) for hb in h]
    factors = [error_feedback(hb, damp, o if act_order else None) for hb, o in zip(h, order, strict=True)]
    perm = torch.stack(order)  # [B, K]: the sweep's column order
    a = factors[0][0][None] if batch == 1 else torch.stack([f for f, _ in factors])  # [B, K, K] in sweep order
    wt = torch.gather(w, 2, perm[:, None, :].expand(batch, n, k)).transpose(1, 2).contiguous()  # [B, K, N]
    for b, (_, dead) in enumerate(factors):
        wt[b, dead] = 0.0
    original = wt.clone()  # the feedback is from the original weights' rounding errors
    scales = torch.empty(batch, n, groups, dtype=torch.float16)
    zeros = torch.empty_like(scales)
    static = act_order or grid is not None
    if grid is not None:
        scales[:], zeros[:] = grid[0].to(torch.float16), grid[1].to(torch.float16)
    elif act_order:  # static groups: every grid from the weights before the sweep
        pad = groups * group_size - k
        padded = torch.cat([w, w[:, :, -1:].expand(-1, -1, pad)], dim=2) if pad else w
        scale, zero = group_grid(padded.reshape(-1, group_size), bits, shrink)
        scales[:], zeros[:] = scale.view(batch, n, groups), zero.view(batch, n, groups)
    if static:  # each column's grid is picked from its group's when the sweep reaches it ([B, N] a column, not [B, K, N])
        col_group = perm // group_size  # [B, K]
        scales_t = scales.float().transpose(1, 2).contiguous()  # [B, G, N]
        zeros_t = zeros.float().transpose(1, 2).contiguous()
        rows = torch.arange(batch)
    block = max(group_size, BLOCK // group_size * group_size)  # blocks hold whole groups
    outer = max(block, OUTER // block * block)
    codes = torch.empty(batch, k, n, dtype=torch.uint8)
    err = torch.empty_like(wt)  # [B, K, N]: each column's rounding error, once rounded
    s = z = inv = None
    for o0 in range(0, k, outer):
        o1 = min(k, o0 + outer)
        for b0 in range(o0, o1, block):
            b1 = min(o1, b0 + block)
            wb = wt[:, b0:b1]  # a view: updated in place
            ab = a[:, b0:b1, b0:b1]
            for i in range(b1 - b0):
                j = b0 + i
                if static:
                    s, z = scales_t[rows, col_group[:, j]], zeros_t[rows, col_group[:, j]]
                    inv = torch.where(s > 0, s, 1.0)
                elif j % group_size == 0:  # a new group: its grid from its columns as they are now
                    cols = _compensated(original, wt, a, j, min(k, j + group_size)).transpose(1, 2).reshape(batch * n, -1)
                    scale, zero = group_grid(cols, bits, shrink)
                    scales[:, :, j // group_size], zeros[:, :, j // group_size] = scale.view(batch, n), zero.view(batch, n)
                    s, z = scale.float().view(batch, n), zero.float().view(batch, n)
                    inv = torch.where(s > 0, s, torch.ones_like(s))
                code = ((wb[:, i] - z) / inv).round_().clamp_(0, top)
                codes[:, j] = code.to(torch.uint8)
                e = torch.sub(original[:, j], code.mul_(s).add_(z), out=err[:, j])  # [B, N]
                if i + 1 < b1 - b0:
                    wb[:, i + 1:].addcmul_(ab[:, i, i + 1:, None], e[:, None, :])
            if b1 < o1:  # the rest of this outer block: one product per block
                wt[:, b1:o1].baddbmm_(a[:, b0:b1, b1:o1].transpose(1, 2), err[:, b0:b1])
        if o1 < k:  # the rest of the matrix: one product per outer block (a long inner dimension)
            wt[:, o1:].baddbmm_(a[:, o0:o1, o1:].transpose(1, 2), err[:, o0:o1])
    q = torch.empty(batch, n, k, dtype=torch.uint8)
    q.scatter_(2, perm[:, None, :].expand(batch, n, k), codes.transpose(1, 2))
    return q, scales, zeros


def _compensated(original: torch.Tensor, wt: torch.Tensor, a: torch.Tensor, j0: int, j1: int) -> torch.Tensor:
    """Columns j0:j1 [B, g, N] as the paper's sweep holds them when it reaches column j0: the original weights
    moved to compensate, as well as they can, for the errors of the columns before j0. The pull sweep holds them
    moved by c = Σ_{i<j0} (w_i − ŵ_i) A_i· only; the compensation is c (I + A_gg)⁻¹ over the group's own
    block (the inverse of a unit upper triangular matrix, restricted to its leading block). The rounded columns
    are the same either way; the group's grid is chosen from these."""
    unit = a[:, j0:j1, j0:j1].transpose(1, 2) + torch.eye(j1 - j0)  # (I + A_gg)ᵀ: unit lower
    moved = torch.linalg.solve_triangular(unit, wt[:, j0:j1] - original[:, j0:j1], upper=False, unitriangular=True)
    return original[:, j0:j1] + moved


def output_error(w: torch.Tensor, w_hat: torch.Tensor, h: torch.Tensor) -> float:
    """tr((W - Ŵ) H (W - Ŵ)ᵀ) / tr(W H Wᵀ): the relative squared error of the layer's outputs over the
    calibration activations whose Hessian is h (what GPTQ minimises; RTN's is the reference)."""
    d = (w.float() - w_hat.float()).double()
    hw = h.double()
    return float(torch.einsum("nk,kl,nl->", d, hw, d) / torch.einsum("nk,kl,nl->", w.double(), hw, w.double()))
