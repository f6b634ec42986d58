"""An augmented Lagrangian method (Powell-Hestenes-Rockafellar) with ALGENCAN's safeguards,
on the shared compiled driver; each outer iteration runs a bounded JAX-native method.

Andreani, Birgin, Martínez & Schuverdt, "On augmented Lagrangian methods with general
lower-level constraints", SIAM J. Optim. 18 (2007), 1286-1309 (Algorithm 3.1, ALGENCAN);
Conn, Gould & Toint, "A globally convergent augmented Lagrangian algorithm for optimization
with general constraints and simple bounds", SIAM J. Numer. Anal. 28 (1991), 545-572.

The problem ``min f(x)`` s.t. ``l <= c(x) <= u`` (rows with ``l == u`` are equalities) and
``x_L <= x <= x_U``: the bounds stay with the inner method, the rows go into the penalty.
With safeguarded multipliers ``lam`` (optsolve's sign: ``>= 0`` at an upper bound, ``<= 0``
at a lower one) and the penalty ``rho``, the k-th subproblem is

    min  f(x) + rho/2 |t(x) - P(t(x))|^2,   t = c(x) + lam / rho,   over the box,

with ``P`` the projection onto [l, u] (for ``g(x) <= 0`` this is PHR's
``rho/2 max(0, g + lam/rho)^2``). Its minimiser x_k gives the new multipliers
``y = rho (t - P(t))``, whose Lagrangian gradient ``grad f + J^T y`` is the subproblem's
gradient, so the inner method's stationarity is the Lagrangian's. ALGENCAN's measure of
feasibility and complementarity, ``V = c(x) - P(t)`` (``max(g, -lam/rho)`` for an
inequality), decides the penalty: rho grows by ``penalty_increase`` when |V| did not fall
below ``infeasibility_decrease`` of its last value. The next shift is y clipped to
``+-multiplier_bound`` (the safeguard that makes the method's global theory hold), and the
inner tolerance shrinks tenfold per outer iteration down to ``optimality_tol``.

Nothing is formed beyond vectors: the subproblem's gradient is one vector-Jacobian product
of c, and the inner method (L-BFGS by default) is matrix-free, so the method serves problems
with far more variables than a dense Newton system allows.

The driver's protocol: a driver step is one outer iteration (a whole inner run, one
``lax.while_loop`` inside the step); the state holds the multipliers, the shift and the
penalty, so ``resume=`` continues exactly; ``Step.g`` is the Lagrangian's gradient, and
``Step.violation`` (with a history) the relative violation at the new x. The run
converges when ``|V|_inf <= feasibility_tol`` and the projected Lagrangian gradient's
infinity norm is at most ``optimality_tol`` times ``max(1, |grad f|_inf)`` (its rounding
floor scales so; ``Step.reduction_converged``), the inner runs' gtol likewise; ``ftol`` is
tested by the method at a point feasible to ``feasibility_tol``. Where rho passes
``rho_max`` with |V| still above ``feasibility_tol``, the constraints are taken as locally
infeasible: the run stops there (the penalised problem's minimiser, the least violation the
method reached) and the backend reports INFEASIBLE with the violation.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from optsolve.backends.constrained.nlp import NLP
from optsolve.backends.native.chunked import run_iterative
from optsolve.backends.native.objective import Objective, all_finite, inf_norm
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.backends.native.rules import (
    F_NONFINITE,
    LS_FAILED,
    STALLED_NONFINITE,
    STALLED_STEP,
)
from optsolve.solve_api.kkt import _stacked, constraint_size
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.registry import backend_for
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.stationarity import stationarity

Array = jax.Array
PyTree = Any

# Defaults by itemsize of x's dtype: (feasibility_tol, optimality_tol, rho_max,
# acceptable_tol). float32's feasibility is what the backend calls feasible there
# (nlp.FEASIBILITY_TOLS): a tighter one is below the rounding of rows of magnitude 10-100.
DEFAULT_TOLS = {8: (1e-8, 1e-8, 1e12, 1e-6), 4: (1e-4, 1e-3, 1e6, 1e-2)}


class ALState(NamedTuple):
    """The augmented Lagrangian method's state (see the module docstring)."""

    y: Array  # the multipliers at x (optsolve's sign)
    shift: Array  # the safeguarded multipliers of the next subproblem
    rho: Array  # its penalty
    inner_tol: Array  # its inner tolerance (relative to grad_scale)
    grad_scale: Array  # max(1, |grad f|_inf) at x: the gradient tests' scale
    infeasibility: Array  # |V|_inf at x (+inf at the start: no fall to judge yet)
    error: Array  # max(|V|_inf, projected Lagrangian gradient) at x
    infeasible: Array  # rho passed rho_max with |V| above tolerance
    inner_iterations: Array  # inner iterations so far (all outer iterations)

    def multipliers(self) -> Array:
        """y (``Solution.multipliers``: the method works on the user's problem as it is)."""
        return self.y


def multipliers(c: Array, shift: Array, rho: Array, lower: Array, upper: Array) -> Array:
    """``y = rho (t - P(t))``, ``t = c + shift / rho``, written without t: in float32,
    ``shift / rho`` vanishes beside c once rho is large, and with it the multipliers."""
    return jnp.maximum(0.0, shift + rho * (c - upper)) + jnp.minimum(0.0, shift + rho * (c - lower))


def infeasibility_complementarity(
    c: Array, shift: Array, rho: Array, lower: Array, upper: Array
) -> Array:
    """ALGENCAN's ``V = c - P(t)``: ``c - u`` past the upper bound, ``c - l`` below the lower
    one, ``-shift / rho`` between (an equality's ``c - l``), decided without forming t."""
    above = shift + rho * (c - upper) > 0
    below = shift + rho * (c - lower) < 0
    inside = jnp.where(lower == upper, c - lower, -shift / rho)
    return jnp.where(above, c - upper, jnp.where(below, c - lower, inside))


class _Penalised:
    """``f(x, p) + rho/2 |t - P(t)|^2`` as a function of ``(x, q)``, ``q = (p, shift, rho,
    lower, upper)``: every number a leaf of q, so that the inner run's problem holds no
    traced value in its static fields."""

    def __init__(self, f: Any, grad: Any, gs: tuple, dtype: Any):
        self.f, self.user_grad, self.gs, self.dtype = f, grad, gs, dtype

    def _key(self):
        return (self.f, self.user_grad, self.gs, jnp.dtype(self.dtype))

    def __eq__(self, other):
        return isinstance(other, _Penalised) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def constraints(self, x: PyTree, p: PyTree) -> Array:
        return jnp.concatenate(
            [jnp.ravel(jnp.asarray(g(x, p))).astype(self.dtype) for g in self.gs]
        )

    def penalty(self, c: Array, q: tuple) -> Array:
        """``rho/2 |t - P(t)|^2 = |y|^2 / (2 rho)``, y the multipliers at c."""
        _, shift, rho, lower, upper = q
        y = multipliers(c, shift, rho, lower, upper)
        return 0.5 * jnp.sum(y * y) / rho

    def __call__(self, x: PyTree, q: tuple) -> Array:
        if not self.gs:
            return self.f(x, q[0])
        return self.f(x, q[0]) + self.penalty(self.constraints(x, q[0]), q)

    def grad(self, x: PyTree, q: tuple) -> PyTree:
        """The user's gradient of f plus the penalty's (one vector-Jacobian product)."""
        if not self.gs:
            return self.user_grad(x, q[0])
        g_pen = jax.grad(lambda v: self.penalty(self.constraints(v, q[0]), q))(x)
        return jax.tree_util.tree_map(jnp.add, self.user_grad(x, q[0]), g_pen)


class ALSolver(SteppingSolver):
    """The steps of :class:`~optsolve.AugmentedLagrangian` (see the module docstring)."""

    tests_tolerances: ClassVar[bool] = True

    def __init__(self, algorithm: Any, problem: OptimizationProblem):
        self.alg, self.problem = algorithm, problem
        self.dtype = ravel_pytree(problem.x0)[0].dtype
        self.default_maxiters = type(algorithm).default_maxiters
        self.default_gtol = None  # the method's own tests decide (module docstring)
        self.ftol = None
        self.history = False
        self.m = constraint_size(problem, problem.x0)
        dtype = self.dtype
        if self.m:
            self.lower = _stacked(problem, problem.x0, "lower")
            self.upper = _stacked(problem, problem.x0, "upper")
        else:
            self.lower = self.upper = jnp.zeros(0, dtype)
        gs = tuple(c.g for c in problem.constraints or ())
        self.penalised = _Penalised(problem.f, problem.grad, gs, dtype)
        self.inner = algorithm.inner_algorithm()
        self.backend = backend_for(self.inner)

    def bind_options(self, options: SolveOptions) -> None:
        self.ftol = options.ftol
        self.history = bool(options.history)  # Step.violation is recorded only then

    def violation(self, objective: Objective, x: PyTree, state: ALState) -> Array:
        """The violation at the driver's first iterate (the history's first entry)."""
        return self._violation(objective, x, self._cons(x, objective.p))

    def _violation(self, objective: Objective, x: PyTree, c: Array) -> Array:
        flat = ravel_pytree(x)[0].astype(self.dtype)
        return NLP(objective, self.problem).violation_of(flat, c)

    def _h(self, name: str) -> Array:
        return jnp.asarray(getattr(self.alg, name), self.dtype)

    def _tolerances(self) -> tuple[Array, Array, Array, Array]:
        defaults = DEFAULT_TOLS[jnp.dtype(self.dtype).itemsize]
        return tuple(
            jnp.asarray(
                defaults[i] if getattr(self.alg, name) is None else getattr(self.alg, name),
                self.dtype,
            )
            for i, name in enumerate(
                ("feasibility_tol", "optimality_tol", "rho_max", "acceptable_tol")
            )
        )

    def _cons(self, x: PyTree, p: PyTree) -> Array:
        if not self.m:
            return jnp.zeros(0, self.dtype)
        return self.penalised.constraints(x, p)

    def _measures(self, objective: Objective, x: PyTree, shift: Array, rho: Array):
        """At x: f, the multipliers y, V, the Lagrangian's gradient and the errors."""
        f, grad_f = objective.value_and_grad(x)
        c, pullback = jax.vjp(lambda v: self._cons(v, objective.p), x)
        y = multipliers(c, shift, rho, self.lower, self.upper)
        v = infeasibility_complementarity(c, shift, rho, self.lower, self.upper)
        g_l = jax.tree_util.tree_map(jnp.add, grad_f, pullback(y)[0]) if self.m else grad_f
        infeasibility = jnp.max(jnp.abs(v), initial=0.0)
        scale = jnp.maximum(1.0, inf_norm(grad_f)).astype(self.dtype)
        optimality = stationarity(x, g_l, self.problem.bounds) / scale
        return f, y, g_l, infeasibility, optimality, c, scale

    def init(self, objective: Objective, x: PyTree, f: Array, g: PyTree) -> ALState:
        _, opt_tol, _, _ = self._tolerances()
        dtype = self.dtype
        shift = jnp.zeros(self.m, dtype)
        c = self._cons(x, objective.p)
        v = c - jnp.clip(c, self.lower, self.upper)
        if self.alg.rho_init is None:
            # ALGENCAN's first penalty, balancing f against the violation's square at x0,
            # capped at 10 rather than 1e8: its inner method is a Newton method, and a large
            # first penalty makes a quasi-Newton inner method's subproblem stiff from the start
            rho = jnp.clip(
                10.0 * jnp.maximum(1.0, jnp.abs(f)) / jnp.maximum(1.0, 0.5 * jnp.sum(v * v)),
                1e-8,
                10.0,
            ).astype(dtype)
            rho = jnp.where(jnp.isfinite(rho), rho, 10.0).astype(dtype)
        else:
            rho = self._h("rho_init")
        _, y, _, infeasibility, optimality, _, scale = self._measures(objective, x, shift, rho)
        return ALState(
            y,
            shift,
            rho,
            jnp.maximum(opt_tol, jnp.sqrt(opt_tol)),
            scale,
            jnp.asarray(jnp.inf, dtype),
            jnp.maximum(infeasibility, optimality),
            jnp.zeros((), bool),
            jnp.zeros((), jnp.int32),
        )

    def step(self, objective: Objective, x: PyTree, f: Array, g: PyTree, state: ALState) -> Step:
        feas_tol, opt_tol, rho_max, acceptable_tol = self._tolerances()
        q = (objective.p, state.shift, state.rho, self.lower, self.upper)
        sub = OptimizationProblem(
            self.penalised,
            x,
            q,
            bounds=self.problem.bounds,
            grad=None if self.problem.grad is None else self.penalised.grad,
        )
        options = SolveOptions(
            maxiters=jnp.asarray(self.alg.inner_maxiters, jnp.int32),
            gtol=state.inner_tol * state.grad_scale,
        )
        run = self.backend(sub, self.inner, options)
        # An inner run that failed (a non-finite value, a failed line search) fails the
        # outer iteration: the run ends at the last outer iterate. One that stalled on
        # non-finite values, or without moving, stalls it (it keeps the inner run's last
        # good point): going on would creep towards the region that stopped it, or repeat
        # the same subproblem.
        x_new = run.x
        code = jnp.asarray(run.retcode, jnp.int32)
        reason = jnp.asarray(0 if run.reason is None else run.reason, jnp.int32)
        nonfinite = (
            (reason >= F_NONFINITE)
            & (reason <= STALLED_NONFINITE)
            & (reason != LS_FAILED)
            & (reason != STALLED_STEP)
        )
        unmoved = jnp.all(ravel_pytree(x_new)[0] == ravel_pytree(x)[0])
        inner_failed = code == int(ReturnCode.FAILURE)
        inner_stalled = (code == int(ReturnCode.STALLED)) & (nonfinite | unmoved)
        f_new, y, g_l, infeasibility, optimality, c, scale = self._measures(
            objective, x_new, state.shift, state.rho
        )
        # (where the inner method can make no further progress, as on a large problem whose
        # f's rounding hides the last decrease, acceptable_tol is enough)
        acceptable = inner_stalled & ~nonfinite & (optimality <= acceptable_tol)
        converged = (infeasibility <= feas_tol) & ((optimality <= opt_tol) | acceptable)
        # (not once |V| meets its tolerance: its rounding floor would raise rho for nothing)
        grow = (infeasibility > self._h("infeasibility_decrease") * state.infeasibility) & (
            infeasibility > feas_tol
        )
        rho = jnp.where(grow & ~converged, state.rho * self._h("penalty_increase"), state.rho)
        infeasible = (rho > rho_max) & (infeasibility > feas_tol)
        bound = self._h("multiplier_bound")
        new = ALState(
            y,
            jnp.clip(y, -bound, bound),
            rho,
            jnp.maximum(opt_tol, 0.1 * state.inner_tol),
            scale,
            infeasibility,
            jnp.maximum(infeasibility, optimality),
            infeasible,
            state.inner_iterations + jnp.asarray(run.stats.iterations, jnp.int32),
        )
        ftol_met = jnp.zeros((), bool)
        if self.ftol is not None:
            f_scale = jnp.maximum(jnp.maximum(jnp.abs(f), jnp.abs(f_new)), 1.0)
            ftol_met = (infeasibility <= feas_tol) & (jnp.abs(f - f_new) <= self.ftol * f_scale)
        evals = lambda n: jnp.asarray(n, jnp.int32) + 1  # the outer evaluation
        failed = ~all_finite(f_new) | ~all_finite(g_l) | inner_failed
        violation = self._violation(objective, x_new, c) if self.history else None
        return Step(
            x_new,
            f_new,
            g_l,
            new,
            evals(run.stats.f_evals),
            evals(run.stats.grad_evals),
            failed,
            (infeasible | inner_stalled) & ~converged,
            (inner_failed | inner_stalled) & nonfinite,
            converged,
            ftol_met,
            violation,
        )


def solve_augmented_lagrangian(
    problem: OptimizationProblem, algorithm: Any, options: SolveOptions, loop: Any = None
) -> Any:
    """Run :class:`~optsolve.AugmentedLagrangian` on the shared driver, then say the
    outcome in its terms (:mod:`optsolve.backends.constrained.outcome`)."""
    from optsolve.backends.constrained.outcome import describe_augmented_lagrangian, finished

    return run_iterative(
        _make_solver,
        problem,
        algorithm,
        options,
        loop,
        after=functools.partial(finished, describe=describe_augmented_lagrangian),
    )


def _make_solver(algorithm: Any, problem: OptimizationProblem) -> ALSolver:
    return ALSolver(algorithm, problem)
