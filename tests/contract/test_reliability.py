"""Reliability suite over every backend: property-based convex quadratics on random pytree
structures and dtypes, every bad-input error, NaN mid-run, exceptions in f, determinism."""

import re
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import optsolve
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve

# One algorithm per backend family, each with the options it needs to converge.
BACKENDS = {
    "optax": (lambda: optsolve.OptaxLBFGS(), {"maxiters": 200}),
    "classical": (lambda: optsolve.LBFGS(), {}),
    "scipy": (lambda: optsolve.ScipyMinimize("BFGS"), {}),
}

# Pytree templates (leaf shapes); values are drawn by hypothesis. A fixed set of structures
# keeps compilations cached across examples, while the numbers vary freely.
STRUCTURES = [
    jnp.zeros(3),
    {"a": jnp.zeros(2), "b": jnp.zeros((2, 2))},
    (jnp.zeros(3), [jnp.zeros(1), jnp.zeros(2)]),
    {"scalar": jnp.zeros(()), "matrix": jnp.zeros((2, 3))},
]


def quadratic(x, p):
    """sum over leaves of 0.5 x^T A x - b^T x, each A symmetric positive definite."""
    total = 0.0
    for leaf, (a, b) in zip(jax.tree_util.tree_leaves(x), p):
        v = jnp.ravel(leaf)
        total = total + 0.5 * v @ (a @ v) - b @ v
    return total


@st.composite
def convex_problems(draw):
    template = draw(st.sampled_from(STRUCTURES))
    dtype = draw(st.sampled_from([jnp.float32, jnp.float64]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    leaves, treedef = jax.tree_util.tree_flatten(template)
    p, minimiser = [], []
    for leaf in leaves:
        n = max(1, leaf.size)
        q, _ = np.linalg.qr(rng.normal(size=(n, n)))
        eigenvalues = rng.uniform(1.0, 10.0, size=n)  # condition number <= 10
        a = (q * eigenvalues) @ q.T
        b = rng.normal(size=n)
        p.append((jnp.asarray(a, dtype), jnp.asarray(b, dtype)))
        minimiser.append(np.linalg.solve(a, b).reshape(leaf.shape))
    x0 = jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray(rng.normal(size=leaf.shape), dtype) for leaf in leaves]
    )
    return OptimizationProblem(quadratic, x0, p), minimiser, dtype


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@settings(max_examples=200, deadline=None, derandomize=True)
@given(case=convex_problems())
def test_convex_quadratics_reach_the_closed_form_minimiser(backend, case):
    prob, minimiser, dtype = case
    make, options = BACKENDS[backend]
    # scipy's BFGS line search reports "precision loss" (FAILURE) below ~1e-8 on these
    gtol = 1e-4 if dtype == jnp.float32 else (1e-7 if backend == "scipy" else 1e-9)
    sol = solve(prob, make(), gtol=gtol, **options)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(prob.x0)
    rtol = 1e-3 if dtype == jnp.float32 else 1e-6
    for leaf, expected in zip(jax.tree_util.tree_leaves(sol.x), minimiser):
        assert leaf.dtype == dtype
        np.testing.assert_allclose(leaf, expected, rtol=rtol, atol=rtol)


SIMPLE = OptimizationProblem(lambda x, p: jnp.sum((x - 1.0) ** 2), jnp.zeros(2))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_bad_input_errors_on_every_backend(backend):
    make, options = BACKENDS[backend]
    name = type(make()).__name__
    with pytest.raises(ValueError, match="must return a scalar"):
        solve(OptimizationProblem(lambda x, p: x, jnp.zeros(2)), make(), **options)
    with pytest.raises(TypeError, match="real floating-point scalar, got a complex"):
        solve(OptimizationProblem(lambda x, p: jnp.sum(x) * 1j, jnp.zeros(2)), make(), **options)
    with pytest.raises(TypeError, match="does not take the option.*Valid options"):
        solve(SIMPLE, make(), not_an_option=1, **options)
    constrained = SIMPLE.replace(constraints=[Constraint(lambda x, p: x[0], 0.0, 1.0)])
    with pytest.raises(ValueError, match=re.escape(name) + " does not support constraints.*Scipy"):
        solve(constrained, make(), **options)
    if not make().takes_bounds:
        with pytest.raises(ValueError, match="does not support bounds"):
            solve(SIMPLE.replace(bounds=(0.0, 0.5)), make(), **options)


def _nan_beyond_half(x, p):
    """Finite for x < 0.5, NaN beyond; the minimum (at 1) lies in the NaN region."""
    return jnp.where(jnp.all(x < 0.5), jnp.sum((x - 1.0) ** 2), jnp.nan)


def _nan_away_from_start(x, p):
    """Finite only at the starting point 0: any step lands on NaN, as a line search will."""
    return jnp.where(jnp.all(x == 0.0), jnp.sum((x - 1.0) ** 2), jnp.nan)


# Per backend, a run that must meet a NaN: fixed-step Adam walks into the NaN region; every
# trial of a line search from 0 is NaN; scipy's BFGS line search meets the NaN region.
NAN_CASES = {
    "optax": (_nan_beyond_half, lambda: optsolve.Adam(0.1), {"maxiters": 100}),
    "classical": (_nan_away_from_start, lambda: optsolve.LBFGS(), {}),
    "scipy": (_nan_beyond_half, lambda: optsolve.ScipyMinimize("BFGS"), {}),
}


@pytest.mark.parametrize("backend", sorted(NAN_CASES))
def test_nan_mid_run_gives_failure_with_the_last_finite_iterate(backend):
    f, make, options = NAN_CASES[backend]
    sol = solve(OptimizationProblem(f, jnp.zeros(2)), make(), **options)
    assert sol.retcode == ReturnCode.FAILURE, sol.retcode
    x = np.asarray(sol.x)
    value, grad = jax.value_and_grad(f)(jnp.asarray(x), None)
    assert np.isfinite(value) and np.all(np.isfinite(grad))  # the iterate is a finite one
    np.testing.assert_allclose(sol.objective, value, rtol=1e-6)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_nan_region_never_yields_success_or_a_non_finite_iterate(backend):
    # line searches step around the NaN region: they may stop at its edge, never with SUCCESS
    make, options = BACKENDS[backend]
    sol = solve(OptimizationProblem(_nan_beyond_half, jnp.zeros(2)), make(), **options)
    assert sol.retcode != ReturnCode.SUCCESS
    value, grad = jax.value_and_grad(_nan_beyond_half)(jnp.asarray(sol.x), None)
    assert np.isfinite(value) and np.all(np.isfinite(grad))


class ObjectiveError(Exception):
    pass


def failing_objective(x, p):
    raise ObjectiveError("raised inside the user's objective")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_exception_in_f_propagates_with_its_traceback(backend):
    make, options = BACKENDS[backend]
    with pytest.raises(ObjectiveError, match="raised inside the user's objective") as info:
        solve(OptimizationProblem(failing_objective, jnp.zeros(2)), make(), **options)
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_objective" in frames


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_same_call_twice_gives_identical_results(backend):
    make, options = BACKENDS[backend]
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - p) ** 2 * jnp.arange(1.0, 4.0)) + jnp.sum(x**4),
        jnp.zeros(3),
        jnp.asarray(0.7),
    )
    first, second = (solve(prob, make(), gtol=1e-8, **options) for _ in range(2))
    np.testing.assert_array_equal(first.x, second.x)
    assert first.retcode == second.retcode
    assert int(first.stats.f_evals) == int(second.stats.f_evals)


def _rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


@pytest.mark.parametrize(
    "algorithm, options",
    [
        # Nelder-Mead's best vertex often stays put for an iteration
        (optsolve.ScipyMinimize("Nelder-Mead"), {}),
        # a warm-up schedule starting at 0 makes the first update zero
        (optsolve.Adam(optax.linear_schedule(0.0, 0.01, 10)), {"maxiters": 20000}),
        # a rejected trust-region step leaves x and f as they were
        (optsolve.TrustRegion(), {}),
    ],
    ids=["Nelder-Mead", "Adam+warmup", "TrustRegion"],
)
def test_ftol_is_not_fooled_by_an_unchanged_iterate(algorithm, options):
    sol = solve(
        OptimizationProblem(_rosenbrock, jnp.array([-1.2, 1.0])), algorithm, ftol=1e-12, **options
    )
    if sol.retcode == ReturnCode.SUCCESS:
        np.testing.assert_allclose(sol.x, [1.0, 1.0], atol=1e-3)
    assert float(sol.objective) < 1e-5
