"""Line searches of the classical methods, as pluggable pytree options.

``Backtracking`` (Armijo) and ``Zoom`` (strong Wolfe) are immutable pytrees whose constants
(``c1``, ``c2``, ``shrink``) are leaves, so a new value reuses compiled code; the trial budget
is static. Both work on flat vectors: ``fun(x) -> (f, g)`` evaluates value and gradient
together (every trial's gradient is needed by Wolfe's test, and on acceptance by the method).

# Own line searches rather than optax's transforms: those keep value/grad in a transform state
# and cost ~2x per iteration (PEERS.md); a function returning (x, f, g, alpha) lets the driver
# own the state and the stall/failure classification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.solve_api.loops import inner_while_loop
from optsolve.solve_api.pytree import pytree_dataclass, static_field

Array = jax.Array
Fun = Callable[[Array], tuple[Array, Array]]


class LineSearchResult(NamedTuple):
    """The accepted point of a line search and what it cost.

    Attributes:
      x, f, g: the accepted point, its value and gradient where ``decreased``; elsewhere
        the start point (zoom) or the last trial (backtracking: the caller keeps its start
        point there).
      alpha: the accepted step length (0 when nothing was accepted).
      evals: value-and-gradient evaluations made.
      decreased: a point satisfying the sufficient-decrease (Armijo) condition was found.
      stalled: nothing was accepted and the trial values were indistinguishable from f at
        rounding level: no further progress is possible along this direction.
      nonfinite: some trial point had a non-finite value or gradient.
    """

    x: Array
    f: Array
    g: Array
    alpha: Array
    evals: Array
    decreased: Array
    stalled: Array
    nonfinite: Array


def _scalar_dtype(x: Array, f0: Array) -> Any:
    """The dtype of a search's scalars (steps, values, slopes): the wider of x's and f's.
    A mixed-precision objective (bfloat16 x, float32 f) keeps its values' precision, and
    every cast is explicit, as JAX's strict dtype promotion requires (which refuses even to
    name the wider type: it is looked up under standard promotion)."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(x.dtype, f0.dtype)


def _project(x: Array, bounds: tuple[Array, Array] | None) -> Array:
    return x if bounds is None else jnp.clip(x, bounds[0], bounds[1])


def _flat_tolerance(f0: Array) -> Array:
    """How far above f0 a trial may be and still count as "not higher" where f is flat at
    rounding level (the epsilon of Hager & Zhang's approximate Wolfe conditions)."""
    return jnp.maximum(1e-10, 64 * jnp.finfo(f0.dtype).eps) * jnp.abs(f0)


def _approx_armijo(fa: Array, f0: Array, slope_a: Array, slope_0: Array, c1: Any) -> Array:
    """Hager & Zhang's approximate sufficient decrease (SIAM J. Optim. 16, 2005, eq. 4.1):
    ``f(a) <= f0 + eps`` and ``phi'(a) <= (2 c1 - 1) phi'(0)``. Near a minimiser f changes by
    O(|g|^2), below rounding long before g does; the derivative test still sees progress."""
    return (fa <= f0 + _flat_tolerance(f0)) & (slope_a <= (2 * c1 - 1) * slope_0)


def _is_flat(f0: Array, predicted: Array, fa: Array) -> Array:
    """True when no decrease above rounding is possible along the direction: the trial is
    within rounding of ``f0``, or the quadratic through ``f0``, the slope at 0 and the
    trial's value ``fa`` predicts a best decrease below rounding (a steep valley that the
    direction crosses, where the gradient cannot be followed in floating point).

    ``predicted``: the first-order change to the trial, ``phi'(0) a``. With the quadratic's
    curvature ``c = (fa - f0 - phi'(0) a) / a^2``, its best decrease ``phi'(0)^2 / (4 c)`` is
    below ``noise`` where ``(phi'(0) a)^2 <= 4 (fa - f0 - phi'(0) a) noise``: no divisions,
    whose shared results XLA computes in kernels of their own.
    """
    eps = jnp.finfo(f0.dtype).eps
    noise = 64 * eps * jnp.maximum(jnp.abs(f0), jnp.finfo(f0.dtype).tiny)
    rise = fa - f0 - predicted  # c a^2
    small_decrease = (rise > 0) & (predicted * predicted <= 4 * rise * noise)
    return jnp.isfinite(fa) & ((fa - f0 <= noise) | small_decrease)


def backtracking_search(
    fun: Fun,
    x: Array,
    f0: Array,
    g0: Array,
    d: Array,
    alpha0: Array,
    c1: Any,
    shrink: Any,
    max_steps: int,
    bounds: tuple[Array, Array] | None = None,
) -> LineSearchResult:
    """Backtracking along the (projected) arc ``P(x + a d)`` until Armijo's condition
    ``f(x_a) <= f0 + c1 g0 . (x_a - x)`` holds (Nocedal & Wright, Algorithm 3.1; with bounds,
    Bertsekas' projected Armijo rule, Bertsekas 1982), or its approximate form where f is flat
    at rounding level (Hager & Zhang 2005). Non-finite trials count as too long.

    Returns:
      A :class:`LineSearchResult`.
    """
    st = _scalar_dtype(x, f0)
    f_start = f0
    f0 = f0.astype(st)
    c1, shrink = jnp.asarray(c1, st), jnp.asarray(shrink, st)

    def trial(a):
        xa = _project(x + a.astype(x.dtype) * d, bounds)
        fa, ga = fun(xa)
        fa = fa.astype(st)
        step = xa - x
        slope0 = jnp.vdot(g0, step).astype(st)
        slope_a = jnp.vdot(ga, step).astype(st)
        armijo = (fa <= f0 + c1 * slope0) | _approx_armijo(fa, f0, slope_a, slope0, c1)
        finite = jnp.isfinite(fa) & jnp.all(jnp.isfinite(ga))
        # A finite slope g0 . (x_a - x) also makes x_a finite (a non-finite entry makes the
        # product inf or NaN), even where the approximate test accepts an infinite slope.
        ok = finite & armijo & (slope0 < 0) & jnp.isfinite(slope0)
        return xa, fa, ga, slope0, ok, ~finite

    a0 = jnp.asarray(alpha0).astype(st)
    xa, fa, ga, slope0, ok, nonfinite = trial(a0)

    def cond(c):
        return ~c[6] & (c[0] < max_steps)

    def body(c):
        i, a, *_, seen = c
        a = a * shrink
        xa, fa, ga, slope0, ok, nonfinite = trial(a)
        return i + 1, a, xa, fa, ga, slope0, ok, seen | nonfinite

    i, a, xa, fa, ga, slope0, ok, nonfinite = inner_while_loop(
        cond, body, (jnp.ones((), jnp.int32), a0, xa, fa, ga, slope0, ok, nonfinite), max_steps - 1
    )
    # the last trial's first-order change g0 . (x_a - x), as its test computed it
    stalled = ~ok & _is_flat(f0, slope0, fa)
    # the trial unselected: the caller's select of its next point is then the only one
    return LineSearchResult(
        xa,
        fa.astype(f_start.dtype),
        ga,
        jnp.where(ok, a, 0.0).astype(x.dtype),
        i,
        ok,
        stalled,
        nonfinite,
    )


@pytree_dataclass
class Backtracking:
    """Backtracking line search: shrink the step until sufficient decrease (Armijo).

    Nocedal & Wright, *Numerical Optimization* (2006), Algorithm 3.1. With bounds the trial
    points are projected onto the box and the condition uses ``g . (x_a - x)`` (Bertsekas,
    "Projected Newton methods", SIAM J. Control Optim. 1982).

    Args:
      c1: sufficient-decrease constant, 0 < c1 < 1 (default 1e-4).
      shrink: factor applied to a rejected step, 0 < shrink < 1 (default 0.5).
      max_steps: the most trials per iteration (static; default 40).
    """

    c1: Any = 1e-4
    shrink: Any = 0.5
    max_steps: int = static_field(default=40)

    def __post_init__(self):
        _check_open_unit("Backtracking", "c1", self.c1)
        _check_open_unit("Backtracking", "shrink", self.shrink)
        _check_steps("Backtracking", self.max_steps)

    def search(
        self,
        fun: Fun,
        x: Array,
        f0: Array,
        g0: Array,
        d: Array,
        alpha0: Array,
        bounds: tuple[Array, Array] | None = None,
    ) -> LineSearchResult:
        """Search along ``d`` from ``x`` starting at step ``alpha0``; see the class doc."""
        return backtracking_search(
            fun, x, f0, g0, d, alpha0, self.c1, self.shrink, self.max_steps, bounds
        )

    def finite_points(self, bounded: bool) -> bool:
        """Whether an accepted point is always finite (on a problem with bounds or
        without): it is, its slope ``g0 . (x_a - x)`` being finite."""
        return True

    def keeps_start(self, bounded: bool) -> bool:
        """Whether a search that accepts no point returns its start (x, f, g) itself: it
        returns its last trial, which the caller replaces by its start."""
        return False


# From this many variables the zoom search makes and tests its first trial apart, and runs
# its loop only when that trial is not accepted: this skips the loop's set-up (its carry
# holds two n-vectors) on most quasi-Newton iterations, at the price of a conditional and a
# second copy of the trial in the program. Below it one loop from the first trial is faster
# and compiles sooner (docs/benchmarks.md, "The zoom line search's two structures"); under
# vmap it also spares the batch the first trial's separate evaluation.
_FIRST_TRIAL_APART_FROM = 256


class _ZoomCarry(NamedTuple):
    i: Array
    done: Array
    # The bracket's ends, each (step, value, directional derivative), and the steps: one
    # (3, 3) array, as a loop writes each carried array in a kernel of its own. Rows: lo,
    # the best step so far satisfying sufficient decrease (0 = the start); hi, the other
    # end of the bracket (step inf while still bracketing); the steps, (the next trial
    # step, the last trial step, its value (for the stall test)).
    scalars: Array
    x_lo: Array
    g_lo: Array
    nonfinite: Array  # some trial had a non-finite value or derivative

    @property
    def lo(self) -> Array:
        return self.scalars[0]

    @property
    def hi(self) -> Array:
        return self.scalars[1]

    @property
    def steps(self) -> Array:
        return self.scalars[2]

    @property
    def a(self) -> Array:
        return self.steps[0]

    @property
    def a_last(self) -> Array:
        return self.steps[1]

    @property
    def f_last(self) -> Array:
        return self.steps[2]

    @property
    def a_lo(self) -> Array:
        return self.lo[0]

    @property
    def f_lo(self) -> Array:
        return self.lo[1]


def _cubic_min(a_lo, f_lo, d_lo, a_hi, f_hi, d_hi):
    """Minimiser of the cubic through two points with slopes (Nocedal & Wright, eq. 3.59);
    NaN where there is none (an end still unbounded or non-finite, no real minimiser).
    Undefined cases divide and take roots of placeholders, so that their discarded values
    leave no NaN derivative behind (reverse mode through unrolled runs)."""
    finite = jnp.isfinite(a_hi) & jnp.isfinite(f_hi) & jnp.isfinite(d_hi) & (a_lo != a_hi)
    a_hi, f_hi, d_hi = (
        jnp.where(finite, v, default)
        for v, default in ((a_hi, a_lo + 1.0), (f_hi, f_lo), (d_hi, d_lo))
    )
    d1 = d_lo + d_hi - 3 * (f_lo - f_hi) / (a_lo - a_hi)
    disc = d1 * d1 - d_lo * d_hi
    positive = disc > 0
    d2 = jnp.where(positive, jnp.sign(a_hi - a_lo) * jnp.sqrt(jnp.where(positive, disc, 1.0)), 0.0)
    denominator = d_hi - d_lo + 2 * d2
    valid = finite & (disc >= 0) & (denominator != 0)
    a = a_hi - (a_hi - a_lo) * (d_hi + d2 - d1) / jnp.where(valid, denominator, 1.0)
    return jnp.where(valid, a, jnp.nan)


@pytree_dataclass
class Zoom:
    """Line search for the strong Wolfe conditions: bracketing, then zoom by safeguarded
    cubic interpolation.

    Finds a step ``a`` with ``f(x + a d) <= f0 + c1 a g0.d`` and
    ``|g(x + a d).d| <= c2 |g0.d|``. Nocedal & Wright, *Numerical Optimization* (2006),
    Algorithms 3.5 (bracketing) and 3.6 (zoom). Non-finite trials count as too long. When the
    trial budget runs out the best sufficient-decrease point found is accepted. Where f is
    flat at rounding level, sufficient decrease may be met in Hager & Zhang's approximate
    form, ``f(a) <= f0 + max(1e-10, 64 eps) |f0|`` and ``phi'(a) <= (2 c1 - 1) phi'(0)``
    (SIAM J. Optim. 16, 2005), so gradients keep shrinking below ``sqrt(eps)``. With bounds
    (projected methods) the search is projected backtracking with this ``c1``: the Wolfe
    curvature condition has no meaning along a projected arc.

    Args:
      c1: sufficient-decrease constant (default 1e-4).
      c2: curvature constant, c1 < c2 < 1 (default 0.9, for quasi-Newton methods; use 0.1
        for nonlinear conjugate gradients).
      max_steps: the most trials per iteration (static; default 30).
    """

    c1: Any = 1e-4
    c2: Any = 0.9
    max_steps: int = static_field(default=30)

    def __post_init__(self):
        _check_open_unit("Zoom", "c1", self.c1)
        _check_open_unit("Zoom", "c2", self.c2)
        if _concrete(self.c1) and _concrete(self.c2) and not float(self.c1) < float(self.c2):
            raise ValueError(f"Zoom: `c1` must be < `c2`, got c1={self.c1!r}, c2={self.c2!r}.")
        _check_steps("Zoom", self.max_steps)

    def search(
        self,
        fun: Fun,
        x: Array,
        f0: Array,
        g0: Array,
        d: Array,
        alpha0: Array,
        bounds: tuple[Array, Array] | None = None,
    ) -> LineSearchResult:
        """Search along ``d`` from ``x`` starting at step ``alpha0``; see the class doc."""
        if bounds is not None:
            return backtracking_search(
                fun, x, f0, g0, d, alpha0, self.c1, 0.5, self.max_steps, bounds
            )
        dtype = _scalar_dtype(x, f0)
        f_start = f0
        f0 = f0.astype(dtype)
        c1, c2 = jnp.asarray(self.c1, dtype), jnp.asarray(self.c2, dtype)
        dphi0 = jnp.vdot(g0, d).astype(dtype)
        inf = jnp.asarray(jnp.inf, dtype)
        zero = jnp.zeros((), dtype)
        a0 = jnp.asarray(alpha0).astype(dtype)
        carry0 = _ZoomCarry(
            jnp.zeros((), jnp.int32),
            jnp.zeros((), bool),
            jnp.stack(
                [
                    jnp.stack([zero, f0, dphi0]),
                    jnp.stack([inf, inf, zero]),
                    jnp.stack([a0, a0, inf]),
                ]
            ),
            x,
            g0,
            jnp.zeros((), bool),
        )

        # the tests' bounds that no trial changes, as one array: computed apart, outside
        # the loop, each would take a kernel of its own
        tolerance = _flat_tolerance(f0)
        limits = lax.optimization_barrier(
            jnp.stack([f0 + tolerance, (2 * c1 - 1) * dphi0, -c2 * dphi0, tolerance])
        )

        def probe(a):
            xa = x + a.astype(x.dtype) * d
            fa, ga = fun(xa)
            return xa, fa.astype(dtype), ga, jnp.vdot(ga, d).astype(dtype)

        def tests(f_lo, a, trial):
            """(finite, approximately sufficient, too long, strong Wolfe) for the trial a.
            Too long: no sufficient decrease, or no better than the best so far (where f is
            flat at rounding level, the approximate Wolfe test decides by the derivative).
            Finite: the point too, which a finite value and slope do not make it (a long
            step may overflow x)."""
            xa, fa, _, da = trial
            f_flat, d_flat, d_wolfe, tolerance = limits
            finite = jnp.isfinite(fa) & jnp.isfinite(da) & jnp.all(jnp.isfinite(xa))
            flat_ok = (fa <= f_flat) & (da <= d_flat)  # _approx_armijo's test
            sufficient = (fa <= f0 + c1 * a * dphi0) | flat_ok
            better = (fa < f_lo) | (flat_ok & (fa <= f_lo + tolerance))
            bad = ~finite | ~sufficient | ~better
            return finite, bad, ~bad & (jnp.abs(da) <= d_wolfe)

        def advance(c: _ZoomCarry, trial) -> _ZoomCarry:
            a = c.a
            xa, fa, ga, da = trial
            finite, bad, wolfe = tests(c.f_lo, a, trial)
            # The minimiser lies between a and the old best when the slope points back.
            flip = ~bad & ~wolfe & (da * jnp.sign(c.hi[0] - c.lo[0]) >= 0)
            move_lo = ~bad
            hi = jnp.where(
                bad,
                jnp.stack([a, jnp.where(finite, fa, inf), jnp.where(finite, da, zero)]),
                jnp.where(flip, c.lo, c.hi),
            )
            lo = jnp.where(move_lo, jnp.stack([a, fa, da]), c.lo)
            a_lo, f_lo, d_lo = lo
            a_hi, f_hi, d_hi = hi
            x_lo = jnp.where(move_lo, xa, c.x_lo)
            g_lo = jnp.where(move_lo, ga, c.g_lo)
            bracketing = jnp.isinf(a_hi)
            # Next trial: extrapolate while bracketing, else safeguarded cubic interpolation.
            width = a_hi - a_lo
            cubic = _cubic_min(a_lo, f_lo, d_lo, a_hi, f_hi, d_hi)
            # After a too-long trial keep to the half next to a_lo, so the bracket at least
            # halves: a cubic hugging a_hi would shrink it only by 0.9 per trial.
            lo_safe = a_lo + 0.1 * width
            hi_safe = jnp.where(bad, a_lo + 0.5 * width, a_hi - 0.1 * width)
            inside = jnp.isfinite(cubic) & ((cubic - lo_safe) * (cubic - hi_safe) <= 0)
            # After a non-finite trial shrink hard toward the good end.
            fallback = jnp.where(jnp.isfinite(f_hi), a_lo + 0.5 * width, a_lo + 0.2 * width)
            a_next = jnp.where(bracketing, 2.0 * a, jnp.where(inside, cubic, fallback))
            # steps closer than x's rounding reach the same points
            tiny = ~bracketing & (
                jnp.abs(width) <= 10 * float(jnp.finfo(x.dtype).eps) * jnp.abs(a_lo)
            )
            steps = jnp.stack([a_next, a, jnp.where(finite, fa, inf)])
            return _ZoomCarry(
                c.i + 1, wolfe | tiny, jnp.stack([lo, hi, steps]), x_lo, g_lo, c.nonfinite | ~finite
            )

        def more(c: _ZoomCarry):
            return ~c.done & (c.i < self.max_steps)

        def ended(c: _ZoomCarry):
            return c.x_lo, c.f_lo, c.g_lo, c.a_lo, c.i, c.a_last, c.f_last, c.nonfinite

        if x.size < _FIRST_TRIAL_APART_FROM:
            found = ended(
                inner_while_loop(more, lambda c: advance(c, probe(c.a)), carry0, self.max_steps)
            )
        else:
            found = self._first_apart(probe, tests, advance, more, ended, carry0)
        x_lo, f_lo, g_lo, a_lo, i, a_last, f_last, nonfinite = found
        decreased = a_lo > 0
        stalled = ~decreased & _is_flat(f0, dphi0 * a_last, f_last)
        return LineSearchResult(
            x_lo,
            f_lo.astype(f_start.dtype),
            g_lo,
            a_lo.astype(x.dtype),
            i,
            decreased,
            stalled,
            nonfinite,
        )

    def finite_points(self, bounded: bool) -> bool:
        """Whether an accepted point is always finite: it is. With bounds the search is
        backtracking (see :meth:`Backtracking.finite_points`); without, a trial point
        with a non-finite entry counts as a non-finite trial (too long), so that a long
        step that overflows x is never accepted where f and its slope stay finite."""
        return True

    def keeps_start(self, bounded: bool) -> bool:
        """Whether a search that accepts no point returns its start (x, f, g) itself: the
        zoom search does (its best point so far is the start); with bounds, as
        backtracking, it returns its last trial."""
        return not bounded

    def _first_apart(self, probe, tests, advance, more, ended, carry0):
        """The search with its first trial made and tested outside the loop: it ends most
        quasi-Newton searches (unit step), and then the loop does not run."""
        a0, f0 = carry0.a, carry0.f_lo
        first = probe(a0)

        def accept_first():
            xa, fa, ga, _ = first
            return xa, fa, ga, a0, jnp.ones((), jnp.int32), a0, fa, jnp.zeros((), bool)

        def body(state):
            # The loop carries its next trial, made only while the search goes on: one
            # trace of ``advance`` (most of the search's program) and no evaluation past
            # the last trial.
            c = advance(*state)
            return c, lax.cond(more(c), probe, lambda _: state[1], c.a)

        def search_on():
            return ended(
                inner_while_loop(
                    lambda state: more(state[0]), body, (carry0, first), self.max_steps
                )[0]
            )

        return lax.cond(tests(f0, a0, first)[2], accept_first, search_on)


LineSearch = Backtracking | Zoom


def _concrete(value: Any) -> bool:
    return not isinstance(value, jax.core.Tracer) and jnp.ndim(value) == 0


def _check_open_unit(owner: str, name: str, value: Any) -> None:
    if _concrete(value) and not 0.0 < float(value) < 1.0:
        raise ValueError(f"{owner}: `{name}` must be in (0, 1), got {value!r}.")


def _check_steps(owner: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: `max_steps` must be an integer >= 1, got {value!r}.")


def check_linesearch(owner: str, value: Any) -> None:
    """Raise a clear error unless ``value`` is a line-search option of this module."""
    if not isinstance(value, (Backtracking, Zoom)):
        raise TypeError(
            f"{owner}: `linesearch` must be optsolve.Backtracking(...) or optsolve.Zoom(...), "
            f"got {value!r}."
        )
