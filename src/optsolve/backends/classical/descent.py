"""JAX-native classical optimizers: the shared line-search method, gradient descent and
nonlinear conjugate gradients.

A method is composed, optimistix-style, of a *descent direction* hook, a pluggable line search
(:mod:`optsolve.backends.classical.linesearch`) and an *update* hook that refreshes the curvature
model (quasi-Newton memory, CG's previous direction) after the step. :class:`DescentSolver` does the
composition once; each algorithm supplies the hooks. Everything runs inside the one compiled loop of
:mod:`optsolve.backends.native.driver`, which owns stopping, the non-finite check and counts.

Solvers work on the flattened iterate (``jax.flatten_util.ravel_pytree``), so any pytree
``x0`` works; a single array costs no copy.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from optsolve.backends.classical.linesearch import (
    Backtracking,
    LineSearch,
    Zoom,
    _scalar_dtype,
    check_linesearch,
)
from optsolve.backends.native.chunked import run_iterative
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass, static_field
from optsolve.solve_api.registry import register_algorithm, register_backend
from optsolve.solve_api.solution import Solution

Array = jax.Array
PyTree = Any

# Default gradient tolerances by dtype: float64 runs reach published minima to ~1e-8
# relative; float32 cannot resolve gradients much below ~100 eps times their scale.
DEFAULT_GTOL = {8: 1e-8, 4: 1e-5, 2: 1e-2}


def default_gtol(dtype: Any) -> float:
    """The default gradient inf-norm tolerance for iterates of ``dtype``:
    1e-8 (float64), 1e-5 (float32), 1e-2 (16-bit floats)."""
    return DEFAULT_GTOL[jnp.dtype(dtype).itemsize]


class ClassicalAlgorithm(Algorithm):
    """Base of the JAX-native classical methods (capability traits shared by all).

    They stop by themselves: at ``gtol`` = :func:`default_gtol` of the iterate's dtype and
    at the class's ``default_maxiters``, unless ``solve`` is given others. ``xtol`` (a
    ``solve`` option) stops with SUCCESS once a step is below ``xtol * max(|x|_inf, 1)``.
    """

    family: ClassVar[str] = "classical"
    stops_by_itself: ClassVar[bool] = True
    extra_options: ClassVar[tuple[str, ...]] = ("xtol",)
    default_maxiters: ClassVar[int] = 1000
    resumable: ClassVar[bool] = True
    records_history: ClassVar[bool] = True
    compiled_driver: ClassVar[bool] = True
    # line searches and CG run as bounded scans under UnrolledAdjoint (loops.inner_while_loop)
    unrollable: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The least-squares methods factorise the Jacobian (QR, SVD: LAPACK has no 16-bit
        # kernels) and in float16 their matrix-free form overflows: 32 or 64 bits only.
        if cls.needs_residuals and "float_dtypes" not in cls.__dict__:
            cls.float_dtypes = ("float32", "float64")


class Flat:
    """A problem seen through its flattened iterate: value-and-gradient and Hessian products
    of flat vectors, with the box bounds flattened too (None when unbounded)."""

    def __init__(self, objective: Objective, problem: OptimizationProblem):
        _, self.unravel = ravel_pytree(problem.x0)
        self.objective = objective
        self.bounds = None
        # All-infinite concrete bounds are no bounds: keep the Wolfe line search.
        if problem.bounds is not None and problem.has_bounds:
            self.bounds = (ravel_pytree(problem.bounds[0])[0], ravel_pytree(problem.bounds[1])[0])

    @staticmethod
    def ravel(tree: PyTree) -> Array:
        return ravel_pytree(tree)[0]

    def value_and_grad(self, x: Array) -> tuple[Array, Array]:
        f, g = self.objective.value_and_grad(self.unravel(x))
        return f, self.ravel(g)

    def hvp_at(self, x: Array):
        """``v -> H(x) v`` for flat ``v``; linearised once, so repeated products are cheap."""
        if self.objective.user_hvp is not None:
            xt = self.unravel(x)
            return lambda v: self.ravel(self.objective.hvp(xt, self.unravel(v)))
        _, lin = jax.linearize(lambda z: self.ravel(self.objective.grad(self.unravel(z))), x)
        return lin


class DescentState(NamedTuple):
    """State of a line-search method: the model, the last step length and direction."""

    model: PyTree  # the method's curvature model (memory, matrix, previous direction)
    alpha: Array  # last accepted step length (0 before the first)
    d: Array  # last search direction
    g: Array  # gradient at the previous iterate (for CG's beta)
    k: Array  # iterations since the last restart
    retry: Array  # the last search failed along a model direction: use steepest descent
    # (the lowest objective, the smallest (projected) gradient inf-norm) so far, in the
    # wider of f's and x's dtypes: one array, which a loop writes in one kernel
    best: Array
    idle: Array  # iterations since either of them last improved


# Iterations without a new lowest objective (beyond rounding) nor a new smallest gradient
# after which a run is STALLED: the steps then move x within the rounding noise of f and g
# (bfloat16 near a minimiser), which no number of further iterations changes.
_IDLE_ITERATIONS = 10


class DescentSolver(SteppingSolver):
    """One iteration of a line-search method (Nocedal & Wright, ch. 3): direction, safeguard,
    line search, model update. Subclasses implement ``init_model``, ``direction``,
    ``update_model`` and may override ``initial_step``.

    A direction that is not a descent direction is replaced by steepest descent. A line
    search that finds no decrease along a model direction resets the model (next iteration
    is steepest descent); along steepest descent it means STALLED (values flat at rounding
    level) or FAILURE (otherwise).
    """

    # The model that update_model resets to gives steepest descent itself (the direction
    # -g, flagged steepest): no carried flag forces it after a failed search.
    resets_to_steepest: ClassVar[bool] = False
    # every trial of a line search evaluates the value and the gradient
    evaluates_together: ClassVar[bool] = True

    def __init__(self, algorithm: Algorithm, problem: OptimizationProblem):
        self.alg = algorithm
        self.problem = problem
        x0 = ravel_pytree(problem.x0)[0]
        self.dtype = x0.dtype
        self.n = x0.size
        self.default_gtol = default_gtol(self.dtype)
        self.default_maxiters = type(algorithm).default_maxiters
        self.linesearch: LineSearch = algorithm.linesearch
        # With a search that accepts finite points only, a step that fails returns its
        # start point (see NativeSolver.keeps_point).
        bounded = problem.bounds is not None and problem.has_bounds
        self.keeps_point = self.linesearch.finite_points(bounded)
        # where the search returns its last trial on failure, the step keeps its start point
        self.selects_start = self.keeps_point and not self.linesearch.keeps_start(bounded)

    # -- hooks
    def init_model(self, x: Array, g: Array) -> PyTree:
        return ()

    def direction(
        self, model: PyTree, x: Array, g: Array, state: DescentState, flat: Flat
    ) -> tuple[Array, Array]:
        """(direction, whether it is plain steepest descent)."""
        raise NotImplementedError

    def update_model(
        self, model: PyTree, s: Array, y: Array, g_new: Array, decreased: Array
    ) -> PyTree:
        """The model after the step ``s`` with gradient change ``y``; where ``decreased`` is
        False (no step was taken) the model must be reset so the next step is steepest."""
        return model

    def initial_step(
        self, state: DescentState, f: Array, g: Array, d: Array, steepest: Array
    ) -> Array:
        """First trial step: 1, or ``1/|d|_2`` for an unscaled steepest-descent step."""
        return jnp.where(steepest, 1.0 / jnp.maximum(jnp.linalg.norm(d), 1e-30), 1.0)

    # -- the SteppingSolver protocol
    def init(self, objective: Objective, x: PyTree, f: Array, g: PyTree) -> DescentState:
        xf, gf = Flat.ravel(x), Flat.ravel(g)
        zero = jnp.zeros((), self.dtype)
        flat = Flat(objective, self.problem)
        return DescentState(
            self.init_model(xf, gf),
            zero,
            jnp.zeros_like(xf),
            gf,
            jnp.zeros((), jnp.int32),
            jnp.zeros((), bool),
            _pair(f, _grad_norm(xf, gf, flat.bounds)),
            jnp.zeros((), jnp.int32),
        )

    def step(
        self, objective: Objective, x: PyTree, f: Array, g: PyTree, state: DescentState
    ) -> Step:
        flat = Flat(objective, self.problem)
        xf, gf = Flat.ravel(x), Flat.ravel(g)
        d, steepest = self.direction(state.model, xf, gf, state, flat)
        slope = jnp.vdot(gf, d)
        descent = (slope < 0) & jnp.isfinite(slope)
        if not self.resets_to_steepest:
            descent = descent & ~state.retry
        sd = self.steepest_direction(xf, gf, flat)
        d = jnp.where(descent, d, sd)
        steepest = jnp.where(descent, steepest, True)
        alpha0 = self.initial_step(state, f, gf, d, steepest)
        res = self.linesearch.search(flat.value_and_grad, xf, f, gf, d, alpha0, flat.bounds)
        if self.selects_start:
            # The search accepts finite points only: where it found no decrease the step
            # keeps its start point, and the driver needs no select of its own (a second
            # kernel per value).
            x_new, f_new, g_new = (
                jnp.where(res.decreased, a, b) for a, b in ((res.x, xf), (res.f, f), (res.g, gf))
            )
        else:  # the search's own start point where it found no decrease
            x_new, f_new, g_new = res.x, res.f, res.g
        s, y = x_new - xf, g_new - gf
        # No decrease along a model direction: the hook drops the model, so the next
        # iteration retries with steepest descent.
        model = self.update_model(state.model, s, y, g_new, res.decreased)
        k = jnp.where(res.decreased, state.k + 1, 0)
        g_norm, g_finite, x_finite, tiny = _measures(x_new, g_new, s, xf, flat.bounds)
        # each best in its own dtype again (exactly: they were widened)
        f_best, g_best = state.best[0].astype(f_new.dtype), state.best[1].astype(g_norm.dtype)
        lower = f_new < f_best - float(jnp.finfo(f_best.dtype).eps) * jnp.abs(f_best)
        progress = lower | (g_norm < g_best)
        idle = jnp.where(progress, 0, state.idle + 1).astype(jnp.int32)
        # a method whose reset model gives steepest descent needs no retry flag: it keeps
        # the one it was given (not a value its loop carries)
        retry = state.retry if self.resets_to_steepest else ~res.decreased & ~steepest
        new_state = DescentState(
            model,
            res.alpha,
            d,
            gf,
            k.astype(jnp.int32),
            retry,
            jnp.minimum(_pair(f_new, g_norm), state.best),
            idle,
        )
        failed = ~res.decreased & steepest & ~res.stalled
        stalled = (
            (~res.decreased & steepest & res.stalled)
            | (res.decreased & tiny)
            | (idle >= _IDLE_ITERATIONS)
        )
        g_tree = flat.unravel(g_new)
        return Step(
            flat.unravel(x_new),
            f_new,
            g_tree,
            new_state,
            res.evals,
            res.evals,
            failed,
            stalled,
            res.nonfinite,
            grad_norm=g_norm.astype(jnp.result_type(*jax.tree_util.tree_leaves(g_tree))),
            g_finite=g_finite,
            x_finite=x_finite,
        )

    def steepest_direction(self, x: Array, g: Array, flat: Flat) -> Array:
        return -g


def _pair(f: Array, g_norm: Array) -> Array:
    """``(f, g_norm)`` as one array of the wider of their dtypes (each widened exactly)."""
    dtype = _scalar_dtype(g_norm, f)
    return jnp.stack([f.astype(dtype), g_norm.astype(dtype)])


def _grad_norm(x: Array, g: Array, bounds: tuple[Array, Array] | None) -> Array:
    """The gradient's inf-norm, projected onto the bounds (the driver's gtol measure)."""
    if bounds is not None:
        g = x - jnp.clip(x - g, bounds[0], bounds[1])
    return jnp.max(jnp.abs(g))


def _measures(
    x: Array, g: Array, s: Array, x_prev: Array, bounds: tuple[Array, Array] | None
) -> tuple[Array, Array, Array, Array]:
    """At the new point ``x`` (gradient ``g``), reached by the step ``s`` from ``x_prev``:
    the gradient's inf-norm (projected onto the bounds, as :func:`_grad_norm`), whether g
    and x are finite, and whether the step is tiny (as :func:`tiny_step`), from one
    reduction: one kernel, not four. A maximum with a NaN is NaN, so a finite maximum of
    |g| means every entry of g is finite; ``|s| - 4 eps |x_prev| <= 0`` holds exactly where
    ``|s| <= 4 eps |x_prev|`` does (a difference of two floats keeps its sign)."""
    eps = jnp.finfo(x.dtype).eps
    rows = [jnp.abs(g), jnp.abs(x), jnp.abs(s) - 4 * eps * jnp.abs(x_prev)]
    if bounds is not None:
        rows.append(jnp.abs(x - jnp.clip(x - g, bounds[0], bounds[1])))
    largest = jnp.max(jnp.stack(rows), axis=1)
    return (
        largest[-1] if bounds is not None else largest[0],
        jnp.isfinite(largest[0]),
        jnp.isfinite(largest[1]),
        largest[2] <= 0,
    )


def tiny_step(s: Array, x: Array) -> Array:
    """True when the step changes no component by more than a few units in the last place:
    at that point f and g are rounding noise and no further progress is possible."""
    eps = jnp.finfo(x.dtype).eps
    return jnp.all(jnp.abs(s) <= 4 * eps * jnp.abs(x))


def solve_classical(
    problem: OptimizationProblem, algorithm: Algorithm, options: SolveOptions, loop: Any = None
) -> Solution:
    """Run a classical algorithm: one compiled loop (see :mod:`optsolve.backends.native.driver`),
    in the ``loop`` the adjoint chose."""
    return run_iterative(_make_solver, problem, algorithm, options, loop)


def _make_solver(algorithm: Algorithm, problem: OptimizationProblem):
    return algorithm.make_solver(problem)


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Register a classical algorithm class with ``solve`` (class decorator)."""
    register_algorithm(cls)
    register_backend(cls, solve_classical)
    return cls


def check_positive(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, jax.core.Tracer) and jnp.ndim(value) == 0 and not float(value) > 0:
        raise ValueError(f"{owner}: `{name}` must be > 0, got {value!r}.")


# ----------------------------------------------------------------------- gradient descent


def _ratio(a: Array, b: Array) -> Array:
    """a / b, NaN where b = 0, without the NaN derivative of a division by zero that a
    later ``where`` discards (which would poison reverse mode through unrolled runs)."""
    nonzero = b != 0
    return jnp.where(nonzero, a / jnp.where(nonzero, b, 1.0), jnp.nan)


class _GDSolver(DescentSolver):
    def direction(self, model, x, g, state, flat):
        return -g, jnp.ones((), bool)

    def initial_step(self, state, f, g, d, steepest):
        # Nocedal & Wright eq. 3.60: keep the first-order change of the last step.
        first = self.alg.learning_rate / jnp.maximum(jnp.linalg.norm(d), 1e-30)
        ratio = _ratio(jnp.vdot(state.g, state.d), jnp.vdot(g, d))
        grown = state.alpha * ratio
        return jnp.where((state.alpha > 0) & jnp.isfinite(grown) & (grown > 0), grown, first)


@register
@pytree_dataclass
class GradientDescent(ClassicalAlgorithm):
    """Steepest descent with a line search; projected gradient descent under bounds.

    ``x_{k+1} = P(x_k - a_k g_k)``, ``a_k`` from the line search (backtracking Armijo by
    default), started at ``a_{k-1} g_{k-1}.d_{k-1} / g_k.d_k`` (Nocedal & Wright,
    *Numerical Optimization*, 2006, §3.1 and eq. 3.60). Under bounds the arc is projected
    (Bertsekas 1976, "On the Goldstein-Levitin-Polyak gradient projection method") and
    convergence is measured on the projected gradient.

    Args:
      learning_rate: the first trial step as a fraction of ``1/|g_0|_2`` (default 1).
      linesearch: :class:`Backtracking` (default) or :class:`Zoom`.

    Example:
      >>> sol = optsolve.solve(prob, optsolve.GradientDescent())
    """

    takes_bounds: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 10000

    learning_rate: Any = 1.0
    linesearch: Any = None

    def __post_init__(self):
        check_positive("GradientDescent", "learning_rate", self.learning_rate)
        _default_linesearch(self, Backtracking())

    def make_solver(self, problem: OptimizationProblem) -> DescentSolver:
        return _GDSolver(self, problem)


def _default_linesearch(alg: Algorithm, default: LineSearch) -> None:
    if alg.linesearch is None:
        object.__setattr__(alg, "linesearch", default)
    check_linesearch(type(alg).__name__, alg.linesearch)


# ---------------------------------------------------------- nonlinear conjugate gradients

_CG_METHODS = ("fletcher-reeves", "polak-ribiere", "hestenes-stiefel", "dai-yuan")


class _CGSolver(DescentSolver):
    def direction(self, model, x, g, state, flat):
        g_prev, d_prev = state.g, state.d
        y = g - g_prev
        gg, gpgp = jnp.vdot(g, g), jnp.vdot(g_prev, g_prev)
        dy = jnp.vdot(d_prev, y)
        method = self.alg.method
        if method == "fletcher-reeves":
            beta = _ratio(gg, gpgp)
        elif method == "polak-ribiere":  # PR+ (Gilbert & Nocedal 1992)
            beta = jnp.maximum(_ratio(jnp.vdot(g, y), gpgp), 0.0)
        elif method == "hestenes-stiefel":
            beta = jnp.maximum(_ratio(jnp.vdot(g, y), dy), 0.0)
        else:  # dai-yuan
            beta = _ratio(gg, dy)
        # Restart every n steps and when successive gradients are far from orthogonal
        # (Powell's test, Nocedal & Wright eq. 5.52).
        restart = (
            (state.k == 0)
            | (state.k % self.n == 0)
            | (jnp.abs(jnp.vdot(g, g_prev)) >= self.alg.restart_threshold * gg)
            | ~jnp.isfinite(beta)
        )
        beta = jnp.where(restart, 0.0, beta)
        return -g + beta * d_prev, restart

    def initial_step(self, state, f, g, d, steepest):
        first = 1.0 / jnp.maximum(jnp.linalg.norm(d), 1e-30)
        grown = state.alpha * jnp.vdot(state.g, state.d) / jnp.vdot(g, d)  # N&W eq. 3.60
        return jnp.where((state.alpha > 0) & jnp.isfinite(grown) & (grown > 0), grown, first)


@register
@pytree_dataclass
class NonlinearCG(ClassicalAlgorithm):
    """Nonlinear conjugate gradients: ``d_k = -g_k + beta_k d_{k-1}``.

    ``beta`` (``method``): Fletcher-Reeves ``|g_k|^2/|g_{k-1}|^2``; Polak-Ribiere+
    ``max(g_k.y/|g_{k-1}|^2, 0)`` (Gilbert & Nocedal 1992); Hestenes-Stiefel+
    ``max(g_k.y/d_{k-1}.y, 0)``; Dai-Yuan ``|g_k|^2/d_{k-1}.y`` (Dai & Yuan 1999), with
    ``y = g_k - g_{k-1}``. Restarts with steepest descent every n iterations and when
    ``|g_k.g_{k-1}| >= restart_threshold |g_k|^2`` (Nocedal & Wright, *Numerical
    Optimization*, 2006, Algorithm 5.4 and eq. 5.52).

    Args:
      method: "polak-ribiere" (default), "fletcher-reeves", "hestenes-stiefel" or
        "dai-yuan" (static).
      restart_threshold: Powell's restart constant (default 0.2).
      linesearch: :class:`Zoom` with ``c2=0.1`` (default) or :class:`Backtracking`.
    """

    default_maxiters: ClassVar[int] = 10000

    method: str = static_field(default="polak-ribiere")
    restart_threshold: Any = 0.2
    linesearch: Any = None

    def __post_init__(self):
        if self.method not in _CG_METHODS:
            raise ValueError(
                f"NonlinearCG: `method` must be one of {', '.join(map(repr, _CG_METHODS))}, "
                f"got {self.method!r}."
            )
        check_positive("NonlinearCG", "restart_threshold", self.restart_threshold)
        _default_linesearch(self, Zoom(c2=0.1))

    def make_solver(self, problem: OptimizationProblem) -> DescentSolver:
        return _CGSolver(self, problem)
