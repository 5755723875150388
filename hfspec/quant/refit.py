"""The grid refit after GPTQ (`refit_grid`): with the codes GPTQ chose fixed, each group's fp16 scale and zero moved
to where the layer's outputs over the calibration activations are closest, a weighted least-squares problem of two
unknowns per group, solved exactly per row (`hfspec.quant.gptq` picks codes against grids chosen for the weights'
own squared error)."""

from __future__ import annotations

import torch

DAMP = 0.01  # diagonal dampening of H, as a fraction of the mean of diag(H): GPTQ's and the refit's

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
    (a group no input reached) each row's whole 2G system is solved (`_Whole`). A row whose fp32 factor fails is
    solved again whole in fp64 (LU)."""
    n, k = w.shape
    groups = scale.shape[1]
    pad = groups * group_size - k
    mid = float(q.max()) / 2 if q.numel() else 0.0  # any fixed offset is exact; the codes' middle conditions best
    hf = torch.nn.functional.pad(h.float(), (0, pad, 0, pad))  # [Kp, Kp]: padded columns weigh nothing
    hf.diagonal()[:k] += damp * float(torch.diagonal(h).double().mean())
    hb = hf.view(groups, group_size, groups, group_size)
    h_rows = hb.sum(dim=1)  # [G(a), G(b), g]: Σ_{i in a} H[i, (b, j)], S H by groups
    m22 = hb.sum(dim=(1, 3))  # [G, G]: Σ over both groups' H entries (the offsets' block)
    if not bool(torch.isfinite(m22).all()):  # a poisoned Hessian (any entry non-finite: its group's sum is) poisons
        return scale.clone(), zero.clone()  # every row's system: all keep their grids
    real = torch.nn.functional.pad(torch.ones(k), (0, pad)).view(groups, group_size)  # 0 on padded columns
    qg = (torch.nn.functional.pad(q.float(), (0, pad)).view(n, groups, group_size) - mid) * real
    wp = torch.nn.functional.pad(w.float(), (0, pad))  # [N, Kp]
    offsets = _offsets_factor(m22)
    system = _Eliminated(hf, wp, h_rows, m22, *offsets) if offsets is not None else _Whole(hf, wp, h_rows, m22)
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
            m, rhs = _whole_rows(qc[redo], hb, h_rows, m22, wp[rows] @ hf)
            theta[redo] = _solve64(m, rhs + _ridge(m.diagonal(dim1=1, dim2=2)) * old[redo], old[redo]).float()
        theta = torch.where(finite[:, None], theta, old)
        new_scale = theta[:, :groups].clamp(-65504, 65504).half()
        new_zero = (theta[:, groups:] - mid * new_scale.float()).clamp(-65504, 65504).half()
        rounded = torch.cat([new_scale.float(), new_zero.float() + mid * new_scale.float()], 1)
        ok = (finite & torch.isfinite(theta).all(1) & (theta[:, :groups] > 0).all(1) & (theta.abs() < 65504).all(1)
              & torch.isfinite(rounded).all(1) & (change(rounded) < 0))
        scale_out[r0:r1][ok], zero_out[r0:r1][ok] = new_scale[ok], new_zero[ok]
    return scale_out, zero_out


def _whole_rows(qc: torch.Tensor, hb: torch.Tensor, h_rows: torch.Tensor, m22: torch.Tensor, hw: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(M [c, 2G, 2G], r [c, 2G]): the rows' whole normal equations M θ = r, for codes qc [c, G, g] (centred), H
    viewed [G, g, G, g], its group sums h_rows [G, G, g] (S H), the offsets' block m22 and H w of each row
    hw [c, Kp]."""
    c, groups, group_size = qc.shape
    m = torch.empty(c, 2 * groups, 2 * groups)
    _scale_block(qc, hb, m[:, :groups, :groups])
    m[:, groups:, :groups] = torch.einsum("abj,nbj->nab", h_rows, qc)  # offsets' rows, scales' columns
    m[:, :groups, groups:] = m[:, groups:, :groups].transpose(1, 2)
    m[:, groups:, groups:] = m22
    hw = hw.view(c, groups, group_size)
    return m, torch.cat([(qc * hw).sum(-1), hw.sum(-1)], 1)


class _Whole:
    """Each row's whole 2G system, one fp32 Cholesky factor a row (used where the offsets' block is singular)."""

    def __init__(self, hf: torch.Tensor, wp: torch.Tensor, h_rows: torch.Tensor, m22: torch.Tensor):
        groups = m22.shape[0]
        self.hb, self.h_rows, self.m22 = hf.view(groups, -1, groups, hf.shape[0] // groups), h_rows, m22
        self.hw = wp @ hf  # [N, Kp]: H w of every row
        self.eye = torch.eye(2 * groups)

    def solve(self, qc: torch.Tensor, r0: int, r1: int, old: torch.Tensor):
        """(θ [c, 2G], info [c], finite [c], change: grid [c, 2G] -> each row's change of output error from old)."""
        m, rhs = _whole_rows(qc, self.hb, self.h_rows, self.m22, self.hw[r0:r1])
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

    def __init__(self, hf: torch.Tensor, wp: torch.Tensor, h_rows: torch.Tensor, m22: torch.Tensor,
                 inverse: torch.Tensor, ridge: float):
        groups = m22.shape[0]
        group_size = hf.shape[0] // groups
        hb = hf.view(groups, group_size, groups, group_size)
        self.sh = h_rows.reshape(groups, -1)  # S H [G, Kp]
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
        top = (torch.bmm(schur, ys[..., None])[..., 0] - ridge * ys - 2 * qhpw
               + self._qt(qc, (ey @ self.c_inv + yo - 2 * uw) @ self.sh))
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
