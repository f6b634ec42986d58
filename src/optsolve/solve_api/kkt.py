"""Multipliers and the tangent of a solution of a problem with general constraints, from its
Karush-Kuhn-Tucker conditions.

With the constraints flattened to one vector ``c(x, p)`` (``lower <= c <= upper``) and the
Lagrangian ``L = f + lambda . c``, a solution satisfies, on the active set A (equalities, and
inequalities held at one of their bounds ``b``) and on the coordinates F not held at a box
bound,

    (grad_x f + J_A^T lambda_A)_F = 0,      c_A(x, p) = b_A,

and differentiating both gives the KKT system (Nocedal & Wright, *Numerical Optimization*,
2006, section 12.8; Fiacco, *Introduction to Sensitivity and Stability Analysis in Nonlinear
Programming*, 1983):

    [ H_L  J_A^T ] [ dx ]   [ -d/dp (grad_x L) dp             ]
    [ J_A   0    ] [ dl ] = [ db_A - d/dp c_A dp              ],

with box-held coordinates moving with their bound. The multipliers are the least-squares
solution of the first condition at the returned x, for every backend alike; the sign
convention makes ``-lambda_j`` the derivative of f* with respect to constraint j's active
bound (lambda_j >= 0 at an upper bound, <= 0 at a lower one). ``grad_x f`` and ``H_L``'s
part from f come from the problem's ``grad`` and ``hvp`` where it gives them.

The system is solved densely by the null-space method (Nocedal & Wright, section 16.2): dx
is a particular solution of the (row-normalised) constraint rows, J_A's and one a box-held
coordinate, plus a step in their null space Z from the reduced system
``Z^T H_L Z y = Z^T (rhs - H_L dx_p)``. The Hessian never meets the constraint rows in one
matrix, so small curvature next to large constraint gradients is not lost to rounding (as
in a least-squares solve of the whole system in float32). Where the active constraints'
gradients are linearly dependent (LICQ fails) the particular solution is the minimum-norm
least-squares one, and a singular reduced Hessian gets the minimum-norm step.

The active set: an equality always; an inequality side whose gap is at most 1e-3 (1 +
|bound|), whose multiplier (from the least-squares fit on every such candidate side) pushes
outward, and for which dropping the constraint would let the Newton step cross the bound:
``|lambda_j| |grad c_j|^2 / h_j > gap_j``, with ``h_j = grad c_j . H_L grad c_j /
|grad c_j|^2`` the Lagrangian's curvature along the constraint's gradient (any outward
multiplier where h_j <= 0). Both sides scale alike with f, so scaling f does not change the
verdict. Box bounds use the same test with the Lagrangian's gradient and the diagonal of
H_L (:func:`~optsolve.solve_api.stationarity.active_sides`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.linear_solve import warn_singular
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.sensitivity import hessian_product
from optsolve.solve_api.stationarity import active_sides

PyTree = Any

_CANDIDATE_GAP = 1e-3


def _shapes(problem: OptimizationProblem, x: PyTree) -> list[tuple[int, ...]]:
    return [tuple(jax.eval_shape(c.g, x, problem.p).shape) for c in problem.constraints or ()]


def _sizes(problem: OptimizationProblem, x: PyTree) -> list[int]:
    return [int(np.prod(shape)) for shape in _shapes(problem, x)]


def _stacked(
    problem: OptimizationProblem, x: PyTree, field: str, constraints: Any = None
) -> jax.Array:
    """One constraint bound (``lower`` or ``upper``) of every constraint, as one vector."""
    constraints = problem.constraints if constraints is None else constraints
    dtype = ravel_pytree(x)[0].dtype
    return jnp.concatenate(
        [
            jnp.broadcast_to(jnp.asarray(getattr(c, field), dtype), (n,)).ravel()
            for c, n in zip(constraints, _sizes(problem, x))
        ]
    )


def constraint_values(constraints: Any, x: PyTree, p: PyTree, dtype: Any) -> jax.Array:
    """Every constraint's ``g(x, p)``, flattened and cast to ``dtype``, as one vector.

    Args:
      constraints: a sequence of :class:`~optsolve.solve_api.problem.Constraint`.
      x: the point, a pytree like the problem's x0.
      p: the hyperparameters.
      dtype: the dtype of the result (each constraint's values are cast to it first, so
        constraints of mixed dtypes concatenate under strict dtype promotion).

    Returns:
      A 1-D array of ``dtype``: the constraints' values in order.
    """
    return jnp.concatenate([jnp.ravel(jnp.asarray(c.g(x, p))).astype(dtype) for c in constraints])


class _Active:
    """The active set at a solution and the least-squares multipliers on it."""

    def __init__(self, problem: OptimizationProblem, x: PyTree):
        flat_x, self.unravel = ravel_pytree(x)
        p, dtype = problem.p, flat_x.dtype
        self.values = lambda v, q: constraint_values(problem.constraints, self.unravel(v), q, dtype)
        self.lower, self.upper = _stacked(problem, x, "lower"), _stacked(problem, x, "upper")
        c = self.values(flat_x, p)
        jac = jax.jacfwd(self.values)(flat_x, p)
        self.grad_fn = problem.grad if problem.grad is not None else jax.grad(problem.f)
        grad_f = ravel_pytree(self.grad_fn(x, p))[0]
        hvp = hessian_product(problem, x)
        # H is symmetric: its rows are the products with the unit vectors
        self.hessian_f = jax.vmap(lambda e: ravel_pytree(hvp(self.unravel(e)))[0])(
            jnp.eye(flat_x.size, dtype=dtype)
        )
        self.jac, self.flat_x, self.p = jac, flat_x, p
        equality = self.lower == self.upper
        gap_lower, gap_upper = c - self.lower, self.upper - c

        def near(gap, bound):
            return jnp.isfinite(bound) & (gap <= _CANDIDATE_GAP * (1 + jnp.abs(bound)))

        # a constraint near both of its bounds is a candidate on both: the sign of its
        # multiplier says which one holds it
        candidate_lower = equality | near(gap_lower, self.lower)
        candidate_upper = ~equality & near(gap_upper, self.upper)
        on_box = self._on_box_bound(problem, flat_x)
        lam = self._least_squares(jac, grad_f, candidate_lower | candidate_upper, on_box)
        hessian = self.lagrangian_hessian(lam)
        norm2 = jnp.sum(jac**2, axis=1)
        along = jnp.maximum(jnp.einsum("jn,nk,jk->j", jac, hessian, jac), 0.0)

        def newton_crosses(push, gap):  # |lam| |J|^2 / h > gap, with h = J H J^T / |J|^2
            return push * norm2**2 > gap * along

        at_lower = equality | (candidate_lower & (lam < 0) & newton_crosses(-lam, gap_lower))
        at_upper = candidate_upper & (lam > 0) & newton_crosses(lam, gap_upper)
        self.active = at_lower | at_upper
        grad_lagrangian = grad_f + jac.T @ self._least_squares(jac, grad_f, self.active, on_box)
        self.box_sides = active_sides(
            x, self.unravel(grad_lagrangian), problem.bounds, self.unravel(jnp.diagonal(hessian))
        )
        held = (
            jnp.zeros_like(flat_x)
            if self.box_sides is None
            else ravel_pytree(
                jax.tree_util.tree_map(lambda lo, up: (lo | up).astype(dtype), *self.box_sides)
            )[0]
        )
        self.free = 1.0 - held
        self.lam = self._least_squares(jac, grad_f, self.active, held)
        self.at_lower = at_lower

    def lagrangian_hessian(self, lam: jax.Array) -> jax.Array:
        """The dense Hessian in x of ``f + lam . c`` at the solution."""
        return self.hessian_f + jax.hessian(lambda v: jnp.dot(lam, self.values(v, self.p)))(
            self.flat_x
        )

    @staticmethod
    def _on_box_bound(problem: OptimizationProblem, flat_x: jax.Array) -> jax.Array:
        """1 on coordinates on a box bound (to 1e-8 relative), else 0: before the
        multipliers are known, a coordinate on its bound is taken as held there."""
        if problem.bounds is None:
            return jnp.zeros_like(flat_x)
        lower, upper = (ravel_pytree(bound)[0] for bound in problem.bounds)
        scale = 1e-8 * jnp.maximum(1.0, jnp.abs(flat_x))
        return ((flat_x - lower <= scale) | (upper - flat_x <= scale)).astype(flat_x.dtype)

    @staticmethod
    def _least_squares(jac, grad_f, active, held_x) -> jax.Array:
        """argmin |(grad f + J_A^T lambda)_F| with lambda = 0 off A (minimum norm)."""
        rows = (1.0 - held_x)[:, None] * (jac * active[:, None]).T
        return -jnp.linalg.lstsq(rows, (1.0 - held_x) * grad_f)[0]


def _null_space_solve(
    hessian: jax.Array, rows: jax.Array, targets: jax.Array, rhs: jax.Array
) -> jax.Array:
    """dx with ``rows @ dx = targets`` and ``Z^T (hessian @ dx - rhs) = 0``, Z a basis of the
    rows' null space.

    Args:
      hessian: the (n, n) Hessian of the Lagrangian.
      rows: (k, n) linearised equality constraints on dx, k >= n (zero rows are ignored).
      targets: (k,) their right-hand sides.
      rhs: (n,) the right-hand side of the stationarity rows.

    Returns:
      dx, (n,): the minimum-norm least-squares solution of the rows where they are
      dependent or inconsistent, plus the minimum-norm solution of the reduced system where
      the reduced Hessian is singular (which warns once).
    """
    norms = jnp.linalg.norm(rows, axis=1)
    scale = jnp.where(norms > 0, 1.0 / jnp.where(norms > 0, norms, 1.0), 0.0)
    # with at least n rows (the box rows are n), vt is a complete (n, n) basis
    u, s, vt = jnp.linalg.svd(rows * scale[:, None], full_matrices=False)
    rank = s > jnp.max(s, initial=0.0) * max(rows.shape) * jnp.finfo(rows.dtype).eps
    inverse = jnp.where(rank, 1.0 / jnp.where(rank, s, 1.0), 0.0)
    particular = vt.T @ (inverse * (u.T @ (targets * scale)))
    null = (~rank).astype(hessian.dtype)
    reduced = null[:, None] * (vt @ hessian @ vt.T) * null[None, :]
    # the filler on the range rows is of the reduced block's size, so lstsq's relative
    # cut-off judges the reduced Hessian against itself
    fill = jnp.max(jnp.abs(reduced), initial=0.0)
    reduced = reduced + jnp.diag((1.0 - null) * jnp.where(fill > 0, fill, 1.0))
    step, _, rank, _ = jnp.linalg.lstsq(reduced, null * (vt @ (rhs - hessian @ particular)))
    warn_singular(rank < reduced.shape[0])
    return particular + vt.T @ (null * step)


def multipliers(problem: OptimizationProblem, x: PyTree) -> tuple[jax.Array, ...]:
    """The constraints' multipliers at ``x``, one array per constraint shaped like its g
    (zero on inactive constraints; see the module docstring for the sign)."""
    return per_constraint(problem, x, _Active(problem, x).lam)


def per_constraint(
    problem: OptimizationProblem, x: PyTree, flat: jax.Array
) -> tuple[jax.Array, ...]:
    """Flat per-component values (multipliers; a leading batch axis allowed) as one array
    per constraint, shaped like its g at ``x`` (x without the batch axis)."""
    batch, out, start = jnp.shape(flat)[:-1], [], 0
    for shape in _shapes(problem, x):
        n = int(np.prod(shape))
        out.append(jnp.reshape(flat[..., start : start + n], batch + shape))
        start += n
    return tuple(out)


def constraint_size(problem: OptimizationProblem, x: PyTree) -> int:
    """The number of constraint components at ``x`` (the length of flat multipliers; 0
    without constraints)."""
    return sum(_sizes(problem, x)) if problem.constraints else 0


def kkt_tangent(
    problem: OptimizationProblem,
    x: PyTree,
    p_dot: PyTree | None,
    bounds_dot: tuple[PyTree, PyTree] | None,
    constraints_dot: Any | None,
) -> PyTree:
    """dx at the solution ``x`` of a constrained problem.

    Args:
      problem: the problem solved (its p, bounds and constraints are the primal values).
      x: the solution.
      p_dot: the tangent of ``problem.p``, or None where p is not differentiated.
      bounds_dot: the tangents of the box bounds (lower, upper), or None.
      constraints_dot: the tangents of the constraints (their ``lower`` / ``upper``), or
        None.

    Returns:
      dx, a pytree like x.
    """
    active = _Active(problem, x)
    unravel, flat_x, free, lam = active.unravel, active.flat_x, active.free, active.lam
    p = problem.p
    n, m = flat_x.size, lam.size
    mask = active.active.astype(flat_x.dtype)
    hessian = active.lagrangian_hessian(lam)

    def grad_lagrangian(q: PyTree) -> jax.Array:
        return ravel_pytree(active.grad_fn(x, q))[0] + jax.grad(
            lambda v: jnp.dot(lam, active.values(v, q))
        )(flat_x)

    rhs_x = jnp.zeros(n, flat_x.dtype)
    rhs_c = jnp.zeros(m, flat_x.dtype)
    if p_dot is not None:
        rhs_x = -jax.jvp(grad_lagrangian, (p,), (p_dot,))[1]
        rhs_c = -jax.jvp(lambda q: active.values(flat_x, q), (p,), (p_dot,))[1]
    if constraints_dot is not None:
        d_lower = _stacked(problem, x, "lower", constraints_dot)
        d_upper = _stacked(problem, x, "upper", constraints_dot)
        rhs_c = rhs_c + jnp.where(active.at_lower, d_lower, d_upper)
    held_move = jnp.zeros(n, flat_x.dtype)
    if bounds_dot is not None and active.box_sides is not None:
        held_move = ravel_pytree(
            jax.tree_util.tree_map(
                lambda lo, up, dlo, dup: jnp.where(lo, dlo, jnp.where(up, dup, 0.0)),
                *active.box_sides,
                *bounds_dot,
            )
        )[0].astype(flat_x.dtype)
    held = 1.0 - free
    rows = jnp.concatenate([mask[:, None] * active.jac, jnp.diag(held)], axis=0)
    targets = jnp.concatenate([mask * rhs_c, held * held_move])
    return unravel(_null_space_solve(hessian, rows, targets, rhs_x))
