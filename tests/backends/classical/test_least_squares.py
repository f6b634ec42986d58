"""Residual problems, the JAX-native least-squares methods, covariance and curve_fit.

References: scipy.optimize.least_squares and curve_fit called by hand at tight tolerances,
closed forms (the linear model's normal equations and its derivative with respect to the
data; the normal distribution's maximum-likelihood covariance), and NIST's certified values
(tests/backends/classical/test_nist.py has the whole StRD set).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import optsolve
from optsolve import LeastSquaresProblem, OptimizationProblem, ReturnCode, solve

T = np.linspace(0.0, 4.0, 50)
Y = 2.5 * np.exp(-1.3 * T) + 0.01 * np.random.default_rng(0).standard_normal(50)
DATA = (jnp.asarray(T), jnp.asarray(Y))
X0 = jnp.array([1.0, 0.5])


def _decay(b, data):
    t, y = data
    return b[0] * jnp.exp(-b[1] * t) - y


def _scipy_fit(method="lm", **options):
    jac = jax.jit(jax.jacfwd(lambda b: _decay(b, (T, Y))))
    return so.least_squares(
        lambda b: np.asarray(_decay(jnp.asarray(b), (T, Y))),
        np.asarray(X0),
        jac=lambda b: np.asarray(jac(b)),
        method=method,
        **options,
    )


LEAST_SQUARES = {
    "LevenbergMarquardt": optsolve.LevenbergMarquardt(),
    "LevenbergMarquardt-cg": optsolve.LevenbergMarquardt(linear_solver="cg"),
    "GaussNewton": optsolve.GaussNewton(),
    "GaussNewton-cg": optsolve.GaussNewton(linear_solver="cg"),
    "ScipyLeastSquares": optsolve.ScipyLeastSquares("trf"),
}


def test_the_objective_is_half_the_squared_residual_norm_over_a_pytree():
    residual = lambda x, p: {"a": x["u"] - p, "b": jnp.stack([x["v"], 2 * x["v"]])}
    prob = LeastSquaresProblem(residual, {"u": jnp.ones(3), "v": jnp.array(2.0)}, 0.5)
    np.testing.assert_allclose(prob.f(prob.x0, prob.p), 0.5 * (3 * 0.25 + 4 + 16), rtol=1e-15)
    # every scalar algorithm solves it: u = p, v = 0
    sol = solve(prob, optsolve.LBFGS())
    assert sol.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(sol.x["u"], 0.5, atol=1e-8)
    np.testing.assert_allclose(sol.x["v"], 0.0, atol=1e-8)
    for name in ("LevenbergMarquardt", "GaussNewton"):
        sol = solve(prob, LEAST_SQUARES[name])
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        np.testing.assert_allclose(sol.x["u"], 0.5, atol=1e-10)


def test_replace_keeps_the_residual_and_names_the_fields():
    prob = LeastSquaresProblem(_decay, X0, DATA)
    moved = prob.replace(x0=X0 + 1.0)
    assert isinstance(moved, LeastSquaresProblem) and moved.residual is _decay
    assert moved.f == prob.f  # the same objective: compiled code is shared
    with pytest.raises(TypeError, match="replace `residual` instead"):
        prob.replace(f=lambda x, p: 0.0)
    with pytest.raises(TypeError, match="unknown field.*valid fields are residual, x0, p, bounds"):
        prob.replace(q=1.0)


def test_bad_residuals_and_problems_get_clear_errors():
    with pytest.raises(TypeError, match="`residual` must be a callable"):
        LeastSquaresProblem(3.0, X0)
    ints = LeastSquaresProblem(lambda x, p: jnp.arange(3), X0)
    with pytest.raises(TypeError, match="real floating-point residuals, got dtype int"):
        solve(ints, optsolve.LevenbergMarquardt())
    empty = LeastSquaresProblem(lambda x, p: jnp.zeros(0), X0)
    with pytest.raises(ValueError, match="no residuals"):
        solve(empty, optsolve.GaussNewton())
    scalar = OptimizationProblem(lambda x, p: jnp.sum(x**2), X0)
    for alg in (optsolve.GaussNewton(), optsolve.LevenbergMarquardt()):
        with pytest.raises(TypeError, match="works on residuals.*LeastSquaresProblem.*LBFGS"):
            solve(scalar, alg)
    with pytest.raises(ValueError, match="`linear_solver` must be one of"):
        optsolve.LevenbergMarquardt(linear_solver="qr")
    with pytest.raises(ValueError, match="`max_trials` must be an integer >= 1"):
        optsolve.LevenbergMarquardt(max_trials=0)


@pytest.mark.parametrize(
    "name", ["LevenbergMarquardt", "GaussNewton", "LevenbergMarquardt-cg", "GaussNewton-cg"]
)
def test_the_exponential_decay_fit_matches_scipy_in_fewer_evaluations_than_lbfgs(name):
    ref = _scipy_fit(ftol=1e-14, xtol=1e-14, gtol=1e-14)
    sol = solve(LeastSquaresProblem(_decay, X0, DATA), LEAST_SQUARES[name])
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, ref.x, rtol=1e-9)
    np.testing.assert_allclose(sol.objective, ref.cost, rtol=1e-12)
    lbfgs = solve(LeastSquaresProblem(_decay, X0, DATA), optsolve.LBFGS())
    assert sol.stats.f_evals < lbfgs.stats.f_evals
    # scipy's lm: 6 residual and 5 Jacobian evaluations; the driver adds the one at x0
    assert sol.stats.f_evals <= _scipy_fit().nfev + 1


def test_levenberg_marquardt_needs_no_more_evaluations_than_minpack():
    ref = _scipy_fit()
    sol = solve(LeastSquaresProblem(_decay, X0, DATA), optsolve.LevenbergMarquardt())
    np.testing.assert_allclose(sol.x, ref.x, rtol=1e-8)
    assert sol.stats.f_evals <= ref.nfev and sol.stats.grad_evals <= ref.njev + 1


def test_a_zero_residual_problem_converges_exactly():
    # Rosenbrock as residuals: the minimum has r = 0 (Moré, Garbow & Hillstrom 1981, #1)
    residual = lambda x, p: jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])
    for alg in (optsolve.LevenbergMarquardt(), optsolve.GaussNewton()):
        sol = solve(LeastSquaresProblem(residual, jnp.array([-1.2, 1.0])), alg)
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        np.testing.assert_allclose(sol.x, [1.0, 1.0], rtol=1e-10)


def test_matrix_free_and_dense_agree_on_a_large_linear_fit():
    # 20000 residuals, 20 parameters, a polynomial basis: the normal equations' solution
    rng = np.random.default_rng(1)
    basis = rng.standard_normal((20000, 20))
    y = basis @ np.arange(1.0, 21.0) + 0.1 * rng.standard_normal(20000)
    exact = np.linalg.lstsq(basis, y, rcond=None)[0]
    residual = lambda b, d: d[0] @ b - d[1]
    prob = LeastSquaresProblem(residual, jnp.zeros(20), (jnp.asarray(basis), jnp.asarray(y)))
    for solver in ("dense", "cg"):
        for cls in (optsolve.LevenbergMarquardt, optsolve.GaussNewton):
            sol = solve(prob, cls(linear_solver=solver, cg_rtol=1e-10))
            assert sol.retcode == ReturnCode.SUCCESS, (cls, solver, sol.message)
            np.testing.assert_allclose(sol.x, exact, rtol=1e-8, err_msg=f"{cls} {solver}")


def _line(t, a, b):
    return a + b * t


def test_curve_fit_matches_scipy_curve_fit():
    model = lambda t, a, k: a * jnp.exp(-k * t)
    np_model = lambda t, a, k: a * np.exp(-k * t)
    sigma = 0.01 + 0.002 * np.arange(50)
    tight = dict(ftol=1e-14, xtol=1e-14, gtol=1e-14)
    for kwargs in (
        {},
        {"sigma": sigma},
        {"sigma": sigma, "absolute_sigma": True},
        {"sigma": np.diag(sigma**2) + 1e-5},
    ):
        popt, pcov = optsolve.curve_fit(model, T, Y, [1.0, 0.5], **kwargs, ftol=1e-14, xtol=1e-14)
        ref_popt, ref_pcov = so.curve_fit(
            np_model, T, Y, p0=[1.0, 0.5], method="lm", **kwargs, **tight
        )
        np.testing.assert_allclose(popt, ref_popt, rtol=1e-9, err_msg=str(kwargs.keys()))
        np.testing.assert_allclose(pcov, ref_pcov, rtol=1e-6, err_msg=str(kwargs.keys()))


def test_curve_fit_with_bounds_matches_scipy_trf():
    model = lambda t, a, k: a * jnp.exp(-k * t)
    bounds = ([0.0, 0.0], [2.0, 5.0])  # a's optimum (2.5) lies outside: a = 2 is active
    popt, pcov = optsolve.curve_fit(
        model, T, Y, [1.0, 0.5], bounds=bounds, ftol=1e-14, xtol=1e-14, gtol=1e-14
    )
    ref_popt, ref_pcov = so.curve_fit(
        lambda t, a, k: a * np.exp(-k * t),
        T,
        Y,
        p0=[1.0, 0.5],
        bounds=bounds,
        ftol=1e-14,
        xtol=1e-14,
        gtol=1e-14,
    )
    np.testing.assert_allclose(popt, ref_popt, rtol=1e-8)
    np.testing.assert_allclose(pcov, ref_pcov, rtol=1e-5)


def test_curve_fit_that_fails_raises_like_scipy():
    with pytest.raises(RuntimeError, match="Optimal parameters not found"):
        optsolve.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), T, Y, [1.0, 0.5], maxiters=1)
    with pytest.raises(ValueError, match="`p0` must be a 1-D array"):
        optsolve.curve_fit(_line, T, Y, [[1.0, 0.5]])


@pytest.mark.parametrize("name", sorted(LEAST_SQUARES))
def test_fits_differentiate_with_respect_to_the_data(name):
    """A straight line: popt = (X^T X)^-1 X^T y, so d popt / dy is that matrix exactly;
    reverse and forward mode through the solve, under jit, for every least-squares solver."""
    design = np.stack([np.ones_like(T), T], axis=1)
    exact = np.linalg.solve(design.T @ design, design.T)
    alg = LEAST_SQUARES[name]
    fit = jax.jit(lambda y: optsolve.curve_fit(_line, T, y, jnp.zeros(2), algorithm=alg)[0])
    for mode in (jax.jacrev, jax.jacfwd):
        np.testing.assert_allclose(
            mode(fit)(jnp.asarray(Y)), exact, rtol=1e-7, atol=1e-10, err_msg=mode.__name__
        )


def test_a_batch_of_fits_under_vmap_matches_one_by_one():
    model = lambda t, a, k: a * jnp.exp(-k * t)
    ys = jnp.stack([jnp.asarray(Y), 1.5 * jnp.asarray(Y), 0.5 * jnp.asarray(Y)])
    batched = jax.vmap(lambda y: optsolve.curve_fit(model, T, y, jnp.array([1.0, 0.5]))[0])(ys)
    for y, popt in zip(ys, batched):
        np.testing.assert_allclose(popt, optsolve.curve_fit(model, T, y, [1.0, 0.5])[0], rtol=1e-12)


def test_covariance_of_a_maximum_likelihood_fit_is_the_inverse_hessian():
    """Normal samples, f = the negative log-likelihood in (mu, sigma): at the estimate the
    inverse Hessian is diag(sigma^2 / n, sigma^2 / (2 n)) (the Fisher information)."""
    y = jnp.asarray(Y)
    nll = lambda m, d: 0.5 * jnp.sum((d - m[0]) ** 2) / m[1] ** 2 + d.size * jnp.log(m[1])
    sol = solve(OptimizationProblem(nll, jnp.array([0.0, 1.0]), y), optsolve.LBFGS())
    n, var = y.size, float(jnp.var(y))
    np.testing.assert_allclose(sol.x, [jnp.mean(y), np.sqrt(var)], rtol=1e-8)
    np.testing.assert_allclose(
        optsolve.covariance(sol), np.diag([var / n, var / (2 * n)]), rtol=1e-6, atol=1e-12
    )


def test_covariance_needs_its_problem_after_jit_and_refuses_huge_dense_matrices():
    prob = LeastSquaresProblem(_decay, X0, DATA)
    sol = jax.jit(lambda d: solve(prob.replace(p=d), optsolve.LevenbergMarquardt()))(DATA)
    with pytest.raises(ValueError, match="holds no problem.*covariance\\(sol, problem\\)"):
        optsolve.covariance(sol)
    eager = solve(prob, optsolve.LevenbergMarquardt())
    np.testing.assert_allclose(
        optsolve.covariance(sol, prob), optsolve.covariance(eager), rtol=1e-10
    )
    big = OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.zeros(5000))
    with pytest.raises(ValueError, match="limited to 4096 parameters"):
        optsolve.covariance(solve(big, optsolve.LBFGS()))


def test_a_new_xtol_reuses_the_compiled_run_and_may_be_traced():
    from compile_count import count_compilations

    prob = LeastSquaresProblem(_decay, X0, DATA)
    for alg in (optsolve.LevenbergMarquardt(), optsolve.LBFGS(), optsolve.ScipyLeastSquares()):
        solve(prob, alg, xtol=1e-8)
        with count_compilations() as counter:
            solve(prob, alg, xtol=1e-9)
        assert counter.count == 0, type(alg).__name__
        run = jax.jit(lambda xtol: solve(prob, alg, xtol=xtol).x)  # noqa: B023  (called in this iteration)
        np.testing.assert_allclose(run(1e-9), run(1e-10), rtol=1e-6)


def test_a_rank_deficient_start_stays_out_of_the_null_space():
    """a exp(-k t) + c from zeros: J's columns for k and c are 0 and t-dependent, so J has
    rank 1 at the start; scipy's lm (MINPACK) converges from there, and so must ours."""
    t, y = DATA
    y = y + 0.3
    residual = lambda b, d: b[0] * jnp.exp(-b[1] * d[0]) + b[2] - d[1]
    jac = jax.jit(jax.jacfwd(lambda b: residual(b, (t, y))))
    ref = so.least_squares(
        lambda b: np.asarray(residual(jnp.asarray(b), (t, y))),
        np.zeros(3),
        jac=lambda b: np.asarray(jac(b)),
        method="lm",
        ftol=1e-14,
        xtol=1e-14,
        gtol=1e-14,
    )
    for alg in (optsolve.LevenbergMarquardt(), optsolve.GaussNewton()):
        sol = solve(LeastSquaresProblem(residual, jnp.zeros(3), (t, y)), alg)
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        np.testing.assert_allclose(sol.x, ref.x, rtol=1e-7)


def test_covariance_of_a_maximised_log_likelihood_with_its_problem_passed():
    y = jnp.asarray(Y)
    loglik = lambda m, d: (
        -0.5 * jnp.sum((d - m[0]) ** 2) / m[1] ** 2 - d.size * jnp.log(m[1]),
        m[1] ** 2,
    )
    prob = OptimizationProblem(loglik, jnp.array([0.0, 1.0]), y, sense="max", has_aux=True)
    sol = solve(prob, optsolve.LBFGS())
    n, var = y.size, float(jnp.var(y))
    expected = np.diag([var / n, var / (2 * n)])
    np.testing.assert_allclose(optsolve.covariance(sol), expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(optsolve.covariance(sol, prob), expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(sol.aux, var, rtol=1e-8)


def test_levenberg_marquardt_differentiates_unrolled_in_reverse_mode():
    """Its inner loops (trials, the secular equation) are bounded under UnrolledAdjoint, so
    reverse mode runs through them; the derivative of a straight-line fit is exact."""
    design = np.stack([np.ones_like(T), T], axis=1)
    exact = np.linalg.solve(design.T @ design, design.T)
    prob = LeastSquaresProblem(lambda b, y: _line(jnp.asarray(T), *b) - y, jnp.zeros(2), Y)
    fit = lambda y: (
        solve(
            prob.replace(p=y),
            optsolve.LevenbergMarquardt(),
            adjoint=optsolve.UnrolledAdjoint(),
            maxiters=20,
        ).x
    )
    np.testing.assert_allclose(jax.jacrev(fit)(jnp.asarray(Y)), exact, rtol=1e-7, atol=1e-10)


def test_gauss_newton_docs_say_when_to_prefer_levenberg_marquardt():
    """scipy's fun_trivial, r = x^2 + 5 (a residual of 5 at the minimum x = 0): Gauss-Newton's
    step -r / J is a Newton step towards a root that does not exist and it ends at maxiters;
    LevenbergMarquardt solves it. GaussNewton's docstring says so."""
    prob = LeastSquaresProblem(lambda x, p: x**2 + 5.0, jnp.array([2.0]))
    assert solve(prob, optsolve.GaussNewton(), maxiters=200).retcode != ReturnCode.SUCCESS
    sol = solve(prob, optsolve.LevenbergMarquardt())
    assert sol.retcode == ReturnCode.SUCCESS and abs(float(sol.x[0])) < 1e-4
    doc = " ".join(optsolve.GaussNewton.__doc__.split())
    assert "prefer LevenbergMarquardt" in doc and "large residuals" in doc


def test_levenberg_marquardt_reads_a_nan_residual_norm_as_non_finite():
    """LevenbergMarquardt rejects a trial whose residual norm is not finite (MINPACK's
    rule). Its norm's sqrt has a zero derivative at 0 (for unrolled reverse mode) and
    once read NaN as 0, so such a trial was accepted and the run ended FAILURE
    (test_curve_fit_scipy.py::test_gh4555 from scipy's start); the norm keeps NaN."""
    from optsolve.backends.classical.least_squares import _norm, _sqrt

    assert bool(jnp.isnan(_sqrt(jnp.asarray(jnp.nan))))
    assert bool(jnp.isnan(_norm(jnp.array([1.0, jnp.nan]))))
    assert float(_norm(jnp.array([3.0, 4.0]))) == 5.0
    assert float(jax.grad(_sqrt)(0.0)) == 0.0 and float(_sqrt(0.0)) == 0.0
