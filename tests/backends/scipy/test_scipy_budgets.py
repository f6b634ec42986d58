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
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev) == (maxiter, ref.nfev)
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
    sol = solve(
        PROBLEM, ScipyMinimize("Nelder-Mead"), callback=lambda k, x, f: seen.append(k) or k == 6
    )
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


# ------------------------------------------------------------------------------ COBYQA
# maxiters is COBYQA's `maxiter` (its trust-region iterations, scipy's nit); its evaluation
# budget `maxfev` is its own option. Its callback runs after each evaluation, so a callback
# stop at the k-th call is the run scipy makes with StopIteration there: nit as scipy counts.


def test_cobyqa_reports_scipys_nit():
    ref = _by_hand("COBYQA")
    sol = solve(PROBLEM, ScipyMinimize("COBYQA"))
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)


@pytest.mark.parametrize("maxiter", [2, 4])
def test_cobyqa_maxiters_is_scipys_maxiter(maxiter):
    ref = _by_hand("COBYQA", maxiter=maxiter)
    sol = solve(PROBLEM, ScipyMinimize("COBYQA"), maxiters=maxiter)
    assert sol.retcode == ReturnCode.MAXITERS, sol.message
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev) == (maxiter, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)
    assert f"solve's maxiters={maxiter}" in sol.message


def test_cobyqa_takes_its_own_evaluation_budget():
    ref = _by_hand("COBYQA", maxfev=30)
    sol = solve(PROBLEM, ScipyMinimize("COBYQA", maxfev=30))
    assert sol.retcode == ReturnCode.MAXITERS, sol.message
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev) == (ref.nit, 30)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)
    assert "evaluation budget `maxfev`" in sol.message


def test_cobyqa_callback_stop_is_scipys_stop_at_that_evaluation():
    calls = []

    def stop(intermediate_result):
        calls.append(1)
        if len(calls) == 15:
            raise StopIteration

    ref = so.minimize(lambda x: float(_F(x)), X0, method="COBYQA", callback=stop)
    seen = []
    sol = solve(
        PROBLEM, ScipyMinimize("COBYQA"), callback=lambda k, x, f: seen.append(k) or k == 15
    )
    assert seen == list(range(1, 16))
    assert sol.retcode == ReturnCode.TERMINATED
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev) == (ref.nit, 15)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)


def test_cobyqa_maxiter_is_refused_in_favour_of_maxiters():
    with pytest.raises(TypeError, match=r"`maxiter` is set through solve's common option"):
        ScipyMinimize("COBYQA", maxiter=4)


# --------------------------------------------------------- global methods' own budgets

BOXED = OptimizationProblem(rosen, jnp.asarray(X0), bounds=(-2.0, 2.0))


def test_differential_evolution_takes_its_own_maxiter():
    ref = so.differential_evolution(
        lambda x: float(_F(x)), [(-2.0, 2.0)] * 5, rng=0, maxiter=3, x0=X0, polish=False
    )
    sol = solve(BOXED, ScipyGlobal("differential_evolution", maxiter=3, rng=0, polish=False))
    assert sol.retcode == ReturnCode.MAXITERS, sol.message
    assert (sol.stats.iterations, sol.stats.f_evals) == (ref.nit, ref.nfev) == (3, ref.nfev)
    np.testing.assert_array_equal(np.asarray(sol.x), ref.x)
    assert (
        "the iteration budget `maxiter=3` of ScipyGlobal('differential_evolution')" in sol.message
    )
    # the same budget through solve: the same run, the message naming solve's maxiters
    common = solve(BOXED, ScipyGlobal("differential_evolution", rng=0, polish=False), maxiters=3)
    np.testing.assert_array_equal(np.asarray(common.x), ref.x)
    assert "solve's maxiters=3" in common.message


@pytest.mark.parametrize(
    "method, option, extra",
    [
        ("basinhopping", "niter", {"rng": 0}),
        ("dual_annealing", "maxiter", {"rng": 0}),
        ("shgo", "iters", {}),
        ("direct", "maxiter", {}),
    ],
)
def test_global_methods_take_their_own_iteration_budgets(method, option, extra):
    prob = BOXED if method != "basinhopping" else PROBLEM
    sol = solve(prob, ScipyGlobal(method, **{option: 5}, **extra))
    assert sol.retcode == ReturnCode.MAXITERS, sol.message
    assert f"`{option}=5` of ScipyGlobal({method!r})" in sol.message
    # (direct's own maxiter counts the two iterations that divide the box before its
    # first callback, as scipy's nit does; stats.iterations does not)
    assert sol.stats.iterations == (3 if method == "direct" else 5)
    # solve's maxiters, smaller, ends the run first and is the one named
    capped = solve(prob, ScipyGlobal(method, **{option: 5}, **extra), maxiters=2)
    assert capped.retcode == ReturnCode.MAXITERS and "solve's maxiters=2" in capped.message
    assert capped.stats.iterations == 2


def test_dual_annealing_default_run_ends_with_its_budget_not_a_tolerance():
    """dual_annealing has no convergence test: a default run ends when its iteration
    budget (scipy's default maxiter=1000) is used up, and says so."""
    prob = OptimizationProblem(rosen, jnp.zeros(2), bounds=(-2.0, 2.0))
    ref = so.dual_annealing(lambda x: float(_F(x)), [(-2.0, 2.0)] * 2, rng=0, x0=np.zeros(2))
    sol = solve(prob, ScipyGlobal("dual_annealing", rng=0))
    assert sol.stats.iterations == ref.nit == 1000
    assert sol.retcode == ReturnCode.MAXITERS
    assert "a stopping tolerance" not in sol.message
    assert "no convergence test" in sol.message
    assert "`maxiter=1000` (scipy's default)" in sol.message


# -------------------------------------------------- the budget options messages name


def test_every_budget_option_a_message_names_is_accepted():
    """The notes that name an evaluation budget ("raise it with ...(maxfev=...)") name an
    option the class takes (COBYLA's message named `maxiter` while the docstring called
    `maxiter` an error)."""
    from optsolve.backends.scipy import retcodes
    from optsolve.backends.scipy.options import GLOBAL_SPECS, MINIMIZE_SPECS

    for table in (retcodes._BUDGET_STATUS, retcodes._BUDGET_MESSAGE):
        for key, (_, option) in table.items():
            if key in MINIMIZE_SPECS:
                ScipyMinimize(key, **{option: 5})
            elif key in GLOBAL_SPECS:
                ScipyGlobal(key, **{option: 5})


def test_scipy_minimize_docstring_says_where_maxiter_is_the_methods_own():
    doc = " ".join(ScipyMinimize.__doc__.split())
    assert "COBYLA's ``maxiter``" in doc
    ScipyMinimize("COBYLA", maxiter=50)  # accepted, as the docstring says
