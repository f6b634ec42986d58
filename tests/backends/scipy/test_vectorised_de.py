"""differential_evolution's population in one vmapped compiled call (scipy's ``vectorized``).

The run must be the one-point-per-call run with ``updating='deferred'``: same rng, same
trials, same result; only the number of calls (scipy's ``nfev`` under ``vectorized``)
changes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optsolve import Constraint, OptimizationProblem, ReturnCode, ScipyGlobal, solve
from optsolve.backends.scipy.compiled import HostProblem


def rastrigin(x, p):
    return p * x.size + jnp.sum(x**2 - p * jnp.cos(2 * jnp.pi * x))


def _problem(n=4, **kw):
    return OptimizationProblem(rastrigin, jnp.full(n, 1.5), 10.0, bounds=(-5.12, 5.12), **kw)


def _pair(problem, **options):
    one = solve(
        problem,
        ScipyGlobal(
            "differential_evolution", rng=3, updating="deferred", vectorized=False, **options
        ),
    )
    many = solve(problem, ScipyGlobal("differential_evolution", rng=3, vectorized=True, **options))
    return one, many


def _assert_same_run(one, many):
    np.testing.assert_allclose(many.x, one.x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(many.objective, one.objective, rtol=1e-12, atol=1e-12)
    assert many.retcode == one.retcode
    assert many.stats.iterations == one.stats.iterations
    assert many.stats.f_evals == one.stats.f_evals  # points, not calls


@pytest.mark.parametrize("polish", [True, False])
def test_same_result_as_one_point_per_call_for_the_same_rng(polish):
    one, many = _pair(_problem(), polish=polish, maxiter=60)
    _assert_same_run(one, many)
    # scipy's own count under vectorized is of calls: one per generation (and the initial
    # population), plus the polish's evaluations
    calls = many.original.nfev - (one.original.nfev - one.stats.f_evals if polish else 0)
    assert one.original.nfev == one.stats.f_evals
    assert many.original.nfev < one.original.nfev / 20
    assert calls <= many.stats.iterations + 1 + (one.stats.f_evals if polish else 0)


def test_deferred_updating_is_vectorised_by_default():
    base = solve(
        _problem(),
        ScipyGlobal("differential_evolution", rng=5, maxiter=30, updating="deferred", polish=False),
    )
    off = solve(
        _problem(),
        ScipyGlobal(
            "differential_evolution",
            rng=5,
            maxiter=30,
            updating="deferred",
            polish=False,
            vectorized=False,
        ),
    )
    assert base.original.nfev == base.stats.iterations + 1  # one call a generation
    assert off.original.nfev == off.stats.f_evals
    _assert_same_run(off, base)


def test_immediate_updating_stays_one_point_per_call():
    sol = solve(_problem(), ScipyGlobal("differential_evolution", rng=5, maxiter=5, polish=False))
    assert sol.original.nfev == sol.stats.f_evals


def test_constraints_are_evaluated_per_population_too():
    # x0 + x1 >= 1 moves the minimum off the origin
    con = Constraint(lambda x, p: x[0] + x[1], lower=1.0)
    problem = _problem(3, constraints=[con])
    one, many = _pair(problem, maxiter=40)
    _assert_same_run(one, many)
    assert float(many.x[0] + many.x[1]) >= 1.0 - 1e-6


def test_nonfinite_values_are_rejected_as_point_by_point():
    def f(x, p):
        return jnp.where(x[0] > 2.0, jnp.nan, rastrigin(x, p))

    problem = OptimizationProblem(f, jnp.full(3, 1.5), 10.0, bounds=(-5.12, 5.12))
    one, many = _pair(problem, maxiter=20, polish=False)
    _assert_same_run(one, many)
    assert many.detail == one.detail
    assert "f was not finite at" in many.detail
    assert float(many.x[0]) <= 2.0


def test_inside_jit_and_with_p_traced():
    alg = ScipyGlobal("differential_evolution", rng=2, vectorized=True, maxiter=20, polish=False)
    eager = solve(_problem(3), alg)

    @jax.jit
    def run(p):
        return solve(_problem(3).replace(p=p), alg).x

    np.testing.assert_allclose(run(10.0), eager.x, rtol=1e-12)


def test_population_batches_reuse_one_compilation_by_padding():
    host = HostProblem(_problem(3))
    pts = np.random.default_rng(0).uniform(-5, 5, (3, 8))
    full = host.fun_batch(pts)
    part = host.fun_batch(pts[:, :5])  # padded to the compiled 8
    one = host.fun_batch(pts[:, 0])  # (n,) is one point
    assert list(host._batched) == [("f_batch", 8)]
    expect = [float(rastrigin(jnp.asarray(c), 10.0)) for c in pts.T]
    np.testing.assert_allclose(full, expect, rtol=1e-13)
    np.testing.assert_allclose(part, expect[:5], rtol=1e-13)
    np.testing.assert_allclose(one, expect[:1], rtol=1e-13)
    assert host.n_f == 14
    assert host.fun_batch(np.empty((3, 0))).shape == (0,)


def test_a_run_ends_successfully_on_rastrigin_10d():
    problem = _problem(10)
    sol = solve(problem, ScipyGlobal("differential_evolution", rng=1, vectorized=True))
    assert sol.retcode == ReturnCode.SUCCESS
    assert sol.original.nfev < sol.stats.f_evals / 50


def test_vectorized_must_be_a_flag():
    with pytest.raises(
        TypeError,
        match=r"`vectorized` must be True or False, got "
        r"vectorized='yes'",
    ):
        ScipyGlobal("differential_evolution", vectorized="yes")
