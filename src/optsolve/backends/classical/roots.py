"""JAX-native root finders for square systems ``F(x, p) = 0``: Newton-Raphson (dense
Jacobian, or matrix-free with a Krylov solver) and Broyden's good method, each globalised by a
backtracking line search on the merit ``0.5 |F|^2``.

They run on the shared compiled driver (:mod:`optsolve.backends.native.driver`), on the
:class:`~optsolve.solve_api.root_problem.RootSystem` of the root problem: the driver's
objective is the merit and its gradient field is F itself, so the driver's gradient test is
the root test ``max|F| <= ftol`` (``solve`` maps its ``ftol`` onto it), its non-finite check
keeps the last finite iterate, and callbacks, history (``grad_norm`` = ``max|F|``), resume
and maxtime work as for every other JAX-native method. Solvers work on flat vectors
(``jax.flatten_util.ravel_pytree``), so any pytree x works.

Steps solve the linear model of the (approximate) Jacobian, scaled by its column norms: by
LU where it is well conditioned, else by its singular value decomposition, so that a
singular or rank-deficient Jacobian, at the start (scipy's pressure-network test) or on the
way, gets the least-squares step of least scaled norm, never NaN; where a line search finds
no decrease, the next step is damped, Levenberg-style.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jax.flatten_util import ravel_pytree

from optsolve.backends.classical.descent import (
    ClassicalAlgorithm,
    check_positive,
    default_gtol,
    register,
)
from optsolve.backends.classical.least_squares import DenseWhenAsked
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.linear_solve import cg
from optsolve.solve_api.loops import inner_while_loop
from optsolve.solve_api.pytree import pytree_dataclass, static_field
from optsolve.solve_api.root_problem import MATRIX_FREE_ABOVE, krylov_solve

Array = jax.Array

# Damping: a rejected step raises mu (in units of the Jacobian's largest squared singular
# value) to at least _MU_FIRST, then by _MU_GROWTH; an accepted one lowers it by _MU_DECAY.
# Once mu reaches _MU_GIVE_UP and still no step decreases the merit, the run ends.
_MU_FIRST, _MU_GROWTH, _MU_DECAY, _MU_GIVE_UP = 1e-4, 100.0, 0.1, 1e4


class _Field:
    """F on flat vectors (x's dtype), with p bound."""

    def __init__(self, problem: LeastSquaresProblem, p: Any):
        _, self.unravel = ravel_pytree(problem.x0)
        self.residual, self.p = problem.residual, p

    def __call__(self, x: Array) -> Array:
        return ravel_pytree(self.residual(self.unravel(x), self.p))[0].astype(x.dtype)

    def jacobian(self, x: Array) -> Array:
        return jax.jacfwd(self)(x)

    def linearized(self, x: Array) -> tuple[Any, Any]:
        """(v -> J v, u -> J^T u) at x, linearised once."""
        _, jvp = jax.linearize(self, x)
        vjp = jax.linear_transpose(jvp, x)
        return jvp, lambda u: vjp(u)[0]


def _merit(F: Array) -> Array:
    return 0.5 * jnp.sum(jnp.square(F))


class _Search(NamedTuple):
    k: Array  # trials made
    alpha: Array  # the step length of the next trial (of the accepted one once done)
    x: Array  # the last trial point
    F: Array
    phi: Array
    accepted: Array
    nonfinite: Array


def _backtrack(
    field: _Field, x: Array, F: Array, d: Array, slope: Array, c1: Any, max_trials: int
) -> _Search:
    """Backtracking along ``d`` from ``alpha = 1`` until the Armijo condition on the merit,
    ``phi(alpha) <= phi(0) + c1 alpha slope``, holds (``slope``: phi's derivative at 0, the
    model's where the Jacobian is approximate); each cut is the minimiser of the quadratic
    through phi(0), slope and phi(alpha), kept within [0.1, 0.5] alpha (Dennis & Schnabel,
    *Numerical Methods for Unconstrained Optimization and Nonlinear Equations*, 1983,
    Algorithm A6.3.1). A non-finite trial counts as no decrease."""
    phi0 = _merit(F)

    def cond(s: _Search) -> Array:
        return ~s.accepted & (s.k < max_trials)

    def body(s: _Search) -> _Search:
        x_trial = x + s.alpha * d
        F_trial = field(x_trial)
        phi = _merit(F_trial)
        finite = jnp.isfinite(phi)
        # a strict decrease too: a model slope (Broyden's) may point uphill, where only
        # steps too small to change phi beyond rounding pass the Armijo test
        accepted = finite & (phi <= phi0 + c1 * s.alpha * slope) & (phi < phi0)
        excess = phi - phi0 - slope * s.alpha
        quadratic = jnp.where(
            finite & (excess > 0),
            -slope * s.alpha**2 / (2 * jnp.where(excess > 0, excess, 1.0)),
            0.5 * s.alpha,
        )
        cut = jnp.clip(quadratic, 0.1 * s.alpha, 0.5 * s.alpha)
        return _Search(
            s.k + 1,
            jnp.where(accepted, s.alpha, cut).astype(s.alpha.dtype),
            x_trial,
            F_trial,
            phi,
            accepted,
            s.nonfinite | ~finite,
        )

    false = jnp.zeros((), bool)
    start = _Search(jnp.zeros((), jnp.int32), jnp.ones((), x.dtype), x, F, phi0, false, false)
    return inner_while_loop(cond, body, start, max_trials)


def _model_step(jac: Array, F: Array, mu: Array) -> tuple[Array, Array]:
    """The step of the linear model ``F + J d = 0``, damped by ``mu``.

    The variables are scaled by J's column norms D (MINPACK's scaling, Moré 1978): with
    ``J D^-1 = U S V^T`` (an SVD), ``d = -D^-1 V (S^2 + mu s_1^2)^+ S U^T F``, singular
    values at rounding level taken as zero. That is the Newton step ``-J^-1 F`` where J is
    regular and mu = 0, whatever the scaling; the least-squares step of least scaled norm
    where J is singular; and, scaled, the columns of a badly scaled J (Powell's problem:
    1e4 against 1e-2) do not hide a regular direction below the rounding cut-off. mu is in
    units of ``s_1^2``, the scaled J's largest squared singular value. Where mu = 0 and the
    scaled J is well conditioned (its LU factors' pivots within sqrt(eps) of each other),
    the same Newton step comes from an LU factorisation, an order of magnitude cheaper
    than the SVD (:func:`_scaled_step`).

    Returns:
      (d, the model's slope of the merit along d, ``F^T J d``).
    """
    colnorm = jnp.sqrt(jnp.sum(jnp.square(jac), axis=0))
    scale_x = jnp.where(colnorm > 0, colnorm, 1.0)
    e, slope = _scaled_step(jac / scale_x[None, :], F, mu)
    return e / scale_x, slope


def _svd_step(scaled: Array, F: Array, mu: Array) -> tuple[Array, Array]:
    u, s, vt = jnp.linalg.svd(scaled)
    eps = jnp.finfo(scaled.dtype).eps
    kept = s > eps * scaled.shape[0] * s[0]
    c = u.T @ F
    denominator = jnp.square(s) + mu * jnp.square(s[0])
    coef = jnp.where(kept, s * c / jnp.where(kept, denominator, 1.0), 0.0)
    slope = -jnp.sum(jnp.where(kept, s * c * coef, 0.0))  # F^T J d = -sum s c coef
    return -(vt.T @ coef), slope


def _lu_step(scaled: Array, F: Array, mu: Array) -> tuple[Array, Array, Array]:
    """The undamped Newton step by LU, its slope, and whether it stands for the SVD's: mu
    is 0, the step is finite and the pivots are within sqrt(eps) of each other."""
    lu, piv = jax.scipy.linalg.lu_factor(scaled)
    e = jax.scipy.linalg.lu_solve((lu, piv), -F)
    pivots = jnp.abs(jnp.diagonal(lu))
    eps = jnp.finfo(scaled.dtype).eps
    fits = (
        (mu == 0) & jnp.all(jnp.isfinite(e)) & (jnp.min(pivots) > jnp.sqrt(eps) * jnp.max(pivots))
    )
    return e, jnp.dot(F, scaled @ e), fits


@custom_vmap
def _scaled_step(scaled: Array, F: Array, mu: Array) -> tuple[Array, Array]:
    """The step in the scaled variables: LU where it fits, else the SVD's."""
    e, slope, fits = _lu_step(scaled, F, mu)
    return lax.cond(fits, lambda: (e, slope), lambda: _svd_step(scaled, F, mu))


@_scaled_step.def_vmap
def _scaled_step_batched(axis_size, in_batched, scaled, F, mu):
    # Batched (vmap over problems), a cond per element would run both branches for all:
    # the SVDs run only where some element needs one
    scaled, F, mu = (
        a if batched else jnp.broadcast_to(a, (axis_size,) + jnp.shape(a))
        for a, batched in zip((scaled, F, mu), in_batched)
    )
    e, slope, fits = jax.vmap(_lu_step)(scaled, F, mu)

    def with_svd():
        e_svd, slope_svd = jax.vmap(_svd_step)(scaled, F, mu)
        return (jnp.where(fits[:, None], e, e_svd), jnp.where(fits, slope, slope_svd))

    return lax.cond(jnp.all(fits), lambda: (e, slope), with_svd), (True, True)


class _RootState(NamedTuple):
    jac: Array  # the Jacobian at x (NewtonRaphson) or Broyden's approximation of it
    fresh: Array  # jac is the true Jacobian at x (evaluated there, not updated since)
    restart: Array  # the next step evaluates the true Jacobian first (Broyden)
    mu: Array  # the damping, in units of the scaled jac's largest squared singular value
    alpha: Array  # the last step length (0 before the first, and after a rejected step)


def _tiny(s: Array, x: Array) -> Array:
    """A step that changes no component beyond a few units in the last place."""
    eps = jnp.finfo(x.dtype).eps
    return jnp.all(jnp.abs(s) <= 4 * eps * jnp.abs(x))


class _RootSolver(SteppingSolver):
    """One iteration: the model step (damped by mu), a backtracking line search on the
    merit, then the model's update (:meth:`update`). A search that finds no decrease leaves
    x where it was and raises mu; the run fails once mu is at its limit and still no step
    decreases the merit (a local minimum of |F|^2 that is not a root, or non-finite values
    all around), or stalls where a step along the true Jacobian's model no longer changes
    x beyond rounding."""

    # a rejected step leaves x unchanged without a stall: the step decides
    detect_stall: ClassVar[bool] = False

    def __init__(self, alg: Any, problem: LeastSquaresProblem):
        if not isinstance(problem, LeastSquaresProblem):  # solve checks first; a direct caller
            raise TypeError(
                f"{type(alg).__name__} solves an optsolve.RootProblem, got "
                f"{type(problem).__name__}."
            )
        self.alg, self.problem = alg, problem
        x0 = ravel_pytree(problem.x0)[0]
        self.n, self.dtype = x0.size, x0.dtype
        # the root tolerance on max|F| where solve is given no ftol (the driver's gtol)
        self.default_gtol = default_gtol(self.dtype)
        self.default_maxiters = type(alg).default_maxiters

    def init(self, objective: Objective, x, f, g) -> _RootState:
        field = _Field(self.problem, objective.p)
        zero, true = jnp.zeros((), self.dtype), jnp.ones((), bool)
        return _RootState(field.jacobian(ravel_pytree(x)[0]), true, ~true, zero, zero)

    def model(self, field: _Field, state: _RootState, x: Array) -> tuple[Array, Array, Array]:
        """The Jacobian (or its approximation) the step uses, whether it is the true one,
        and the Jacobian evaluations that cost."""
        return state.jac, state.fresh, jnp.zeros((), jnp.int32)

    def direction(
        self, field: _Field, jac: Array, x: Array, F: Array, mu: Array
    ) -> tuple[Array, Array]:
        """The step of the model damped by mu, and the model's slope of the merit along it."""
        return _model_step(jac, F, mu)

    def update(
        self,
        field: _Field,
        jac: Array,
        fresh: Array,
        x: Array,
        F: Array,
        x_new: Array,
        F_new: Array,
        accepted: Array,
    ) -> tuple[Array, Array, Array]:
        """The model at the next iterate, whether it is the true Jacobian there, and the
        Jacobian evaluations that cost."""
        raise NotImplementedError

    def step(self, objective: Objective, x, f, g, state: _RootState) -> Step:
        field = _Field(self.problem, objective.p)
        xf, unravel = ravel_pytree(x)
        Ff = ravel_pytree(g)[0].astype(self.dtype)  # the gradient field is F
        jac, fresh, jac_evals = self.model(field, state, xf)
        d, slope = self.direction(field, jac, xf, Ff, state.mu)
        found = _backtrack(field, xf, Ff, d, slope, self.alg.c1, self.alg.max_trials)
        accepted = found.accepted
        x_new = jnp.where(accepted, found.x, xf)
        F_new = jnp.where(accepted, found.F, Ff)
        jac_new, fresh_new, evals = self.update(field, jac, fresh, xf, Ff, x_new, F_new, accepted)
        full = accepted & (found.alpha == 1)
        mu = jnp.where(
            full,
            state.mu * _MU_DECAY,
            jnp.where(accepted, state.mu, jnp.maximum(state.mu * _MU_GROWTH, _MU_FIRST)),
        )
        mu = jnp.where(mu < jnp.finfo(self.dtype).eps, 0.0, mu).astype(self.dtype)
        alpha = jnp.where(accepted, found.alpha, 0.0).astype(self.dtype)
        tiny = accepted & _tiny(x_new - xf, xf)
        # no decrease even along the most damped step of the true Jacobian: nothing left
        exhausted = ~accepted & fresh & (state.mu >= _MU_GIVE_UP)
        # no decrease and the trial values are the current one at rounding level
        flat = ~accepted & (jnp.abs(found.phi - f) <= 16 * jnp.finfo(self.dtype).eps * f)
        stalled = (tiny & fresh) | (exhausted & flat)
        failed = exhausted & ~stalled
        # a model that gave no step (or a step below rounding) is replaced by the true
        # Jacobian before the next one
        restart = (~accepted | tiny) & ~fresh_new
        new_state = _RootState(jac_new, fresh_new, restart, mu, alpha)
        return Step(
            unravel(x_new),
            _merit(F_new).astype(f.dtype),
            unravel(F_new),
            new_state,
            found.k,
            jac_evals + evals,
            failed,
            stalled,
            found.nonfinite,
        )


# ------------------------------------------------------------------------ Newton-Raphson


class _NewtonSolver(_RootSolver):
    def update(self, field, jac, fresh, x, F, x_new, F_new, accepted):
        jac_new = lax.cond(accepted, field.jacobian, lambda _: jac, x_new)
        return jac_new, fresh, accepted.astype(jnp.int32)


class _MatrixFreeNewtonSolver(_RootSolver):
    """Newton-Raphson on Jacobian products only: J is never formed, the state holds no
    matrix (its ``jac`` is an empty placeholder) and each step linearises F at x."""

    def init(self, objective: Objective, x, f, g) -> _RootState:
        zero, true = jnp.zeros((), self.dtype), jnp.ones((), bool)
        return _RootState(jnp.zeros((0,), self.dtype), true, ~true, zero, zero)

    def model(self, field, state, x):
        # the linearisation at x is the true Jacobian, evaluated as products in direction
        return state.jac, jnp.ones((), bool), jnp.ones((), jnp.int32)

    def direction(self, field, jac, x, F, mu):
        jvp, vjp = field.linearized(x)
        alg = self.alg
        maxiter = alg.krylov_maxiter if alg.krylov_maxiter is not None else max(self.n, 20)
        # inexact Newton (Dembo, Eisenstat & Steihaug 1982): J d = -F to krylov_rtol
        F_norm = jnp.linalg.norm(F)

        def newton():
            d = krylov_solve(
                alg.linear_solver, jvp, -F, alg.krylov_rtol, maxiter, alg.krylov_restart
            )
            Jd = jvp(d)
            # a Krylov step that barely lowers |F + J d| (a singular J, a stagnating or
            # broken down Krylov method) is not worth a line search
            usable = jnp.all(jnp.isfinite(Jd)) & (jnp.linalg.norm(F + Jd) <= 0.9 * F_norm)
            return d, jnp.dot(F, Jd), usable

        # the Krylov solve only where the step is undamped (a damped one does without it)
        d_newton, slope_newton, usable = lax.cond(
            mu == 0,
            newton,
            lambda: (jnp.zeros_like(F), jnp.zeros((), F.dtype), jnp.zeros((), bool)),
        )

        def damped():
            # (J^T J + lambda I) d = -J^T F by CG; lambda = mu |J^T F|^2 / |F|^2, a lower
            # bound of mu s_1^2 (the dense step's damping), at least _MU_FIRST's where mu is
            # 0 and the Newton step failed
            g = vjp(F)
            scale = jnp.sum(jnp.square(g)) / jnp.where(F_norm > 0, F_norm**2, 1.0)
            lam = jnp.maximum(mu, _MU_FIRST) * scale
            d = cg(lambda v: vjp(jvp(v)) + lam * v, -g, rtol=alg.krylov_rtol, maxiter=maxiter).x
            return d, jnp.dot(F, jvp(d))

        return lax.cond(usable, lambda: (d_newton, slope_newton), damped)

    def update(self, field, jac, fresh, x, F, x_new, F_new, accepted):
        return jac, fresh, jnp.zeros((), jnp.int32)


_NEWTON_LINEAR_SOLVERS = ("auto", "dense", "bicgstab", "gmres")


class _RootAlgorithm(ClassicalAlgorithm):
    """What the root solvers share: the traits, the line search's constants."""

    needs_residuals: ClassVar[bool] = True
    # roots: solve hands them the RootSystem of a RootProblem, whose gradient field is F
    solves_roots: ClassVar[str] = "field"
    roots_only: ClassVar[bool] = True
    extra_options: ClassVar[tuple[str, ...]] = ()
    # implicit differentiation (the implicit function theorem) is exact at a root; through
    # the iterations reverse mode would meet the SVD's derivative at repeated singular values
    unrollable: ClassVar[bool] = False
    dense_matrices: ClassVar[int] = 3
    default_maxiters: ClassVar[int] = 200

    def _check(self):
        check_positive(type(self).__name__, "c1", self.c1)
        if (
            isinstance(self.max_trials, bool)
            or not isinstance(self.max_trials, int)
            or self.max_trials < 1
        ):
            raise ValueError(
                f"{type(self).__name__}: `max_trials` must be an integer >= 1, "
                f"got {self.max_trials!r}."
            )


@register
@pytree_dataclass
class NewtonRaphson(DenseWhenAsked, _RootAlgorithm):
    """Newton-Raphson for square systems ``F(x, p) = 0`` (an
    :class:`~optsolve.RootProblem`), with a dense Jacobian and a backtracking line search on
    the merit ``0.5 |F|^2`` for global convergence.

    Each iteration takes the Jacobian ``J = dF/dx`` at x (``jax.jacfwd``: n forward passes)
    and the step ``d = -J^-1 F``, with the variables scaled by J's column norms (MINPACK's
    scaling): by LU where the scaled J is well conditioned, else from its singular value
    decomposition, so that a singular or rank-deficient J gets the least-squares step of
    least scaled norm, never NaN (scipy's pressure-network test starts at one). The step
    length backtracks from 1 until ``phi(a) <= phi(0) + c1 a phi'(0)``, with
    ``phi(a) = 0.5 |F(x + a d)|^2`` (Dennis & Schnabel, *Numerical Methods for
    Unconstrained Optimization and Nonlinear Equations*, 1983, §6.5 and Algorithm A6.3.1).
    Where no step length decreases the merit, x stays and the next step is damped,
    Levenberg-style,
    ``d = -(J^T J + mu s_1^2 I)^-1 J^T F`` (s_1: J's largest singular value), with mu
    raised by 100 at each such iteration and lowered by 10 after each full step; the run
    fails once mu passes 1e4 without a decrease (a local minimum of |F|^2 that is not a
    root). Near a regular root the full Newton step is accepted and convergence is
    quadratic.

    Above 256 unknowns (``linear_solver="auto"``) J is never formed: each iteration
    linearises F at x (``jax.linearize``) and solves ``J d = -F`` to ``krylov_rtol`` by
    BiCGStab (``"bicgstab"``) or restarted GMRES (``"gmres"``) on Jacobian-vector products,
    an inexact Newton method (Dembo, Eisenstat & Steihaug, "Inexact Newton methods", SIAM J.
    Numer. Anal. 19, 1982); where the Krylov step does not lower ``|F + J d|`` below 0.9
    ``|F|`` (a singular J) or the line search found no decrease, the damped step
    ``(J^T J + lambda I) d = -J^T F`` comes from CG on products with J and J^T
    (``lambda = mu |J^T F|^2 / |F|^2``, a lower bound of the dense step's damping). The
    variables are not scaled there. Memory is a few vectors of x's size, whatever n. The
    implicit derivative of a root of more than 256 unknowns is matrix-free too.

    It stops with SUCCESS once ``max|F(x)| <= ftol`` (``solve``'s ``ftol``, default 1e-8 in
    float64, 1e-5 in float32), at ``maxiters`` (default 200) or with STALLED where the step
    no longer changes x beyond rounding. Counts: ``f_evals`` are evaluations of F (the line
    search's trials), ``grad_evals`` Jacobian evaluations, each with the driver's one at x0.
    ``sol.history.grad_norm`` records ``max|F|``.

    Args:
      c1: the line search's sufficient-decrease constant (default 1e-4).
      max_trials: the most trial steps per line search (static; default 30).
      linear_solver: "auto" (default: "dense" up to 256 unknowns, else "bicgstab"),
        "dense" (J by ``jax.jacfwd``, LU or SVD), "bicgstab" or "gmres" (matrix-free)
        (static).
      krylov_rtol: the matrix-free solves' relative residual tolerance (default 1e-8).
      krylov_maxiter: the most Jacobian products a matrix-free solve makes (static;
        default None: n, at least 20).
      krylov_restart: GMRES's restart length (static; default 50).

    Counts: with a matrix-free solver ``grad_evals`` counts linearisations of F, one an
    iteration; the products each solve makes are not counted.

    Example:
      >>> prob = optsolve.RootProblem(lambda x, p: x ** 3 - p, jnp.ones(2), p=8.0)
      >>> sol = optsolve.solve(prob, optsolve.NewtonRaphson())
    """

    c1: Any = 1e-4
    max_trials: int = static_field(default=30)
    linear_solver: str = static_field(default="auto")
    krylov_rtol: Any = 1e-8
    krylov_maxiter: int | None = static_field(default=None)
    krylov_restart: int = static_field(default=50)

    def __post_init__(self):
        self._check()
        if self.linear_solver not in _NEWTON_LINEAR_SOLVERS:
            raise ValueError(
                "NewtonRaphson: `linear_solver` must be one of "
                f"{', '.join(map(repr, _NEWTON_LINEAR_SOLVERS))}, got {self.linear_solver!r}."
            )
        check_positive("NewtonRaphson", "krylov_rtol", self.krylov_rtol)
        for name in ("krylov_restart", "krylov_maxiter"):
            value = getattr(self, name)
            if value is None and name == "krylov_maxiter":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NewtonRaphson: `{name}` must be an integer >= 1, got {value!r}.")

    def make_solver(self, problem: LeastSquaresProblem) -> _RootSolver:
        n = ravel_pytree(problem.x0)[0].size
        dense = self.linear_solver == "dense" or (
            self.linear_solver == "auto" and n <= MATRIX_FREE_ABOVE
        )
        return (_NewtonSolver if dense else _MatrixFreeNewtonSolver)(self, problem)


# ------------------------------------------------------------------------------ Broyden


class _BroydenSolver(_RootSolver):
    def model(self, field, state, x):
        # a restart (the last model gave no step): the true Jacobian replaces the model
        jac = lax.cond(state.restart, field.jacobian, lambda _: state.jac, x)
        return jac, state.fresh | state.restart, state.restart.astype(jnp.int32)

    def update(self, field, jac, fresh, x, F, x_new, F_new, accepted):
        # Broyden's good update (Broyden 1965): B+ = B + (y - B s) s^T / (s^T s)
        s, y = x_new - x, F_new - F
        ss = jnp.dot(s, s)
        usable = accepted & (ss > 0) & jnp.all(jnp.isfinite(y))
        updated = jac + jnp.outer(y - jac @ s, s) / jnp.where(usable, ss, 1.0)
        return (jnp.where(usable, updated, jac), fresh & ~usable, jnp.zeros((), jnp.int32))


@register
@pytree_dataclass
class Broyden(_RootAlgorithm):
    """Broyden's ("good") method for square systems ``F(x, p) = 0`` (an
    :class:`~optsolve.RootProblem`): a secant approximation B of the Jacobian, updated
    from each step instead of re-evaluated, with a backtracking line search on the merit
    ``0.5 |F|^2`` (C. G. Broyden, "A class of methods for solving nonlinear simultaneous
    equations", *Mathematics of Computation* 19, 1965, pp. 577-593).

    B starts as the true Jacobian at x0 (``jax.jacfwd``). Each iteration steps along
    ``d = -B^-1 F`` (as in :class:`NewtonRaphson`: the least-squares step of least scaled
    norm where B is singular),
    backtracks from the unit step until ``phi(a) <= phi(0) + c1 a phi'(0)`` with the
    model's slope ``phi'(0) = F^T B d``, and updates
    ``B+ = B + (y - B s) s^T / (s^T s)`` with ``s = x+ - x``, ``y = F(x+) - F(x)``. Where the
    line search finds no decrease (the update has made B a bad model), x stays and the next
    iteration restarts from the true Jacobian at x, with a damped, Levenberg-style step as
    in :class:`NewtonRaphson`; the run fails once the damping passes its limit without a
    decrease. Near a regular root convergence is superlinear, with one evaluation of F per
    iteration and no Jacobian.

    It stops with SUCCESS once ``max|F(x)| <= ftol`` (``solve``'s ``ftol``, default 1e-8 in
    float64, 1e-5 in float32), at ``maxiters`` (default 200) or with STALLED. Counts:
    ``f_evals`` are evaluations of F, ``grad_evals`` Jacobian evaluations (at x0 and at
    restarts).

    Args:
      c1: the line search's sufficient-decrease constant (default 1e-4).
      max_trials: the most trial steps per line search (static; default 30).

    Example:
      >>> prob = optsolve.RootProblem(lambda x, p: x ** 3 - p, jnp.ones(2), p=8.0)
      >>> sol = optsolve.solve(prob, optsolve.Broyden())
    """

    c1: Any = 1e-4
    max_trials: int = static_field(default=30)

    def __post_init__(self):
        self._check()

    def make_solver(self, problem: LeastSquaresProblem) -> _BroydenSolver:
        return _BroydenSolver(self, problem)
