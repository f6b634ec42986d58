"""The contract every root-solving class keeps: every registered class whose traits say it
solves RootProblems (``solves_roots``; the capability table's
:func:`~optsolve.solve_api.root_problem.root_form`) x every shared rule below, on one
standard system. The matrix of tests/contract/test_contract.py (Rosenbrock minimisation) does not
apply to the classes that solve RootProblems only; a registered root-solving class without a
case here fails ``test_every_root_solving_class_has_a_case``.

The system: ``F(x, p) = (x0^2 - |p|, x1 - x0)``, roots ``(s, s)``, ``s = +-sqrt|p|``, from
``x0 = (1, 0)`` (the rules accept either root: scipy's anderson finds the negative one);
for p < 0 with a NaN region just ahead of the start (x[0] beyond 1 + 1e-5), which any step
towards the root enters. A bracketing class (trait
``solves_roots == "bracket"``: one scalar x within a bracket) takes the system's first
equation on the line x1 = x0, ``F(x, p) = x^2 - |p|`` (NaN beyond 1 + 1e-5 for p < 0),
from ``x0 = 1`` within the bracket ``(0, 5)``, as tests/contract/test_contract.py gives its scalar
classes the contract problem on a line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from compile_count import count_compilations
from optsolve import ReturnCode, RootProblem, solve
from optsolve.solve_api.registry import algorithm_classes
from optsolve.solve_api.root_problem import root_form


@dataclasses.dataclass(frozen=True)
class Case:
    """How the rules build one root-solving class."""

    make: Callable[[], Any]
    host: bool = False  # scipy on the host: no callback, no history; iterations are its own
    scalar: bool = False  # a bracketing method: the scalar system within BRACKET


# scipy's mixing methods take J ~ -1/alpha: F here increases in x, so alpha is negative
_SCIPY_OPTIONS = {
    "linearmixing": {"jac_options": {"alpha": -0.2}},
    "excitingmixing": {"jac_options": {"alpha": -0.1, "alphamax": -1.0}},
}


CASES = {
    cls: Case(cls)
    for cls in (optsolve.NewtonRaphson, optsolve.Broyden, optsolve.LevenbergMarquardt)
}
for _cls in algorithm_classes():
    if issubclass(_cls, optsolve.ScipyRoot):  # one registered class per scipy method
        CASES[_cls] = Case(
            lambda method=_cls.spec.key: optsolve.ScipyRoot(
                method, **_SCIPY_OPTIONS.get(method, {})
            ),
            host=True,
        )
for _cls in (optsolve.Bisection, optsolve.Brentq):
    CASES[_cls] = Case(_cls, scalar=True)
CLASSES = list(CASES)
X0 = jnp.array([1.0, 0.0])
BRACKET = (0.0, 5.0)


def _F(x, p):
    nan_ahead = (p < 0) & (x[0] > 1.0 + 1e-5)
    F = jnp.stack([x[0] ** 2 - jnp.abs(p), x[1] - x[0]])
    return jnp.where(nan_ahead, jnp.nan, F)


def _F_scalar(x, p):
    """The system's first equation on the line x1 = x0 (NaN region included)."""
    nan_ahead = (p < 0) & (x > 1.0 + 1e-5)
    return jnp.where(nan_ahead, jnp.nan, x**2 - jnp.abs(p))


def _merit(x, p):
    F = _F_scalar if jnp.ndim(x) == 0 else _F
    return 0.5 * float(np.sum(np.square(np.asarray(F(jnp.asarray(x), p)))))


def _start(cls, x0=X0):
    """``x0`` as ``cls`` takes it: itself, or for a bracketing class its first entry."""
    return jnp.asarray(x0)[0] if cls is not None and CASES[cls].scalar else x0


def _problem(p=4.0, x0=X0, cls=None) -> RootProblem:
    if cls is not None and CASES[cls].scalar:
        return RootProblem(_F_scalar, _start(cls, x0), p, bracket=BRACKET)
    return RootProblem(_F, x0, p)


def _root(cls, r):
    """The root ``(r, r)`` as ``cls``'s x holds it."""
    return r if CASES[cls].scalar else [r, r]


def _id(cls) -> str:
    return cls.__name__


def test_every_root_solving_class_has_a_case():
    root_solvers = [c for c in algorithm_classes() if root_form(c) is not None]
    missing = [c.__name__ for c in root_solvers if c not in CASES]
    assert not missing, f"root-solving classes without a case: {missing}"
    assert {optsolve.NewtonRaphson, optsolve.Broyden, optsolve.Bisection, optsolve.Brentq} <= set(
        root_solvers
    )
    scipy_methods = {c.spec.key for c in root_solvers if issubclass(c, optsolve.ScipyRoot)}
    assert scipy_methods == set(optsolve.backends.scipy.root.METHODS)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_converges_on_the_standard_system(cls):
    sol = solve(_problem(cls=cls), CASES[cls].make())
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert sol.message.startswith(sol.retcode.message)
    # judged by max|F| <= ftol; a bracketing method by its bracket (or F = 0)
    assert ("F(x)" if CASES[cls].scalar else "max|F(x)|") in sol.message
    np.testing.assert_allclose(np.abs(sol.x), _root(cls, 2.0), rtol=1e-8)
    x = np.atleast_1d(np.asarray(sol.x))
    assert float(x[0]) == pytest.approx(float(x[-1]), rel=1e-8)
    F = _F_scalar if CASES[cls].scalar else _F
    assert np.max(np.abs(np.asarray(F(sol.x, 4.0)))) <= 1e-8
    # (atol: F is about 1e-9 at the root; its rounding in 1e-25 of the merit)
    np.testing.assert_allclose(sol.objective, _merit(sol.x, 4.0), rtol=1e-12, atol=1e-24)
    stats = sol.stats
    assert all(isinstance(v, int) for v in (stats.iterations, stats.f_evals, stats.grad_evals))
    assert isinstance(stats.time, float)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_maxiters_zero_returns_x0_and_a_short_budget_is_maxiters(cls):
    alg = CASES[cls].make()
    start = solve(_problem(cls=cls), alg, maxiters=0)
    assert start.retcode == ReturnCode.MAXITERS and start.stats.iterations == 0
    np.testing.assert_array_equal(start.x, _start(cls))
    short = solve(_problem(cls=cls), alg, maxiters=1)
    assert short.retcode == ReturnCode.MAXITERS, short.message
    assert short.stats.iterations == 1 or CASES[cls].host


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_jit_equals_eager_and_vmap_equals_a_loop(cls):
    alg = CASES[cls].make()
    ps = jnp.array([4.0, 9.0, 2.0])

    def run(p):
        sol = solve(_problem(p, cls=cls), alg)
        return sol.x, sol.retcode, sol.stats.iterations

    looped = [solve(_problem(float(p), cls=cls), alg) for p in ps]
    xs, codes, iterations = jax.jit(jax.vmap(run))(ps)
    for i, eager in enumerate(looped):
        np.testing.assert_allclose(xs[i], eager.x, rtol=1e-10, atol=1e-12)
        assert int(codes[i]) == eager.retcode and int(iterations[i]) == eager.stats.iterations
    np.testing.assert_allclose(
        np.abs(xs if CASES[cls].scalar else xs[:, 0]), np.sqrt(ps), rtol=1e-8
    )
    x, code, _ = jax.jit(run)(4.0)
    np.testing.assert_allclose(x, looped[0].x, rtol=1e-10, atol=1e-12)
    assert int(code) == ReturnCode.SUCCESS


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_nonfinite_values_fail_with_the_last_finite_iterate(cls):
    sol = solve(_problem(p=-4.0, cls=cls), CASES[cls].make(), maxiters=50)
    assert sol.retcode in (ReturnCode.FAILURE, ReturnCode.STALLED), sol.message
    x = np.asarray(sol.x)
    assert np.all(np.isfinite(x)) and np.isfinite(sol.objective)
    assert np.ravel(x)[0] <= 1.0 + 1e-5  # never beyond the NaN region's edge
    np.testing.assert_allclose(sol.objective, _merit(x, -4.0), rtol=1e-12)
    assert "finite" in sol.message, sol.message


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_bad_input_is_refused_naming_the_argument(cls):
    alg = CASES[cls].make()
    bad_shape = (
        RootProblem(lambda x, p: jnp.reshape(x, (1,)), _start(cls, X0), bracket=BRACKET)
        if CASES[cls].scalar
        else RootProblem(lambda x, p: x[:1], X0)
    )
    with pytest.raises(
        TypeError,
        match=r"RootProblem: `F\(x, p\)` must return an array "
        r"shaped like x",
    ):
        solve(bad_shape, alg)
    with pytest.raises(TypeError, match=r"RootProblem: `x0` must hold real floating-point"):
        RootProblem(_F, jnp.array([1, 0]))
    with pytest.raises(ValueError, match="`gtol` is not an option of a RootProblem's solve"):
        solve(_problem(cls=cls), alg, gtol=1e-6)
    with pytest.raises(TypeError, match="`adjoint` must be optsolve.ImplicitAdjoint"):
        solve(_problem(cls=cls), alg, adjoint="implicit")


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_derivative_equals_finite_differences(cls):
    """x*(p) for F = (x0^2 - p0, x1 - p1 x0): (s, p1 s), s = +-sqrt p0; jacfwd and jacrev
    against central differences and the closed form. ftol=1e-12: the differences divide
    the roots' error by h. A bracketing class: F = x^2 - p0 p1, x* = sqrt(p0 p1), its
    (p1, p0) / (2 sqrt(p0 p1)), in the same two columns."""
    alg = CASES[cls].make()
    scalar = CASES[cls].scalar

    def F(x, p):
        if scalar:
            return x**2 - p[0] * p[1]
        return jnp.stack([x[0] ** 2 - p[0], x[1] - p[1] * x[0]])

    def root(p):
        if scalar:
            return solve(RootProblem(F, _start(cls), p, bracket=BRACKET), alg, ftol=1e-12).x
        return solve(RootProblem(F, X0, p), alg, ftol=1e-12).x

    p = jnp.array([4.0, 3.0])
    h = 1e-4 if scalar else 1e-6  # above the bracket tolerance (2e-12) by far
    fd = np.stack(
        [(np.asarray(root(p + h * e)) - np.asarray(root(p - h * e))) / (2 * h) for e in np.eye(2)],
        axis=-1,
    )
    sign = np.sign(float(np.ravel(root(p))[0]))  # the root found: +-sqrt p0
    closed = sign * np.array([[0.25, 0.0], [0.75, 2.0]])  # d sqrt(p0) = 1/(2 sqrt p0) dp0
    if scalar:
        closed = np.array([3.0, 4.0]) / (2 * np.sqrt(12.0))
    for jac in (jax.jacfwd(root)(p), jax.jacrev(root)(p)):
        np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(jac, closed, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_callback_stops_and_history_records_every_iterate(cls):
    alg = CASES[cls].make()
    seen = []
    if CASES[cls].host:
        with pytest.raises(ValueError, match="does not take `callback`"):
            solve(_problem(), alg, maxiters=50, callback=lambda i, x, f: None)
        with pytest.raises(ValueError, match="does not record a history"):
            solve(_problem(), alg, maxiters=50, history=True)
        return
    sol = solve(
        _problem(cls=cls), alg, maxiters=50, callback=lambda i, x, f: seen.append(i) or i >= 1
    )
    assert sol.retcode == ReturnCode.TERMINATED and sol.stats.iterations == seen[-1] == 1
    sol = solve(_problem(cls=cls), alg, maxiters=50, history=True)
    k = sol.stats.iterations
    objective = np.asarray(sol.history.objective)
    np.testing.assert_allclose(objective[0], _merit(_start(cls), 4.0), rtol=1e-15)
    np.testing.assert_allclose(objective[k], sol.objective, rtol=1e-12, atol=1e-30)
    assert np.all(np.isfinite(objective[: k + 1])) and np.all(np.isnan(objective[k + 1 :]))


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_float32_in_float32_out_and_no_recompilation_for_new_numbers(cls):
    alg = CASES[cls].make()
    sol = solve(_problem(x0=X0.astype(jnp.float32), p=jnp.float32(4.0), cls=cls), alg)
    assert np.asarray(sol.x).dtype == np.float32 and sol.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(np.abs(sol.x), _root(cls, 2.0), rtol=1e-5)
    solve(_problem(p=4.0, cls=cls), alg)
    moved = X0 + 0.5
    with count_compilations() as counter:
        again = solve(_problem(p=9.0, x0=moved, cls=cls), alg)
    assert counter.count == 0
    np.testing.assert_allclose(np.abs(again.x), _root(cls, 3.0), rtol=1e-8)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_resume_continues_the_run_or_is_refused(cls):
    alg = CASES[cls].make()
    first = solve(_problem(cls=cls), alg, maxiters=1)
    if CASES[cls].host:
        with pytest.raises(ValueError, match="cannot resume"):
            solve(_problem(cls=cls), alg, maxiters=1, resume=first)
        return
    second = solve(_problem(cls=cls), alg, maxiters=1, resume=first)
    whole = solve(_problem(cls=cls), alg, maxiters=2)
    np.testing.assert_allclose(second.x, whole.x, rtol=1e-12, atol=1e-14)
    assert second.stats.iterations == whole.stats.iterations == 2
