"""A constrained problem as the interior-point method sees it: flat vectors, slacks for the
inequalities, and the barrier terms, errors and KKT measures of IPOPT's formulation.

The problem ``min f(x)`` s.t. ``x_L <= x <= x_U``, ``c_L <= c(x) <= c_U`` becomes, with a
slack ``s_i`` for every inequality row (Wächter & Biegler 2006, eq. (1)-(2)),

    min f(x)   s.t.   c_E(x) = c_L,E,   c_I(x) - s = 0,   x_L <= x <= x_U,   c_L,I <= s <= c_U,I.

Equality rows (``c_L == c_U``) have no slack: their ``s`` entry is pinned at the bound and
never moves. A row with neither bound finite constrains nothing and is masked out (its
multiplier stays 0). The primal variables with box bounds are ``v = (x, s)``, of length
``n + m``; the masks say which entries have a finite lower or upper bound, so that one set
of array shapes serves every problem (under jit and vmap the masks may be traced).

The Lagrangian is ``L = f + y.(c(x) - s) - z_L.(v - v_L) - z_U.(v_U - v)``, so that
``y_j >= 0`` at an upper bound and ``<= 0`` at a lower one: the sign convention of
:mod:`optsolve.solve_api.kkt` (``-y_j`` is the derivative of f* with respect to the active
bound).

The interior-point method sees the problem scaled and its bounds relaxed, as IPOPT does by
default (its ``nlp_scaling_method gradient-based`` and ``bound_relax_factor``): f times a
scalar ``f_scale`` and each row of c (with its bounds) times ``c_scale`` (both in (0, 1],
fixed at the start), and the finite bounds of the slacks (the inequality rows' bounds, not
x's) moved outwards by ``relax max(1, |b|)``.
Evaluations, Jacobians, residuals and multipliers here are those of the scaled problem; the
violation (:meth:`NLP.violation_of`) is measured on the user's problem and bounds, and
the interior point's ``IPState.multipliers`` gives y in the user's terms
(``Solution.multipliers``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.backends.native.objective import Objective
from optsolve.solve_api.kkt import _sizes, _stacked, constraint_size, constraint_values
from optsolve.solve_api.linear_solve import cg
from optsolve.solve_api.problem import OptimizationProblem

Array = jax.Array

# What the constrained backends call feasible, relative to max(1, |bound|), by the itemsize
# of x's dtype: the scipy backend's 1e-6 in float64; float32 cannot evaluate a row of
# magnitude 40 closer to its bound than one unit in the last place, 3.8e-6.
FEASIBILITY_TOLS = {8: 1e-6, 4: 1e-4, 2: 1e-2}


def feasibility_tol(dtype: Any) -> float:
    """The violation (relative to max(1, |bound|)) up to which a point of ``dtype`` is
    feasible: :data:`FEASIBILITY_TOLS` by the dtype's itemsize."""
    return FEASIBILITY_TOLS[min(jnp.dtype(dtype).itemsize, 8)]


# Lower bound on the scaling of the dual and complementarity errors (IPOPT's s_max).
_S_MAX = 100.0
# IPOPT's kappa_d: a small linear term on variables bounded on one side only, so that the
# barrier problem has a minimiser along directions the log barrier alone leaves unbounded.
_KAPPA_D = 1e-5
# CG iterations of the matrix-free multiplier estimate (it is a starting guess only)
_ESTIMATE_ITERATIONS = 100


class NLP:
    """The flattened problem: f, c and their derivatives on flat ``x``, and the bounds of
    ``v = (x, s)`` with their masks.

    Attributes:
      n, m: the number of variables and of constraint components.
      lower, upper: the bounds of v (+-inf where none; equality and masked rows: none).
      has_lower, has_upper: where they are finite (a fixed variable's are not counted).
      fixed: the entries of v held at their bound (x entries with equal bounds); free_x:
        the x entries that move.
      eq: equality rows; ineq: inequality rows with a slack; rows: rows that constrain.
      c_lower: the rows' lower bounds (the equality rows' value).
      dense: whether c's Jacobian and the Lagrangian's Hessian are formed as matrices; if
        not (the matrix-free form), only their products are, and the state's Jacobian is
        an empty placeholder (:meth:`jacobian` linearises c where a product is needed).
      condensed: (dense only) the Newton system is reduced by eliminating the inequality
        rows (:mod:`newton_system`): to x and the equality rows ``eq_rows`` (their
        indices, concrete: ``equalities``, found by :func:`equality_rows` before the run
        is traced). None where they were not known (bounds traced then): an equality row
        then makes the factorisation fail (NaN), never a silent step.
      f_scale, c_scale: the scaling of f (a scalar) and of c's rows (``scale``; default 1).
      x_lower, x_upper, c_lower_user, c_upper_user: the user's bounds (unscaled, not
        relaxed), which the violation is measured against.
    """

    def __init__(
        self,
        objective: Objective,
        problem: OptimizationProblem,
        dense: bool = True,
        scale: tuple[Array, Array] | None = None,
        relax: Any = 0.0,
        condensed: bool = False,
        equalities: tuple[int, ...] | None = None,
    ):
        flat, self.unravel = ravel_pytree(problem.x0)
        self.dense, self.condensed = dense, dense and condensed
        self.objective, self.problem = objective, problem
        self.dtype = flat.dtype
        self.n = flat.size
        self.constraints = problem.constraints or ()
        self.m = constraint_size(problem, problem.x0)
        dtype = self.dtype
        if problem.bounds is not None:
            x_lower, x_upper = (ravel_pytree(b)[0].astype(dtype) for b in problem.bounds)
        else:
            x_lower = jnp.full(self.n, -jnp.inf, dtype)
            x_upper = jnp.full(self.n, jnp.inf, dtype)
        if self.m:
            c_lower = _stacked(problem, problem.x0, "lower")
            c_upper = _stacked(problem, problem.x0, "upper")
        else:
            c_lower = c_upper = jnp.zeros(0, dtype)
        if scale is None:
            scale = (jnp.ones((), dtype), jnp.ones(self.m, dtype))
        self.f_scale, self.c_scale = scale
        self.x_lower, self.x_upper = x_lower, x_upper
        self.c_lower_user, self.c_upper_user = c_lower, c_upper
        self.eq = c_lower == c_upper
        self.rows = self.eq | jnp.isfinite(c_lower) | jnp.isfinite(c_upper)
        self.ineq = self.rows & ~self.eq
        self.eq_rows = (
            None if equalities is None or not self.condensed else np.asarray(equalities, int)
        )
        # (a positive scale keeps infinite bounds infinite)
        self.c_lower, self.c_upper = c_lower * self.c_scale, c_upper * self.c_scale
        inf = jnp.asarray(jnp.inf, dtype)
        # a variable with equal bounds is held there (IPOPT's fixed_variable_treatment
        # make_parameter): no barrier term, no step, no entry in the dual residual
        self.fixed = jnp.concatenate([x_lower == x_upper, jnp.zeros(self.m, bool)])
        self.free_x = ~self.fixed[: self.n]
        lower = jnp.concatenate([x_lower, jnp.where(self.ineq, self.c_lower, -inf)])
        upper = jnp.concatenate([x_upper, jnp.where(self.ineq, self.c_upper, inf)])
        # only the slacks' bounds are relaxed, not x's: f and c are evaluated inside the
        # user's box only, and the x returned needs no projection back into it (which
        # would move c by the sum of the projections over every active bound)
        slack = jnp.concatenate([jnp.zeros(self.n, bool), self.ineq])
        relaxed = slack & jnp.isfinite(lower)
        self.lower = jnp.where(relaxed, lower - relax * jnp.maximum(1.0, jnp.abs(lower)), lower)
        relaxed = slack & jnp.isfinite(upper)
        self.upper = jnp.where(relaxed, upper + relax * jnp.maximum(1.0, jnp.abs(upper)), upper)
        self.has_lower = jnp.isfinite(self.lower) & ~self.fixed
        self.has_upper = jnp.isfinite(self.upper) & ~self.fixed

    # ------------------------------------------------------------------ evaluations
    def value(self, x: Array) -> Array:
        """f (scaled) at flat x."""
        return self.f_scale * self.objective.value(self.unravel(x))

    def grad(self, x: Array) -> Array:
        """f's gradient (scaled) at flat x."""
        return self.f_scale * ravel_pytree(self.objective.grad(self.unravel(x)))[0]

    def cons(self, x: Array) -> Array:
        """c(x) (scaled), one flat vector (empty without constraints)."""
        if not self.m:
            return jnp.zeros(0, self.dtype)
        return self.c_scale * constraint_values(
            self.constraints, self.unravel(x), self.objective.p, self.dtype
        )

    def jac(self, x: Array) -> Array:
        """The (m, n) Jacobian of c; in the matrix-free form an empty (0, n) placeholder."""
        if not self.m or not self.dense:
            return jnp.zeros((0, self.n), self.dtype)
        return jax.jacfwd(self.cons)(x)

    def jacobian(self, x: Array, jac: Array) -> Jacobian:
        """c's Jacobian at x as products: from the stored matrix ``jac = self.jac(x)``, or,
        in the matrix-free form, from c linearised at x."""
        return Jacobian(self, x, jac)

    def lagrangian_hessian(self, x: Array, y: Array) -> Array:
        """The dense Hessian of ``f + y.c`` at x: forward differentiation of its gradient
        (the user's gradient where given), n products, symmetrised."""
        w = jax.jacfwd(self._lagrangian_grad(y))(x)
        return 0.5 * (w + w.T)

    def lagrangian_hvp(self, x: Array, y: Array):
        """``u -> W u``, the Hessian of ``f + y.c`` at x times u: its gradient linearised
        once at x (forward over reverse), for the matrix-free form."""
        return jax.linearize(self._lagrangian_grad(y), x)[1]

    def _lagrangian_grad(self, y: Array):
        def grad_l(v):
            g = self.grad(v)
            if self.m:
                g = g + jax.vjp(self.cons, v)[1](y)[0]
            return g

        return grad_l

    # ----------------------------------------------------- the slack formulation
    def residual(self, c: Array, s: Array) -> Array:
        """The constraints' residual: c - s on inequality rows, c - c_L on equality rows,
        0 on rows that constrain nothing."""
        target = jnp.where(self.eq, self.c_lower, s)
        return jnp.where(self.rows, c - target, 0.0)

    def gaps(self, v: Array) -> tuple[Array, Array]:
        """``v - v_L`` and ``v_U - v``, 1 where there is no bound (so logs and divisions
        stay finite; the masks drop those entries)."""
        one = jnp.ones_like(v)
        return (
            jnp.where(self.has_lower, v - self.lower, one),
            jnp.where(self.has_upper, self.upper - v, one),
        )

    def damping(self) -> tuple[Array, Array]:
        """IPOPT's kappa_d masks: entries bounded below only, above only."""
        return self.has_lower & ~self.has_upper, self.has_upper & ~self.has_lower

    def barrier(self, f: Array, v: Array, mu: Array) -> Array:
        """phi_mu = f - mu sum log(gaps) + kappa_d mu (one-sided gaps)."""
        gl, gu = self.gaps(v)
        only_l, only_u = self.damping()
        logs = jnp.sum(jnp.where(self.has_lower, jnp.log(gl), 0.0)) + jnp.sum(
            jnp.where(self.has_upper, jnp.log(gu), 0.0)
        )
        linear = jnp.sum(jnp.where(only_l, gl, 0.0)) + jnp.sum(jnp.where(only_u, gu, 0.0))
        return f - mu * logs + _KAPPA_D * mu * linear

    def barrier_grad(self, grad_f: Array, v: Array, mu: Array) -> Array:
        """The gradient of phi_mu in v = (x, s) (f's part on x only)."""
        gl, gu = self.gaps(v)
        only_l, only_u = self.damping()
        g = jnp.concatenate([grad_f, jnp.zeros(self.m, self.dtype)])
        g = g - jnp.where(self.has_lower, mu / gl, 0.0) + jnp.where(self.has_upper, mu / gu, 0.0)
        return g + _KAPPA_D * mu * (only_l.astype(g.dtype) - only_u.astype(g.dtype))

    def sigma(self, v: Array, z_l: Array, z_u: Array) -> Array:
        """The primal-dual barrier Hessian's diagonal, ``z_L / (v - v_L) + z_U / (v_U - v)``."""
        gl, gu = self.gaps(v)
        return jnp.where(self.has_lower, z_l / gl, 0.0) + jnp.where(self.has_upper, z_u / gu, 0.0)

    def dual_residual(self, grad_f: Array, jty: Array, y: Array, z_l: Array, z_u: Array) -> Array:
        """grad_v L: ``grad f + J^T y - z_L + z_U`` on x (``jty = J^T y``), ``-y - z_L + z_U``
        on the slacks of inequality rows (0 on the others)."""
        on_x = jnp.where(self.free_x, grad_f + jty, 0.0)
        on_s = jnp.where(self.ineq, -y, 0.0)
        return jnp.concatenate([on_x, on_s]) - z_l + z_u

    def errors(
        self,
        grad_f: Array,
        c: Array,
        jty: Array,
        v: Array,
        y: Array,
        z_l: Array,
        z_u: Array,
        mu: Array,
    ) -> tuple[Array, Array, Array, Array]:
        """IPOPT's optimality error E_mu (eq. (5)): the scaled dual infeasibility, the
        constraint violation and the scaled complementarity, with each of the three
        (``jty = J^T y``)."""
        s = v[self.n :]
        dual = _max_abs(self.dual_residual(grad_f, jty, y, z_l, z_u))
        # (zero-size reductions kept out of the program: with m = 0, XLA on the CPU then
        # loses the FFI version of a host callback elsewhere in the driver's program)
        primal = _max_abs(self.residual(c, s)) if self.m else jnp.zeros((), self.dtype)
        gl, gu = self.gaps(v)
        compl = jnp.maximum(
            _max_abs(jnp.where(self.has_lower, gl * z_l - mu, 0.0)),
            _max_abs(jnp.where(self.has_upper, gu * z_u - mu, 0.0)),
        )
        count_z = jnp.sum(self.has_lower) + jnp.sum(self.has_upper)
        count_y = jnp.sum(self.rows) if self.m else jnp.zeros((), count_z.dtype)
        z_sum = jnp.sum(jnp.abs(z_l)) + jnp.sum(jnp.abs(z_u))
        y_sum = jnp.sum(jnp.abs(y)) if self.m else jnp.zeros((), self.dtype)
        s_d = (
            jnp.maximum(
                _S_MAX, (y_sum + z_sum) / jnp.maximum(count_y + count_z, 1).astype(self.dtype)
            )
            / _S_MAX
        )
        s_c = jnp.maximum(_S_MAX, z_sum / jnp.maximum(count_z, 1).astype(self.dtype)) / _S_MAX
        error = jnp.maximum(jnp.maximum(dual / s_d, primal), compl / s_c)
        return error, dual, primal, compl

    def theta(self, c: Array, s: Array) -> Array:
        """The filter's infeasibility measure, ``|residual|_1``."""
        if not self.m:
            return jnp.zeros((), self.dtype)
        return jnp.sum(jnp.abs(self.residual(c, s)))

    def push(self, v: Array, push: Array, frac: Array) -> Array:
        """v moved strictly inside its bounds (IPOPT §3.6, bound_push and bound_frac)."""
        width = self.upper - self.lower
        p_l = jnp.minimum(push * jnp.maximum(1.0, jnp.abs(self.lower)), frac * width)
        p_u = jnp.minimum(push * jnp.maximum(1.0, jnp.abs(self.upper)), frac * width)
        v = jnp.where(self.has_lower, jnp.maximum(v, self.lower + p_l), v)
        v = jnp.where(self.has_upper, jnp.minimum(v, self.upper - p_u), v)
        return jnp.where(self.fixed, self.lower, v)

    def least_squares_y(self, grad_f: Array, jacobian: Jacobian, z_l: Array, z_u: Array) -> Array:
        """IPOPT's multiplier estimate (§3.6): y minimising ``|grad_v f - z_L + z_U + J_v^T
        y|``, the x and slack parts together: by an SVD of J_v, or, matrix-free, by CG on
        the normal equations ``J_v J_v^T y = -J_v g``."""
        if not self.m:
            return jnp.zeros(0, self.dtype)
        g = (
            jnp.concatenate([jnp.where(self.free_x, grad_f, 0.0), jnp.zeros(self.m, self.dtype)])
            - z_l
            + z_u
        )
        if self.condensed:
            y = self._condensed_least_squares_y(jacobian.matrix, g)
        elif self.dense:
            y = jnp.linalg.lstsq(self.jac_v(jacobian.matrix).T, -g)[0]
        else:

            def normal(w):
                return self.jac_v_mv(jacobian, self.jac_v_rmv(jacobian, w))

            y = cg(
                normal,
                -self.jac_v_mv(jacobian, g),
                maxiter=_ESTIMATE_ITERATIONS,
                rtol=jnp.sqrt(jnp.finfo(self.dtype).eps),
                negative_curvature="last",
            ).x
        return jnp.where(self.rows, y, 0.0)

    def _condensed_least_squares_y(self, matrix: Array, g: Array) -> Array:
        """The normal equations ``J_v J_v^T y = -J_v g`` through a system of size n + m_E
        (no m x m one). With J_v = [[J_I, -I], [J_E, 0]] and t = J^T y, they read
        ``(I + J_I^T J_I) t - J_E^T y_E = J_I^T b_I``, ``J_E t = b_E`` (b = -J_v g), and
        ``y_I = b_I - J_I t``; without equality rows, Woodbury's identity."""
        n = self.n
        jac = jnp.where(self.rows[:, None] & self.free_x[None, :], matrix, 0.0)
        b = jnp.where(self.ineq, g[n:], 0.0) - jac @ g[:n]
        jac_i = jnp.where(self.ineq[:, None], jac, 0.0)
        b_i = jnp.where(self.ineq, b, 0.0)
        top = jnp.eye(n, dtype=self.dtype) + jac_i.T @ jac_i
        rows = self._eq_rows()
        if not rows.size:
            t = jnp.linalg.solve(top, jac_i.T @ b_i)
            return jnp.where(self.rows, b_i - jac_i @ t, 0.0)
        jac_e = jac[rows]
        bordered = jnp.block(
            [[top, -jac_e.T], [-jac_e, jnp.zeros((rows.size, rows.size), self.dtype)]]
        )
        # lstsq: the equality rows' Jacobian may be rank-deficient
        sol = jnp.linalg.lstsq(bordered, jnp.concatenate([jac_i.T @ b_i, -b[rows]]))[0]
        y = (b_i - jac_i @ sol[:n]).at[rows].set(sol[n:])
        return jnp.where(self.rows, y, 0.0)

    def _eq_rows(self) -> np.ndarray:
        return np.zeros(0, int) if self.eq_rows is None else self.eq_rows

    def jac_v_mv(self, jacobian: Jacobian, d: Array) -> Array:
        """``J_v d`` for d in v = (x, s) (the product with :meth:`jac_v`'s matrix)."""
        on_s = jnp.where(self.ineq, d[self.n :], 0.0)
        on_x = jacobian.mv(jnp.where(self.free_x, d[: self.n], 0.0))
        return jnp.where(self.rows, on_x - on_s, 0.0)

    def jac_v_rmv(self, jacobian: Jacobian, w: Array) -> Array:
        """``J_v^T w`` (the transposed product with :meth:`jac_v`'s matrix)."""
        w = jnp.where(self.rows, w, 0.0)
        return jnp.concatenate(
            [jnp.where(self.free_x, jacobian.rmv(w), 0.0), -jnp.where(self.ineq, w, 0.0)]
        )

    def jac_v(self, jac: Array) -> Array:
        """The Jacobian of the residual in v = (x, s): ``[J, -I]`` on inequality rows,
        ``[J, 0]`` on equality rows, 0 on rows that constrain nothing (and in the columns of
        fixed variables)."""
        on_s = -jnp.diag(self.ineq.astype(self.dtype))
        jac = jnp.where(self.free_x[None, :], jac, 0.0)
        return jnp.where(self.rows[:, None], jnp.concatenate([jac, on_s], axis=1), 0.0)

    def violation(self, x: Array) -> Array:
        """The largest violation of the bounds and constraints at flat x, relative to
        max(1, |bound|) (the scipy backend's FEASIBILITY_TOL measure)."""
        return self.violation_of(x, None)

    def violation_of(self, x: Array, c: Array | None) -> Array:
        """:meth:`violation` at flat x where ``c = c(x)`` (this NLP's, scaled) is known (no
        evaluation; None: evaluated here)."""
        pairs = [(x, self.x_lower, self.x_upper)]
        if self.m:
            c = self.cons(x) if c is None else c
            pairs.append((c / self.c_scale, self.c_lower_user, self.c_upper_user))
        worst = jnp.zeros((), self.dtype)
        for value, lo, up in pairs:
            below = jnp.where(jnp.isfinite(lo), (lo - value) / jnp.maximum(1.0, jnp.abs(lo)), 0.0)
            above = jnp.where(jnp.isfinite(up), (value - up) / jnp.maximum(1.0, jnp.abs(up)), 0.0)
            worst = jnp.maximum(worst, jnp.max(jnp.maximum(below, above), initial=0.0))
            worst = jnp.where(jnp.all(jnp.isfinite(value)), worst, jnp.inf)
        return worst


def equality_rows(problem: OptimizationProblem) -> np.ndarray | None:
    """The indices of the equality rows (lower == upper) among the flat constraint rows, a
    concrete array (empty where every row is an inequality); None without constraints or
    where the constraints' bounds are traced (then not known when the program is built)."""
    if not problem.constraints:
        return None
    try:  # numpy, not jnp: under an outer jit, jnp would stage even constant bounds
        masks = [
            np.broadcast_to(np.asarray(c.lower) == np.asarray(c.upper), (size,))
            for c, size in zip(problem.constraints, _sizes(problem, problem.x0))
        ]
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None
    return np.flatnonzero(np.concatenate(masks))


class Jacobian:
    """c's Jacobian at one x, as the products ``J d`` and ``J^T w``: with the stored
    matrix, or (matrix-free) from c linearised at x, one evaluation of c per use."""

    def __init__(self, nlp: NLP, x: Array, matrix: Array):
        self.matrix = matrix
        if not nlp.m:
            self.mv = lambda d: jnp.zeros(0, nlp.dtype)
            self.rmv = lambda w: jnp.zeros(nlp.n, nlp.dtype)
        elif nlp.dense:
            self.mv = lambda d: matrix @ d
            self.rmv = lambda w: matrix.T @ w
        else:
            jvp = jax.linearize(nlp.cons, x)[1]
            vjp = jax.linear_transpose(jvp, x)
            self.mv = jvp
            self.rmv = lambda w: vjp(w)[0]


def _max_abs(a: Array) -> Array:
    return jnp.max(jnp.abs(a))


def flat_problem_size(problem: OptimizationProblem) -> Any:
    """(n, m) of a problem: variables and constraint components."""
    n = ravel_pytree(problem.x0)[0].size
    return n, constraint_size(problem, problem.x0)
