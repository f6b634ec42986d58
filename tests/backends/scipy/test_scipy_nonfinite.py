"""Non-finite values used on purpose (issue 36, item 6): ``inf`` outside a feasible region is
a common scipy idiom for Nelder-Mead, differential evolution and COBYQA, and a NaN gradient
at one kink (Ackley at 0) must not turn differential evolution's correct global minimum into
a FAILURE. ``solve(nonfinite="reject")``, the default of the methods that compare values
(trait ``rejects_nonfinite``), hands the method +inf at such a point and counts it in the
message; ``nonfinite="fail"`` keeps the FAILURE. References: scipy run by hand on the same
objective (counts and points compared exactly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import optsolve
from optsolve import OptimizationProblem, ReturnCode, ScipyGlobal, ScipyMinimize, solve

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def outside_inf(x, p):
    """A quadratic defined on the half-plane x0 + x1 <= 1, inf beyond (scipy's idiom)."""
    q = jnp.sum((x - jnp.array([1.0, 2.0])) ** 2) + 0.1 * jnp.sum(x**2)
    return jnp.where(x[0] + x[1] > 1.0, p, q)


_F = jax.jit(outside_inf)
X0 = np.zeros(2)
BOX = [(-3.0, 3.0)] * 2


def _f(bad):
    return lambda x: float(_F(x, bad))


def _problem(bad=jnp.inf, bounds=None):
    return OptimizationProblem(outside_inf, jnp.asarray(X0), jnp.asarray(bad), bounds=bounds)


@pytest.mark.parametrize("method", ["Nelder-Mead", "COBYQA"])
def test_inf_outside_the_region_is_scipys_run_by_default(method):
    ref = so.minimize(_f(np.inf), X0, method=method)
    assert ref.success
    sol = solve(_problem(), ScipyMinimize(method))
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)
    assert "f was not finite at " in sol.message and "rejected" in sol.message
    # a NaN region is the same run: the method sees +inf there
    nan = solve(_problem(jnp.nan), ScipyMinimize(method))
    np.testing.assert_array_equal(np.asarray(nan.x), ref.x)
    assert nan.retcode == ReturnCode.SUCCESS


@pytest.mark.parametrize("method", ["Nelder-Mead", "COBYQA"])
def test_fail_policy_keeps_the_failure(method):
    sol = solve(_problem(), ScipyMinimize(method), nonfinite="fail")
    assert sol.retcode == ReturnCode.FAILURE
    assert "f was not finite at " in sol.message and "rejected" not in sol.message


def test_differential_evolution_passes_over_inf_and_nan_regions():
    ref = so.differential_evolution(_f(np.inf), BOX, rng=0, x0=X0, polish=False)
    for bad in (jnp.inf, jnp.nan):  # scipy itself fails on the NaN region (a NaN best)
        sol = solve(
            _problem(bad, bounds=(-3.0, 3.0)),
            ScipyGlobal("differential_evolution", rng=0, polish=False),
        )
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev)
        np.testing.assert_array_equal(np.asarray(sol.x), ref.x)
        assert "rejected" in sol.message


def ackley(x, p):
    """Ackley's function as usually written: its gradient is NaN at 0 (sqrt at 0)."""
    r = jnp.sqrt(jnp.mean(x**2))
    return -20.0 * jnp.exp(-0.2 * r) - jnp.exp(jnp.mean(jnp.cos(2 * jnp.pi * x))) + 20.0 + jnp.e


def test_a_nan_gradient_at_a_kink_does_not_fail_differential_evolution():
    assert np.isnan(jax.grad(ackley)(jnp.zeros(2), None)).all()
    prob = OptimizationProblem(ackley, jnp.full(2, 2.3), bounds=(-32.768, 32.768))
    sol = solve(prob, ScipyGlobal("differential_evolution", rng=0))
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(np.asarray(sol.x), 0.0, atol=1e-6)
    failing = solve(prob, ScipyGlobal("differential_evolution", rng=0), nonfinite="fail")
    assert failing.retcode == ReturnCode.FAILURE
    assert "the gradient was not finite at" in failing.message


def test_success_is_never_reported_at_a_nonfinite_point():
    # x0 itself lies in the inf region, and so does every point Nelder-Mead tries first
    prob = OptimizationProblem(
        lambda x, p: jnp.where(jnp.sum(x) > -10.0, jnp.inf, 0.0), jnp.ones(2)
    )
    sol = solve(prob, ScipyMinimize("Nelder-Mead"), nonfinite="reject")
    assert sol.retcode == ReturnCode.FAILURE
    assert np.all(np.isfinite(np.asarray(sol.x)))


@pytest.mark.parametrize("algorithm", [ScipyMinimize("BFGS"), optsolve.LBFGS()])
def test_reject_is_refused_where_the_method_cannot_pass_over_a_point(algorithm):
    with pytest.raises(
        ValueError,
        match=r"nonfinite='reject' passes over points where f is "
        r"not finite, which .* cannot.*Nelder-Mead",
    ):
        solve(_problem(), algorithm, maxiters=5, nonfinite="reject")


def test_nonfinite_must_be_one_of_the_policies():
    with pytest.raises(
        ValueError,
        match=r"`nonfinite` must be None \(the method's default\), "
        r"'reject' .*, 'fail' or 'skip' \(on data\), got 'drop'",
    ):
        solve(_problem(), ScipyMinimize("Nelder-Mead"), nonfinite="drop")


def test_the_defaults_are_the_capability_table():
    """'reject' by default exactly where the trait says the method can."""
    for cls in optsolve.solve_api.registry.algorithm_classes():
        traits = cls.traits()
        if traits.get("rejects_nonfinite"):
            spec = cls.spec
            assert not spec.needs_gradient or issubclass(cls, ScipyGlobal), cls.__name__
    assert ScipyGlobal("basinhopping").capabilities()["rejects_nonfinite"]
    assert not ScipyMinimize("L-BFGS-B").capabilities()["rejects_nonfinite"]
