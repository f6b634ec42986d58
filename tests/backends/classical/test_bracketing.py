"""Bisection and Brentq (root_scalar's bracketing methods) against scipy's own tests.

Ported from scipy/optimize/tests/test_zeros.py (``TestBracketMethods``): the APS collection
(Alefeld, Potra & Shi, TOMS Algorithm 748, 1995; smoothness >= 1, as scipy's
``test_aps_collection``) and the Chandrupatla collection (Chandrupatla 1997, as scipy's
``test_chandrupatla_collection``), their cases (brackets, parameters, roots) read from
scipy's ``_tstutils``, the functions written again in jax.numpy. Each root is checked with
scipy's own rule: within ``xtol = rtol = 4 eps`` of the reference root, or F = 0 there;
the iterations are scipy's (brentq's, bisect's, run here on scipy's own function) plus at
most two. Every family of cases runs as one vmapped solve over its parameters and
brackets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so
from scipy.optimize._tstutils import get_tests

import optsolve
from optsolve import ReturnCode, RootProblem, solve

TOL = 4 * np.finfo(float).eps  # scipy's test_zeros: xtol = rtol = 4 eps
_MAX_EXPABLE = float(np.log(np.finfo(float).max))
_II = jnp.arange(1.0, 21.0)


def _aps13(x, p):
    safe = jnp.where(x == 0, 1.0, x)
    y = 1 / safe**2
    return jnp.where((x == 0) | (y > _MAX_EXPABLE), 0.0, safe / jnp.exp(jnp.minimum(y, 700.0)))


# scipy's _tstutils functions in jax.numpy, F(x, p) with p the case's args
JAX_FUNCTIONS = {
    "aps01_f": lambda x, p: jnp.sin(x) - x / 2,
    "aps02_f": lambda x, p: -2 * jnp.sum((2 * _II - 5) ** 2 / (x - _II**2) ** 3),
    "aps03_f": lambda x, p: p[0] * x * jnp.exp(p[1] * x),
    "aps04_f": lambda x, p: jnp.power(x, p[0]) - p[1],
    "aps05_f": lambda x, p: jnp.sin(x) - 1.0 / 2,
    "aps06_f": lambda x, p: 2 * x * jnp.exp(-p[0]) - 2 * jnp.exp(-p[0] * x) + 1,
    "aps07_f": lambda x, p: (1 + (1 - p[0]) ** 2) * x - (1 - p[0] * x) ** 2,
    "aps08_f": lambda x, p: x * x - jnp.power(1 - x, p[0]),
    "aps09_f": lambda x, p: (1 + (1 - p[0]) ** 4) * x - (1 - p[0] * x) ** 4,
    "aps10_f": lambda x, p: jnp.exp(-p[0] * x) * (x - 1) + jnp.power(x, p[0]),
    "aps11_f": lambda x, p: (p[0] * x - 1) / ((p[0] - 1) * x),
    "aps12_f": lambda x, p: jnp.power(x, 1.0 / p[0]) - jnp.power(p[0], 1.0 / p[0]),
    "aps13_f": _aps13,
    "fun1": lambda x, p: x**3 - 2 * x - 5,
    "fun2": lambda x, p: 1 - 1 / x**2,
    "fun3": lambda x, p: (x - 3) ** 3,
    "fun4": lambda x, p: 6 * (x - 2) ** 5,
    "fun5": lambda x, p: x**9,
    "fun6": lambda x, p: x**19,
    "fun7": lambda x, p: jnp.where(
        jnp.abs(x) < 3.8e-4, 0.0, x * jnp.exp(-(jnp.where(x == 0, 1.0, x) ** (-2)))
    ),
    "fun8": lambda x, p: (
        -(3062 * (1 - 0.61489) * jnp.exp(-x)) / (0.61489 + (1 - 0.61489) * jnp.exp(-x))
        - 1013
        + 1628 / x
    ),
    "fun9": lambda x, p: jnp.exp(x) - 2 - 0.01 / x**2 + 0.000002 / x**3,
}

METHODS = {optsolve.Bisection: so.bisect, optsolve.Brentq: so.brentq}


def _families(collection: str, smoothness=None) -> dict[str, list[dict]]:
    families: dict[str, list[dict]] = {}
    for tc in get_tests(collection, smoothness=smoothness):
        families.setdefault(tc["f"].__name__, []).append(tc)
    return families


APS = _families("aps", smoothness=1)
CHANDRUPATLA = _families("chandrupatla")


def _solve_family(cases: list[dict], alg, dtype=jnp.float64):
    """One vmapped solve over the cases' parameters and brackets: (x, retcode,
    iterations) per case."""
    F = JAX_FUNCTIONS[cases[0]["f"].__name__]
    width = max(len(tc.get("args", ())) for tc in cases)
    ps = jnp.asarray(
        [
            list(tc.get("args", ())) + [0.0] * (width - len(tc.get("args", ()))) or [0.0]
            for tc in cases
        ],
        dtype,
    )
    ends = jnp.asarray([tc["bracket"] for tc in cases], dtype)

    def run(p, a, b):
        sol = solve(RootProblem(F, a, p, bracket=(a, b)), alg)
        return sol.x, sol.retcode, sol.stats.iterations

    return jax.jit(jax.vmap(run))(ps, ends[:, 0], ends[:, 1])


def _check_against_scipy(cases, cls, xs, codes, iterations):
    F = JAX_FUNCTIONS[cases[0]["f"].__name__]
    for tc, x, code, its in zip(cases, np.asarray(xs), np.asarray(codes), np.asarray(iterations)):
        args = tc.get("args", ())
        _ref_root, ref = METHODS[cls](
            tc["f"], *tc["bracket"], args=args, xtol=TOL, rtol=TOL, full_output=True, disp=False
        )
        if not ref.converged:  # scipy's brentq on the triple and quintuple roots (fun3,
            # fun4), which scipy's own test leaves out: neither converges in 100
            assert int(code) == ReturnCode.MAXITERS and int(its) == 100, tc["ID"]
            continue
        assert int(code) == ReturnCode.SUCCESS, (tc["ID"], int(code))
        root = tc["root"]
        # scipy's rule: numpy's isclose (|x - root| <= atol + rtol |root|), else F is 0 at
        # the purported root (scipy's F; or this F, whose rounding can differ)
        close = np.isclose(float(x), root, rtol=TOL, atol=TOL)
        assert (
            close
            or tc["f"](float(x), *args) == 0
            or float(F(jnp.asarray(x), jnp.asarray(args, float))) == 0
        ), (tc["ID"], float(x), root)
        # no worse than scipy's by more than two (fewer where F, in jax.numpy's rounding,
        # is 0 at a point where numpy's is not)
        assert int(its) <= ref.iterations + 2, (tc["ID"], int(its), ref.iterations)


@pytest.mark.parametrize("family", sorted(APS))
@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_aps_collection(cls, family):
    cases = APS[family]
    xs, codes, iterations = _solve_family(cases, cls(xtol=TOL, rtol=TOL))
    _check_against_scipy(cases, cls, xs, codes, iterations)


@pytest.mark.parametrize("family", sorted(CHANDRUPATLA))
@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_chandrupatla_collection(cls, family):
    cases = CHANDRUPATLA[family]
    xs, codes, iterations = _solve_family(cases, cls(xtol=TOL, rtol=TOL))
    _check_against_scipy(cases, cls, xs, codes, iterations)


def test_brentq_takes_fewer_iterations_than_bisection_on_smooth_functions():
    cases = APS["aps12_f"]
    _, _, its = _solve_family(cases, optsolve.Brentq(xtol=TOL, rtol=TOL))
    _, _, bisect_its = _solve_family(cases, optsolve.Bisection(xtol=TOL, rtol=TOL))
    assert np.all(np.asarray(its) * 3 < np.asarray(bisect_its))


# Brentq not on fun3's triple root, which scipy's brentq does not reach in 100 iterations
_FLOAT32 = [
    (cls, family)
    for cls in METHODS
    for family in ("fun1", "fun2", "fun3", "fun5", "fun6", "fun7", "fun8", "fun9")
    if not (cls is optsolve.Brentq and family == "fun3")
]


@pytest.mark.parametrize("cls, family", _FLOAT32, ids=[f"{c.__name__}-{f}" for c, f in _FLOAT32])
def test_float32_in_float32_out_within_its_tolerance(cls, family):
    """float32 x and brackets (the default tolerances: xtol 2e-12, rtol 4 eps of float32):
    the root within 8 eps32 |root| (+ 4e-12), or F (in float32) is 0 there. The cases
    whose |F| at the bracket's ends passes 1e19 are left out: the run's record, the merit
    0.5 F^2, overflows float32 there (a non-finite value, FAILURE)."""
    cases = [
        tc
        for tc in CHANDRUPATLA[family]
        if max(abs(tc["f"](float(e))) for e in tc["bracket"]) < 1e19
    ]
    xs, codes, _ = _solve_family(cases, cls(), jnp.float32)
    assert xs.dtype == jnp.float32
    F = JAX_FUNCTIONS[family]
    eps = float(np.finfo(np.float32).eps)
    for tc, x, code in zip(cases, np.asarray(xs), np.asarray(codes)):
        assert int(code) == ReturnCode.SUCCESS, (tc["ID"], int(code))
        close = abs(float(x) - tc["root"]) <= 8 * eps * abs(tc["root"]) + 4e-12
        assert close or float(F(jnp.float32(x), None)) == 0, (tc["ID"], float(x))


def test_basic_root_scalar_functions_with_scipy_defaults():
    """scipy's test_basic_root_scalar: f1, f2, f3 of _tstutils on [0.5, sqrt 3] (root 1),
    scipy's default tolerances (xtol 2e-12, rtol 4 eps)."""
    functions = [
        lambda x, p: x * (x - 1.0),
        lambda x, p: x**2 - 1,
        lambda x, p: x * (x - 1.0) * (x - 2.0) * (x - 3.0),
    ]
    for F in functions:
        for cls, ref_method in METHODS.items():
            prob = RootProblem(F, jnp.array(0.5), bracket=(0.5, np.sqrt(3)))
            sol = solve(prob, cls())
            assert sol.retcode == ReturnCode.SUCCESS, sol.message
            np.testing.assert_allclose(sol.x, 1.0, atol=2e-12, rtol=TOL)
            ref = so.root_scalar(
                lambda x: float(F(x, None)),  # noqa: B023  (called in this iteration)
                bracket=[0.5, np.sqrt(3)],
                method=ref_method.__name__,
            )
            assert sol.stats.iterations <= ref.iterations + 2


@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_vmap_over_p_equals_a_loop_and_jit_equals_eager(cls):
    def F(x, p):
        return jnp.power(x, 1.0 / p) - jnp.power(p, 1.0 / p)

    alg = cls()
    ps = jnp.array([2.0, 5.0, 9.0, 21.0])

    def run(p):
        sol = solve(RootProblem(F, jnp.array(1.0), p, bracket=(1.0, 100.0)), alg)
        return sol.x, sol.retcode, sol.stats.iterations, sol.stats.f_evals

    xs, codes, its, evals = jax.vmap(run)(ps)
    for i, p in enumerate(ps):
        eager = solve(RootProblem(F, jnp.array(1.0), float(p), bracket=(1.0, 100.0)), alg)
        assert float(xs[i]) == float(eager.x)
        assert int(codes[i]) == eager.retcode == ReturnCode.SUCCESS
        assert int(its[i]) == eager.stats.iterations and int(evals[i]) == eager.stats.f_evals
        x, _code, it, _ = jax.jit(run)(p)
        assert float(x) == float(eager.x) and int(it) == eager.stats.iterations
    np.testing.assert_allclose(xs, ps, rtol=1e-12)


@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_derivative_is_the_implicit_one_in_closed_form(cls):
    """x*(p) for F = exp(p0 x) - p1: log(p1) / p0, so dx/dp = -F_p / F_x =
    (-log(p1) / p0^2, 1 / (p0 p1)); jax.grad, jacfwd, jacrev and under vmap."""
    alg = cls()

    def F(x, p):
        return jnp.exp(p[0] * x) - p[1]

    def root(p):
        return solve(RootProblem(F, jnp.array(0.0), p, bracket=(-5.0, 5.0)), alg).x

    p = jnp.array([2.0, 3.0])
    closed = np.array([-np.log(3.0) / 4.0, 1.0 / 6.0])
    np.testing.assert_allclose(root(p), np.log(3.0) / 2.0, rtol=0, atol=4e-12)
    for jac in (jax.grad(root)(p), jax.jacfwd(root)(p), jax.jacrev(root)(p)):
        np.testing.assert_allclose(jac, closed, rtol=1e-10)
    ps = jnp.array([[2.0, 3.0], [1.0, 5.0]])
    batched = jax.vmap(jax.grad(root))(ps)
    np.testing.assert_allclose(batched[1], [-np.log(5.0), 0.2], rtol=1e-10)
    np.testing.assert_allclose(batched[0], closed, rtol=1e-10)


@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_a_bracket_without_a_sign_change_is_refused_naming_it(cls):
    prob = RootProblem(lambda x, p: x**2 - p, jnp.array(1.0), 4.0, bracket=(3.0, 5.0))
    with pytest.raises(
        ValueError,
        match=r"`bracket` = \(3, 5\) holds no sign change of F: "
        r"f\(a\) and f\(b\) must have different signs",
    ):
        solve(prob, cls())
    # under a trace: FAILURE at x0, its reason in the message
    sol = jax.jit(lambda p: solve(prob.replace(p=p), cls()))(4.0)
    assert int(sol.retcode) == ReturnCode.FAILURE and float(sol.x) == 1.0
    assert "must have different signs" in sol.message


@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_a_root_at_an_end_is_returned_at_once(cls):
    for bracket, end in (((2.0, 5.0), 2.0), ((-1.0, 2.0), 2.0)):
        prob = RootProblem(lambda x, p: x**2 - p, jnp.array(0.5), 4.0, bracket=bracket)
        sol = solve(prob, cls())
        assert sol.retcode == ReturnCode.SUCCESS and float(sol.x) == end
        assert sol.stats.iterations == 1 and "F(x) = 0" in sol.message


@pytest.mark.parametrize("cls", list(METHODS), ids=lambda c: c.__name__)
def test_nonfinite_values_fail_at_the_last_good_point(cls):
    def F(x, p):  # NaN right of 1.5, the root (2) beyond it
        return jnp.where(x > 1.5, jnp.nan, x - 2.0)

    # a bracket reaching into the NaN region: FAILURE at x0 (its end is not finite)
    sol = solve(RootProblem(F, jnp.array(0.25), bracket=(0.0, 3.0)), cls())
    assert sol.retcode == ReturnCode.FAILURE and "finite" in sol.message
    assert float(sol.x) == 0.25

    def G(x, p):  # finite at both ends, NaN on (1.2, 2)
        return jnp.where((x > 1.2) & (x < 2.0), jnp.nan, x - 1.0 - p)

    sol = solve(RootProblem(G, jnp.array(0.0), 0.1, bracket=(0.0, 4.0)), cls(), maxiters=50)
    assert sol.retcode in (ReturnCode.SUCCESS, ReturnCode.FAILURE), sol.message
    assert np.isfinite(float(sol.x)) and np.isfinite(float(sol.objective))
    if sol.retcode == ReturnCode.FAILURE:
        assert "finite" in sol.message and not 1.2 < float(sol.x) < 2.0


def test_bad_brackets_are_refused_naming_the_argument():
    F = lambda x, p: x - 1.0
    with pytest.raises(ValueError, match=r"`bracket` must be \(a, b\) with a < b"):
        RootProblem(F, jnp.array(0.0), bracket=(2.0, 0.0))
    with pytest.raises(ValueError, match="`bracket` must have finite ends"):
        RootProblem(F, jnp.array(0.0), bracket=(0.0, np.inf))
    with pytest.raises(ValueError, match=r"`bracket` must be a pair \(a, b\) of real numbers"):
        RootProblem(F, jnp.array(0.0), bracket=(0.0, 1.0, 2.0))
    with pytest.raises(
        ValueError,
        match=r"`bracket` brackets one scalar unknown, so `x0` "
        r"must be a 0-d float array",
    ):
        RootProblem(F, jnp.zeros(2), bracket=(0.0, 2.0))
    for cls in METHODS:
        with pytest.raises(
            ValueError,
            match=rf"{cls.__name__} searches the interval given "
            r"by the problem's `bracket`.*bracket=None",
        ):
            solve(RootProblem(F, jnp.array(0.0)), cls())
        with pytest.raises(ValueError, match=r"searches a bracket around one scalar"):
            solve(RootProblem(lambda x, p: x - 1.0, jnp.zeros(2)), cls())
    with pytest.raises(ValueError, match="`xtol` must be >= 0"):
        optsolve.Brentq(xtol=-1.0)
    # an array bracket (scipy's np.array([a, b])) is a pair; replace keeps it
    prob = RootProblem(F, jnp.array(0.0), bracket=np.array([0.0, 2.0]))
    assert float(solve(prob, optsolve.Brentq()).x) == 1.0
    assert prob.replace(p=1.0).bracket is not None
    # the others do not use it: NewtonRaphson starts from x0
    assert float(solve(prob, optsolve.NewtonRaphson()).x) == pytest.approx(1.0)


def test_ftol_also_ends_a_bracketing_run():
    prob = RootProblem(lambda x, p: x**3 - p, jnp.array(1.0), 2.0, bracket=(0.0, 4.0))
    loose = solve(prob, optsolve.Bisection(), ftol=1e-3)
    tight = solve(prob, optsolve.Bisection())
    assert loose.retcode == tight.retcode == ReturnCode.SUCCESS
    assert abs(float(loose.x) ** 3 - 2.0) <= 1e-3
    assert loose.stats.iterations < tight.stats.iterations
