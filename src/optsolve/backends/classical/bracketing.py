"""Bracketing root finders for one scalar unknown: bisection and Brent's method (brentq).

A :class:`~optsolve.RootProblem` whose ``x0`` is one 0-d float array and whose ``bracket``
``(a, b)`` holds a sign change of F is searched within the bracket, as scipy's
``root_scalar(f, bracket=[a, b], method="bisect" | "brentq")``. Both methods keep a
sub-interval with a sign change of F around the root and shrink it; they use the signs and
values of F only. They run in the compiled loop of :mod:`optsolve.backends.native.driver`
like every classical method (jit, vmap, resume, history, callbacks), on the problem's
:class:`~optsolve.solve_api.root_problem.RootSystem`, one evaluation of F per iteration
(the first iteration's count includes the two at the bracket's ends, which the first step
reads).

The driver's iterate is the method's current estimate of the root; its gradient field is
F (the history's ``grad_norm`` records ``|F|``). The run ends with SUCCESS once the
bracket is below ``xtol + rtol |x|`` or F is 0 there (the method's own test, reported
through the driver's solver-owned convergence test; ``solve``'s ``ftol``, where given,
also ends it once ``|F(x)| <= ftol``). ``xtol`` and ``rtol`` are hyperparameters, so
pytree leaves. A bracket whose ends F takes with one sign fails the first step (``solve``
raises a ValueError naming ``bracket``; under a trace the Solution is FAILURE at x0). A
non-finite F at a trial point ends the run with FAILURE at the last good iterate.
``sol.x`` is differentiable with respect to ``p`` through ``solve``'s implicit rule for
roots: ``dx*/dp = -F_p / F_x``.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optsolve.backends.classical.descent import ClassicalAlgorithm, register
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.pytree import pytree_dataclass
from optsolve.solve_api.root_problem import RootSystem

Array = jax.Array
PyTree = Any

# scipy's defaults for brentq and bisect: xtol = 2e-12 (absolute), rtol = 4 eps (float64)
DEFAULT_XTOL = 2e-12


def default_rtol(dtype: Any) -> float:
    """The default (and least) relative tolerance: 4 eps of x's dtype (8.9e-16 in float64,
    4.8e-7 in float32), scipy's, below which the bracket test cannot be met."""
    return 4.0 * float(jnp.finfo(dtype).eps)


def _leaf(tree: PyTree) -> Array:
    return jax.tree_util.tree_leaves(tree)[0]


class _BracketAlgorithm(ClassicalAlgorithm):
    """The base of the bracketing methods: a RootProblem over one scalar, with a bracket.

    Traits: ``solves_roots = "bracket"`` (``solve`` hands them the RootSystem with the
    problem's bracket and judges the run by their own bracket test), ``roots_only``,
    ``scalar_only`` (x0 one 0-d array), no gradient (F's signs and values only).
    """

    needs_gradient: ClassVar[bool] = False
    needs_residuals: ClassVar[bool] = True
    solves_roots: ClassVar[str] = "bracket"
    roots_only: ClassVar[bool] = True
    extra_options: ClassVar[tuple[str, ...]] = ()
    # scipy's maxiter for brentq and bisect
    default_maxiters: ClassVar[int] = 100
    # comparisons pick the points: unrolled, x would have derivative 0 (bisection) or the
    # iterations' (brentq), not x*(p)'s; the implicit rule is exact at a root
    unrollable: ClassVar[bool] = False
    scalar_only: ClassVar[bool] = True
    needs_bounds: ClassVar[bool] = False

    @classmethod
    def traits(cls) -> dict[str, Any]:
        return {
            **super().traits(),
            "scalar_only": cls.scalar_only,
            "needs_bounds": cls.needs_bounds,
        }

    def _check(self) -> None:
        name = type(self).__name__
        for field in ("xtol", "rtol"):
            value = getattr(self, field)
            if value is None or isinstance(value, jax.core.Tracer) or jnp.ndim(value) != 0:
                continue
            if not float(value) >= 0:
                raise ValueError(f"{name}: `{field}` must be >= 0, got {value!r}.")


class _BracketSolver(SteppingSolver):
    """What both methods share: the scalar leaf, the bracket, the tolerances, F."""

    default_gtol = None

    def __init__(self, algorithm: _BracketAlgorithm, problem: RootSystem):
        self.alg = algorithm
        self.problem = problem
        self.dtype = jnp.result_type(_leaf(problem.x0))
        self.treedef = jax.tree_util.tree_structure(problem.x0)
        self.default_maxiters = type(algorithm).default_maxiters

    def tree(self, x: Array) -> PyTree:
        return jax.tree_util.tree_unflatten(self.treedef, [x])

    def scalar(self, value: Any) -> Array:
        return jnp.reshape(jnp.asarray(value, self.dtype), ())

    def ends(self) -> tuple[Array, Array]:
        bracket = getattr(self.problem, "bracket", None)  # a RootSystem's; solve checks
        if not isinstance(self.problem, RootSystem) or bracket is None:
            raise TypeError(
                f"{type(self.alg).__name__} solves an optsolve.RootProblem with "
                f"a bracket, got {type(self.problem).__name__}."
            )
        a, b = bracket
        return self.scalar(a), self.scalar(b)

    def start(self, objective: Objective) -> tuple[Array, Array, Array, Array, Array, Array]:
        """The ends, F there, which end is a root (0: none, 1: a, 2: b) and which is the
        first where F is not finite (likewise)."""
        a, b = self.ends()
        fa, fb = self.F(objective, a), self.F(objective, b)
        end_root = jnp.where(fa == 0, 1, jnp.where(fb == 0, 2, 0)).astype(jnp.int32)
        bad_end = jnp.where(~jnp.isfinite(fa), 1, jnp.where(~jnp.isfinite(fb), 2, 0)).astype(
            jnp.int32
        )
        return a, b, fa, fb, end_root, bad_end

    def first_trial(self, first: Array, bad_end: Array, u: Array, fu: Array) -> tuple[Array, Array]:
        """The trial point: an end where F is not finite on the first step (so that the
        run fails there, at x0), else ``u``."""
        a, b = self.ends()
        bad = first & (bad_end > 0)
        return (
            jnp.where(bad, jnp.where(bad_end == 1, a, b), u),
            jnp.where(bad, jnp.nan, fu).astype(self.dtype),
        )

    def tolerances(self) -> tuple[Array, Array]:
        xtol, rtol = self.alg.xtol, self.alg.rtol
        least = default_rtol(self.dtype)
        rtol = least if rtol is None else jnp.maximum(self.scalar(rtol), least)
        return (self.scalar(DEFAULT_XTOL if xtol is None else xtol), self.scalar(rtol))

    def F(self, objective: Objective, u: Array) -> Array:
        return self.scalar(_leaf(self.problem.residual(self.tree(u), objective.p)))

    def step_of(
        self,
        x: Array,
        fx: Array,
        u: Array,
        fu: Array,
        state: NamedTuple,
        converged: Array,
        failed: Array,
        f_evals: Array,
    ) -> Step:
        """The driver's step: the new estimate x with F(x), or the trial point u where F is
        not finite there (the driver then fails, keeping the last good iterate)."""
        bad = ~jnp.isfinite(fu)
        x, fx = jnp.where(bad, u, x), jnp.where(bad, fu, fx)
        return Step(
            self.tree(x),
            0.5 * jnp.square(fx),
            self.tree(fx),
            state,
            f_evals.astype(jnp.int32),
            jnp.zeros((), jnp.int32),
            failed,
            radius_converged=converged & ~bad & ~failed,
        )


def _opposite(fa: Array, fb: Array) -> Array:
    """F takes opposite signs (neither is 0)."""
    return (fa != 0) & (fb != 0) & (jnp.signbit(fa) != jnp.signbit(fb))


def _same_sign(fa: Array, fb: Array) -> Array:
    """F takes one sign at both (finite, nonzero) values."""
    finite = jnp.isfinite(fa) & jnp.isfinite(fb)
    return finite & (fa != 0) & (fb != 0) & (jnp.signbit(fa) == jnp.signbit(fb))


# --------------------------------------------------------------------------- bisection


class BisectionState(NamedTuple):
    """The left end ``xa`` of the bracket and F's value there (its sign is F(a)'s), the
    half-width ``dm`` to halve next; ``first``: the first step is yet to run (it reads the
    ends); ``end_root``: an end of the bracket is a root (0: none, 1: a, 2: b);
    ``bad_end``: F is not finite at an end (likewise); ``sign_error``: F(a), F(b) are
    nonzero with one sign."""

    xa: Array
    fa: Array
    dm: Array
    first: Array
    end_root: Array
    bad_end: Array
    sign_error: Array


class _BisectionSolver(_BracketSolver):
    def init(self, objective, x, f, g) -> BisectionState:
        a, b, fa, fb, end_root, bad_end = self.start(objective)
        return BisectionState(
            a, fa, b - a, jnp.ones((), bool), end_root, bad_end, _same_sign(fa, fb)
        )

    def step(self, objective, x, f, g, state: BisectionState) -> Step:
        xa, fa, dm, first, end_root, bad_end, sign_error = state
        xtol, rtol = self.tolerances()
        dm = 0.5 * dm
        xm = xa + dm
        fm = self.F(objective, xm)
        same = jnp.signbit(fm) == jnp.signbit(fa)
        xa_new = jnp.where((fm == 0) | same, xm, xa)
        converged = (fm == 0) | (jnp.abs(dm) < xtol + rtol * jnp.abs(xm))
        # an end is a root: the first step returns it (no halving)
        at_end = first & (end_root > 0)
        a, b = self.ends()
        x_end = jnp.where(end_root == 1, a, b)
        x_new = jnp.where(at_end, x_end, xm)
        f_new = jnp.where(at_end, 0.0, fm).astype(self.dtype)
        u, fu = self.first_trial(
            first,
            bad_end,
            jnp.where(at_end, x_end, xm),
            jnp.where(at_end, 0.0, fm).astype(self.dtype),
        )
        failed = first & sign_error
        new = BisectionState(
            jnp.where(at_end, xa, xa_new),
            fa,
            dm,
            jnp.zeros((), bool),
            end_root,
            bad_end,
            sign_error,
        )
        evals = jnp.where(first, 2, 0) + jnp.where(at_end, 0, 1)
        return self.step_of(x_new, f_new, u, fu, new, converged | at_end, failed, evals)


@register
@pytree_dataclass
class Bisection(_BracketAlgorithm):
    """Bisection: find a root of a scalar F within the problem's ``bracket = (a, b)``.

    With ``F(a)`` and ``F(b)`` of opposite signs, each iteration evaluates F at the middle
    ``xm`` of the bracket and keeps the half in which F changes sign, so the bracket halves
    every evaluation whatever F is (continuous or not). The iterate is the last middle
    point; the run ends with SUCCESS once the half-width is below ``xtol + rtol |xm|`` or
    ``F(xm) = 0``: xm is then within about ``2 (xtol + rtol |x|)`` of a sign change of F.
    The method is scipy's ``bisect`` (``root_scalar(method="bisect")``), iteration for
    iteration.

    Counts: ``f_evals`` are evaluations of F, the two at the bracket's ends included (in
    the first iteration's) and the driver's one at x0 (which only starts the record).

    Args:
      xtol: the absolute tolerance on x (default 2e-12, scipy's).
      rtol: the relative tolerance on x (default and least 4 eps of x0's dtype: 8.9e-16 in
        float64, 4.8e-7 in float32).

    Example:
      >>> prob = optsolve.RootProblem(lambda x, p: x ** 3 - p, jnp.array(1.0), 8.0,
      ...                             bracket=(0.0, 4.0))
      >>> sol = optsolve.solve(prob, optsolve.Bisection())
    """

    xtol: Any = None
    rtol: Any = None

    def __post_init__(self):
        self._check()

    def make_solver(self, problem: RootSystem) -> _BisectionSolver:
        return _BisectionSolver(self, problem)


# ------------------------------------------------------------------------------ brentq


class BrentqState(NamedTuple):
    """Brent's points after the bookkeeping at the top of scipy's brentq loop: the
    estimate ``xcur`` (|F| smallest), the previous one ``xpre``, the other end of the
    bracket ``xblk`` (F(xblk) of the opposite sign to F(xcur)), with F's values, the
    step before last ``spre`` and the last ``scur``; ``first``, ``end_root``,
    ``bad_end``, ``sign_error`` as :class:`BisectionState`'s."""

    xpre: Array
    fpre: Array
    xcur: Array
    fcur: Array
    xblk: Array
    fblk: Array
    spre: Array
    scur: Array
    first: Array
    end_root: Array
    bad_end: Array
    sign_error: Array


def _brent_top(xpre, fpre, xcur, fcur, xblk, fblk, spre, scur):
    """The top of scipy's brentq loop: where the new point changed the sign, the other end
    of the bracket becomes the previous point (and the steps restart from the bracket's
    width); then the end with the smaller |F| becomes the estimate."""
    flip = _opposite(fpre, fcur)
    xblk, fblk = jnp.where(flip, xpre, xblk), jnp.where(flip, fpre, fblk)
    width = xcur - xpre
    spre, scur = jnp.where(flip, width, spre), jnp.where(flip, width, scur)
    swap = jnp.abs(fblk) < jnp.abs(fcur)
    xpre, fpre = jnp.where(swap, xcur, xpre), jnp.where(swap, fcur, fpre)
    xcur, xblk = jnp.where(swap, xblk, xcur), jnp.where(swap, xcur, xblk)
    fcur, fblk = jnp.where(swap, fblk, fcur), jnp.where(swap, fpre, fblk)
    return xpre, fpre, xcur, fcur, xblk, fblk, spre, scur


def _brent_test(xcur, fcur, xblk, xtol, rtol):
    """(converged, delta, sbis): scipy's test, the half-bracket below delta or F = 0."""
    delta = 0.5 * (xtol + rtol * jnp.abs(xcur))
    sbis = 0.5 * (xblk - xcur)
    return (fcur == 0) | (jnp.abs(sbis) < delta), delta, sbis


def _safe(denominator: Array) -> Array:
    return jnp.where(denominator == 0, 1.0, denominator)


class _BrentqSolver(_BracketSolver):
    def init(self, objective, x, f, g) -> BrentqState:
        a, b, fa, fb, end_root, bad_end = self.start(objective)
        zero = jnp.zeros((), self.dtype)
        top = _brent_top(a, fa, b, fb, a, fa, zero, zero)
        return BrentqState(*top, jnp.ones((), bool), end_root, bad_end, _same_sign(fa, fb))

    def step(self, objective, x, f, g, state: BrentqState) -> Step:
        (xpre, fpre, xcur, fcur, xblk, fblk, spre, scur, first, end_root, bad_end, sign_error) = (
            state
        )
        xtol, rtol = self.tolerances()
        done, delta, sbis = _brent_test(xcur, fcur, xblk, xtol, rtol)
        # inverse quadratic interpolation (three distinct points) or the secant (two)
        secant = xpre == xblk
        stry_secant = -fcur * (xcur - xpre) / _safe(fcur - fpre)
        dpre = (fpre - fcur) / _safe(xpre - xcur)
        dblk = (fblk - fcur) / _safe(xblk - xcur)
        stry_iqi = -fcur * (fblk * dblk - fpre * dpre) / _safe(dblk * dpre * (fblk - fpre))
        stry = jnp.where(secant, stry_secant, stry_iqi)
        try_it = (jnp.abs(spre) > delta) & (jnp.abs(fcur) < jnp.abs(fpre))
        # a short step (under half the step before last and inside the bracket's 3/4),
        # else bisection: the bracket at least halves every other step
        good = try_it & (2 * jnp.abs(stry) < jnp.minimum(jnp.abs(spre), 3 * jnp.abs(sbis) - delta))
        spre_new, scur_new = jnp.where(good, scur, sbis), jnp.where(good, stry, sbis)
        step = jnp.where(jnp.abs(scur_new) > delta, scur_new, jnp.where(sbis > 0, delta, -delta))
        u = xcur + step
        fu = self.F(objective, u)
        top = _brent_top(xcur, fcur, u, fu, xblk, fblk, spre_new, scur_new)
        converged, _, _ = _brent_test(top[2], top[3], top[4], xtol, rtol)
        # converged already (the ends, read by init): the first step takes no new point
        # and returns the estimate (an end that is a root, or the better end)
        at_end = first & ((end_root > 0) | done)
        a, b = self.ends()
        x_end = jnp.where(end_root == 1, a, jnp.where(end_root == 2, b, xcur))
        f_end = jnp.where(end_root > 0, 0.0, fcur).astype(self.dtype)
        new = BrentqState(
            *(jnp.where(at_end, old, t) for old, t in zip(state[:8], top)),
            jnp.zeros((), bool),
            end_root,
            bad_end,
            sign_error,
        )
        x_new = jnp.where(at_end, x_end, top[2])
        f_new = jnp.where(at_end, f_end, top[3])
        u, fu = self.first_trial(
            first, bad_end, jnp.where(at_end, x_new, u), jnp.where(at_end, f_new, fu)
        )
        failed = first & sign_error
        evals = jnp.where(first, 2, 0) + jnp.where(at_end, 0, 1)
        return self.step_of(x_new, f_new, u, fu, new, converged | at_end, failed, evals)


@register
@pytree_dataclass
class Brentq(_BracketAlgorithm):
    """Brent's method for a root of a scalar F within the problem's ``bracket = (a, b)``:
    inverse quadratic interpolation safeguarded by bisection.

    The bracket ``[xcur, xblk]`` holds a sign change of F, ``xcur`` the end with the
    smaller |F| (the estimate). Each iteration tries the step to the zero of the inverse
    quadratic through the last three points (the secant through two, where two
    coincide); it is taken when the step before last was above the tolerance, |F| fell
    and the step is under half the step before last and inside the bracket's 3/4, else
    the iteration bisects; no step is shorter than ``delta = (xtol + rtol |xcur|) / 2``.
    The bracket at least halves every other iteration (never slower than bisection by
    more than a factor of two), and shrinks superlinearly near a simple root. The run
    ends with SUCCESS once the half-bracket is below ``delta`` or ``F(xcur) = 0``. The
    method is scipy's ``brentq`` (``root_scalar(method="brentq")``), iteration for
    iteration: each iteration here is one of scipy's (evaluating its point), which counts
    the last iteration, which evaluates none, as one more.

    Counts: ``f_evals`` are evaluations of F, the two at the bracket's ends included (in
    the first iteration's) and the driver's one at x0 (which only starts the record).

    References: R. P. Brent, *Algorithms for Minimization without Derivatives*,
    Prentice-Hall, 1973, chapter 4 (procedure ``zero``); scipy's ``brentq.c`` (the
    extrapolation form of the inverse quadratic step).

    Args:
      xtol: the absolute tolerance on x (default 2e-12, scipy's).
      rtol: the relative tolerance on x (default and least 4 eps of x0's dtype: 8.9e-16 in
        float64, 4.8e-7 in float32).

    Example:
      >>> prob = optsolve.RootProblem(lambda x, p: x ** 3 - p, jnp.array(1.0), 8.0,
      ...                             bracket=(0.0, 4.0))
      >>> sol = optsolve.solve(prob, optsolve.Brentq())
    """

    xtol: Any = None
    rtol: Any = None

    def __post_init__(self):
        self._check()

    def make_solver(self, problem: RootSystem) -> _BrentqSolver:
        return _BrentqSolver(self, problem)
