"""Quasi-Newton methods: limited-memory BFGS (with bounds) and dense BFGS.

Both are :class:`~optsolve.backends.classical.DescentSolver` compositions: a direction from
the inverse-Hessian model, the strong-Wolfe line search by default, and the BFGS update of
the model as the update hook.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.classical.descent import (
    ClassicalAlgorithm,
    DescentSolver,
    _default_linesearch,
    register,
)
from optsolve.backends.classical.linesearch import Zoom
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass, static_field

Array = jax.Array


def _curvature_ok(s: Array, y: Array, decreased: Array) -> tuple[Array, Array, Array]:
    """(s.y, y.y, whether the pair keeps the model positive definite). Where it does not,
    s.y and y.y are returned as 1: the update built from them is discarded, and a division
    by zero there would give NaN derivatives through unrolled runs."""
    return _curvature_test(jnp.vdot(y, s), jnp.vdot(y, y), decreased, s.dtype)


def _curvature_test(
    ys: Array, yy: Array, decreased: Array, dtype: Any
) -> tuple[Array, Array, Array]:
    """:func:`_curvature_ok` of the products ``ys = s.y`` and ``yy = y.y``."""
    eps = jnp.finfo(dtype).eps
    ok = decreased & (ys > eps * yy) & jnp.isfinite(ys) & (yy > 0)
    return jnp.where(ok, ys, 1.0), jnp.where(ok, yy, 1.0), ok


# ----------------------------------------------------------------------------- L-BFGS

# Below this many variables the memory products run as multiply-and-sum, which XLA fuses
# into the surrounding loop (fewer kernels); from it on as matrix-vector products, several
# times faster at n >= 1000 (docs/benchmarks.md's layout table measures both).
_DOT_FROM = 256


class LBFGSModel(NamedTuple):
    """The last ``m`` pairs in compact form, oldest first; unused slots are zero.

    ``W[0]`` holds the steps s_i, ``W[1]`` the gradient changes y_i (rows); ``RY[0]`` the
    inverse of the upper triangle R of ``s_i . y_j`` (i <= j; identity on unused slots) and
    ``RY[1]`` the Gram matrix ``y_i . y_j``; ``Dg`` R's diagonal ``s_i . y_i`` followed by
    gamma. Arrays of one shape are stacked: a loop writes each carried array in a kernel
    of its own.
    """

    W: Array
    RY: Array
    Dg: Array
    count: Array

    @property
    def Rinv(self) -> Array:
        return self.RY[0]

    @property
    def YY(self) -> Array:
        return self.RY[1]

    @property
    def D(self) -> Array:
        return self.Dg[:-1]

    @property
    def gamma(self) -> Array:
        return self.Dg[-1]


class _LBFGSSolver(DescentSolver):
    # A step's state is finite (line searches accept finite points only) and a failed step
    # resets the model itself, so the driver keeps it as it is rather than selecting the
    # previous one, a copy of the whole memory each iteration (a cost on small solves).
    select_state = False
    # the emptied memory applies gamma = 1: -(g + 0), steepest descent (a zero entry of g
    # may change sign, as at the first iteration)
    resets_to_steepest = True

    def init_model(self, x, g):
        m = self.alg.memory_size
        zeros = lambda *shape: jnp.zeros(shape, self.dtype)
        return LBFGSModel(
            zeros(2, m, self.n),
            jnp.stack([jnp.eye(m, dtype=self.dtype), zeros(m, m)]),
            jnp.concatenate([zeros(m), jnp.ones((1,), self.dtype)]),
            jnp.zeros((), jnp.int32),
        )

    def _apply_inverse(self, model: LBFGSModel, q: Array) -> Array:
        """``H q`` from the compact representation (Byrd, Nocedal & Schnabel 1994, Thm 2.2):
        ``H = gI + [S gY] [[R^-T (D + g Y^T Y) R^-1, -R^-T], [-R^-1, 0]] [S^T; g Y^T]``.

        Two products with the (2m, n) memory and m x m products: the same O(mn) as the
        two-loop recursion (Nocedal & Wright Algorithm 7.4) in a handful of kernels instead
        of 4m sequential ones, which dominate small problems.
        """
        gamma = model.gamma
        ab = self._memory_dot(model.W, q)
        # broadcasts written out: they hold under jax_numpy_rank_promotion='raise'
        u = jnp.sum(model.Rinv * ab[0][None, :], axis=1)
        w = model.D * u + gamma * jnp.sum(model.YY * u[None, :], axis=1) - gamma * ab[1]
        p = jnp.sum(model.Rinv * w[:, None], axis=0)
        coef = jnp.stack([p, -gamma * u])
        return gamma * q + self._memory_combine(model.W, coef)

    def _memory_dot(self, W: Array, v: Array) -> Array:
        """(2, m) products of every stored vector with ``v``."""
        if self.n < _DOT_FROM:
            return jnp.sum(W * v[None, None, :], axis=-1)
        return (W.reshape(-1, self.n) @ v).reshape(W.shape[:2])

    def _memory_combine(self, W: Array, coef: Array) -> Array:
        """sum_ij coef[i, j] W[i, j]."""
        if self.n < _DOT_FROM:
            return jnp.sum(W * coef[:, :, None], axis=(0, 1))
        return coef.reshape(-1) @ W.reshape(-1, self.n)

    def direction(self, model, x, g, state, flat):
        if flat.bounds is None:
            return -self._apply_inverse(model, g), model.count == 0
        # Two-metric projection (Bertsekas 1982): quasi-Newton on the free variables, steepest
        # descent on the epsilon-active ones, then the projected arc search.
        lo, up = flat.bounds
        pg = jnp.max(jnp.abs(x - jnp.clip(x - g, lo, up)))
        eps_active = jnp.minimum(pg, 1e-3)
        active = ((x <= lo + eps_active) & (g > 0)) | ((x >= up - eps_active) & (g < 0))
        r = self._apply_inverse(model, jnp.where(active, 0.0, g))
        return jnp.where(active, -g, -r), model.count == 0

    def update_model(self, model, s, y, g_new, decreased):
        W = jnp.concatenate([model.W[:, 1:], jnp.stack([s, y])[:, None]], axis=1)
        col = self._memory_dot(W, y)  # (s_i . y, y_i . y) for every slot
        # the new pair's own products are the last column's: no reductions of their own
        ys, yy, ok = _curvature_test(col[0, -1], col[1, -1], decreased, s.dtype)
        pushed = self._push(model, W, col, ys, yy)
        kept = jax.tree_util.tree_map(
            lambda a, z: jnp.where(decreased, a, z), model, self.init_model(None, None)
        )
        return jax.tree_util.tree_map(lambda a, b: jnp.where(ok, a, b), pushed, kept)

    def _push(self, model, W, col, ys, yy):
        """The model with the pair appended to the memory ``W`` (``col``: its products)."""
        m = self.alg.memory_size
        # Dropping the oldest pair keeps the trailing block of R^-1; appending the column
        # (c, d) of the new pair appends (-R^-1 c / d, 1/d) (block inverse of a triangle).
        trail = model.Rinv[1:, 1:]
        Rinv = (
            jnp.zeros_like(model.Rinv)
            .at[:-1, :-1]
            .set(trail)
            .at[:-1, -1]
            .set(-jnp.sum(trail * col[0, :-1][None, :], axis=1) / ys)
            .at[-1, -1]
            .set(1.0 / ys)
        )
        D = jnp.concatenate([model.D[1:], ys[None]])
        YY = (
            jnp.zeros_like(model.YY)
            .at[:-1, :-1]
            .set(model.YY[1:, 1:])
            .at[:, -1]
            .set(col[1])
            .at[-1, :]
            .set(col[1])
        )
        return LBFGSModel(
            W,
            jnp.stack([Rinv, YY]),
            jnp.concatenate([D, (ys / yy)[None]]),
            jnp.minimum(model.count + 1, m),
        )


# XLA's CPU runtime runs a loop body's kernels one after another in the calling thread only
# when every buffer they touch is at most 512 bytes (ThunkExecutor's sequential threshold);
# otherwise it schedules them as a dataflow graph on its thread pool, which costs more than
# the kernels themselves on tiny problems. So while an (m, n) memory fits that size, L-BFGS
# keeps it as two (m, n) arrays for the two-loop recursion, without the compact form's m x m
# matrices (8 m^2 bytes in float64). Chained Rosenbrock, m = 10: 0.42x the compact form's
# time at n = 2, 0.69x at n = 6 (make bench, the memory-layout table of docs/benchmarks.md).
# Just above the limit (n = 8) both run in the thread-pool mode and runs disagree (0.84x to
# 1.38x); the compact form, with fewer kernels per iteration, takes over there.
_SEQUENTIAL_BUFFER_BYTES = 512


class TwoLoopModel(NamedTuple):
    """The last ``m`` pairs, oldest first (a new pair pushes the oldest out): ``S[i]``,
    ``Y[i]`` a step and its gradient change, ``rho[i] = 1 / s_i . y_i`` (0 for an empty
    slot, which then does nothing)."""

    S: Array
    Y: Array
    rho: Array
    gamma: Array
    count: Array


class _TwoLoopLBFGSSolver(_LBFGSSolver):
    """L-BFGS for problems small enough that its memory fits XLA's cheap sequential mode:
    the two-loop recursion (Nocedal & Wright Algorithm 7.4) as two scans over the memory
    (scans rather than unrolled loops, which measured slower on chained Rosenbrock n = 2)."""

    def init_model(self, x, g):
        m = self.alg.memory_size
        zeros = jnp.zeros((m, self.n), self.dtype)
        return TwoLoopModel(
            zeros,
            zeros,
            jnp.zeros(m, self.dtype),
            jnp.ones((), self.dtype),
            jnp.zeros((), jnp.int32),
        )

    def _apply_inverse(self, model: TwoLoopModel, q: Array) -> Array:
        def newest_first(q, pair):
            s, y, rho = pair
            a = rho * jnp.vdot(s, q)
            return q - a * y, a

        q, alphas = lax.scan(newest_first, q, (model.S, model.Y, model.rho), reverse=True)

        def oldest_first(r, pair):
            s, y, rho, a = pair
            return r + (a - rho * jnp.vdot(y, r)) * s, None

        r, _ = lax.scan(oldest_first, model.gamma * q, (model.S, model.Y, model.rho, alphas))
        return r

    def update_model(self, model, s, y, g_new, decreased):
        ys, yy, ok = _curvature_ok(s, y, decreased)
        m = self.alg.memory_size
        # No curvature: the memory stays as it is.
        push = lambda old, new: jnp.where(ok, jnp.concatenate([old[1:], new[None]]), old)
        pushed = TwoLoopModel(
            push(model.S, s),
            push(model.Y, y),
            push(model.rho, 1.0 / ys),
            jnp.where(ok, ys / yy, model.gamma),
            jnp.where(ok, jnp.minimum(model.count + 1, m), model.count),
        )
        # No step at all: empty the memory (the next step is steepest descent).
        return jax.tree_util.tree_map(
            lambda a, b: jnp.where(decreased, a, b), pushed, self.init_model(None, None)
        )


@register
@pytree_dataclass
class LBFGS(ClassicalAlgorithm):
    """Limited-memory BFGS; with bounds, a projected (L-BFGS-B-style) variant.

    The inverse Hessian is the BFGS update of ``gamma_k I`` by the last ``memory_size``
    pairs ``(s, y)`` (Nocedal & Wright, *Numerical Optimization*, 2006, Algorithm 7.5; Liu &
    Nocedal 1989), ``gamma_k = s.y / y.y`` (eq. 7.20), applied in the compact form of Byrd,
    Nocedal & Schnabel (Math. Prog. 63, 1994), or, for problems whose memory fits in 512
    bytes per array (XLA's CPU runtime is much faster below that size), by the two-loop
    recursion (Algorithm 7.4): the same products up to rounding. Pairs with
    ``s.y <= eps y.y`` are skipped. Under bounds: quasi-Newton
    directions on the free variables, steepest descent on the epsilon-active ones, and a
    projected Armijo arc search (Bertsekas' two-metric projection, SIAM J. Control Optim.
    20, 1982); convergence is measured on the projected gradient, as L-BFGS-B's ``pgtol``.

    Args:
      memory_size: pairs kept (static; default 10).
      linesearch: :class:`Zoom` (default, strong Wolfe c1=1e-4, c2=0.9) or
        :class:`Backtracking`.

    Example:
      >>> sol = optsolve.solve(prob, optsolve.LBFGS(memory_size=5), gtol=1e-10)
    """

    takes_bounds: ClassVar[bool] = True

    memory_size: int = static_field(default=10)
    linesearch: Any = None

    def __post_init__(self):
        m = self.memory_size
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"LBFGS: `memory_size` must be an integer >= 1, got {m!r}.")
        _default_linesearch(self, Zoom())

    def inverse_hessian_estimate(self, problem: OptimizationProblem, state: Any):
        """v -> the L-BFGS memory's H^-1 v (the implicit adjoint's CG preconditioner)."""
        solver = self.make_solver(problem)
        return lambda v: solver._apply_inverse(state.model, v)

    def make_solver(self, problem: OptimizationProblem) -> DescentSolver:
        solver = _LBFGSSolver(self, problem)
        memory_bytes = self.memory_size * solver.n * jnp.dtype(solver.dtype).itemsize
        if memory_bytes <= _SEQUENTIAL_BUFFER_BYTES:
            return _TwoLoopLBFGSSolver(self, problem)
        return solver


# ------------------------------------------------------------------------------ BFGS


class BFGSModel(NamedTuple):
    """The dense inverse-Hessian approximation, its product with the current gradient, and
    the number of updates since the last reset."""

    H: Array
    Hg: Array
    count: Array


class _BFGSSolver(DescentSolver):
    select_state = False  # as for L-BFGS: a failed step resets H itself
    resets_to_steepest = True  # H = I and Hg = g: the direction -Hg is -g exactly

    def init_model(self, x, g):
        return BFGSModel(jnp.eye(self.n, dtype=self.dtype), g, jnp.zeros((), jnp.int32))

    def direction(self, model, x, g, state, flat):
        return -model.Hg, model.count == 0

    def update_model(self, model, s, y, g_new, decreased):
        # O(n^2): one product H g_new, then the rank-two update, which also gives H+ g_new
        # without a second product (Nocedal & Wright eq. 6.17).
        Hgn = model.H @ g_new
        u = Hgn - model.Hg  # H y, before H_0's scale
        # the five dot products of the update as one reduction (one kernel, not five)
        left, right = jnp.stack([y, y, s, y, u]), jnp.stack([s, y, g_new, u, g_new])
        ys, yy, sg, yu, ug = jnp.sum(left * right, axis=1)
        ys, yy, ok = _curvature_test(ys, yy, decreased, s.dtype)
        # Before the first update H_0 = (s.y / y.y) I (N&W eq. 6.20).
        # both divisions as one (correctly rounded either way): XLA computes a division
        # that several products read in a kernel of its own
        ratios = jnp.stack([ys, jnp.ones_like(ys)]) / jnp.stack([yy, ys])
        scale = jnp.where(model.count == 0, ratios[0], 1.0)
        Hy = scale * u
        rho = ratios[1]
        c = rho * (1.0 + rho * scale * yu)
        Hyg = scale * ug
        H_new = (
            scale * model.H
            + c * s[:, None] * s[None, :]
            - rho * (s[:, None] * Hy[None, :] + Hy[:, None] * s[None, :])
        )
        Hg_new = scale * Hgn + c * sg * s - rho * (Hyg * s + sg * Hy)
        eye = jnp.eye(self.n, dtype=self.dtype)
        H = jnp.where(ok, H_new, jnp.where(decreased, model.H, eye))
        Hg = jnp.where(ok, Hg_new, jnp.where(decreased, Hgn, g_new))
        count = jnp.where(ok, model.count + 1, jnp.where(decreased, model.count, 0))
        return BFGSModel(H, Hg, count.astype(jnp.int32))


@register
@pytree_dataclass
class BFGS(ClassicalAlgorithm):
    """BFGS with a dense inverse-Hessian approximation, updated in O(n^2) per iteration.

    ``H_{k+1} = (I - rho s y^T) H_k (I - rho y s^T) + rho s s^T``, ``rho = 1/y.s``, with
    ``H_0 = (y.s / y.y) I`` before the first update (Nocedal & Wright, *Numerical
    Optimization*, 2006, Algorithm 6.1, eqs. 6.17 and 6.20). Memory O(n^2): use
    :class:`LBFGS` for large problems.

    Args:
      linesearch: :class:`Zoom` (default, strong Wolfe c1=1e-4, c2=0.9) or
        :class:`Backtracking`.
    """

    # H in the carry, the updated H, the identity of a reset and the selected one
    dense_matrices: ClassVar[int] = 4

    linesearch: Any = None

    def __post_init__(self):
        _default_linesearch(self, Zoom())

    def make_solver(self, problem: OptimizationProblem) -> DescentSolver:
        return _BFGSSolver(self, problem)
