"""scipy's own counts and budgets, exactly (issue 36, item 2): ``maxiters`` is scipy's
``maxiter`` as scipy counts iterations, ``stats.iterations`` is scipy's ``nit``, and a callback
that stops at iteration N gives the run of ``maxiter=N`` (scipy's own
``test_callback_stopiteration``). References: scipy run by hand on the same objective and
gradient (jitted JAX), compared exactly (counts) and to the last bit (points).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

from optsolve import OptimizationProblem, ReturnCode, ScipyGlobal, ScipyMinimize, solve

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def rosen(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


X0 = np.array([1.1] * 5)  # scipy's test_callback_stopiteration start
PROBLEM = OptimizationProblem(rosen, jnp.asarray(X0))
_F = jax.jit(lambda x: rosen(x, None))


def _by_hand(method, **options):
    return so.minimize(lambda x: float(_F(x)), X0, method=method, options=options)


# ------------------------------------------------------------------------- Nelder-Mead

def test_nelder_mead_reports_scipys_nit():
    ref = _by_hand("Nelder-Mead")
    sol = solve(PROBLEM, ScipyMinimize("Nelder-Mead"))
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)


@pytest.mark.parametrize("maxiter", [1, 2, 6])
def test_nelder_mead_maxiters_is_scipys_maxiter(maxiter):
    ref = _by_hand("Nelder-Mead", maxiter=maxiter)
    sol = solve(PROBLEM, ScipyMinimize("Nelder-Mead"), maxiters=maxiter)
    assert sol.retcode == ReturnCode.MAXITERS, sol.message
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev) == (
        maxiter, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)


def test_nelder_mead_callback_stop_at_n_is_maxiter_n():
    """scipy's test_callback_stopiteration: StopIteration at the 5th call is maxiter=6
    ("nelder-mead counts differently": its first iteration builds the simplex, before any
    callback). optsolve's callback sees scipy's iteration numbers, 2 first."""
    calls = []

    def stop(intermediate_result):
        calls.append(1)
        if len(calls) == 5:
            raise StopIteration

    ref = so.minimize(lambda x: float(_F(x)), X0, method="Nelder-Mead", callback=stop)
    assert ref.nit == 6
    seen = []
    sol = solve(PROBLEM, ScipyMinimize("Nelder-Mead"),
                callback=lambda k, x, f: seen.append(k) or k == 6)
    assert seen == [2, 3, 4, 5, 6]
    assert sol.retcode == ReturnCode.TERMINATED
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)
    budget = solve(PROBLEM, ScipyMinimize("Nelder-Mead"), maxiters=6)
    assert (budget.stats.iterations, budget.stats.f_evals) == (6, ref.nfev)
    np.testing.assert_array_equal(np.asarray(budget.x), np.asarray(sol.x))


def test_nelder_mead_history_has_an_entry_per_scipy_iteration():
    """Iteration 1 is the initial simplex: its entry is its best vertex (scipy's sim[0])."""
    ref = _by_hand("Nelder-Mead", maxiter=1)
    sol = solve(PROBLEM, ScipyMinimize("Nelder-Mead"), maxiters=4, history=True)
    objective = np.asarray(sol.history.objective)
    assert sol.stats.iterations == 4 and objective.shape == (5,)
    assert objective[0] == float(_F(X0))
    assert objective[1] == ref.fun
    assert objective[4] == float(sol.objective)


# --------------------------------------------------------------------- dual_annealing

def test_dual_annealing_at_its_iteration_budget_does_not_claim_a_tolerance():
    prob = OptimizationProblem(rosen, jnp.zeros(2), bounds=(-2.0, 2.0))
    sol = solve(prob, ScipyGlobal("dual_annealing", rng=0), maxiters=3)
    assert sol.retcode == ReturnCode.MAXITERS
    assert "Maximum number of iteration reached" in sol.message
    assert "a stopping tolerance" not in sol.message
