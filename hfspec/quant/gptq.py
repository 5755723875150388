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
OUTER = 256  # ... and blocks whose errors reach the columns beyond them as one product (long inner dimension)
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
    if static:
        col_group = (perm // group_size)[:, :, None].expand(batch, k, n)  # [B, K, N]
        sp = torch.gather(scales.float().transpose(1, 2), 1, col_group)
        zp = torch.gather(zeros.float().transpose(1, 2), 1, col_group)
        safe = torch.where(sp > 0, sp, torch.ones_like(sp))
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
                    s, z, inv = sp[:, j], zp[:, j], safe[:, j]
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


REFIT_ROWS = 64  # rows whose systems `refit_grid` builds and solves together, at least ...
REFIT_SYSTEMS = 2 << 20  # ... and as many as fit this many floats of systems (small G: fewer, larger steps)
REFIT_SCRATCH = 2 << 20  # floats of products held at once while a block of rows' systems is built (cache-sized)
CHOLESKY_ROWS = 16  # rows' G-sized systems factored in one call (more: the batch leaves the CPU's cache, slower)


@torch.no_grad()
def refit_grid(w: torch.Tensor, h: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
               group_size: int, damp: float = DAMP) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) fp16 [N, G] that minimise the output error tr((W − Ŵ) H (W − Ŵ)ᵀ) for the codes q [N, K]
    fixed, Ŵ = q · scale + zero per group: a weighted least-squares problem of 2G unknowns per row (rows are
    independent), solved exactly. GPTQ picks codes against grids chosen for the weights' own squared error; this
    moves each grid to where the layer's outputs are closest (on SmolLM2-135M off the grid: output error −25 %,
    Σ min(p, q) +0.009). H is dampened as for GPTQ. A row keeps its grid where the new one is not finite, has a
    scale ≤ 0 or out of fp16's range, or does not lower that row's error.

    The unknowns are each group's scale and its value at the middle code (zero + scale · top / 2): with the codes
    centred the two columns of a group are nearly orthogonal, so the systems are well conditioned. Each row's
    system is [[A, Eᵀ], [E, C]]: A (scales) and E depend on the row's codes, C (offsets) does not. The offsets
    are eliminated (`_Eliminated`): a G-sized Cholesky factor a row in fp32; where C is not positive definite
    (a group no input reached) each row's whole 2G system is solved (`_whole`). A row whose fp32 factor fails is
    solved again whole in fp64 (LU)."""
    n, k = w.shape
    groups = scale.shape[1]
    pad = groups * group_size - k
    mid = float(q.max()) / 2 if q.numel() else 0.0  # any fixed offset is exact; the codes' middle conditions best
    hf = torch.nn.functional.pad(h.float(), (0, pad, 0, pad))  # [Kp, Kp]: padded columns weigh nothing
    hf.diagonal()[:k] += damp * float(torch.diagonal(h).double().mean())
    hb = hf.view(groups, group_size, groups, group_size)
    m22 = hb.sum(dim=(1, 3))  # [G, G]: Σ over both groups' H entries (the offsets' block)
    if not bool(torch.isfinite(m22).all()):  # a poisoned Hessian (any entry non-finite: its group's sum is) poisons
        return scale.clone(), zero.clone()  # every row's system: all keep their grids
    real = torch.nn.functional.pad(torch.ones(k), (0, pad)).view(groups, group_size)  # 0 on padded columns
    qg = (torch.nn.functional.pad(q.float(), (0, pad)).view(n, groups, group_size) - mid) * real
    wp = torch.nn.functional.pad(w.float(), (0, pad))  # [N, Kp]
    offsets = _offsets_factor(m22)
    system = _Eliminated(hf, wp, m22, *offsets) if offsets is not None else _Whole(hf, wp, m22)
    scale_out, zero_out = scale.clone(), zero.clone()
    step = max(REFIT_ROWS, REFIT_SYSTEMS // ((1 if offsets is not None else 4) * groups**2))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        qc = qg[r0:r1]  # [c, G, g]
        s_old = scale[r0:r1].float()
        old = torch.cat([s_old, zero[r0:r1].float() + mid * s_old], 1)  # (scale, value at the middle code)
        theta, info, finite, change = system.solve(qc, r0, r1, old)
        redo = ((info != 0) | ~torch.isfinite(theta).all(1)) & finite
        if bool(redo.any()):  # fp32 was not enough for these rows: fp64 LU, and a row that is singular keeps its grid
            rows = torch.arange(r0, r1)[redo]
            m, rhs = _whole_rows(qc[redo], hb, m22, wp[rows] @ hf)
            theta[redo] = _solve64(m, rhs + _ridge(m.diagonal(dim1=1, dim2=2)) * old[redo], old[redo]).float()
        theta = torch.where(finite[:, None], theta, old)
        new_scale = theta[:, :groups].clamp(-65504, 65504).half()
        new_zero = (theta[:, groups:] - mid * new_scale.float()).clamp(-65504, 65504).half()
        rounded = torch.cat([new_scale.float(), new_zero.float() + mid * new_scale.float()], 1)
        ok = (finite & torch.isfinite(theta).all(1) & (theta[:, :groups] > 0).all(1) & (theta.abs() < 65504).all(1)
              & torch.isfinite(rounded).all(1) & (change(rounded) < 0))
        scale_out[r0:r1][ok], zero_out[r0:r1][ok] = new_scale[ok], new_zero[ok]
    return scale_out, zero_out


def _whole_rows(qc: torch.Tensor, hb: torch.Tensor, m22: torch.Tensor, hw: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(M [c, 2G, 2G], r [c, 2G]): the rows' whole normal equations M θ = r, for codes qc [c, G, g] (centred), H
    viewed [G, g, G, g], the offsets' block m22 and H w of each row hw [c, Kp]."""
    c, groups, group_size = qc.shape
    m = torch.empty(c, 2 * groups, 2 * groups)
    _scale_block(qc, hb, m[:, :groups, :groups])
    m[:, groups:, :groups] = torch.einsum("abj,nbj->nab", hb.sum(dim=1), qc)  # offsets' rows, scales' columns
    m[:, :groups, groups:] = m[:, groups:, :groups].transpose(1, 2)
    m[:, groups:, groups:] = m22
    hw = hw.view(c, groups, group_size)
    return m, torch.cat([(qc * hw).sum(-1), hw.sum(-1)], 1)


class _Whole:
    """Each row's whole 2G system, one fp32 Cholesky factor a row (used where the offsets' block is singular)."""

    def __init__(self, hf: torch.Tensor, wp: torch.Tensor, m22: torch.Tensor):
        groups = m22.shape[0]
        self.hb, self.m22 = hf.view(groups, -1, groups, hf.shape[0] // groups), m22
        self.hw = wp @ hf  # [N, Kp]: H w of every row
        self.eye = torch.eye(2 * groups)

    def solve(self, qc: torch.Tensor, r0: int, r1: int, old: torch.Tensor):
        """(θ [c, 2G], info [c], finite [c], change: grid [c, 2G] -> each row's change of output error from old)."""
        m, rhs = _whole_rows(qc, self.hb, self.m22, self.hw[r0:r1])
        finite = torch.isfinite(rhs).all(1) & torch.isfinite(old).all(1)  # (m is: H is, and codes are)
        if not bool(finite.all()):  # (the full-size selections only where some row needs them)
            m, rhs = torch.where(finite[:, None, None], m, self.eye), torch.where(finite[:, None], rhs, old)
            old = torch.where(finite[:, None], old, 0.0)
        ridge = _ridge(m.diagonal(dim1=1, dim2=2))  # a constant-code group
        factor, info = torch.linalg.cholesky_ex(m + ridge[:, :, None] * self.eye)
        theta = torch.cholesky_solve((rhs + ridge * old)[..., None], factor)[..., 0]
        return theta, info, finite, lambda new: _error_change(m, rhs, old, new)


class _Eliminated:
    """Each row's system with the offsets eliminated. With S summing a K-vector by groups, a row's system is
    A = Qᵀ H Q, E = S H Q, C = S H Sᵀ (Q: the row's codes as a [K, G] block diagonal), r = (Qᵀ H w, S H w).
    C is the same for every row, so the Schur complement A − Eᵀ C⁻¹ E = Qᵀ H' Q with one projected Hessian
    H' = H − H Sᵀ C⁻¹ S H for all rows: each row's G-sized system is built like A (`_scale_block`), with no
    [G, G] products a row (at K = 8192 a third less time than eliminating row by row). Then
    (Qᵀ H' Q) s = Qᵀ (H' w − Uᵀ ρ o_old) + λ s_old and o = U (w − Q s) + ρ C⁻¹ o_old, U = C⁻¹ S H, with the
    ridges λ (the row's, from its whole diagonal) and ρ (C's, in C) on the old grid, as the whole system's."""

    def __init__(self, hf: torch.Tensor, wp: torch.Tensor, m22: torch.Tensor, inverse: torch.Tensor, ridge: float):
        groups = m22.shape[0]
        group_size = hf.shape[0] // groups
        hb = hf.view(groups, group_size, groups, group_size)
        self.sh = hb.sum(dim=1).reshape(groups, -1)  # S H [G, Kp]
        v = (inverse @ self.sh.double()).float()  # L⁻¹ S H, C = L Lᵀ (C with its ridge ρ)
        self.u = (inverse.t() @ v.double()).float()  # U = C⁻¹ S H [G, Kp]
        self.c_inv = (inverse.t() @ inverse).float()
        projected = torch.addmm(hf, v.t(), v, alpha=-1.0)  # H' = H − (L⁻¹ S H)ᵀ (L⁻¹ S H)
        self.hp = projected.view(groups, group_size, groups, group_size)
        self.diag = torch.diagonal(hb, dim1=0, dim2=2).permute(2, 0, 1)  # [G, g, g]: H's diagonal blocks
        self.hpw = wp @ projected  # [N, Kp]: H' w
        self.uw, self.shw = wp @ self.u.t(), wp @ self.sh.t()  # [N, G]: U w, S H w
        self.m22, self.rho = m22, ridge

    def solve(self, qc: torch.Tensor, r0: int, r1: int, old: torch.Tensor):
        """As `_Whole.solve`."""
        c, groups, group_size = qc.shape
        hpw = self.hpw[r0:r1].view(c, groups, group_size)
        uw, shw = self.uw[r0:r1], self.shw[r0:r1]
        qhpw = (qc * hpw).sum(-1)  # Qᵀ H' w [c, G]
        finite = (torch.isfinite(qhpw).all(1) & torch.isfinite(uw).all(1) & torch.isfinite(shw).all(1)
                  & torch.isfinite(old).all(1))
        schur = torch.empty(c, groups, groups)
        _scale_block(qc, self.hp, schur)
        qt = qc.transpose(0, 1)  # [G, c, g]
        a_diag = (torch.bmm(qt, self.diag) * qt).sum(-1).t()  # [c, G]: A's diagonal, q_aᵀ H_aa q_a
        ridge = _ridge(torch.cat([a_diag, self.m22.diagonal().expand(c, -1)], 1))  # the whole system's
        o_old = old[:, groups:]
        b = qhpw - self._qt(qc, self.rho * o_old @ self.u) + ridge * old[:, :groups]
        schur.diagonal(dim1=1, dim2=2).add_(ridge)
        parts = [torch.linalg.cholesky_ex(schur[i:i + CHOLESKY_ROWS]) for i in range(0, c, CHOLESKY_ROWS)]
        factor, info = torch.cat([f for f, _ in parts]), torch.cat([i for _, i in parts])
        s = torch.cholesky_solve(b[..., None], factor)[..., 0]
        o = uw - self._q(qc, s) @ self.u.t() + self.rho * o_old @ self.c_inv
        change = lambda new: self._change(qc, schur, ridge, qhpw, uw, shw, old, new)  # noqa: E731
        return torch.cat([s, o], 1), info, finite, change

    @staticmethod
    def _q(qc: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Q s [c, Kp]: each row's codes times its groups' values."""
        return (qc * s[:, :, None]).reshape(qc.shape[0], -1)

    @staticmethod
    def _qt(qc: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Qᵀ x [c, G] for x [c, Kp]."""
        return (qc * x.view(qc.shape)).sum(-1)

    def _change(self, qc, schur, ridge, qhpw, uw, shw, old, new) -> torch.Tensor:
        """`_error_change` from the eliminated parts: with y = new + old, M y = (Σ y_s + Eᵀ (C⁻¹ E y_s + y_o),
        E y_s + m22 y_o), r = (Qᵀ H' w + Eᵀ U w, S H w), E x = S H (Q x), Eᵀ z = Qᵀ ((S H)ᵀ z); Σ = Qᵀ H' Q,
        `schur` holding Σ + λ I."""
        groups = qc.shape[1]
        d, y = (new - old), (new + old)
        ys, yo = y[:, :groups], y[:, groups:]
        ey = self._q(qc, ys) @ self.sh.t()  # E y_s [c, G]
        top = (torch.bmm(schur, ys[..., None])[..., 0] - ridge * ys + self._qt(qc, (ey @ self.c_inv + yo - 2 * uw) @ self.sh)
               - 2 * qhpw)
        bottom = ey + yo @ self.m22 - 2 * shw
        return (d[:, :groups].double() * top.double()).sum(1) + (d[:, groups:].double() * bottom.double()).sum(1)


def _ridge(diagonal: torch.Tensor) -> torch.Tensor:
    """The ridge a normal matrix gets from its diagonal [..., n]: a millionth of its mean magnitude ([..., 1]),
    so that a group whose codes are all equal (a scale column of zeros) still has a factor."""
    return 1e-6 * diagonal.abs().mean(-1, keepdim=True) + 1e-30


def _offsets_factor(m22: torch.Tensor) -> tuple[torch.Tensor, float] | None:
    """(L⁻¹ fp64 [G, G], ridge) for the offsets' block M22 + ridge I = L Lᵀ (fp64 Cholesky; a ridge like the rows'
    own), the same for every row; None where M22 is not positive definite (a group no input reached): rows are
    then solved whole."""
    g = m22.shape[0]
    c64 = m22.double()
    ridge = float(_ridge(c64.diagonal()))
    factor, info = torch.linalg.cholesky_ex(c64 + ridge * torch.eye(g, dtype=torch.float64))
    if int(info) != 0:
        return None
    inverse = torch.linalg.solve_triangular(factor, torch.eye(g, dtype=torch.float64), upper=False)
    return (inverse, ridge) if bool(torch.isfinite(inverse).all()) else None


def _scale_block(qc: torch.Tensor, hb: torch.Tensor, out: torch.Tensor) -> None:
    """out[c, a, b] = Σ_ij q_c[a, i] H[(a, i), (b, j)] q_c[b, j] for codes qc [c, G, g] and H viewed [G, g, G, g]:
    the scales' block of each row's normal matrix. Symmetric in (a, b), so only b ≥ a (by chunks of groups a)
    is computed and mirrored; chunks small enough that their products stay in the CPU's cache (3× faster than
    one product over all groups at K = 8192)."""
    c, groups, group_size = qc.shape
    per = max(1, REFIT_SCRATCH // max(1, c * groups * group_size))
    qt = qc.transpose(0, 1)  # [G, c, g]
    for a0 in range(0, groups, per):
        a1 = min(groups, a0 + per)
        x = torch.bmm(qt[a0:a1], hb[a0:a1, :, a0:].reshape(a1 - a0, group_size, -1))  # [A, c, (G - a0) g]
        block = (x.view(a1 - a0, c, groups - a0, group_size) * qc[None, :, a0:]).sum(-1).permute(1, 0, 2)
        out[:, a0:a1, a0:] = block
        out[:, a1:, a0:a1] = block[:, :, a1 - a0:].transpose(1, 2)


def _solve64(m: torch.Tensor, b: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Solutions in fp64 (LU) of the rows' systems; a row whose matrix is singular gets its old grid back."""
    m64, b64, old64 = m.double(), b.double(), old.double()
    eye = torch.eye(m.shape[-1], dtype=torch.float64)
    lu, pivots, info = torch.linalg.lu_factor_ex(m64)
    good = info == 0
    if not bool(good.all()):
        lu = torch.where(good[:, None, None], lu, eye)
        pivots = torch.where(good[:, None], pivots, torch.arange(1, m.shape[-1] + 1, dtype=pivots.dtype))
    try:
        theta = torch.linalg.lu_solve(lu, pivots, b64[..., None])[..., 0]
    except RuntimeError:  # LAPACK met a zero pivot after all (values beyond its range): these rows keep theirs
        return old64
    return torch.where(good[:, None], theta, old64)


def _error_change(m: torch.Tensor, rhs: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Each row's change of output error (w_n − ŵ_n)ᵀ H (w_n − ŵ_n) from grid `old` to grid `new`, from the row's
    normal equations (M θ = r): with d = new − old, Δ = dᵀ (M (new + old) − 2 r), in fp64 from the fp32 product
    (the constant w_nᵀ H w_n cancels; comparing two grids costs (2G)² a row, not K²)."""
    d = (new - old).double()
    return (d * ((m @ (new + old)[..., None])[..., 0].double() - 2 * rhs.double())).sum(1)


def output_error(w: torch.Tensor, w_hat: torch.Tensor, h: torch.Tensor) -> float:
    """tr((W - Ŵ) H (W - Ŵ)ᵀ) / tr(W H Wᵀ): the relative squared error of the layer's outputs over the
    calibration activations whose Hessian is h (what GPTQ minimises; RTN's is the reference)."""
    d = (w.float() - w_hat.float()).double()
    hw = h.double()
    return float(torch.einsum("nk,kl,nl->", d, hw, d) / torch.einsum("nk,kl,nl->", w.double(), hw, w.double()))
