"""Scalar minimisation: JAX-native Brent and GoldenSection, and ScipyMinimizeScalar.

scipy's own minimize_scalar tests (scipy/optimize/tests/test_optimize.py,
``TestOptimizeScalar``), ported: each within that test's own tolerance, on the JAX-native
path (where the bracket is the box: scipy's downhill bracket search from a point becomes a
box around it) and on the scipy path (the same calls, through optsolve). Then what only
optsolve promises: jit and vmap over p equal the loop, float32 and float64, derivatives with
respect to p and to the bounds against closed forms and finite differences, the errors,
and NaN as FAILURE with the last good iterate.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

SOLUTION = 1.5


def fun(x, a):
    """scipy's TestOptimizeScalar.fun, a the hyperparameter (scipy's ``args``)."""
    return (x - a) ** 2 - 0.8


def square(x, p):
    return x**2


def quartic(x, p):
    """x^4 / 4 - p x: x*(p) = p^(1/3), dx*/dp = p^(-2/3) / 3."""
    return x**4 / 4 - p * x


def wavy(x, p):
    """scipy's test_nan_values objective, NaN right of p: with p = -0.1 its minimiser
    (-0.05) lies in the NaN region, which the search walks into."""
    return jnp.where(x > p, jnp.nan, x**2 + 0.1 * jnp.sin(x))


def fourth(x, p):
    return x**4


def fourth_as_vector(x, p):
    return jnp.reshape(x**4, (1,))


def shifted(x, p):
    return (x - 1) ** 2


def to_p(x, p):
    return (x - p) ** 2


NATIVE = [optsolve.Brent, optsolve.GoldenSection]
BOUNDED = [
    optsolve.Brent,
    optsolve.GoldenSection,
    lambda **kw: optsolve.ScipyMinimizeScalar("bounded", **kw),
]


def _ids(make) -> str:
    if isinstance(make, str):
        return f"Scipy-{make}"
    return getattr(make, "__name__", "Scipy-bounded")


def _boxed(x0, lower, upper, f=fun, p=SOLUTION):
    return OptimizationProblem(f, jnp.asarray(x0, jnp.float64), p, bounds=(lower, upper))


# ------------------------------------------------------------------ scipy's tests, ported


@pytest.mark.parametrize("make", NATIVE, ids=_ids)
def test_brent_and_golden_as_scipy_tests_them(make):
    """test_brent / test_golden: the default bracket search from 0, from (-3, -2) and from
    (-15, -1, 15) all reach 1.5 within 1e-6; natively the box is the bracket."""
    for x0, box in ((0.0, (-10.0, 10.0)), (-3.0, (-3.0, 10.0)), (-1.0, (-15.0, 15.0))):
        sol = solve(_boxed(x0, *box), make())
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        np.testing.assert_allclose(sol.x, SOLUTION, atol=1e-6)
        np.testing.assert_allclose(sol.objective, -0.8, atol=1e-12)


@pytest.mark.parametrize("method", ["brent", "golden"])
def test_scipy_brent_and_golden_with_scipys_brackets(method):
    for bracket in (None, (-3, -2), (-15, -1, 15)):
        options = {} if bracket is None else {"bracket": bracket}
        prob = OptimizationProblem(fun, jnp.array(0.0), SOLUTION)
        sol = solve(prob, optsolve.ScipyMinimizeScalar(method, **options))
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        np.testing.assert_allclose(sol.x, SOLUTION, atol=1e-6)
        expected = so.minimize_scalar(
            lambda x: (x - 1.5) ** 2 - 0.8, method=method, bracket=bracket or (0.0, 1.0)
        )
        np.testing.assert_allclose(sol.x, expected.x, rtol=1e-14)
        assert sol.stats.f_evals == expected.nfev and sol.stats.iterations == expected.nit
    # scipy's own complaints about a bad bracket reach the user unchanged
    prob = OptimizationProblem(fun, jnp.array(0.0), SOLUTION)
    with pytest.raises(ValueError, match=r"\(f\(xb\) < f\(xa\)\) and \(f\(xb\) < f\(xc\)\)"):
        solve(prob, optsolve.ScipyMinimizeScalar(method, bracket=(-1, 0, 1)))
    with pytest.raises(ValueError, match=r"\(xa < xb\) and \(xb < xc\)"):
        solve(prob, optsolve.ScipyMinimizeScalar(method, bracket=(0, -1, 1)))


def test_golden_with_tol_0_runs_to_its_budget():
    """test_golden's tol=0: no tolerance ever holds, the run ends at maxiter, at 1.5 all the
    same (assert_allclose's default rtol, 1e-7)."""
    sol = solve(_boxed(0.0, -10.0, 10.0), optsolve.GoldenSection(xtol=0.0, atol=0.0))
    assert sol.retcode == ReturnCode.MAXITERS and sol.stats.iterations == 500
    np.testing.assert_allclose(sol.x, SOLUTION)
    sol = solve(
        OptimizationProblem(fun, jnp.array(0.0), SOLUTION),
        optsolve.ScipyMinimizeScalar("golden", xtol=0.0),
    )
    np.testing.assert_allclose(sol.x, SOLUTION)


@pytest.mark.parametrize("maxiters", [1, 5])
def test_golden_evaluates_once_per_iteration(maxiters):
    """test_golden's maxiter cases: each iteration more costs one evaluation more."""
    native = solve(_boxed(0.0, -10.0, 10.0), optsolve.GoldenSection(), maxiters=maxiters)
    assert native.retcode == ReturnCode.MAXITERS
    assert native.stats.f_evals == 1 + maxiters and native.stats.iterations == maxiters
    prob = OptimizationProblem(fun, jnp.array(0.0), SOLUTION)
    scipy_path = [
        solve(prob, optsolve.ScipyMinimizeScalar("golden"), maxiters=m) for m in (1, maxiters)
    ]
    assert scipy_path[1].stats.f_evals - scipy_path[0].stats.f_evals == maxiters - 1


@pytest.mark.parametrize("make", BOUNDED, ids=_ids)
def test_fminbound(make):
    """test_fminbound, test_fminbound_scalar and minimize_scalar's bounded cases: (0, 1)
    ends at its upper bound within 1e-4, (1, 5) at 1.5 within 1e-6; bounds given as
    1-element arrays or 0-d arrays work; lower > upper and bounds of another shape are
    errors."""
    sol = solve(_boxed(0.5, 0.0, 1.0), make())
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, 1.0, atol=1e-4)
    for lower, upper in ((1.0, 5.0), (np.array([1.0]), np.array([5.0])), (1.0, np.array(5.0))):
        lower, upper = (np.reshape(b, ()) for b in (lower, upper))
        sol = solve(_boxed(2.0, lower, upper), make())
        np.testing.assert_allclose(sol.x, SOLUTION, atol=1e-6)
    with pytest.raises(ValueError, match="lower <= upper"):
        _boxed(2.0, 5.0, 1.0)
    with pytest.raises(ValueError, match="bounds"):
        _boxed(0.5, np.zeros((1, 2)), 1.0)


@pytest.mark.parametrize("make", BOUNDED, ids=_ids)
def test_gh11207_an_interval_of_one_point(make):
    sol = solve(_boxed(0.0, 0.0, 0.0, f=square), make())
    assert sol.retcode == ReturnCode.SUCCESS and float(sol.x) == 0.0


def test_brent_is_fminbound():
    """Brent() from the golden-section point of the box, with fminbound's tolerances
    (sqrt(2.2e-16) relative, xatol=1e-5), takes fminbound's evaluations to its point."""
    for lower, upper in ((0.0, 1.0), (1.0, 5.0), (-10.0, 10.0), (0.1, 1.5)):
        x0 = lower + 0.5 * (3 - math.sqrt(5)) * (upper - lower)
        sol = solve(_boxed(x0, lower, upper), optsolve.Brent(xtol=math.sqrt(2.2e-16), atol=1e-5))
        expected = so.minimize_scalar(
            lambda x: (x - 1.5) ** 2 - 0.8, bounds=(lower, upper), method="bounded"
        )
        np.testing.assert_allclose(sol.x, expected.x, rtol=1e-13)
        assert sol.stats.f_evals == expected.nfev


def test_minimize_scalar_defaults_gh10911():
    """x^2 from the default bracket reaches 0 within 1e-8; on (1, 100) with xatol=1e-10
    the bound 1 (assert_allclose's rtol 1e-7)."""
    for alg, box in (
        (optsolve.Brent(), (-10.0, 10.0)),
        (optsolve.GoldenSection(), (-10.0, 10.0)),
        (optsolve.ScipyMinimizeScalar("brent"), None),
    ):
        prob = OptimizationProblem(square, jnp.array(0.0 if box is None else 3.0), bounds=box)
        np.testing.assert_allclose(solve(prob, alg).x, 0.0, atol=1e-8)
    for alg in (
        optsolve.Brent(atol=1e-10),
        optsolve.GoldenSection(atol=1e-10),
        optsolve.ScipyMinimizeScalar("bounded", xatol=1e-10),
    ):
        np.testing.assert_allclose(solve(_boxed(50.0, 1.0, 100.0, f=square), alg).x, 1.0)


@pytest.mark.parametrize("make", BOUNDED, ids=_ids)
def test_minimize_non_finite_bounds_gh10911(make):
    with pytest.raises(ValueError, match="both ends must be finite; got bounds=\\(1.0, inf\\)"):
        solve(_boxed(2.0, 1.0, np.inf, f=square), make())
    with pytest.raises(
        ValueError, match="needs finite bounds=\\(lower, upper\\) on x; got bounds=None"
    ):
        solve(OptimizationProblem(square, jnp.array(2.0)), make())


@pytest.mark.parametrize("method", ["brent", "golden"])
def test_minimize_unbounded_method_with_bounds_gh10911(method):
    with pytest.raises(ValueError, match="does not support bounds"):
        solve(_boxed(1.5, 1.0, 2.0, f=square), optsolve.ScipyMinimizeScalar(method))


@pytest.mark.parametrize("make", BOUNDED + ["brent", "golden"], ids=_ids)
def test_nan_values_fail_with_the_last_good_iterate(make):
    """test_nan_values: a NaN stops the run unsuccessfully; optsolve's rule on top: FAILURE
    at the last finite iterate, its value the objective there."""
    if isinstance(make, str):
        prob = OptimizationProblem(wavy, jnp.array(-1.0), -0.1)
        alg = optsolve.ScipyMinimizeScalar(make, bracket=(-1, 0, 1))
    else:
        prob = _boxed(-1.0, -1.0, 1.0, f=wavy, p=-0.1)
        alg = make()
    sol = solve(prob, alg, maxiters=20)
    assert sol.retcode == ReturnCode.FAILURE and "finite" in sol.message, sol.message
    assert np.isfinite(sol.x) and float(sol.x) <= -0.1
    np.testing.assert_allclose(sol.objective, wavy(sol.x, -0.1), rtol=1e-15)


@pytest.mark.parametrize("make", BOUNDED + ["brent", "golden"], ids=_ids)
def test_result_shapes_and_fields_gh16196(make):
    """test_result_attributes and test_minimize_scalar_dimensionality_gh16196: x and the
    objective are 0-d (x0's shape), with a retcode, message and counts; an f returning
    shape (1,) is refused, as every algorithm refuses a non-scalar f."""
    if isinstance(make, str):
        prob, alg = (
            OptimizationProblem(fourth, jnp.array(-0.1)),
            optsolve.ScipyMinimizeScalar(make, bracket=(-0.1, 0.2)),
        )
    else:
        prob, alg = _boxed(0.05, -0.1, 0.2, f=fourth), make()
    sol = solve(prob, alg)
    assert np.shape(sol.x) == np.shape(sol.objective) == ()
    assert sol.success and isinstance(sol.message, str)
    assert sol.stats.f_evals >= 1 and sol.stats.iterations >= 1
    with pytest.raises(ValueError, match="must return a scalar, got an array of shape \\(1,\\)"):
        solve(prob.replace(f=fourth_as_vector), alg)


@pytest.mark.parametrize("make", BOUNDED + ["brent", "golden"], ids=_ids)
def test_maxiter_ends_as_maxiters_without_a_warning_gh1953(make):
    """test_minimize_scalar_warnings_gh1953: maxiter=3 ends the run unconverged; optsolve
    says so in the retcode (MAXITERS), not by a warning (warnings are errors here)."""
    if isinstance(make, str):
        prob = OptimizationProblem(shifted, jnp.array(-2.0))
        alg = optsolve.ScipyMinimizeScalar(make, bracket=(-2, 10))
    else:
        prob, alg = _boxed(-2.0, -2.0, 10.0, f=shifted), make()
    sol = solve(prob, alg, maxiters=3)
    assert sol.retcode == ReturnCode.MAXITERS and sol.stats.iterations == 3, sol.message


def test_scipy_options_are_checked():
    """test_disp has scipy print; optsolve reports through the Solution, and names the valid
    options for any other."""
    with pytest.raises(TypeError, match="`disp` is not an option here"):
        optsolve.ScipyMinimizeScalar("brent", disp=1)
    with pytest.raises(TypeError, match="`maxiter` is not an option here: set it with solve"):
        optsolve.ScipyMinimizeScalar("golden", maxiter=3)
    with pytest.raises(TypeError, match="does not take the option `xtol`.*Valid options: xatol"):
        optsolve.ScipyMinimizeScalar("bounded", xtol=1e-3)
    with pytest.raises(ValueError, match="`method` must be one of 'brent', 'golden', 'bounded'"):
        optsolve.ScipyMinimizeScalar("Nelder-Mead")
    with pytest.raises(ValueError, match="`bracket` must be a pair"):
        optsolve.ScipyMinimizeScalar("brent", bracket=(1,))
    alg = optsolve.ScipyMinimizeScalar("Bounded", xatol=1e-8)
    assert type(alg) is type(optsolve.ScipyMinimizeScalar("bounded"))
    assert repr(alg) == "ScipyMinimizeScalar(method='bounded', xatol=1e-08)"
    prob = _boxed(2.0, 1.0, 5.0)
    for option in ("gtol", "ftol"):
        with pytest.raises(ValueError, match=f"does not take `{option}`.*`xatol`"):
            solve(prob, alg, **{option: 1e-6})


# --------------------------------------------------------------------- optsolve's rules


def test_errors_name_the_argument_and_what_was_given():
    with pytest.raises(
        ValueError,
        match=r"Brent minimises over one scalar, so `x0` must be a "
        r"0-d float array .*got an array of shape \(2,\)",
    ):
        solve(
            OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.zeros(2), bounds=(0, 1)),
            optsolve.Brent(),
        )
    with pytest.raises(
        ValueError,
        match=r"got a pytree of 2 arrays. For a vector x use e.g. "
        r".*LBFGS",
    ):
        solve(
            OptimizationProblem(
                lambda x, p: x[0] ** 2 + x[1] ** 2, (jnp.array(0.0), jnp.array(1.0)), bounds=(0, 1)
            ),
            optsolve.ScipyMinimizeScalar("bounded"),
        )
    with pytest.raises(ValueError, match="GoldenSection: `xtol` must be >= 0, got -1"):
        optsolve.GoldenSection(xtol=-1.0)
    with pytest.raises(ValueError, match="Brent: `atol` must be >= 0"):
        optsolve.Brent(atol=-1e-3)
    with pytest.raises(TypeError, match="xtol"):  # the bracket's tolerance is Brent's own
        solve(_boxed(2.0, 1.0, 5.0), optsolve.Brent(), xtol=1e-3)


@pytest.mark.parametrize("make", NATIVE, ids=_ids)
def test_jit_and_vmap_over_p_equal_the_loop(make):
    """100 values of p in one vmapped, jitted solve: each run is the eager run of its p
    (x, objective, counts, retcode), and the minimiser is p^(1/3)."""
    alg = make()
    prob = OptimizationProblem(quartic, jnp.array(1.0), 1.0, bounds=(0.0, 3.0))
    ps = jnp.linspace(0.5, 20.0, 100)
    batched = jax.jit(jax.vmap(lambda p: solve(prob.replace(p=p), alg)))(ps)
    for i in (0, 17, 63, 99):
        one = solve(prob.replace(p=ps[i]), alg)
        np.testing.assert_allclose(batched.x[i], one.x, rtol=1e-12)
        np.testing.assert_allclose(batched.objective[i], one.objective, rtol=1e-12)
        assert int(batched.stats.f_evals[i]) == one.stats.f_evals
        assert int(batched.retcode[i]) == one.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(batched.x, ps ** (1 / 3), rtol=1e-7)


def test_scipy_path_under_jit_and_vmap_equals_the_loop():
    alg = optsolve.ScipyMinimizeScalar("bounded", xatol=1e-10)
    prob = OptimizationProblem(quartic, jnp.array(1.0), 1.0, bounds=(0.0, 3.0))
    ps = jnp.linspace(0.5, 20.0, 100)
    batched = jax.jit(jax.vmap(lambda p: solve(prob.replace(p=p), alg).x))(ps)
    loop = np.array([float(solve(prob.replace(p=p), alg).x) for p in ps[::11]])
    np.testing.assert_allclose(batched[::11], loop, rtol=1e-15)
    # bounded's tolerance: sqrt(2.2e-16) |x| + xatol / 3
    np.testing.assert_allclose(batched, ps ** (1 / 3), rtol=5e-8)


@pytest.mark.parametrize("make", BOUNDED + ["brent"], ids=_ids)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_float32_and_float64(make, dtype):
    """x comes back in x0's dtype, at the minimiser to the dtype's resolution (the default
    tolerance is sqrt(eps): 3.5e-4 relative in float32, 1.5e-8 in float64)."""
    prob = OptimizationProblem(
        fun,
        jnp.asarray(0.0, dtype),
        jnp.asarray(SOLUTION, dtype),
        bounds=None if make == "brent" else (-10.0, 10.0),
    )
    alg = optsolve.ScipyMinimizeScalar("brent") if make == "brent" else make()
    sol = solve(prob, alg)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert np.asarray(sol.x).dtype == dtype and np.asarray(sol.objective).dtype == dtype
    tol = 2e-3 if dtype == jnp.float32 else 1e-6
    np.testing.assert_allclose(sol.x, SOLUTION, atol=tol)


@pytest.mark.parametrize("make", BOUNDED + ["brent"], ids=_ids)
def test_hypergradient_is_the_closed_form(make):
    """x*(p) = p^(1/3) (interior: f'(x*) = 0): dx*/dp = p^(-2/3) / 3 by the implicit
    function theorem, equal to central finite differences; the optimal value's derivative
    is -x* (the envelope theorem). Forward and reverse mode agree."""
    if make == "brent":
        alg, bounds = optsolve.ScipyMinimizeScalar("brent", xtol=1e-12), None
    else:
        alg, bounds = (make(xatol=1e-12) if not isinstance(make, type) else make()), (0.0, 3.0)
    prob = OptimizationProblem(quartic, jnp.array(1.0), 2.0, bounds=bounds)
    x_of = lambda p: solve(prob.replace(p=p), alg).x
    p = 2.0
    expected = p ** (-2 / 3) / 3
    np.testing.assert_allclose(jax.grad(x_of)(p), expected, rtol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(x_of)(p), expected, rtol=1e-6)
    h = 1e-2  # a step far above the solutions' tolerance (1.5e-8 relative)
    fd = (x_of(p + h) - x_of(p - h)) / (2 * h)
    np.testing.assert_allclose(jax.grad(x_of)(p), fd, rtol=1e-4)
    value = jax.grad(lambda p: solve(prob.replace(p=p), alg).objective)(p)
    np.testing.assert_allclose(value, -(p ** (1 / 3)), rtol=1e-7)


@pytest.mark.parametrize("make", NATIVE, ids=_ids)
def test_derivative_at_an_active_bound_follows_the_bound(make):
    """min (x - 3)^2 on [0, u] at u = 1: x* = u, dx*/du = 1 and dx*/dp = 0 for the
    objective's own p."""

    def run(u, p):
        prob = OptimizationProblem(to_p, jnp.array(0.5), p, bounds=(0.0, u))
        return solve(prob, make()).x

    du, dp = jax.grad(run, argnums=(0, 1))(1.0, 3.0)
    np.testing.assert_allclose(du, 1.0, atol=1e-8)
    np.testing.assert_allclose(dp, 0.0, atol=1e-8)


def test_unrolled_derivative_agrees_with_the_implicit_one():
    """Brent's parabolic steps move with f's values, so unrolling them differentiates x*;
    golden-section points move with the box only, and unrolling is refused."""
    prob = OptimizationProblem(quartic, jnp.array(1.0), 2.0, bounds=(0.0, 3.0))

    def unrolled(alg, p):
        return solve(prob.replace(p=p), alg, maxiters=100, adjoint=optsolve.UnrolledAdjoint()).x

    np.testing.assert_allclose(
        jax.grad(lambda p: unrolled(optsolve.Brent(), p))(2.0), 2.0 ** (-2 / 3) / 3, rtol=1e-4
    )
    with pytest.raises(ValueError, match="GoldenSection cannot be differentiated by unrolling"):
        jax.grad(lambda p: unrolled(optsolve.GoldenSection(), p))(2.0)


def test_brent_beats_golden_section_on_a_smooth_function():
    """The parabolic steps: Brent needs several times fewer evaluations than golden-section
    search on the same box and tolerance (scipy's counts on this problem: 6 and 42)."""
    prob = _boxed(1.0 + 0.5 * (3 - math.sqrt(5)) * 4.0, 1.0, 5.0)
    brent, golden = (solve(prob, alg()) for alg in NATIVE)
    assert brent.retcode == golden.retcode == ReturnCode.SUCCESS
    assert 3 * brent.stats.f_evals < golden.stats.f_evals


def test_the_message_names_the_bracket_test_and_history_records_every_iterate():
    sol = solve(_boxed(0.0, -10.0, 10.0), optsolve.Brent(), history=True, maxiters=100)
    assert sol.retcode == ReturnCode.SUCCESS and "xtol" in sol.message
    k = sol.stats.iterations
    objective = np.asarray(sol.history.objective)[: k + 1]
    assert np.all(np.diff(objective) <= 0)  # the iterate is the best point so far
    np.testing.assert_allclose(objective[-1], sol.objective, rtol=1e-15)
