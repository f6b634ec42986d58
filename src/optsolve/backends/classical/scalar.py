"""Minimisation over one scalar within an interval: Brent's method and golden-section search.

An :class:`~optsolve.OptimizationProblem` whose ``x0`` is one 0-d float array and whose
``bounds`` are finite is searched over the interval ``[lower, upper]`` (the bracket is the
box). Both methods compare values only and shrink the bracket by at least a fixed ratio
every one or two evaluations; they run in the compiled loop of
:mod:`optsolve.backends.native.driver` like every classical method (jit, vmap, resume,
history, callbacks), one function evaluation per iteration.

The driver's iterate is the best point of the current bracket; the step also returns f's
derivative there (from the same evaluation, through ``value_and_grad``) for the driver's
optional ``gtol`` test, the history and the callback: the methods themselves use values
only. The run ends with SUCCESS once the bracket is below the tolerance (``xtol`` relative,
``atol`` absolute: hyperparameters, so pytree leaves), reported through the driver's
solver-owned convergence test. A non-finite value at a trial point ends the run with
FAILURE at the last good iterate. ``sol.x`` is differentiable with respect to ``p`` (and
the bounds) through the default :class:`~optsolve.ImplicitAdjoint`: at an interior
minimiser f'(x*) = 0; at an end of the interval x* moves with that bound.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optsolve.backends.classical.descent import ClassicalAlgorithm, register
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass

Array = jax.Array
PyTree = Any

# (3 - sqrt 5) / 2: the fraction of the larger part a golden-section step moves into
_GOLDEN = 0.5 * (3.0 - math.sqrt(5.0))
# (sqrt 5 - 1) / 2 = 1 - _GOLDEN: where golden-section search places its interior points
_RATIO = 1.0 - _GOLDEN


def default_xtol(dtype: Any) -> float:
    """The default relative bracket tolerance for x of ``dtype``: sqrt(eps), as Brent
    advises (f is flat to rounding within sqrt(eps) |x| of a smooth minimiser), i.e.
    1.5e-8 (float64), 3.5e-4 (float32)."""
    return float(math.sqrt(float(jnp.finfo(dtype).eps)))


def default_atol(dtype: Any) -> float:
    """The default absolute bracket tolerance: 1e-3 sqrt(eps) (1.5e-11 in float64, near
    scipy's brent floor of 1e-11), which ends a run whose minimiser is at 0."""
    return 1e-3 * default_xtol(dtype)


def _leaf(tree: PyTree) -> Array:
    return jax.tree_util.tree_leaves(tree)[0]


class _ScalarAlgorithm(ClassicalAlgorithm):
    """The base of the interval methods: one scalar, within finite bounds.

    Traits beyond the classical ones: ``scalar_only`` (x0 must be one 0-d array) and
    ``needs_bounds`` (finite bounds, the first bracket), which ``solve`` checks before the
    run (:mod:`optsolve.solve_api.capabilities`). Tolerances are hyperparameters, not
    ``solve``'s ``xtol`` option (the driver's xtol tests a step, and these methods take
    steps as short as the tolerance long before the bracket is that small).
    """

    takes_bounds: ClassVar[bool] = True
    needs_gradient: ClassVar[bool] = False
    extra_options: ClassVar[tuple[str, ...]] = ()
    default_maxiters: ClassVar[int] = 500
    scalar_only: ClassVar[bool] = True
    needs_bounds: ClassVar[bool] = True

    @classmethod
    def traits(cls) -> dict[str, Any]:
        return {
            **super().traits(),
            "scalar_only": cls.scalar_only,
            "needs_bounds": cls.needs_bounds,
        }

    def _check(self) -> None:
        name = type(self).__name__
        for field in ("xtol", "atol"):
            value = getattr(self, field)
            if value is None or isinstance(value, jax.core.Tracer) or jnp.ndim(value) != 0:
                continue
            if not float(value) >= 0:
                raise ValueError(f"{name}: `{field}` must be >= 0, got {value!r}.")


class _IntervalSolver(SteppingSolver):
    """What both methods share: the scalar leaf, the box, the tolerances, the evaluation."""

    default_gtol = None

    def __init__(self, algorithm: _ScalarAlgorithm, problem: OptimizationProblem):
        self.alg = algorithm
        self.problem = problem
        x0 = _leaf(problem.x0)
        self.dtype = jnp.result_type(x0)
        self.treedef = jax.tree_util.tree_structure(problem.x0)
        self.default_maxiters = type(algorithm).default_maxiters

    def tree(self, x: Array) -> PyTree:
        return jax.tree_util.tree_unflatten(self.treedef, [x])

    def scalar(self, value: Any) -> Array:
        return jnp.reshape(jnp.asarray(value, self.dtype), ())

    def box(self) -> tuple[Array, Array]:
        lower, upper = self.problem.bounds
        return self.scalar(_leaf(lower)), self.scalar(_leaf(upper))

    def tolerances(self) -> tuple[Array, Array]:
        xtol, atol = self.alg.xtol, self.alg.atol
        return (
            self.scalar(default_xtol(self.dtype) if xtol is None else xtol),
            self.scalar(default_atol(self.dtype) if atol is None else atol),
        )

    def evaluate(self, objective: Objective, u: Array) -> tuple[Array, Array]:
        fu, gu = objective.value_and_grad(self.tree(u))
        return fu, _leaf(gu)

    def step_of(
        self,
        x: Array,
        f: Array,
        g: Array,
        u: Array,
        fu: Array,
        gu: Array,
        state: NamedTuple,
        converged: Array,
    ) -> Step:
        """The driver's step: the new best point, or the trial point where its value or
        derivative is not finite (the driver then fails, keeping the last good iterate)."""
        bad = ~(jnp.isfinite(fu) & jnp.isfinite(gu))
        one = jnp.ones((), jnp.int32)
        return Step(
            self.tree(jnp.where(bad, u, x)),
            jnp.where(bad, fu, f),
            self.tree(jnp.where(bad, gu, g)),
            state,
            one,
            one,
            jnp.zeros((), bool),
            radius_converged=converged & ~bad,
        )


# ------------------------------------------------------------------------------- Brent


class BrentState(NamedTuple):
    """Brent's bracket ``[a, b]``, the second and third best points ``w``, ``v`` with their
    values, the last step ``d`` and the one before, ``e``."""

    a: Array
    b: Array
    v: Array
    w: Array
    fv: Array
    fw: Array
    d: Array
    e: Array


class _BrentSolver(_IntervalSolver):
    def init(self, objective, x, f, g) -> BrentState:
        a, b = self.box()
        x, f = self.scalar(_leaf(x)), jnp.asarray(f)
        zero = jnp.zeros((), self.dtype)
        return BrentState(a, b, x, x, f, f, zero, zero)

    def step(self, objective, x, f, g, state: BrentState) -> Step:
        x, g = self.scalar(_leaf(x)), _leaf(g)
        a, b, v, w, fv, fw, d, e = state
        xtol, atol = self.tolerances()
        xm = 0.5 * (a + b)
        tol1 = xtol * jnp.abs(x) + atol / 3
        tol2 = 2 * tol1
        # A parabola through (x, f), (w, fw), (v, fv): its vertex is x + p / q.
        r = (x - w) * (f - fv)
        q = (x - v) * (f - fw)
        p = (x - v) * q - (x - w) * r
        q = 2 * (q - r)
        p = jnp.where(q > 0, -p, p)
        q = jnp.abs(q)
        # taken when the step before last was long enough, the vertex lies inside the
        # bracket and the step is below half the step before last (so the steps shrink).
        # Three distinct points: where two coincide q is 0 in exact arithmetic (no
        # parabola), but XLA's fused multiply-adds can leave it a rounding error.
        distinct = (x != w) & (x != v) & (w != v)
        parabolic = (
            distinct
            & (jnp.abs(e) > tol1)
            & (jnp.abs(p) < jnp.abs(0.5 * q * e))
            & (p > q * (a - x))
            & (p < q * (b - x))
        )
        d_par = p / jnp.where(parabolic, q, 1.0)
        u_par = x + d_par
        toward_middle = jnp.where(xm - x >= 0, tol1, -tol1)
        d_par = jnp.where((u_par - a < tol2) | (b - u_par < tol2), toward_middle, d_par)
        # else a golden-section step into the larger part of the bracket
        e_gold = jnp.where(x >= xm, a - x, b - x)
        d_new = jnp.where(parabolic, d_par, _GOLDEN * e_gold)
        e_new = jnp.where(parabolic, d, e_gold)
        # never closer than tol1 to x (f cannot tell such points apart)
        sign = jnp.where(d_new >= 0, 1.0, -1.0).astype(self.dtype)
        u = jnp.clip(x + sign * jnp.maximum(jnp.abs(d_new), tol1), a, b)
        fu, gu = self.evaluate(objective, u)
        better = fu <= f
        a_new = jnp.where(better, jnp.where(u >= x, x, a), jnp.where(u < x, u, a))
        b_new = jnp.where(better, jnp.where(u >= x, b, x), jnp.where(u < x, b, u))
        # the three best points: u replaces x, w or v by rank
        as_w = ~better & ((fu <= fw) | (w == x))
        as_v = ~better & ~as_w & ((fu <= fv) | (v == x) | (v == w))
        v_new = jnp.where(better | as_w, w, jnp.where(as_v, u, v))
        fv_new = jnp.where(better | as_w, fw, jnp.where(as_v, fu, fv))
        w_new = jnp.where(better, x, jnp.where(as_w, u, w))
        fw_new = jnp.where(better, f, jnp.where(as_w, fu, fw))
        x_new, f_new, g_new = (
            jnp.where(better, u, x),
            jnp.where(better, fu, f),
            jnp.where(better, gu, g),
        )
        new = BrentState(a_new, b_new, v_new, w_new, fv_new, fw_new, d_new, e_new)
        return self.step_of(
            x_new, f_new, g_new, u, fu, gu, new, _brent_converged(x_new, a_new, b_new, xtol, atol)
        )


def _brent_converged(x, a, b, xtol, atol) -> Array:
    """Brent's test: x lies within 2 tol1 of both ends of the bracket."""
    tol1 = xtol * jnp.abs(x) + atol / 3
    return jnp.abs(x - 0.5 * (a + b)) <= 2 * tol1 - 0.5 * (b - a)


@register
@pytree_dataclass
class Brent(_ScalarAlgorithm):
    """Brent's method: minimise f over one scalar x within ``bounds = (lower, upper)``.

    Each iteration evaluates f at one point: the vertex of the parabola through the three
    best points so far when it falls inside the bracket and the step is under half the
    step before last, else a golden-section step (fraction (3 - sqrt 5)/2) into the larger
    part of the bracket; no point closer than ``tol1 = xtol |x| + atol / 3`` to the best
    one. The bracket ``[a, b]`` keeps the best point inside and shrinks every iteration.
    The run starts from x0 (projected onto the bounds; put it where the minimiser is
    expected, or at the middle) and ends with SUCCESS once
    ``|x - (a + b)/2| <= 2 tol1 - (b - a)/2``: x is then within about ``2 tol1`` of a
    local minimiser (the global one for a unimodal f). The method is scipy's
    ``minimize_scalar(method="bounded")`` (``fminbound``), Brent's FMIN.

    Reference: R. P. Brent, *Algorithms for Minimization without Derivatives*,
    Prentice-Hall, 1973, chapter 5 (procedure ``localmin``).

    Args:
      xtol: the relative tolerance on x (default sqrt(eps) of x0's dtype: 1.5e-8 in
        float64, 3.5e-4 in float32).
      atol: the absolute tolerance on x (default 1e-3 sqrt(eps): 1.5e-11 in float64).

    Example:
      >>> prob = optsolve.OptimizationProblem(lambda x, p: (x - p) ** 2, jnp.array(0.0),
      ...                                     1.5, bounds=(-3.0, 3.0))
      >>> sol = optsolve.solve(prob, optsolve.Brent())
    """

    xtol: Any = None
    atol: Any = None

    def __post_init__(self):
        self._check()

    def make_solver(self, problem: OptimizationProblem) -> _BrentSolver:
        return _BrentSolver(self, problem)


# ------------------------------------------------------------------ golden section


class GoldenState(NamedTuple):
    """The bracket ``[a, b]`` and its two interior points ``c < d`` at the golden ratio,
    with their values and derivatives; ``known`` counts the interior points evaluated
    (the first two iterations evaluate c, then d)."""

    a: Array
    b: Array
    c: Array
    d: Array
    fc: Array
    fd: Array
    gc: Array
    gd: Array
    known: Array


class _GoldenSolver(_IntervalSolver):
    def init(self, objective, x, f, g) -> GoldenState:
        a, b = self.box()
        nan = jnp.full((), jnp.nan, jnp.result_type(f))
        gnan = jnp.full((), jnp.nan, self.dtype)
        return GoldenState(
            a,
            b,
            b - _RATIO * (b - a),
            a + _RATIO * (b - a),
            nan,
            nan,
            gnan,
            gnan,
            jnp.zeros((), jnp.int32),
        )

    def step(self, objective, x, f, g, state: GoldenState) -> Step:
        a, b, c, d, fc, fd, gc, gd, known = state
        xtol, atol = self.tolerances()
        full = known >= 2
        # Kiefer's step: keep the part of the bracket around the lower interior point; its
        # other interior point is reused, one new point is placed at the golden ratio.
        left = full & (fc < fd)
        right = full & ~left
        a_new = jnp.where(right, c, a)
        b_new = jnp.where(left, d, b)
        c_new = jnp.where(left, b_new - _RATIO * (b_new - a_new), jnp.where(right, d, c))
        d_new = jnp.where(right, a_new + _RATIO * (b_new - a_new), jnp.where(left, c, d))
        fc_new, gc_new = jnp.where(right, fd, fc), jnp.where(right, gd, gc)
        fd_new, gd_new = jnp.where(left, fc, fd), jnp.where(left, gc, gd)
        # the point evaluated: c, then d, then the new one
        at_c = (known == 0) | left
        u = jnp.where(at_c, c_new, d_new)
        fu, gu = self.evaluate(objective, u)
        fc_new, gc_new = jnp.where(at_c, fu, fc_new), jnp.where(at_c, gu, gc_new)
        fd_new, gd_new = jnp.where(at_c, fd_new, fu), jnp.where(at_c, gd_new, gu)
        known = jnp.minimum(known + 1, 2).astype(jnp.int32)
        # the iterate: the lower interior point evaluated (c alone after the first step)
        take_c = (known < 2) | (fc_new < fd_new)
        x_new = jnp.where(take_c, c_new, d_new)
        f_new = jnp.where(take_c, fc_new, fd_new)
        g_new = jnp.where(take_c, gc_new, gd_new)
        new = GoldenState(a_new, b_new, c_new, d_new, fc_new, fd_new, gc_new, gd_new, known)
        converged = (known >= 2) & (
            b_new - a_new <= xtol * (jnp.abs(c_new) + jnp.abs(d_new)) + atol
        )
        return self.step_of(x_new, f_new, g_new, u, fu, gu, new, converged)


@register
@pytree_dataclass
class GoldenSection(_ScalarAlgorithm):
    """Golden-section search: minimise f over one scalar x within ``bounds``.

    The bracket ``[a, b]`` holds two interior points ``c = b - r (b - a)`` and
    ``d = a + r (b - a)``, ``r = (sqrt 5 - 1)/2``. Each iteration keeps ``[a, d]`` where
    ``f(c) < f(d)``, else ``[c, b]``, reuses the interior point inside it and evaluates
    one new one, so the bracket shrinks by ``r`` per evaluation whatever f is (slower than
    :class:`Brent` on smooth functions, never slower than this). The first two
    iterations evaluate ``c`` and ``d``; the iterate is the lower of the two (x0 only
    starts the record). The run ends with SUCCESS once
    ``b - a <= xtol (|c| + |d|) + atol`` (scipy's ``golden`` test, plus ``atol``). The
    method is scipy's ``minimize_scalar(method="golden")`` on a bracket that is the box.

    ``sol.x`` is differentiated by the implicit function theorem (the default adjoint);
    :class:`~optsolve.UnrolledAdjoint` is refused: the points are the box's golden sections,
    picked by comparisons alone, so the unrolled iterates do not move with p.

    Reference: J. Kiefer, "Sequential minimax search for a maximum", *Proceedings of the
    American Mathematical Society* 4 (1953), 502-506.

    Args:
      xtol: the relative tolerance on x (default sqrt(eps) of x0's dtype).
      atol: the absolute tolerance on x (default 1e-3 sqrt(eps)).

    Example:
      >>> sol = optsolve.solve(prob, optsolve.GoldenSection(xtol=1e-6))
    """

    # Its points are the box's golden sections, chosen by comparisons alone: unrolled, x
    # has derivative 0 in p wherever it is defined, which is no derivative of x*(p).
    unrollable: ClassVar[bool] = False

    xtol: Any = None
    atol: Any = None

    def __post_init__(self):
        self._check()

    def make_solver(self, problem: OptimizationProblem) -> _GoldenSolver:
        return _GoldenSolver(self, problem)
