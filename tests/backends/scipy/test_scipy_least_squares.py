"""ScipyLeastSquares: scipy.optimize.least_squares on a LeastSquaresProblem.

The reference is scipy.optimize.least_squares called by hand with the same compiled JAX
residuals and Jacobian (``jax.jit`` of the residual and of its ``jax.jacfwd``): the same
method, loss, f_scale, bounds and tolerances must give the same x (to 1e-10 relative), the
same cost and the same nfev and njev. Derivatives are checked against closed forms (linear
least squares: dx*/dy = pinv(A)) and central finite differences of the solution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import optsolve
from fresh_interpreter import run_without_x64
from optsolve import LeastSquaresProblem, OptimizationProblem, ReturnCode, ScipyLeastSquares, solve

pytestmark = pytest.mark.usefixtures("one_blas_thread")

METHODS = ["trf", "dogbox", "lm"]
ROBUST = ["soft_l1", "huber", "cauchy", "arctan"]

# An exponential decay with an offset, fitted to 20 points (deterministic noise; two gross
# outliers in Y_OUTLIERS for the robust losses). m = 20 > n = 3: the Jacobian is jacfwd's.
T = jnp.linspace(0.0, 3.0, 20)
Y = 2.5 * jnp.exp(-1.3 * T) + 0.5 + 0.02 * jnp.sin(7.0 * T)
Y_OUTLIERS = Y.at[4].add(2.0).at[13].add(-1.5)
X0 = jnp.array([1.0, 0.5, 0.0])


def decay(x, y):
    return x[0] * jnp.exp(-x[1] * T.astype(y.dtype)) + x[2] - y


def rosenbrock(x, p):
    return jnp.stack([p * (x[1] - x[0] ** 2), 1.0 - x[0]])


A = jnp.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])


def linear(x, y):
    return A @ x - y


# The reference run: the same compiled functions, called from numpy.
_R = jax.jit(lambda residual, x, p: residual(x, p), static_argnums=0)
_J = jax.jit(lambda residual, x, p: jax.jacfwd(residual)(x, p), static_argnums=0)


def by_hand(residual, x0, p, method, **kwargs):
    """scipy.optimize.least_squares with the compiled residual and its Jacobian; the
    iterates its callback (trf, dogbox) or its Jacobian calls at new points (lm) saw."""
    seen = []
    jac_points = [np.asarray(x0, np.float64)]

    def jac(x):
        if not np.array_equal(x, jac_points[-1]):
            jac_points.append(np.array(x))
        return np.asarray(_J(residual, x, p))

    callback = (
        None
        if method == "lm"
        else (
            lambda intermediate_result: seen.append(
                (np.array(intermediate_result.x), float(intermediate_result.cost))
            )
        )
    )
    result = so.least_squares(
        lambda x: np.asarray(_R(residual, x, p)),
        np.asarray(x0, float),
        jac=jac,
        method=method,
        callback=callback,
        **kwargs,
    )
    result.iterates = seen if method != "lm" else [(x, None) for x in jac_points[1:]]
    return result


def assert_same_run(sol, ref):
    np.testing.assert_allclose(np.asarray(sol.x), ref.x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(sol.objective), ref.cost, rtol=1e-10, atol=1e-15)
    assert sol.stats.f_evals == ref.nfev and sol.stats.grad_evals == ref.njev
    assert sol.stats.iterations == len(ref.iterates)
    assert sol.original.status == ref.status and sol.original.message == ref.message
    assert sol.retcode == (ReturnCode.SUCCESS if ref.status > 0 else ReturnCode.MAXITERS)
    assert ref.message in sol.message  # scipy's message is kept in full


# ------------------------------------------------------------------ against scipy by hand


@pytest.mark.parametrize("method", METHODS)
def test_each_method_is_scipy_called_by_hand(method):
    sol = solve(LeastSquaresProblem(decay, X0, Y), ScipyLeastSquares(method))
    ref = by_hand(decay, X0, Y, method)
    assert ref.status > 0
    assert_same_run(sol, ref)
    assert isinstance(sol.original, so.OptimizeResult)
    np.testing.assert_array_equal(sol.original.fun, ref.fun)  # scipy's residuals, untouched


@pytest.mark.parametrize("method", ["trf", "dogbox"])
@pytest.mark.parametrize("loss", ROBUST)
def test_each_robust_loss_with_f_scale_is_scipy_by_hand(method, loss):
    seen = []
    sol = solve(
        LeastSquaresProblem(decay, X0, Y_OUTLIERS),
        ScipyLeastSquares(method, loss=loss, f_scale=0.3),
        callback=lambda k, x, f: seen.append(f),
    )
    ref = by_hand(decay, X0, Y_OUTLIERS, method, loss=loss, f_scale=0.3)
    assert_same_run(sol, ref)
    # the callback's objective is scipy's robust cost at each iterate
    np.testing.assert_allclose(seen, [c for _, c in ref.iterates], rtol=1e-12)
    # the outliers pull the plain fit away: the robust loss is really the one minimised
    plain = by_hand(decay, X0, Y_OUTLIERS, method)
    assert np.max(np.abs(plain.x - np.asarray(sol.x))) > 1e-2


@pytest.mark.parametrize("method", ["trf", "dogbox"])
def test_bounds_are_scipy_by_hand(method):
    # the rate's upper bound 1.0 is active at the solution (unbounded, it is about 1.3)
    lower, upper = jnp.array([0.0, 0.0, -1.0]), jnp.array([5.0, 1.0, 1.0])
    sol = solve(LeastSquaresProblem(decay, X0, Y, bounds=(lower, upper)), ScipyLeastSquares(method))
    ref = by_hand(decay, X0, Y, method, bounds=(np.asarray(lower), np.asarray(upper)))
    assert_same_run(sol, ref)
    assert float(sol.x[1]) == pytest.approx(1.0, abs=1e-8)


def tree_residuals(x, p):
    """Residuals of a pytree x ({"amp", "rate_and_offset"}), returned as a pytree."""
    flat = jnp.concatenate([x["amp"][None], x["rate_and_offset"]])
    r = decay(flat, p)
    return {"head": r[:5], "tail": r[5:].reshape(3, 5)}


def test_a_pytree_x0_and_pytree_residuals():
    x0 = {"amp": jnp.array(1.0), "rate_and_offset": jnp.array([0.5, 0.0])}
    sol = solve(LeastSquaresProblem(tree_residuals, x0, Y), ScipyLeastSquares("trf"))
    # ravel_pytree's order: "amp" then "rate_and_offset"; the residuals' leaves in order
    ref = by_hand(decay, X0, Y, "trf")
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(x0)
    flat = np.concatenate([np.ravel(sol.x["amp"]), np.asarray(sol.x["rate_and_offset"])])
    np.testing.assert_allclose(flat, ref.x, rtol=1e-10)
    assert sol.stats.f_evals == ref.nfev and sol.stats.grad_evals == ref.njev


def underdetermined(x, p):
    return jnp.stack([jnp.sum(x**2) - p, x[0] - 2.0 * x[1]])


def test_fewer_residuals_than_parameters_use_reverse_mode():
    # m = 2 < n = 4: the Jacobian is jax.jacrev's (same values as jacfwd's)
    x0 = jnp.array([1.0, 2.0, 0.5, -1.0])
    sol = solve(LeastSquaresProblem(underdetermined, x0, 1.0), ScipyLeastSquares("trf"))
    ref = by_hand(underdetermined, x0, 1.0, "trf")
    assert_same_run(sol, ref)
    with pytest.raises(
        ValueError,
        match=r"ScipyLeastSquares\(method='lm'\) needs at least as "
        r"many residuals as parameters.*got 2 residuals for 4",
    ):
        solve(LeastSquaresProblem(underdetermined, x0, 1.0), ScipyLeastSquares("lm"))


def test_tolerances_are_scipys_own():
    # solve's ftol, gtol and xtol are scipy's
    prob = LeastSquaresProblem(decay, X0, Y)
    sol = solve(prob, ScipyLeastSquares("trf"), ftol=1e-2, gtol=1e-3, xtol=1e-3)
    ref = by_hand(decay, X0, Y, "trf", xtol=1e-3, ftol=1e-2, gtol=1e-3)
    assert_same_run(sol, ref)
    # lm refuses tolerances below machine epsilon: gtol=0 (no gradient test) runs at it
    eps = np.finfo(float).eps
    sol = solve(
        LeastSquaresProblem(rosenbrock, jnp.array([-1.2, 1.0]), 10.0),
        ScipyLeastSquares("lm"),
        gtol=0.0,
        xtol=0.0,
    )
    assert_same_run(
        sol, by_hand(rosenbrock, jnp.array([-1.2, 1.0]), 10.0, "lm", gtol=eps, xtol=eps)
    )


# ------------------------------------------------------------------------- float32


def test_float32_in_float32_out_evaluated_in_float64():
    prob = LeastSquaresProblem(decay, X0.astype(jnp.float32), Y.astype(jnp.float32))
    sol = solve(prob, ScipyLeastSquares("trf"))
    assert sol.x.dtype == np.float32 and sol.objective.dtype == np.float32
    # JAX's x64 mode is on: scipy's float64 run on the float32 data, returned as float32
    ref = by_hand(decay, X0, Y.astype(jnp.float32).astype(jnp.float64), "trf")
    np.testing.assert_array_equal(sol.x, ref.x.astype(np.float32))
    assert sol.stats.f_evals == ref.nfev


def test_float32_evaluation_warns_once_naming_x64():
    # JAX's x64 mode is process-wide and on in this suite: a fresh interpreter without it
    script = (
        "import warnings, jax.numpy as jnp, optsolve\n"
        "t = jnp.linspace(0.0, 3.0, 20)\n"
        "prob = optsolve.LeastSquaresProblem(lambda x, y: x[0] * jnp.exp(-x[1] * t) - y,\n"
        "                                    jnp.array([1.0, 0.5]), 2.0 * jnp.exp(-1.3 * t))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    sols = [optsolve.solve(prob, optsolve.ScipyLeastSquares(m)) for m in ('trf', 'lm')]\n"
        "print(sum('jax_enable_x64' in str(w.message) for w in caught),\n"
        "      *[s.retcode.name for s in sols], sols[0].x.dtype, *sols[0].x.tolist())\n"
    )
    count, trf, lm, dtype, amp, rate = run_without_x64(script).split()
    assert (count, trf, lm, dtype) == ("1", "SUCCESS", "SUCCESS", "float32")
    np.testing.assert_allclose([float(amp), float(rate)], [2.0, 1.3], rtol=1e-4)


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "make, error, pattern",
    [
        (
            lambda: ScipyLeastSquares("levenberg"),
            ValueError,
            r"ScipyLeastSquares: `method` must be one of 'trf', 'dogbox', 'lm'; got 'levenberg'\.",
        ),
        (
            lambda: ScipyLeastSquares("BFGS"),
            ValueError,
            r"got 'BFGS'\. 'BFGS' is a method of ScipyMinimize, for a scalar objective",
        ),
        (
            lambda: ScipyLeastSquares("trf", loss="l1"),
            ValueError,
            r"ScipyLeastSquares\(method='trf'\): `loss` must be one of 'linear', 'soft_l1', "
            r"'huber', 'cauchy', 'arctan'; got loss='l1'\.",
        ),
        (lambda: ScipyLeastSquares("trf", loss=lambda z: z), ValueError, r"`loss` must be one of"),
        (
            lambda: ScipyLeastSquares("lm", loss="huber"),
            ValueError,
            r"ScipyLeastSquares\(method='lm'\): .* `loss` must be 'linear'; got loss='huber'\. Use "
            r"method='trf' or 'dogbox'",
        ),
        (
            lambda: ScipyLeastSquares("trf", loss="huber", f_scale=0.0),
            ValueError,
            r"`f_scale` must be a positive finite number; got f_scale=0\.0",
        ),
        (
            lambda: ScipyLeastSquares("trf", ftol=1e-3),
            TypeError,
            r"`ftol` is set through solve's common option: solve\(\.\.\., ftol=0\.001\)",
        ),
        (
            lambda: ScipyLeastSquares("dogbox", gtol=1e-3),
            TypeError,
            r"`gtol` is set through solve's common option: solve\(\.\.\., gtol=0\.001\)",
        ),
        (
            lambda: ScipyLeastSquares("trf", diff_step=1e-6),
            TypeError,
            r"`diff_step` only tunes scipy's finite differences, which optsolve never uses",
        ),
        (
            lambda: ScipyLeastSquares("trf", jac_sparsity=np.ones((20, 3))),
            TypeError,
            r"`jac_sparsity` only tunes scipy's finite differences",
        ),
        (
            lambda: ScipyLeastSquares("trf", kwargs={"a": 1}),
            TypeError,
            r"`kwargs` is not an option here: p is the problem's p",
        ),
        (
            lambda: ScipyLeastSquares("trf", jac="3-point"),
            TypeError,
            r"`jac` is not an option here: derivatives come from JAX",
        ),
        (
            lambda: ScipyLeastSquares("trf", max_nfeval=10),
            TypeError,
            r"ScipyLeastSquares\(method='trf'\) does not take the option `max_nfeval` \(got "
            r"max_nfeval=10\)\. Valid options: x_scale, loss, f_scale, tr_solver, tr_options, "
            r"max_nfev, verbose;",
        ),
        (
            lambda: ScipyLeastSquares("trf", maxiter=10),
            TypeError,
            r"`maxiter` is set through solve's common option: solve\(\.\.\., maxiters=10\)",
        ),
        (
            lambda: ScipyLeastSquares("lm", tr_solver="lsmr"),
            TypeError,
            r"`tr_solver` is not an option here: it only applies to the trust-region methods",
        ),
        (
            lambda: ScipyLeastSquares("trf", xtol=1e-10),
            TypeError,
            r"`xtol` is set through solve's common option: solve\(\.\.\., xtol=1e-10\)",
        ),
    ],
)
def test_construction_errors(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


def test_lm_refuses_bounds_with_the_central_error():
    prob = LeastSquaresProblem(decay, X0, Y, bounds=(0.0, 5.0))
    with pytest.raises(
        ValueError,
        match=r"ScipyLeastSquares\(method='lm'\) does not support "
        r"bounds\..*ScipyLeastSquares\(method='trf'\), "
        r"ScipyLeastSquares\(method='dogbox'\)",
    ):
        solve(prob, ScipyLeastSquares("lm"))


def test_a_scalar_problem_gets_the_central_error():
    prob = OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.ones(2))
    with pytest.raises(
        TypeError,
        match=r"ScipyLeastSquares\(method='trf'\) works on "
        r"residuals; declare the problem as "
        r"optsolve.LeastSquaresProblem",
    ):
        solve(prob, ScipyLeastSquares())


def test_errors_scipy_would_raise_mid_run_come_first():
    fixed = (jnp.array([0.0, 1.0, -1.0]), jnp.array([5.0, 1.0, 1.0]))  # x[1] held at 1
    with pytest.raises(ValueError, match=r"needs lower < upper on every variable.*flat index 1"):
        solve(
            LeastSquaresProblem(decay, X0.at[1].set(1.0), Y, bounds=fixed), ScipyLeastSquares("trf")
        )
    with pytest.raises(ValueError, match=r"needs one of ftol, xtol, gtol >= machine epsilon"):
        solve(
            LeastSquaresProblem(decay, X0, Y),
            ScipyLeastSquares("trf"),
            gtol=0.0,
            ftol=0.0,
            xtol=0.0,
        )
    with pytest.raises(ValueError, match=r"solve: `xtol` must be >= 0, got -1.0"):
        solve(LeastSquaresProblem(decay, X0, Y), ScipyLeastSquares("trf"), xtol=-1.0)


def test_algorithm_is_an_immutable_value():
    alg = ScipyLeastSquares("trf", loss="huber", f_scale=0.5, max_nfev=50)
    assert repr(alg) == "ScipyLeastSquares(method='trf', f_scale=0.5, loss='huber', max_nfev=50)"
    assert alg == ScipyLeastSquares("TRF", loss="huber", f_scale=0.5, max_nfev=50)
    assert ScipyLeastSquares() == ScipyLeastSquares("trf", loss="linear", f_scale=1.0)
    assert isinstance(alg, ScipyLeastSquares) and optsolve.ScipyLeastSquares is ScipyLeastSquares
    changed = alg.replace(loss="cauchy")
    assert changed.loss == "cauchy" and changed.f_scale == 0.5 and alg.loss == "huber"
    assert alg.capabilities()["needs_residuals"] and alg.capabilities()["takes_bounds"]
    assert not ScipyLeastSquares("lm").capabilities()["takes_bounds"]


# ------------------------------------------------------------- stopping and failure


@pytest.mark.parametrize("method", METHODS)
def test_maxiters_stops_exactly_there(method):
    prob = LeastSquaresProblem(rosenbrock, jnp.array([-1.2, 1.0]), 10.0)
    sol = solve(prob, ScipyLeastSquares(method), maxiters=3)
    assert sol.retcode == ReturnCode.MAXITERS and sol.stats.iterations == 3
    # the third iterate of scipy's own run (lm: its third accepted step)
    ref = by_hand(rosenbrock, jnp.array([-1.2, 1.0]), 10.0, method)
    np.testing.assert_allclose(np.asarray(sol.x), ref.iterates[2][0], rtol=1e-12)
    np.testing.assert_allclose(float(sol.objective), float(prob.f(sol.x, 10.0)), rtol=1e-12)


def test_scipy_evaluation_budget_is_maxiters_with_a_note():
    prob = LeastSquaresProblem(rosenbrock, jnp.array([-1.2, 1.0]), 10.0)
    sol = solve(prob, ScipyLeastSquares("trf", max_nfev=5))
    ref = by_hand(rosenbrock, jnp.array([-1.2, 1.0]), 10.0, "trf", max_nfev=5)
    assert ref.status == 0 and sol.retcode == ReturnCode.MAXITERS
    assert_same_run(sol, ref)
    assert (
        "scipy's evaluation budget `max_nfev` ended the run, not maxiters: raise it with "
        "ScipyLeastSquares('trf', max_nfev=...)" in sol.message
    )


def nan_beyond(x, p):
    """The decay residuals, NaN once the rate exceeds p (the fit wants about 1.3)."""
    return jnp.where(x[1] > p, jnp.nan, decay(x, Y))


@pytest.mark.parametrize("method", METHODS)
def test_nonfinite_residuals_fail_with_the_last_finite_iterate(method):
    sol = solve(LeastSquaresProblem(nan_beyond, X0, 0.8), ScipyLeastSquares(method))
    assert sol.retcode == ReturnCode.FAILURE, sol.message
    assert "the residuals were not finite at" in sol.message
    x = np.asarray(sol.x)
    assert np.all(np.isfinite(x)) and x[1] <= 0.8
    np.testing.assert_allclose(
        float(sol.objective), 0.5 * np.sum(np.square(decay(x, Y))), rtol=1e-12
    )


def test_nonfinite_start_and_jacobian_fail_without_an_exception():
    sol = solve(LeastSquaresProblem(nan_beyond, X0, 0.1), ScipyLeastSquares("trf"))
    assert sol.retcode == ReturnCode.FAILURE and "Residuals are not finite" in sol.message
    np.testing.assert_array_equal(sol.x, X0)
    # sqrt's derivative is infinite at 0: finite residuals, an infinite Jacobian at x0
    sol = solve(
        LeastSquaresProblem(lambda x, p: jnp.sqrt(x) - p, jnp.zeros(2), 1.0),
        ScipyLeastSquares("trf"),
    )
    assert sol.retcode == ReturnCode.FAILURE and "the Jacobian was not finite" in sol.message
    assert np.all(np.isfinite(np.asarray(sol.x)))


# ----------------------------------------------------------- objective and history


def soft_l1_cost_and_grad(residual, x, p, f_scale):
    """scipy's soft_l1 cost 0.5 sum(c^2 rho((r/c)^2)), rho(z) = 2 (sqrt(1 + z) - 1), and its
    gradient J^T (rho'(z) r), rho'(z) = (1 + z)^-1/2, in numpy."""
    r = np.asarray(_R(residual, x, p))
    jac = np.asarray(_J(residual, x, p))
    z = (r / f_scale) ** 2
    cost = 0.5 * f_scale**2 * np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0))
    return cost, jac.T @ (r / np.sqrt(1.0 + z))


def test_objective_and_history_are_the_robust_cost():
    prob = LeastSquaresProblem(decay, X0, Y_OUTLIERS)
    alg = ScipyLeastSquares("trf", loss="soft_l1", f_scale=0.3)
    sol = solve(prob, alg, history=True)
    objective, grad_norm = np.asarray(sol.history.objective), np.asarray(sol.history.grad_norm)
    assert objective.shape == (sol.stats.iterations + 1,)
    cost0, grad0 = soft_l1_cost_and_grad(decay, X0, Y_OUTLIERS, 0.3)
    np.testing.assert_allclose(objective[0], cost0, rtol=1e-13)
    np.testing.assert_allclose(grad_norm[0], np.max(np.abs(grad0)), rtol=1e-12)
    assert objective[-1] == float(sol.objective) == sol.original.cost
    # maxiters=0 returns x0 and its robust cost
    start = solve(prob, alg, maxiters=0)
    assert start.retcode == ReturnCode.MAXITERS
    np.testing.assert_allclose(float(start.objective), cost0, rtol=1e-13)


# ------------------------------------------------------------------------ derivatives


@pytest.mark.parametrize("method", ["trf", "lm"])
def test_hypergradient_of_linear_least_squares_is_the_pseudoinverse(method):
    # x*(y) = pinv(A) y, so dx*/dy = pinv(A); d(cost*)/dy = -r(x*) = y - A x*
    y = jnp.array([1.0, -2.0, 0.5, 3.0])

    def run(y):
        return solve(
            LeastSquaresProblem(linear, jnp.zeros(2), y), ScipyLeastSquares(method), gtol=1e-14
        )

    np.testing.assert_allclose(jax.jacrev(lambda y: run(y).x)(y), np.linalg.pinv(A), atol=1e-9)
    x = np.linalg.pinv(A) @ y
    np.testing.assert_allclose(jax.grad(lambda y: run(y).objective)(y), y - A @ x, atol=1e-9)


def refined_soft_l1_fit(y):
    """scipy's soft_l1 fit (f_scale 0.3) refined by Newton steps on the gradient of its cost
    (numpy, :func:`soft_l1_cost_and_grad`; the Hessian by central differences of it): the
    minimiser to rounding. scipy's own stops where the cost no longer changes in float64,
    at a gradient near sqrt(eps), too coarse for finite differences of x*."""
    x = by_hand(decay, X0, y, "trf", loss="soft_l1", f_scale=0.3).x
    grad = lambda x: soft_l1_cost_and_grad(decay, x, y, 0.3)[1]
    for _ in range(3):
        hess = np.stack([(grad(x + e) - grad(x - e)) / 2e-6 for e in 1e-6 * np.eye(3)], axis=1)
        x = x - np.linalg.solve(hess, grad(x))
    return x


def test_hypergradient_with_a_robust_loss_is_that_of_the_robust_cost():
    weights = np.array([1.0, -2.0, 0.5])

    def fit(y, alg):  # converged as far as float64 costs tell (the adjoint's point)
        return solve(LeastSquaresProblem(decay, X0, y), alg, gtol=1e-14, ftol=1e-15, xtol=1e-15).x

    robust = ScipyLeastSquares("trf", loss="soft_l1", f_scale=0.3)
    grad = jax.grad(lambda y: jnp.dot(weights, fit(y, robust)))(Y_OUTLIERS)
    h, some = 1e-5, [0, 4, 13]  # two inliers, one outlier
    fd = [
        (
            weights @ refined_soft_l1_fit(Y_OUTLIERS.at[i].add(h))
            - weights @ refined_soft_l1_fit(Y_OUTLIERS.at[i].add(-h))
        )
        / (2 * h)
        for i in some
    ]
    np.testing.assert_allclose(np.asarray(grad)[some], fd, rtol=1e-6, atol=1e-9)
    # the plain sum of squares' optimality condition would give another derivative
    plain = jax.grad(lambda y: jnp.dot(weights, fit(y, ScipyLeastSquares())))(Y_OUTLIERS)
    assert np.max(np.abs(plain - grad)) > 1e-2


def test_status_table():
    # scipy's least_squares statuses (TERMINATION_MESSAGES), the same on every method
    from optsolve.backends.scipy.retcodes import least_squares_retcode

    expected = {
        -2: ReturnCode.TERMINATED,
        -1: ReturnCode.FAILURE,
        0: ReturnCode.MAXITERS,
        1: ReturnCode.SUCCESS,
        2: ReturnCode.SUCCESS,
        3: ReturnCode.SUCCESS,
        4: ReturnCode.SUCCESS,
        7: ReturnCode.FAILURE,
    }
    assert {s: least_squares_retcode(s) for s in expected} == expected


def nan_outside_ball(x, p):
    """The decay residuals, NaN where |x|^2 > p: MINPACK's first trials from (1, 0.1, 0)
    land there, and the optimum (|x|^2 ~ 8.2) lies inside."""
    return jnp.where(jnp.sum(x**2) > p, jnp.nan, decay(x, Y))


def test_lm_steps_past_nonfinite_trials_as_minpack_does():
    """MINPACK rejects a trial whose residuals are not finite (its ratio test fails) and
    shrinks the step; scipy's run converges, and so must ours, with the count in the
    message."""
    x0 = jnp.array([1.0, 0.1, 0.0])
    sol = solve(LeastSquaresProblem(nan_outside_ball, x0, 12.0), ScipyLeastSquares("lm"))
    ref = by_hand(nan_outside_ball, x0, 12.0, "lm")
    assert ref.status in (1, 2, 3, 4)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, ref.x, rtol=1e-12)
    assert "not finite at 3 of" in sol.message and "rejected" in sol.message


def test_lm_refuses_every_tolerance_below_machine_epsilon():
    """scipy: "All tolerances must be higher than machine epsilon" for lm (one below it is
    raised to it here, as documented; all of them below it leave no test to stop on)."""
    with pytest.raises(ValueError, match=r"needs one of ftol, xtol, gtol >= machine epsilon"):
        solve(
            LeastSquaresProblem(decay, X0, Y), ScipyLeastSquares("lm"), gtol=0.0, ftol=0.0, xtol=0.0
        )
