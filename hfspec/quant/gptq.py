"""Error-compensating group quantisation (GPTQ: Frantar, Ashkboos, Hoefler & Alistarh, ICLR 2023, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers"), in hfspec's RTN format.

RTN rounds every weight to its nearest grid point on its own. GPTQ quantises a weight [N, K] one input column at a
time and spreads each column's rounding error over the columns not yet quantised, weighted by the inverse of the
layer's input Hessian H = Σ x xᵀ over calibration activations, so that the layer's *outputs* W x stay close
rather than its weights. The codes, scales and zeros it returns are exactly `groupwise.group_quantize`'s format
(asymmetric, groups of `group_size` along K, fp16 scale rounded up and zero rounded down), so every storage and
kernel that runs an RTN draft runs a GPTQ one at the same bytes.

Tensor functions first (`hessian_update`, `gptq_quantize`), each testable alone; `hfspec.quant.calibrate`
collects Hessians from a model and `hfspec.drafts.calibrated` builds drafts from the result.
"""

from __future__ import annotations

import torch

from hfspec.quant.groupwise import _qparams_of_groups

BLOCK = 32  # columns whose errors are propagated lazily as one matrix product (the paper's "lazy batch")
DAMP = 0.01  # diagonal dampening, as a fraction of the mean of diag(H)
SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8)  # candidate shrinks of a group's [min, max] range (the least squared error wins)


def hessian_update(h: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """H + xᵀx for activations x [..., K] (fp64 accumulation, so long calibrations do not lose precision)."""
    x = x.reshape(-1, x.shape[-1]).double()
    xtx = x.t() @ x
    return xtx if h is None else h.add_(xtx)


def group_grid(w: torch.Tensor, bits: int, shrink: tuple[float, ...] = SHRINK) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) fp16 [N] for a group of columns w [N, g]: RTN's min/max grid, or a shrunk range when that
    rounds the group with less squared error (outliers clipped; the format is the same)."""
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    best_scale, best_zero, best_err = None, None, None
    top = 2**bits - 1
    for s in shrink:
        mid = (lo + hi) / 2
        g = torch.stack([mid + (lo - mid) * s, mid + (hi - mid) * s], dim=1)  # [N, 2]: the range's ends
        scale, zero = _qparams_of_groups(g[:, None, :], bits)
        scale, zero = scale[:, 0], zero[:, 0]
        err = ((_round(w, scale, zero, top) - w) ** 2).sum(dim=1)
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
    return ((w - z.view(shape)) / safe).round_().clamp_(0, top)


def _round(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, top: int) -> torch.Tensor:
    shape = (-1,) + (1,) * (w.dim() - 1)
    return _codes(w, scale, zero, top) * scale.float().view(shape) + zero.float().view(shape)


def inverse_hessian_factor(h: torch.Tensor, damp: float = DAMP) -> tuple[torch.Tensor, torch.Tensor]:
    """(upper Cholesky factor of H⁻¹ after dampening, mask of dead columns) for H [K, K]. A column no
    calibration activation reached (diag 0) gets H_ii = 1 so the factor exists; its weights are rounded plainly."""
    h = h.double().clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    jitter = damp * float(torch.diagonal(h).mean())
    for _ in range(6):  # more dampening until the matrix is numerically positive definite
        try:
            factor = torch.linalg.cholesky(h + jitter * torch.eye(h.shape[0], dtype=h.dtype))
            inv = torch.cholesky_inverse(factor)
            return torch.linalg.cholesky(inv, upper=True).float(), dead
        except torch.linalg.LinAlgError:
            jitter *= 10
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
    errors left them (`group_grid`); within a block of BLOCK columns errors move column by column, beyond it as
    one product per block.

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
    factors = [inverse_hessian_factor(hb.double()[o][:, o], damp) for hb, o in zip(h, order, strict=True)]
    perm = torch.stack(order)  # [B, K]: the sweep's column order
    u = torch.stack([f for f, _ in factors])  # [B, K, K] in sweep order
    wt = torch.gather(w, 2, perm[:, None, :].expand(batch, n, k)).transpose(1, 2).contiguous()  # [B, K, N]
    for b, (_, dead) in enumerate(factors):
        wt[b, dead] = 0.0
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
    if static:
        col_group = (perm // group_size)[:, :, None].expand(batch, k, n)  # [B, K, N]
        sp = torch.gather(scales.float().transpose(1, 2), 1, col_group)
        zp = torch.gather(zeros.float().transpose(1, 2), 1, col_group)
    block = max(group_size, BLOCK // group_size * group_size)  # blocks hold whole groups
    codes = torch.empty(batch, k, n, dtype=torch.uint8)
    s = z = None
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        wb = wt[:, b0:b1]  # a view: updated in place
        ub = u[:, b0:b1, b0:b1]
        err = torch.empty_like(wb)
        for i in range(b1 - b0):
            j = b0 + i
            if static:
                s, z = sp[:, j], zp[:, j]
            elif j % group_size == 0:  # a new group: its grid from its columns as they are now
                cols = wt[:, j:j + group_size].transpose(1, 2).reshape(batch * n, -1)
                scale, zero = group_grid(cols, bits, shrink)
                scales[:, :, j // group_size], zeros[:, :, j // group_size] = scale.view(batch, n), zero.view(batch, n)
                s, z = scale.float().view(batch, n), zero.float().view(batch, n)
            col = wb[:, i]
            code = ((col - z) / torch.where(s > 0, s, torch.ones_like(s))).round_().clamp_(0, top)
            codes[:, j] = code.to(torch.uint8)
            e = (col - (code * s + z)) / ub[:, i, i, None]  # [B, N]
            if i + 1 < b1 - b0:
                wb[:, i + 1:] -= ub[:, i, i + 1:, None] * e[:, None, :]
            err[:, i] = e
        if b1 < k:
            wt[:, b1:] -= u[:, b0:b1, b1:].transpose(1, 2) @ err
    q = torch.empty(batch, n, k, dtype=torch.uint8)
    q.scatter_(2, perm[:, None, :].expand(batch, n, k), codes.transpose(1, 2))
    return q, scales, zeros


REFIT_SCRATCH = 64 << 20  # floats of scratch per block of rows in `refit_grid`


@torch.no_grad()
def refit_grid(w: torch.Tensor, h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
               group_size: int, damp: float = DAMP) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) fp16 [N, G] that minimise the output error tr((W − Ŵ) H (W − Ŵ)ᵀ) for the codes q [N, K]
    fixed, Ŵ = q · scale + zero per group: a weighted least-squares problem of 2G unknowns per row (rows are
    independent), solved exactly. GPTQ picks codes against grids chosen for the weights' own squared error; this
    moves each grid to where the layer's outputs are closest (on SmolLM2-135M off the grid: output error −25 %,
    Σ min(p, q) +0.009). H is dampened as for GPTQ. A row keeps its grid where the new one is not finite, has a
    scale ≤ 0 or out of fp16's range, or does not lower that row's error."""
    n, k = w.shape
    groups = scale.shape[1]
    pad = groups * group_size - k
    hd = h.double() + damp * float(torch.diagonal(h).double().mean()) * torch.eye(k, dtype=torch.float64)
    hf = torch.nn.functional.pad(hd.float(), (0, pad, 0, pad))  # [Kp, Kp]: padded columns weigh nothing
    hb = hf.view(groups, group_size, groups, group_size)
    qg = torch.nn.functional.pad(q.float(), (0, pad)).view(n, groups, group_size)
    hw = (torch.nn.functional.pad(w.float(), (0, pad)) @ hf).view(n, groups, group_size)  # (H w_n) by group
    m22 = hb.sum(dim=(1, 3)).double()  # [G, G]: Σ over both groups' H entries (the zeros' block)
    h_rows = hb.sum(dim=1)  # [G(a), G(b), g]: Σ_{i in a} H[i, (b, j)]
    rows = max(1, REFIT_SCRATCH // max(1, groups * groups * group_size))
    scale_out, zero_out = scale.clone(), zero.clone()
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        qc = qg[r0:r1]  # [c, G, g]
        x = torch.bmm(qc.transpose(0, 1), hb.reshape(groups, group_size, -1))  # [G(a), c, Kp]: Σ_i q_ai H[ai, ·]
        m11 = (x.view(groups, r1 - r0, groups, group_size) * qc[None]).sum(-1).permute(1, 0, 2)  # [c, a, b]
        m21 = torch.einsum("abj,nbj->nab", h_rows, qc)  # [c, a, b]: zeros' rows against scales' columns
        m = torch.cat([torch.cat([m11, m21.transpose(1, 2)], 2), torch.cat([m21, m22.float().expand(r1 - r0, -1, -1)], 2)],
                      1).double()
        rhs = torch.cat([(qc * hw[r0:r1]).sum(-1), hw[r0:r1].sum(-1)], 1).double()
        old = torch.cat([scale[r0:r1].double(), zero[r0:r1].double()], 1)
        finite = torch.isfinite(m).flatten(1).all(1) & torch.isfinite(rhs).all(1)
        eye = torch.eye(2 * groups, dtype=torch.float64)
        if not bool(finite.all()):  # (the full-size selections only where some row needs them)
            m, rhs = torch.where(finite[:, None, None], m, eye), torch.where(finite[:, None], rhs, old)
        ridge = 1e-9 * m.diagonal(dim1=1, dim2=2).abs().mean(1, keepdim=True) + 1e-30  # a constant-code group
        lu, pivots, info = torch.linalg.lu_factor_ex(m + ridge[:, :, None] * eye)
        good = finite & (info == 0)  # singular (a zero pivot): the row solves the identity for its old grid
        b = torch.where(good[:, None], rhs + ridge * old, old)
        if not bool(good.all()):
            lu = torch.where(good[:, None, None], lu, eye)
            pivots = torch.where(good[:, None], pivots, torch.arange(1, 2 * groups + 1, dtype=pivots.dtype))
        try:
            theta = torch.linalg.lu_solve(lu, pivots, b[..., None])[..., 0]
        except RuntimeError:  # LAPACK met a zero pivot after all (values beyond its range): these rows keep theirs
            theta = old
        new_scale, new_zero = theta[:, :groups].clamp(-65504, 65504).half(), theta[:, groups:].clamp(-65504, 65504).half()
        rounded = torch.cat([new_scale.double(), new_zero.double()], 1)
        ok = (torch.isfinite(theta).all(1) & (theta[:, :groups] > 0).all(1) & (theta.abs() < 65504).all(1)
              & (_row_errors(m, rhs, rounded) < _row_errors(m, rhs, old)))
        scale_out[r0:r1][ok], zero_out[r0:r1][ok] = new_scale[ok], new_zero[ok]
    return scale_out, zero_out


def _row_errors(m: torch.Tensor, rhs: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Each row's output error (w_n − ŵ_n)ᵀ H (w_n − ŵ_n) for the grid θ_n, less the constant w_nᵀ H w_n:
    θᵀ M θ − 2 θᵀ r from the row's normal equations (M θ = r), so comparing two grids costs (2G)² a row, not K²."""
    return (theta[:, None, :] @ m @ theta[:, :, None])[:, 0, 0] - 2 * (theta * rhs).sum(1)


def output_error(w: torch.Tensor, w_hat: torch.Tensor, h: torch.Tensor) -> float:
    """tr((W - Ŵ) H (W - Ŵ)ᵀ) / tr(W H Wᵀ): the relative squared error of the layer's outputs over the
    calibration activations whose Hessian is h (what GPTQ minimises; RTN's is the reference)."""
    d = (w.float() - w_hat.float()).double()
    hw = h.double()
    return float(torch.einsum("nk,kl,nl->", d, hw, d) / torch.einsum("nk,kl,nl->", w.double(), hw, w.double()))
