"""The history's constraint violation (``History.violation``): recorded by the methods that
honour constraints (InteriorPoint on the shared driver, the scipy methods that take
constraints), None for the others. Checked against the measure recomputed by hand at the
recorded iterates: the largest violation of the bounds and constraints, relative to
max(1, |bound|)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from constrained_problems import hs071, hs071_objective
from optsolve import OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)

IP = optsolve.InteriorPoint(tol=1e-8)
X0 = np.array([1.0, 5.0, 5.0, 1.0])


# HS071: 1 <= x <= 5, prod(x) >= 25, sum(x^2) == 40; x0 violates the equality by 12 (0.3
# relative to 40).
HS071 = hs071()


def violation(x) -> float:
    """HS071's relative violation at x, written out."""
    x = np.asarray(x, np.float64)
    worst = max(0.0, np.max(1.0 - x), np.max((x - 5.0) / 5.0))
    worst = max(worst, (25.0 - np.prod(x)) / 25.0)
    return max(worst, abs(np.sum(x**2) - 40.0) / 40.0)


def test_interior_point_records_the_violation_at_every_iterate():
    sol = solve(HS071, IP, maxiters=40, history=True)
    assert sol.retcode == optsolve.ReturnCode.SUCCESS
    h, k = sol.history, int(sol.stats.iterations)
    assert h.violation is not None and h.violation.shape == h.objective.shape
    assert h.violation.dtype == h.objective.dtype
    v = np.asarray(h.violation)
    assert np.all(np.isfinite(v[: k + 1])) and np.all(np.isnan(v[k + 1 :]))
    # the first entry is at the driver's x0 (the user's, where objective[0] is f), not at
    # the interior point's x0 pushed inside the bounds
    np.testing.assert_allclose(v[0], violation(X0), rtol=1e-14)
    np.testing.assert_allclose(v[0], 0.3, rtol=1e-14)
    # the last at sol.x
    np.testing.assert_allclose(v[k], violation(sol.x), rtol=1e-10, atol=1e-15)
    assert v[k] <= 1e-6 < v[0]
    # iterate j of the run is the x of a j-step run (same steps, then stopped)
    for j in (1, 3):
        x_j = solve(HS071, IP, maxiters=j).x
        np.testing.assert_allclose(v[j], violation(x_j), rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(h.objective[j], hs071_objective(x_j, None), rtol=1e-14)


def test_interior_point_violation_under_jit_and_after_resume():
    eager = solve(HS071, IP, maxiters=40, history=True)
    jitted = jax.jit(lambda prob: solve(prob, IP, maxiters=40, history=True))(HS071)
    np.testing.assert_allclose(
        jitted.history.violation, eager.history.violation, rtol=1e-12, atol=1e-15
    )
    # a resumed run's first entry is the violation where the first run ended
    first = solve(HS071, IP, maxiters=3, history=True)
    second = solve(HS071, IP, maxiters=5, history=True, resume=first)
    np.testing.assert_allclose(
        second.history.violation[0], first.history.violation[3], rtol=1e-12, atol=1e-15
    )
    np.testing.assert_allclose(second.history.violation[0], violation(first.x), rtol=1e-10)


@pytest.mark.parametrize(
    "algorithm",
    [optsolve.LBFGS(), optsolve.Adam(0.1), optsolve.BFGS()],
    ids=["LBFGS", "Adam", "BFGS"],
)
def test_methods_without_constraints_record_no_violation(algorithm):
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - 1.0) ** 2), jnp.zeros(3))
    sol = solve(prob, algorithm, maxiters=5, history=True)
    assert sol.history.objective.shape == (6,)
    assert sol.history.violation is None


def test_lbfgs_on_bounds_records_no_violation():
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - 3.0) ** 2), jnp.zeros(3), bounds=(-1.0, 1.0)
    )
    assert solve(prob, optsolve.LBFGS(), maxiters=5, history=True).history.violation is None


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr", "COBYLA"])
def test_scipy_constrained_methods_record_the_violation(method):
    sol = solve(HS071, optsolve.ScipyMinimize(method=method), maxiters=200, history=True)
    v = np.asarray(sol.history.violation)
    assert v.shape == np.shape(sol.history.objective)
    np.testing.assert_allclose(v[0], violation(X0), rtol=1e-14)
    # the last entry is at the returned point
    np.testing.assert_allclose(v[-1], violation(sol.x), rtol=1e-9, atol=1e-15)


def test_scipy_methods_without_constraints_record_no_violation():
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - 3.0) ** 2), jnp.zeros(3), bounds=(-1.0, 1.0)
    )
    sol = solve(prob, optsolve.ScipyMinimize(method="L-BFGS-B"), maxiters=20, history=True)
    assert sol.history.violation is None
