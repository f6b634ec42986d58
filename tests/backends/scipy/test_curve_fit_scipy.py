"""scipy's own curve_fit tests (scipy/optimize/tests/test_minpack.py, TestCurveFit), with
their data, expected values and tolerances, the models written with jax.numpy.

Cases that need a callable ``jac`` (JAX differentiates the model) are not ported; the
differences that remain are listed in ``optsolve.curve_fit``'s docstring.
"""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_almost_equal, assert_array_equal
from scipy.optimize import Bounds, OptimizeWarning

import optsolve
from optsolve import curve_fit

X = np.array([1.0, 2.0, 3.0, 4.0])
Y = np.array([1.0, 3.2, 9.5, 13.7])


def test_one_argument_and_full_output_is_scipys_tuple():
    popt, pcov = curve_fit(lambda x, a: x**a, X, Y)
    assert len(popt) == 1 and pcov.shape == (1, 1)
    assert_allclose(popt[0], 1.9149, atol=1e-4)
    assert_allclose(pcov[0, 0], 0.0016, atol=1e-4)
    popt2, _pcov2, infodict, errmsg, ier = curve_fit(
        lambda x, a: x**a, X, Y, full_output=1, check_finite=False
    )
    assert_array_almost_equal(popt, popt2)
    for key in ("nfev", "fvec", "fjac", "ipvt", "qtf", "solution"):
        assert key in infodict, key
    assert isinstance(errmsg, str) and ier in (1, 2, 3, 4)
    assert_allclose(infodict["fvec"], popt2[0] ** 0 * X ** popt2[0] - Y, rtol=1e-10)


def test_two_arguments_p0_from_the_signature_and_a_bound_method():
    class Model:
        def func(self, x, a, b):
            return b * x**a

    for f in (lambda x, a, b: b * x**a, Model().func):
        popt, pcov = curve_fit(f, X, Y)
        assert pcov.shape == (2, 2)
        assert_array_almost_equal(popt, [1.7989, 1.1642], decimal=4)
        assert_array_almost_equal(pcov, [[0.0852, -0.1260], [-0.1260, 0.1912]], decimal=4)


def test_regression_2639():
    x = [
        574.14200000000005,
        574.154,
        574.16499999999996,
        574.17700000000002,
        574.18799999999999,
        574.19899999999996,
        574.21100000000001,
        574.22199999999998,
        574.23400000000004,
        574.245,
    ]
    y = [859.0, 997.0, 1699.0, 2604.0, 2013.0, 1964.0, 2435.0, 1550.0, 949.0, 841.0]
    guess = [574.1861428571428, 574.2155714285715, 1302.0, 1302.0, 0.0035019999999983615, 859.0]
    good = [
        5.74177150e02,
        5.74209188e02,
        1.74187044e03,
        1.58646166e03,
        1.0068462e-02,
        8.57450661e02,
    ]

    def f_double_gauss(x, x0, x1, a0, a1, sigma, c):
        return (
            a0 * jnp.exp(-((x - x0) ** 2) / (2.0 * sigma**2))
            + a1 * jnp.exp(-((x - x1) ** 2) / (2.0 * sigma**2))
            + c
        )

    popt, _ = curve_fit(f_double_gauss, x, y, guess, maxfev=10000)
    assert_allclose(popt, good, rtol=1e-5)


@pytest.mark.parametrize("method", ["lm", "trf", "dogbox"])
def test_pcov(method):
    xdata = np.array([0, 1, 2, 3, 4, 5])
    ydata = np.array([1, 1, 5, 7, 8, 12])
    sigma = np.array([1, 2, 1, 2, 1, 2])
    f = lambda x, a, b: a * x + b
    for s, absolute, expected in (
        (sigma, False, [0.20659803, 0.57204404]),
        (3 * sigma, False, [0.20659803, 0.57204404]),
        (sigma, True, [0.30714756, 0.85045308]),
        (3 * sigma, True, [3 * 0.30714756, 3 * 0.85045308]),
    ):
        _, pcov = curve_fit(
            f, xdata, ydata, p0=[2, 0], sigma=s, absolute_sigma=absolute, method=method
        )
        assert_allclose(np.sqrt(np.diag(pcov)), expected, rtol=1e-3)


def test_infinite_variances_are_inf_with_a_warning():
    xdata = np.array([0, 1, 2, 3, 4, 5])
    ydata = np.array([1, 1, 5, 7, 8, 12])
    sigma = np.array([1, 2, 1, 2, 1, 2])
    expected = np.full((2, 2), np.inf)
    with pytest.warns(OptimizeWarning, match="Covariance of the parameters could not be"):
        _, pcov = curve_fit(lambda x, a, b: a * x, xdata, ydata, p0=[2, 0], sigma=sigma)
    assert_array_equal(pcov, expected)
    with pytest.warns(OptimizeWarning, match="Covariance of the parameters could not be"):
        _, pcov1 = curve_fit(lambda x, a, b: a * x + b, xdata[:2], ydata[:2], p0=[2, 0])
    assert_array_equal(pcov1, expected)


def test_array_like():
    assert_allclose(
        curve_fit(lambda x, a, b: a * x + b, [1, 2, 3, 4], [3, 5, 7, 9])[0], [2, 1], atol=1e-10
    )


def test_indeterminate_covariance():
    with pytest.warns(OptimizeWarning):
        curve_fit(
            lambda x, a, b: a * x, np.array([1, 2, 3, 4, 5, 6]), np.array([1, 2, 3, 4, 5.5, 6])
        )


def test_nan_handling_is_a_value_error():
    xdata, ydata = np.array([1, np.nan, 3]), np.array([1, 2, 3])
    line = lambda x, a, b: a * x + b
    for x, y, kw in (
        (xdata, ydata, {}),
        (ydata, xdata, {}),
        (xdata, ydata, {"check_finite": True}),
    ):
        with pytest.raises(ValueError):
            curve_fit(line, x, y, **kw)


def _check_nan_policy(f, x_nan, x_clean, y_nan, y_clean, method):
    kwargs = dict(f=f, xdata=x_nan, ydata=y_nan, method=method, check_finite=False)
    with pytest.raises(
        ValueError, match="`nan_policy='propagate'` is not supported by this function."
    ):
        curve_fit(**kwargs, nan_policy="propagate", maxfev=2000)
    with pytest.raises(ValueError, match="The input contains nan"):
        curve_fit(**kwargs, nan_policy="raise")
    with_nan, _ = curve_fit(**kwargs, nan_policy="omit")
    kwargs.update(xdata=x_clean, ydata=y_clean)
    without_nan, _ = curve_fit(**kwargs)
    assert_allclose(with_nan, without_nan)
    with pytest.raises(
        ValueError,
        match=r"nan_policy must be one of \{(?:'raise'|'omit'|None)"
        r"(?:, ?(?:'raise'|'omit'|None))*\}",
    ):
        curve_fit(**kwargs, nan_policy="hi")


@pytest.mark.parametrize("method", ["lm", "trf", "dogbox"])
def test_nan_policy_1d(method):
    _check_nan_policy(
        lambda x, a, b: a * x + b,
        np.array([2, 3, np.nan, 4, 4, np.nan]),
        np.array([2, 3, 4]),
        np.array([1, 2, 5, 3, np.nan, 7]),
        np.array([1, 2, 3]),
        method,
    )


@pytest.mark.parametrize("method", ["lm", "trf", "dogbox"])
def test_nan_policy_2d(method):
    _check_nan_policy(
        lambda x, a, b: a * x[0, :] + b + x[1, :],
        np.array([[2, 3, np.nan, 4, 4, np.nan, 5], [2, 3, np.nan, np.nan, 4, np.nan, 7]]),
        np.array([[2, 3, 5], [2, 3, 7]]),
        np.array([1, 2, 5, 3, np.nan, 7, 10]),
        np.array([1, 2, 10]),
        method,
    )


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("method", ["lm", "trf", "dogbox"])
def test_nan_policy_2_3d(n, method):
    def f(x, a, b):
        return a * x[..., 0, :].squeeze() + b + x[..., 1, :].squeeze()

    x_nan = np.array([[[2, 3, np.nan, 4, 4, np.nan, 5], [2, 3, np.nan, np.nan, 4, np.nan, 7]]])
    x_nan = x_nan.squeeze() if n == 2 else x_nan
    _check_nan_policy(
        f,
        x_nan,
        np.array([[[2, 3, 5], [2, 3, 7]]]),
        np.array([1, 2, 5, 3, np.nan, 7, 10]),
        np.array([1, 2, 10]),
        method,
    )


def test_empty_inputs_and_no_parameters_and_args():
    line = lambda x, a: a * x
    for x, y, kw in (
        ([], [], {}),
        ([], [], {"bounds": (1, 2)}),
        ([1], [], {}),
        ([2], [], {"bounds": (1, 2)}),
    ):
        with pytest.raises(ValueError):
            curve_fit(line, x, y, **kw)
    with pytest.raises(ValueError, match="Unable to determine number of fit parameters"):
        curve_fit(lambda x: x, [1, 2], [3, 4])
    with pytest.raises(ValueError, match="args"):
        curve_fit(
            lambda x, a, b: a * x + b, xdata=[1, 2, 3, 4], ydata=[5, 9, 13, 17], p0=[1], args=(1,)
        )
    with pytest.raises(TypeError, match="The number of func parameters="):
        curve_fit(
            lambda x, a, b, c, d, e: a * jnp.exp(-b * x) + c + d + e,
            xdata=[1, 2, 3, 4],
            ydata=[5, 9, 13, 17],
        )


def test_none_x():
    popt, _ = curve_fit(lambda _, a: a * jnp.arange(10), None, 2 * np.arange(10))
    assert_allclose(popt, [2.0])


def test_method_argument_and_full_output():
    f = lambda x, a, b: a * jnp.exp(-b * x)
    xdata = np.linspace(0, 1, 11)
    ydata = 2.0 * np.exp(-2.0 * xdata)
    for method in ["trf", "dogbox", "lm", None]:
        popt, _ = curve_fit(f, xdata, ydata, method=method)
        assert_allclose(popt, [2.0, 2.0])
        popt, _pcov, infodict, errmsg, ier = curve_fit(
            f, xdata, ydata, method=method, full_output=True
        )
        assert_allclose(popt, [2.0, 2.0])
        assert "nfev" in infodict and "fvec" in infodict
        if method in ("lm", None):
            assert {"fjac", "ipvt", "qtf"} <= set(infodict)
        assert isinstance(errmsg, str)
        assert ier in (1, 2, 3, 4)
    with pytest.raises(ValueError):
        curve_fit(f, xdata, ydata, method="unknown")


def test_bounds():
    f = lambda x, a, b: a * jnp.exp(-b * x)
    xdata = np.linspace(0, 1, 11)
    ydata = 2.0 * np.exp(-2.0 * xdata)
    lb, ub = [1.0, 0], [1.5, 3.0]
    for method in [None, "trf", "dogbox"]:
        popt, _ = curve_fit(f, xdata, ydata, bounds=(lb, ub), method=method)
        assert_allclose(popt[0], 1.5)
        popt_class, _ = curve_fit(f, xdata, ydata, bounds=Bounds(lb, ub), method=method)
        assert_allclose(popt_class, popt)
    popt, _ = curve_fit(f, xdata, ydata, method="trf", bounds=([0.0, 0], [0.6, np.inf]))
    assert_allclose(popt[0], 0.6)
    with pytest.raises(ValueError):
        curve_fit(f, xdata, ydata, bounds=(lb, ub), method="lm")


def test_bounds_p0():
    f = lambda x, a: jnp.sin(x + a)
    xdata = np.linspace(-2 * np.pi, 2 * np.pi, 40)
    ydata = np.sin(xdata)
    for method in ["trf", "dogbox"]:
        popt_1, _ = curve_fit(f, xdata, ydata, p0=2.1 * np.pi)
        popt_2, _ = curve_fit(
            f, xdata, ydata, p0=2.1 * np.pi, bounds=(-3 * np.pi, 3 * np.pi), method=method
        )
        assert_allclose(popt_1, popt_2)


def test_maxfev_and_bounds():
    x = np.arange(0, 10)
    popt1, _ = curve_fit(lambda x, p: p * x, x, 2 * x, bounds=(0, 3), maxfev=100)
    popt2, _ = curve_fit(lambda x, p: p * x, x, 2 * x, bounds=(0, 3), max_nfev=100)
    assert_allclose(popt1, 2, atol=1e-14)
    assert_allclose(popt2, 2, atol=1e-14)


@pytest.mark.parametrize("sigma_dim", [0, 1, 2])
def test_curvefit_omitnan(sigma_dim):
    exponential = lambda x, a, b: b * jnp.exp(a * x)
    rng = np.random.default_rng(578285731148908)
    n = 100
    x = np.linspace(1, 10, n)
    y = 0.5 * np.exp(0.2 * x)
    if sigma_dim == 0:
        sigma = 0.05
        y += rng.normal(0, sigma, n)
    elif sigma_dim == 1:
        sigma = x * 0.05
        y += rng.normal(0, sigma, n)
    else:
        a = rng.normal(0, 2, (n, n))
        sigma = a @ a.T
        y += rng.multivariate_normal(np.zeros_like(x), sigma)
    p0 = [0.1, 1.0]
    i_x, i_y = rng.integers(n, size=5), rng.integers(n, size=5)
    x[i_x] = np.nan
    y[i_y] = np.nan
    res_opt, res_cov = curve_fit(exponential, x, y, p0=p0, sigma=sigma, nan_policy="omit")
    keep = np.setdiff1d(np.arange(n), np.concatenate((i_x, i_y)))
    sigma = np.asarray(sigma)
    if sigma.ndim == 1:
        sigma = sigma[keep]
    elif sigma.ndim == 2:
        sigma = sigma[np.ix_(keep, keep)]
    ref_opt, ref_cov = curve_fit(exponential, x[keep], y[keep], p0=p0, sigma=sigma)
    assert_allclose(res_opt, ref_opt, atol=1e-14)
    assert_allclose(res_cov, ref_cov, atol=1e-14)


def test_curvefit_simplecovariance():
    func = lambda x, a, b: a * jnp.exp(-b * x)
    rng = np.random.default_rng(123)
    xdata = np.linspace(0, 4, 50)
    ydata = 2.5 * np.exp(-1.3 * xdata) + 0.2 * rng.standard_normal(size=len(xdata))
    sigma = np.zeros(len(xdata)) + 0.2
    for absolute_sigma in [False, True]:
        popt1, pcov1 = curve_fit(func, xdata, ydata, sigma=sigma, absolute_sigma=absolute_sigma)
        popt2, pcov2 = curve_fit(
            func, xdata, ydata, sigma=np.diag(sigma**2), absolute_sigma=absolute_sigma
        )
        assert_allclose(popt1, popt2, atol=1e-14)
        assert_allclose(pcov1, pcov2, atol=1e-14)


def test_curvefit_covariance():
    rotn = np.array(
        [
            [1.0 / np.sqrt(2), -1.0 / np.sqrt(2), 0],
            [1.0 / np.sqrt(2), 1.0 / np.sqrt(2), 0],
            [0, 0, 1.0],
        ]
    )
    func = lambda x, a, b: a * jnp.exp(-b * x)
    funcp = lambda x, a, b: jnp.asarray(rotn) @ (a * jnp.exp(-b * x))
    rng = np.random.default_rng(1234)
    xdata = np.arange(1, 4)
    ydata = 2.5 * np.exp(-1.0 * xdata) + 0.2 * rng.standard_normal(size=len(xdata))
    sigma = np.zeros(len(xdata)) + 0.2
    covar = np.diag(sigma**2)
    for absolute_sigma in [False, True]:
        popt1, pcov1 = curve_fit(func, xdata, ydata, sigma=sigma, absolute_sigma=absolute_sigma)
        popt2, pcov2 = curve_fit(
            funcp, xdata, rotn @ ydata, sigma=rotn @ covar @ rotn.T, absolute_sigma=absolute_sigma
        )
        assert_allclose(popt1, popt2, rtol=1.4e-7, atol=1e-14)
        assert_allclose(pcov1, pcov2, rtol=1.4e-7, atol=1e-14)


@pytest.mark.parametrize("absolute_sigma", [False, True])
def test_curvefit_scalar_sigma(absolute_sigma):
    func = lambda x, a, b: a * x + b
    _, pcov1 = curve_fit(func, X, Y, sigma=2, absolute_sigma=absolute_sigma)
    _, pcov2 = curve_fit(func, X, Y, sigma=np.full_like(Y, 2), absolute_sigma=absolute_sigma)
    assert np.all(pcov1 == pcov2)


@pytest.mark.parametrize("method", ["lm", "trf", "dogbox"])
def test_dtypes(method):
    x = np.arange(-3, 5)
    y = 1.5 * x + 3.0 + 0.5 * np.sin(x)
    for dtx in [np.float32, np.float64]:
        for dty in [np.float32, np.float64]:
            with warnings.catch_warnings():
                warnings.simplefilter("error", OptimizeWarning)
                p, cov = curve_fit(
                    lambda x, a, b: a * x + b, x.astype(dtx), y.astype(dty), method=method
                )
            assert np.isfinite(cov).all()
            assert not np.allclose(p, 1)


def test_dtypes2():
    def hyperbola(x, s_1, s_2, o_x, o_y, c):
        b_2, b_1 = (s_1 + s_2) / 2, (s_2 - s_1) / 2
        return o_y + b_1 * (x - o_x) + b_2 * jnp.sqrt((x - o_x) ** 2 + c**2 / 4)

    min_fit = np.array([-3.0, 0.0, -2.0, -10.0, 0.0])
    max_fit = np.array([0.0, 3.0, 3.0, 0.0, 10.0])
    guess = np.array([-2.5 / 3.0, 4 / 3.0, 1.0, -4.0, 0.5])
    params = [-2, 0.4, -1, -5, 9.5]
    xdata = np.array([-32, -16, -8, 4, 4, 8, 16, 32])
    popt_64, _ = curve_fit(
        hyperbola,
        xdata,
        np.asarray(hyperbola(xdata * 1.0, *params)),
        p0=guess,
        bounds=(min_fit, max_fit),
    )
    x32 = xdata.astype(np.float32)
    popt_32, _ = curve_fit(
        hyperbola, x32, np.asarray(hyperbola(x32, *params)), p0=guess, bounds=(min_fit, max_fit)
    )
    assert_allclose(popt_32, popt_64, atol=2e-5)


@pytest.mark.parametrize("method", ["lm", "trf", "dogbox"])
def test_broadcast_y(method):
    xdata = np.arange(10)
    target = 4.7 * xdata**2 + 3.5 * xdata + np.random.default_rng(123).random(size=10)
    fit_func = lambda x, a, b: a * x**2 + b * x - target
    _, pcov0 = curve_fit(fit_func, xdata=xdata, ydata=np.zeros_like(xdata), method=method)
    _, pcov1 = curve_fit(fit_func, xdata=xdata, ydata=0, method=method)
    assert_allclose(pcov0, pcov1)


def test_gh4555():
    """scipy's p0 (all ones) is symmetric in (a, b) and (c, d): with JAX's exact Jacobian the
    iterates stay symmetric (MINPACK's finite differences break the tie) and the fit ends
    where J has two equal columns, an indeterminate covariance (inf, warned). From a start
    that breaks the symmetry, scipy's assertions hold."""
    f = lambda x, a, b, c, d, e: a * jnp.log(x + 1 + b) + c * jnp.log(x + 1 + d) + e
    rng = np.random.default_rng(408113519974467917)
    x = np.arange(100)
    y = np.linspace(2, 7, 100) + rng.random(100)
    with pytest.warns(OptimizeWarning, match="could not be estimated"):
        _, cov = curve_fit(f, x, y, maxfev=100000)
    assert np.all(np.isinf(cov))
    _, cov = curve_fit(f, x, y, p0=[1.0, 1.0, 2.0, 2.0, 1.0], maxfev=100000)
    assert np.all(np.diag(cov) > 0)
    assert np.all(np.linalg.eigh(cov)[0] > -1e-2)
    assert_allclose(cov, cov.T)


def test_gh4555b():
    """scipy's reference is MINPACK's covariance at the point its default ftol stops at;
    converged further (scipy itself at ftol = xtol = 1e-12 with the exact Jacobian gives
    0.0158972457 for the first entry) it moves by up to 1.6e-6 relative: rtol 2e-6 instead of
    2e-7."""
    rng = np.random.default_rng(408113519974467917)
    xdata = np.linspace(0, 4, 50)
    ydata = 2.5 * np.exp(-1.3 * xdata) + 0.5 + 0.2 * rng.normal(size=xdata.size)
    _, res = curve_fit(lambda x, a, b, c: a * jnp.exp(-b * x) + c, xdata, ydata)
    ref = [
        [+0.0158972536486215, 0.0069207183284242, -0.0007474400714749],
        [+0.0069207183284242, 0.0205057958128679, +0.0053997711275403],
        [-0.0007474400714749, 0.0053997711275403, +0.0027833930320877],
    ]
    assert_allclose(res, ref, 2e-6)
    assert_allclose(res[0, 0], 0.01589724565818616, rtol=1e-9)


@pytest.mark.parametrize("method", ["trf", "dogbox"])
def test_gh20155_error_mentions_p0(method):
    with pytest.raises(ValueError, match="Initial guess is outside of provided bounds"):
        curve_fit(lambda x, a: x**a, X, Y, p0=[1], bounds=(1000, 1001), method=method)


def test_covariance_reports_a_rank_deficient_jacobian_as_inf():
    """optsolve.covariance itself: an exactly flat direction is indeterminate (inf and
    scipy's OptimizeWarning), not the pseudo-inverse's finite 0."""
    xdata = np.array([0.0, 1, 2, 3, 4, 5])
    ydata = np.array([1.0, 1, 5, 7, 8, 12])
    prob = optsolve.curve_fit_problem(lambda x, a, b: a * x, xdata, ydata, [2.0, 0.0])
    sol = optsolve.solve(prob, optsolve.LevenbergMarquardt())
    with pytest.warns(OptimizeWarning, match="could not be estimated"):
        cov = optsolve.covariance(sol)
    assert_array_equal(cov, np.full((2, 2), np.inf))
