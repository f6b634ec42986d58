"""The shared rules of every algorithm (issue #14) on every scipy method: history, resume,
progress, the callback's stop, non-finite values, what SUCCESS means, the backend's own
message, and the traits basinhopping takes from its local method.

References are scipy.optimize called by hand (same derivatives, same options) and closed
forms: the quartic below has its minimum at x = A, the Rosenbrock function at x = 1.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

from optsolve import OptimizationProblem, ReturnCode, ScipyGlobal, ScipyMinimize, solve
from optsolve.backends.scipy.options import MINIMIZE_SPECS
from problems import PROBLEMS

pytestmark = pytest.mark.usefixtures("one_blas_thread")

ALL_METHODS = [s.name for s in MINIMIZE_SPECS.values()]
DERIVATIVE_FREE = {"Nelder-Mead", "Powell", "COBYLA", "COBYQA"}
# The global methods whose callback runs once per iteration they count.
GLOBAL_PER_ITERATION = {
    "differential_evolution": {"rng": 0},
    "direct": {},
    "basinhopping": {"rng": 0},
}


def rosen(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


ROSEN = OptimizationProblem(rosen, jnp.array([-1.2, 1.0, -1.2]))
BOXED_ROSEN = ROSEN.replace(bounds=(-2.0, 2.0))

# f = sum c u^2 / 2 + u^4 / 4, u = x - A, written as the same float operations in JAX and
# numpy (u * u for u ** 2) so that scipy by hand takes the same steps.
C = np.array([1.0, 2.0, 3.0])
A = np.array([1.0, 2.0, -1.0])


def quartic(x, p):
    u = x - A
    return jnp.sum(0.5 * C * u**2 + 0.25 * u**4)


def quartic_by_hand(x):
    u = x - A
    return np.sum(0.5 * C * (u * u) + 0.25 * ((u * u) * (u * u))), C * u + u * u * u


QUARTIC = OptimizationProblem(quartic, jnp.zeros(3))


def grad_inf_norm(problem, x):
    """The projected gradient's inf-norm at x (the measure solve's gtol means)."""
    g = np.asarray(jax.grad(problem.f)(x, problem.p))
    x = np.asarray(x)
    if problem.bounds is not None:
        lo, up = (np.broadcast_to(np.asarray(b, float), x.shape) for b in problem.bounds)
        g = x - np.clip(x - g, lo, up)
    return float(np.max(np.abs(g)))


# ---------------------------------------------------------------------------- history


@pytest.mark.parametrize("method", ALL_METHODS)
def test_history_records_x0_then_every_iteration(method):
    if not MINIMIZE_SPECS[method.lower()].callback_per_iteration:
        # COBYQA's callback runs per evaluation; its iterations are not visible to it
        with pytest.raises(ValueError, match="does not record a history"):
            solve(ROSEN, ScipyMinimize(method), maxiters=6, history=True)
        return
    problem = BOXED_ROSEN if MINIMIZE_SPECS[method.lower()].takes_bounds else ROSEN
    sol = solve(problem, ScipyMinimize(method), maxiters=6, history=True)
    objective, grad_norm = np.asarray(sol.history.objective), np.asarray(sol.history.grad_norm)
    assert objective.dtype == grad_norm.dtype == np.float64
    assert objective.shape == grad_norm.shape == (sol.stats.iterations + 1,)
    assert objective[0] == float(rosen(problem.x0, None))
    assert objective[-1] == float(sol.objective)
    if method in DERIVATIVE_FREE:
        assert np.all(np.isnan(grad_norm))
    else:
        np.testing.assert_allclose(grad_norm[0], grad_inf_norm(problem, problem.x0), rtol=1e-12)
        np.testing.assert_allclose(grad_norm[-1], grad_inf_norm(problem, sol.x), rtol=1e-12)


@pytest.mark.parametrize("method", sorted(GLOBAL_PER_ITERATION))
def test_global_history_has_one_entry_per_iteration(method):
    sol = solve(
        BOXED_ROSEN, ScipyGlobal(method, **GLOBAL_PER_ITERATION[method]), maxiters=4, history=True
    )
    assert sol.stats.iterations == 4
    assert np.shape(sol.history.objective) == (5,)
    assert sol.history.objective[0] == float(rosen(BOXED_ROSEN.x0, None))


def test_history_is_refused_where_scipy_shows_no_iterate_per_iteration():
    for method in ("dual_annealing", "shgo"):
        assert not ScipyGlobal(method).capabilities()["records_history"]
    assert ScipyGlobal("direct").capabilities()["records_history"]


def test_history_under_jit_needs_an_eager_solve():
    run = jax.jit(
        lambda p: solve(ROSEN.replace(p=p), ScipyMinimize("BFGS"), maxiters=3, history=True)
    )
    with pytest.raises(
        ValueError,
        match=r"history=True with ScipyMinimize\(method='BFGS'\) "
        r"needs an eager solve",
    ):
        run(1.0)


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "method, hand_maxiter",
    [
        ("BFGS", None),
        ("L-BFGS-B", None),
        ("Nelder-Mead", 1000),
    ],
)
def test_resume_warm_starts_from_x_and_adds_the_counts(method, hand_maxiter):
    first = solve(QUARTIC, ScipyMinimize(method), maxiters=3)
    options = {} if hand_maxiter is None else {"maxiters": hand_maxiter}
    second = solve(QUARTIC, ScipyMinimize(method), resume=first, **options)
    derivative_free = method == "Nelder-Mead"
    fun = (lambda x: quartic_by_hand(x)[0]) if derivative_free else quartic_by_hand
    hand_options = {} if hand_maxiter is None else {"maxiter": hand_maxiter}
    ref = so.minimize(
        fun, np.asarray(first.x), jac=not derivative_free, method=method, options=hand_options
    )
    np.testing.assert_allclose(np.asarray(second.x), ref.x, rtol=0, atol=1e-12)
    assert second.stats.iterations == first.stats.iterations + ref.nit
    assert second.stats.f_evals == first.stats.f_evals + ref.nfev
    if not derivative_free:
        assert second.stats.grad_evals == first.stats.grad_evals + ref.njev
    assert second.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(np.asarray(second.x), A, atol=1e-4)


# --------------------------------------------------------------------------- progress


class _Bar:
    """Stands in for tqdm: records where the bar was moved."""

    made: ClassVar[list[_Bar]] = []

    def __init__(self, total=None, **_):
        self.total, self.n, self.seen = total, 0, []
        _Bar.made.append(self)

    def update(self, k):
        if k:
            self.n += k
            self.seen.append(self.n)

    def set_postfix(self, *_, **__):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("method", ["BFGS", "Nelder-Mead", "TNC"])
def test_progress_bar_advances_to_the_iteration_count(method, monkeypatch):
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", _Bar)
    _Bar.made.clear()
    sol = solve(QUARTIC, ScipyMinimize(method), maxiters=400, progress=True)
    (bar,) = _Bar.made
    assert bar.n == sol.stats.iterations > 0
    # about every maxiters // 100 = 4 iterations, and once at the end
    assert bar.seen == sorted(
        set(list(range(4, sol.stats.iterations + 1, 4)) + [sol.stats.iterations])
    )


# ---------------------------------------------------------------- callback and errors


@pytest.mark.parametrize("method", ALL_METHODS)
def test_callback_stop_at_k_gives_k_iterations(method):
    sol = solve(ROSEN, ScipyMinimize(method), callback=lambda k, x, f: k == 3)
    assert sol.retcode == ReturnCode.TERMINATED
    if MINIMIZE_SPECS[method.lower()].callback_per_evaluation:
        # COBYQA: the callback counts evaluations; the iterations are scipy's nit
        assert sol.stats.f_evals == 3 and sol.stats.iterations == sol.original.nit
    else:
        assert sol.stats.iterations == 3


@pytest.mark.parametrize("method", sorted(GLOBAL_PER_ITERATION))
def test_global_callback_stop_at_k_gives_k_iterations(method):
    sol = solve(
        BOXED_ROSEN,
        ScipyGlobal(method, **GLOBAL_PER_ITERATION[method]),
        callback=lambda k, x, f: k == 3,
    )
    assert sol.retcode == ReturnCode.TERMINATED and sol.stats.iterations == 3


class _UserError(Exception):
    pass


def _nan_beyond_one(x, p):
    # (x - 3)^2 is smallest at x[0] = 3, but f is NaN beyond x[0] = 1.
    return jnp.where(x[0] > 1.0, jnp.nan, jnp.sum((x - 3.0) ** 2))


@pytest.mark.parametrize("method", ["BFGS", "Nelder-Mead", "TNC", "COBYQA"])
def test_an_exception_in_the_callback_propagates(method):
    def callback(k, x, f):
        if k == 2:
            raise _UserError("from the callback")

    with pytest.raises(_UserError, match="from the callback"):
        solve(ROSEN, ScipyMinimize(method), callback=callback)


def test_a_value_error_in_the_callback_propagates_after_nan_evaluations():
    def callback(k, x, f):
        if k == 10:  # after Nelder-Mead has met the NaN region
            raise ValueError("mine")

    with pytest.raises(ValueError, match="mine"):
        solve(
            OptimizationProblem(_nan_beyond_one, jnp.array([0.95, 0.0])),
            ScipyMinimize("Nelder-Mead"),
            callback=callback,
        )


def test_an_exception_in_f_propagates():
    def f(x, p):
        raise _UserError("from f")

    with pytest.raises(_UserError, match="from f"):
        solve(OptimizationProblem(f, jnp.zeros(2)), ScipyMinimize("BFGS"))


# --------------------------------------------------------------------------- non-finite


@pytest.mark.parametrize("method", ["Nelder-Mead", "SLSQP", "COBYQA", "BFGS", "L-BFGS-B"])
def test_nan_region_edge_is_failure_at_the_last_finite_iterate(method):
    # (Nelder-Mead and COBYQA pass over such points by default:
    # tests/backends/scipy/test_scipy_nonfinite.py)
    problem = OptimizationProblem(_nan_beyond_one, jnp.zeros(2))
    sol = solve(problem, ScipyMinimize(method), nonfinite="fail")
    assert sol.retcode == ReturnCode.FAILURE
    x = np.asarray(sol.x)
    assert np.all(np.isfinite(x)) and x[0] <= 1.0
    assert float(sol.objective) == float(_nan_beyond_one(sol.x, None))
    assert "f was not finite at " in sol.message and " evaluations" in sol.message


def test_nonfinite_hessian_is_failure_not_a_scipy_error():
    # |x|^1.5: f and its gradient are finite everywhere, its Hessian is infinite at 0.
    problem = OptimizationProblem(
        lambda x, p: jnp.sum(jnp.abs(x - 1.0) ** 1.5), jnp.array([1.0, 3.0])
    )
    sol = solve(problem, ScipyMinimize("trust-exact"))
    assert sol.retcode == ReturnCode.FAILURE
    assert np.all(np.isfinite(np.asarray(sol.x)))
    assert "the Hessian was not finite at 1 of " in sol.message


# --------------------------------------------------------------- what SUCCESS means


def rosen_by_hand(x):
    d = x[1:] - x[:-1] * x[:-1]
    f = np.sum(100.0 * d * d + (1 - x[:-1]) * (1 - x[:-1]))
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * d - 2.0 * (1 - x[:-1])
    g[1:] += 200.0 * d
    return f, g


def test_l_bfgs_b_honours_gtol_alone():
    sol = solve(ROSEN, ScipyMinimize("L-BFGS-B"), gtol=1e-8)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert grad_inf_norm(ROSEN, sol.x) <= 1e-8
    # scipy by hand, its ftol test off: the same point to rounding
    ref = so.minimize(
        rosen_by_hand,
        np.asarray(ROSEN.x0),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-8, "ftol": 0.0},
    )
    np.testing.assert_allclose(np.asarray(sol.x), ref.x, atol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.x), np.ones(3), atol=1e-7)


def test_success_on_a_test_of_scipys_own_above_gtol_is_stalled():
    # BFGS's xrtol ends the run long before the gradient reaches gtol.
    sol = solve(ROSEN, ScipyMinimize("BFGS", xrtol=1e-1), gtol=1e-10)
    norm = grad_inf_norm(ROSEN, sol.x)
    assert norm > 1e-10
    assert sol.retcode == ReturnCode.STALLED
    assert f"gradient inf-norm {norm:.3g} > gtol 1e-10" in sol.message
    assert "Optimization terminated successfully" in sol.message  # scipy's reason


def test_detail_is_scipys_message_and_none_under_jit():
    sol = solve(QUARTIC, ScipyMinimize("BFGS"))
    assert sol.detail == sol.original.message
    assert sol.message.endswith("backend: " + sol.original.message)
    assert isinstance(sol.stats.iterations, int) and isinstance(sol.retcode, ReturnCode)
    jitted = jax.jit(lambda p: solve(QUARTIC.replace(p=p), ScipyMinimize("BFGS")))(0.0)
    assert jitted.detail is None


def test_dual_annealing_message_list_is_joined_and_small_maxiters_end():
    prob = OptimizationProblem(quartic, jnp.zeros(3), bounds=(-5.0, 5.0))
    sol = solve(prob, ScipyGlobal("dual_annealing", rng=0), maxiters=1)
    assert sol.stats.iterations == 1
    assert sol.detail.startswith("; ".join(sol.original.message) + "; solve's maxiters=1 ")


@pytest.mark.parametrize(
    "algorithm, problem",
    [
        (ScipyMinimize("TNC", maxfun=5), ROSEN),
        (ScipyGlobal("direct", maxfun=40), BOXED_ROSEN),
    ],
)
def test_an_evaluation_budget_is_named_as_the_limit(algorithm, problem):
    sol = solve(problem, algorithm)
    assert sol.retcode == ReturnCode.MAXITERS
    assert "evaluation budget `maxfun` ended the run, not maxiters" in sol.message


# ------------------------------------------------------------------- method traits


def test_basinhopping_takes_its_traits_from_the_local_method():
    caps = ScipyGlobal("basinhopping", local="BFGS").capabilities()
    assert not caps["takes_bounds"] and not caps["takes_constraints"] and caps["needs_gradient"]
    caps = ScipyGlobal("basinhopping", local="COBYLA").capabilities()
    assert caps["takes_bounds"] and caps["takes_constraints"] and not caps["needs_gradient"]


def test_differential_evolution_workers_is_refused_for_pickling():
    with pytest.raises(
        TypeError,
        match=r"`workers` is not supported: scipy evaluates the "
        r"objective in worker processes.*cannot be pickled",
    ):
        ScipyGlobal("differential_evolution", workers=2)


def test_shgo_keeps_scipys_local_tolerance():
    # MGH 18 (Biggs EXP6) in a box: scipy's own shgo, by hand with the same gradient.
    biggs = next(p for p in PROBLEMS if p.name.startswith("18 "))
    box = (np.full(6, -5.0), np.full(6, 15.0))
    prob = OptimizationProblem(biggs.f, jnp.asarray(biggs.x0_array()), bounds=box)
    sol = solve(prob, ScipyGlobal("shgo", n=32))
    value_and_grad = jax.jit(jax.value_and_grad(biggs.f))
    ref = so.shgo(
        lambda x: float(value_and_grad(x)[0]),
        list(zip(*box)),
        n=32,
        minimizer_kwargs={
            "jac": lambda x: np.asarray(value_and_grad(x)[1]),
            "options": {"ftol": 1e-12},
        },
    )
    assert float(sol.objective) <= ref.fun + 1e-12 * (1 + abs(ref.fun))
