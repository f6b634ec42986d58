"""Return codes of the scipy backend: the per-method tables, and runs that produce each code.

The expected meanings below are written out from scipy 1.17's sources (status constants
and messages of each solver), independently of the table in scipy_retcodes.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

from optsolve import Constraint, OptimizationProblem, ReturnCode, ScipyMinimize, solve
from optsolve.backends.scipy.options import MINIMIZE_SPECS
from optsolve.backends.scipy.retcodes import METHOD_TABLES, global_retcode, minimize_retcode

pytestmark = pytest.mark.usefixtures("one_blas_thread")


S, MI, F, T, INF, ST = (
    ReturnCode.SUCCESS,
    ReturnCode.MAXITERS,
    ReturnCode.FAILURE,
    ReturnCode.TERMINATED,
    ReturnCode.INFEASIBLE,
    ReturnCode.STALLED,
)
LINE_SEARCH = {0: S, 1: MI, 2: F, 3: F}  # success, maxiter, precision loss, NaN
TRUST_REGION = {0: S, 1: MI, 2: ST, 3: F}  # success, maxiter, bad approximation, linalg
EXPECTED = {
    "nelder-mead": {0: S, 1: MI, 2: MI},  # success, maxfev, maxiter
    "powell": {0: S, 1: MI, 2: MI, 3: F, 4: INF},  # ..., NaN, out of bounds
    "cg": LINE_SEARCH,
    "bfgs": LINE_SEARCH,
    "newton-cg": {0: S, 1: MI, 2: F, 3: F},  # ..., line search, CG did not converge / NaN
    "l-bfgs-b": {0: S, 1: MI, 2: F},  # CONVERGENCE, maxfun/maxiter, ABNORMAL
    "tnc": {-1: INF, 0: S, 1: S, 2: S, 3: MI, 4: F, 5: S, 6: ST, 7: T},
    "cobyla": {0: S, 1: S, 2: F, 3: MI, 20: MI, -1: F, -2: F, -3: F, 6: INF, 7: ST, 8: F, 30: T},
    "cobyqa": {0: S, 1: S, 2: S, 3: T, 4: S, 5: MI, 6: MI, -1: INF, -2: F},
    "slsqp": {0: S, 2: INF, 3: F, 4: INF, 5: F, 6: F, 7: F, 8: F, 9: MI},
    "trust-constr": {0: MI, 1: S, 2: S, 3: T, 4: INF},
    "dogleg": TRUST_REGION,
    "trust-ncg": TRUST_REGION,
    "trust-exact": TRUST_REGION,
    "trust-krylov": TRUST_REGION,
}


def test_every_minimize_method_has_a_table():
    assert set(METHOD_TABLES) - {"direct"} == set(MINIMIZE_SPECS)


@pytest.mark.parametrize(
    "method, status, code", [(m, s, c) for m, table in EXPECTED.items() for s, c in table.items()]
)
def test_table_entry(method, status, code):
    assert minimize_retcode(method, status) is code


@pytest.mark.parametrize("method", sorted(EXPECTED))
def test_unknown_status_is_failure(method):
    assert minimize_retcode(method, 12345) is F


def test_cobyla_success_status_with_violated_constraints_is_infeasible():
    assert minimize_retcode("cobyla", 0, success=False) is INF
    assert minimize_retcode("cobyla", 0, success=True) is S


@pytest.mark.parametrize("status, code", [(1, MI), (2, MI), (3, S), (4, S), (5, S), (-2, F)])
def test_direct_table(status, code):
    assert global_retcode("direct", so.OptimizeResult(status=status)) is code


@pytest.mark.parametrize(
    "method, result, code",
    [
        (
            "differential_evolution",
            dict(success=True, message="Optimization terminated successfully."),
            S,
        ),
        (
            "differential_evolution",
            dict(success=False, message="Maximum number of iterations has been exceeded."),
            MI,
        ),
        (
            "differential_evolution",
            dict(
                success=False, message="The solution does not satisfy the constraints, MAXCV = 0.1"
            ),
            INF,
        ),
        # no convergence test: the end of its iteration budget is MAXITERS (issue 36.2)
        ("dual_annealing", dict(success=True, message=["Maximum number of iteration reached"]), MI),
        (
            "dual_annealing",
            dict(
                success=False, message=["Maximum number of function call reached during annealing"]
            ),
            MI,
        ),
        ("shgo", dict(success=True, message="Optimization terminated successfully."), S),
        ("shgo", dict(success=False, message="Failed to find a feasible minimizer point."), F),
        (
            "basinhopping",
            dict(
                success=True,
                message=["requested number of basinhopping iterations completed successfully"],
            ),
            S,
        ),
        ("basinhopping", dict(success=False, message=["..."]), F),
    ],
)
def test_global_table(method, result, code):
    assert global_retcode(method, so.OptimizeResult(**result)) is code


# ------------------------------------------------------------------ runs producing each code


def rosen(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


ROSEN = OptimizationProblem(rosen, jnp.array([-1.2, 1.0, -1.2, 1.0]))
ALL = [s.name for s in MINIMIZE_SPECS.values()]


@pytest.mark.parametrize("method", ALL)
def test_maxiters(method):
    sol = solve(ROSEN, ScipyMinimize(method), maxiters=2)
    assert sol.retcode == ReturnCode.MAXITERS, sol.original.message
    assert np.isfinite(float(sol.objective))


def _nan_away_from_start(x, p):
    # Finite only at the start: every trial point is NaN.
    return jnp.where(jnp.all(x == 0.0), jnp.sum((x - 1.0) ** 2), jnp.nan)


@pytest.mark.parametrize(
    "method",
    [
        "Nelder-Mead",
        "Powell",
        "CG",
        "BFGS",
        "L-BFGS-B",
        "TNC",
        "SLSQP",
        "trust-constr",
        "trust-exact",
        "trust-ncg",
        "Newton-CG",
    ],
)
def test_nan_objective_is_failure_with_the_last_finite_iterate(method):
    # nonfinite="fail" (Nelder-Mead and Powell pass over such points by default)
    sol = solve(
        OptimizationProblem(_nan_away_from_start, jnp.zeros(2)),
        ScipyMinimize(method),
        nonfinite="fail",
    )
    assert sol.retcode == ReturnCode.FAILURE, sol.original.message
    np.testing.assert_array_equal(np.asarray(sol.x), [0.0, 0.0])
    assert float(sol.objective) == 2.0


def test_nan_midway_keeps_the_last_finite_iterate():
    # NaN beyond x = 0.5: BFGS's first step lands there and the line search cannot recover.
    f = lambda x, p: jnp.where(x[0] > 0.5, jnp.nan, (x[0] - 3.0) ** 2 + x[1] ** 2)
    sol = solve(OptimizationProblem(f, jnp.zeros(2)), ScipyMinimize("Nelder-Mead"))
    assert np.all(np.isfinite(np.asarray(sol.x))) and np.isfinite(float(sol.objective))
    assert float(sol.x[0]) <= 0.5


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr", "COBYLA", "COBYQA"])
def test_incompatible_constraints_are_infeasible(method):
    # x >= 1 and x <= -1 at once.
    prob = OptimizationProblem(
        lambda x, p: jnp.sum(x**2),
        jnp.zeros(2),
        constraints=[
            Constraint(lambda x, p: x[0], lower=1.0),
            Constraint(lambda x, p: x[0], upper=-1.0),
        ],
    )
    sol = solve(prob, ScipyMinimize(method), maxiters=200)
    assert sol.retcode == ReturnCode.INFEASIBLE, sol.original.message


def _on_the_sphere(lower, upper):
    """min |x - (1, 1, 2)|^2 subject to lower <= (|x|^2, x0 - x1, x0 + x1 + x2) <= upper,
    one vector constraint."""
    g = lambda x, p: jnp.stack([jnp.sum(x**2), x[0] - x[1], x[0] + x[1] + x[2]])
    return g, OptimizationProblem(
        lambda x, p: jnp.sum((x - p) ** 2),
        jnp.zeros(3),
        p=jnp.array([1.0, 1.0, 2.0]),
        constraints=[Constraint(g, lower=jnp.array(lower), upper=jnp.array(upper))],
    )


def test_cobyla_is_judged_by_optsolves_feasibility_tolerance():
    """On the unit sphere with x0 <= x1 and x0 + x1 + x2 <= 1.5: all three constraints
    are active at the solution, x0 = x1 = a, x2 = 1.5 - 2a with
    2a^2 + (1.5 - 2a)^2 = 1: a = (6 - sqrt(6)) / 12. COBYLA ends 1.7e-8 off the sphere (its
    linear models resolve a curved constraint to ~rho^2 at the final radius 1e-4), above
    catol's default sqrt(eps), so scipy's flag is False; optsolve's verdict is the one it
    gives every method: within FEASIBILITY_TOL is SUCCESS."""
    from optsolve.backends.scipy.run import FEASIBILITY_TOL

    g, prob = _on_the_sphere([1.0, -np.inf, -np.inf], [1.0, 0.0, 1.5])
    sol = solve(prob, ScipyMinimize("COBYLA"))
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert not sol.original.success and sol.original.maxcv > np.sqrt(np.finfo(float).eps)
    values = np.asarray(g(sol.x, None))
    violation = max(abs(values[0] - 1.0), values[1], values[2] - 1.5)
    assert violation <= FEASIBILITY_TOL
    assert violation == pytest.approx(sol.original.maxcv, rel=1e-6)
    a = (6.0 - np.sqrt(6.0)) / 12.0
    np.testing.assert_allclose(np.asarray(sol.x), [a, a, 1.5 - 2 * a], atol=1e-4)
    assert "FEASIBILITY_TOL" in sol.message
    # a catol the user gives is the user's test: scipy's verdict by it stands
    tight = solve(prob, ScipyMinimize("COBYLA", catol=1e-10))
    assert tight.retcode == ReturnCode.INFEASIBLE and tight.original.maxcv > 1e-10


def test_cobyla_slightly_infeasible_stays_infeasible():
    # x0 + x1 + x2 is at most sqrt(3) = 1.7320508 on the unit sphere: x0 + x1 + x2 >= 1.7321
    # cannot hold there, by 4.9e-5 (28x FEASIBILITY_TOL relative to 1.7321).
    from optsolve.backends.scipy.run import FEASIBILITY_TOL

    g, prob = _on_the_sphere([1.0, -np.inf, 1.7321], [1.0, np.inf, np.inf])
    sol = solve(prob, ScipyMinimize("COBYLA"))
    assert sol.retcode == ReturnCode.INFEASIBLE, sol.message
    values = np.asarray(g(sol.x, None))
    violation = max(abs(values[0] - 1.0), (1.7321 - values[2]) / 1.7321)
    assert violation > FEASIBILITY_TOL


def test_maxtime_and_callback_codes():
    assert solve(ROSEN, ScipyMinimize("BFGS"), maxtime=1e-9).retcode == ReturnCode.MAXTIME
    assert (
        solve(ROSEN, ScipyMinimize("BFGS"), callback=lambda k, x, f: True).retcode
        == ReturnCode.TERMINATED
    )


def test_every_result_has_every_field():
    # scipy's own rule (test_optimize.py): every method returns x, fun, nfev, status, message.
    for method in ALL:
        sol = solve(ROSEN, ScipyMinimize(method), maxiters=3)
        for field in ("x", "fun", "nfev", "status", "message"):
            assert field in sol.original, (method, field)
        assert sol.stats.iterations is not None and sol.stats.f_evals is not None
        assert (sol.stats.grad_evals is None) == (not MINIMIZE_SPECS[method.lower()].needs_gradient)


def test_keyboard_interrupt_returns_the_last_iterate():
    seen = []

    def callback(k, x, f):
        seen.append(np.array(x))
        if k == 4:
            raise KeyboardInterrupt

    sol = solve(ROSEN, ScipyMinimize("L-BFGS-B"), callback=callback)
    assert sol.retcode == ReturnCode.INTERRUPTED
    np.testing.assert_array_equal(np.asarray(sol.x), seen[-1])


@pytest.mark.parametrize(
    "method", [s.name for s in MINIMIZE_SPECS.values() if s.callback == "intermediate"]
)
def test_a_stop_by_optsolve_names_the_test_not_scipys_stopiteration(method):
    """Where optsolve's monitor stops scipy through StopIteration, scipy's message says only
    "`callback` raised `StopIteration`"; sol.message names the test that stopped it (here
    the user's callback; COBYLA and COBYQA say so in their own words)."""
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - 1.0) ** 2 * jnp.arange(1.0, 4.0)), jnp.zeros(3)
    )
    sol = solve(prob, ScipyMinimize(method), callback=lambda i, x, f: i >= 1, maxiters=50)
    assert sol.retcode == ReturnCode.TERMINATED, sol.message
    backend = sol.message.split("backend: ", 1)[1]
    assert "StopIteration" not in backend and "callback" in backend
