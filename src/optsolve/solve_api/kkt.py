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
bound (lambda_j >= 0 at an upper bound, <= 0 at a lower one). The system is solved densely
by least squares, so a degenerate active set (linearly dependent constraint gradients,
where LICQ fails) gets the minimum-norm solution instead of an error.

The active set: an equality always; an inequality side whose gap is at most 1e-3 (1 +
|bound|), whose multiplier pushes outward and exceeds the gap (the interior-point indicator
also used for box bounds, see :func:`~optsolve.solve_api.stationarity.active_sides`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.stationarity import active_sides

PyTree = Any

_CANDIDATE_GAP = 1e-3


def _shapes(problem: OptimizationProblem, x: PyTree) -> list[tuple[int, ...]]:
    return [tuple(jax.eval_shape(c.g, x, problem.p).shape) for c in problem.constraints]


def _sizes(problem: OptimizationProblem, x: PyTree) -> list[int]:
    return [int(np.prod(shape)) for shape in _shapes(problem, x)]


def _stacked(problem: OptimizationProblem, x: PyTree, field: str,
             constraints: Any = None) -> jax.Array:
    """One constraint bound (``lower`` or ``upper``) of every constraint, as one vector."""
    constraints = problem.constraints if constraints is None else constraints
    dtype = ravel_pytree(x)[0].dtype
    return jnp.concatenate([
        jnp.broadcast_to(jnp.asarray(getattr(c, field), dtype), (n,)).ravel()
        for c, n in zip(constraints, _sizes(problem, x))])


def constraint_values(problem: OptimizationProblem, x: PyTree, p: PyTree) -> jax.Array:
    """Every constraint's g(x, p), flattened into one vector."""
    return jnp.concatenate([jnp.ravel(c.g(x, p)) for c in problem.constraints])


class _Active:
    """The active set at a solution and the least-squares multipliers on it."""

    def __init__(self, problem: OptimizationProblem, x: PyTree):
        flat_x, self.unravel = ravel_pytree(x)
        p = problem.p
        self.lower, self.upper = _stacked(problem, x, "lower"), _stacked(problem, x, "upper")
        c = constraint_values(problem, x, p)
        jac = jax.jacfwd(lambda v: constraint_values(problem, self.unravel(v), p))(flat_x)
        grad_f = ravel_pytree(jax.grad(problem.f)(x, p))[0]
        equality = self.lower == self.upper
        gap_lower, gap_upper = c - self.lower, self.upper - c

        def near(gap, bound):
            return jnp.isfinite(bound) & (gap <= _CANDIDATE_GAP * (1 + jnp.abs(bound)))

        candidate_lower = equality | near(gap_lower, self.lower)
        candidate_upper = ~candidate_lower & near(gap_upper, self.upper)
        on_box = self._on_box_bound(problem, flat_x)
        lam = self._least_squares(jac, grad_f, candidate_lower | candidate_upper, on_box)
        # a side stays active if its multiplier pushes outward and exceeds its gap
        at_lower = equality | (candidate_lower & (lam < 0) & (-lam > gap_lower))
        at_upper = candidate_upper & (lam > 0) & (lam > gap_upper)
        self.active = at_lower | at_upper
        grad_lagrangian = grad_f + jac.T @ self._least_squares(jac, grad_f, self.active, on_box)
        # the box bounds a coordinate is held at, judged by the Lagrangian's gradient
        self.box_sides = active_sides(x, self.unravel(grad_lagrangian), problem.bounds)
        held = jnp.zeros_like(flat_x) if self.box_sides is None else ravel_pytree(
            jax.tree_util.tree_map(lambda lo, up: (lo | up).astype(flat_x.dtype),
                                   *self.box_sides))[0]
        self.free = 1.0 - held
        self.lam = self._least_squares(jac, grad_f, self.active, held)
        self.at_lower, self.jac, self.flat_x = at_lower, jac, flat_x

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


def multipliers(problem: OptimizationProblem, x: PyTree) -> tuple[jax.Array, ...]:
    """The constraints' multipliers at ``x``, one array per constraint shaped like its g
    (zero on inactive constraints; see the module docstring for the sign)."""
    lam = _Active(problem, x).lam
    out, start = [], 0
    for shape in _shapes(problem, x):
        n = int(np.prod(shape))
        out.append(jnp.reshape(lam[start:start + n], shape))
        start += n
    return tuple(out)


def kkt_tangent(problem: OptimizationProblem, x: PyTree, p_dot: PyTree | None,
                bounds_dot: tuple[PyTree, PyTree] | None,
                constraints_dot: Any | None) -> PyTree:
    """dx at the solution ``x`` of a constrained problem for the tangents of p, of the box
    bounds and of the constraints' lower / upper (None where not differentiated)."""
    active = _Active(problem, x)
    unravel, flat_x, free, lam = active.unravel, active.flat_x, active.free, active.lam
    p = problem.p
    n, m = flat_x.size, lam.size
    mask = active.active.astype(flat_x.dtype)

    def grad_lagrangian(v, p):
        y = unravel(v)
        return ravel_pytree(jax.grad(problem.f)(y, p))[0] + jax.grad(
            lambda z: jnp.dot(lam, constraint_values(problem, unravel(z), p)))(v)

    hessian = jax.jacfwd(grad_lagrangian)(flat_x, p)
    jac = active.jac * mask[:, None]
    rhs_x = jnp.zeros(n, flat_x.dtype)
    rhs_c = jnp.zeros(m, flat_x.dtype)
    if p_dot is not None:
        rhs_x = -jax.jvp(lambda q: grad_lagrangian(flat_x, q), (p,), (p_dot,))[1]
        rhs_c = -jax.jvp(lambda q: constraint_values(problem, x, q), (p,), (p_dot,))[1]
    if constraints_dot is not None:
        d_lower = _stacked(problem, x, "lower", constraints_dot)
        d_upper = _stacked(problem, x, "upper", constraints_dot)
        rhs_c = rhs_c + jnp.where(active.at_lower, d_lower, d_upper)
    held_move = jnp.zeros(n, flat_x.dtype)
    if bounds_dot is not None and active.box_sides is not None:
        held_move = ravel_pytree(jax.tree_util.tree_map(
            lambda lo, up, dlo, dup: jnp.where(lo, dlo, jnp.where(up, dup, 0.0)),
            *active.box_sides, *bounds_dot))[0].astype(flat_x.dtype)
    rhs_x = free * (rhs_x - hessian @ held_move)
    rhs_c = mask * (rhs_c - jac @ held_move)
    top = jnp.concatenate([free[:, None] * hessian * free[None, :] + jnp.diag(1.0 - free),
                           (free[:, None] * jac.T)], axis=1)
    bottom = jnp.concatenate([jac * free[None, :], jnp.diag(1.0 - mask)], axis=1)
    system = jnp.concatenate([top, bottom], axis=0)
    solution = jnp.linalg.lstsq(system, jnp.concatenate([rhs_x, rhs_c]))[0]
    return unravel(solution[:n] * free + held_move)

