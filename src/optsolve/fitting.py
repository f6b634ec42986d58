"""``curve_fit``: scipy's signature on optsolve's least-squares solvers.

A front end over the families (it picks a default algorithm from two of them), so it lives
beside the package's public names rather than in ``solve_api``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.covariance import covariance
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.pytree import is_traced
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.scipy_forms import scipy_types
from optsolve.solve_api.solution import Solution
from optsolve.solve_api.solve import solve


def _weighted_residual(model: Callable[..., Any]) -> Callable[[Any, Any], jax.Array]:
    """``(model(xdata, *params) - ydata)`` whitened by sigma (1-D: divided; 2-D: the
    inverse of its Cholesky factor), with the data carried in p (differentiable, and new
    data reuses the compiled solve)."""

    def residual(params, data):
        xdata, ydata, sigma = data
        diff = jnp.ravel(model(xdata, *params) - ydata)
        if sigma is None:
            return diff
        if jnp.ndim(sigma) == 2:
            return jsl.solve_triangular(jnp.linalg.cholesky(sigma), diff, lower=True)
        return diff / jnp.ravel(sigma)

    return residual


# one residual function per model, so that fits of one model share compiled code
_RESIDUALS = BoundedCache(256)


def _residual_of(model: Callable[..., Any]) -> Callable[[Any, Any], jax.Array]:
    return _RESIDUALS.get_or_make(model, lambda: _weighted_residual(model))


# scipy's least_squares options, given to curve_fit's keywords, that configure
# ScipyLeastSquares (method "trf" or "dogbox"); everything else goes to solve
_LEAST_SQUARES_OPTIONS = (
    "x_scale",
    "loss",
    "f_scale",
    "tr_solver",
    "tr_options",
    "verbose",
    "max_nfev",
)
_METHODS = ("lm", "trf", "dogbox")
_NAN_POLICIES = ("raise", "omit", None)
_FINITE_DIFFERENCES = ("2-point", "3-point", "cs")
_CAST_WARNED: list[bool] = []  # the float64 -> float32 warning is given once per process


class _Inputs(NamedTuple):
    xdata: Any
    ydata: Any
    sigma: Any
    p0: Any
    bounds: Any  # None (unbounded) or (lower, upper) as float arrays


def _n_parameters(model: Callable[..., Any]) -> int:
    """The number of fit parameters in ``model(x, a, b, ...)``'s signature (scipy's p0=None)."""
    try:
        params = inspect.signature(model).parameters.values()
    except (TypeError, ValueError):
        params = ()
    named = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(named) < 2:
        raise ValueError(
            "Unable to determine number of fit parameters. curve_fit: give `p0` "
            "(the model's signature names no parameter after xdata)."
        )
    return len(named) - 1


def _warn_cast(name: str, value: Any) -> None:
    """Warn once when float64 NumPy data become float32 (JAX's default without x64)."""
    if _CAST_WARNED or jax.config.jax_enable_x64:
        return
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        _CAST_WARNED.append(True)
        warnings.warn(
            f"curve_fit: float64 NumPy data (`{name}`) are cast to float32, JAX's default: the "
            "fit runs in float32 (its covariance is computed in float64). Enable float64 with "
            "jax.config.update('jax_enable_x64', True). (Shown once.)",
            UserWarning,
            stacklevel=4,
        )


def _float_data(name: str, value: Any, check_finite: bool) -> Any:
    """scipy's ``np.asarray(value, float)`` (and ``asarray_chkfinite``), kept as a JAX array:
    a traced array is cast, not checked."""
    if is_traced(value):
        value = jnp.asarray(value)
        return value if jnp.issubdtype(value.dtype, jnp.floating) else value.astype(float)
    _warn_cast(name, value)
    host = np.asarray(value)
    if not np.issubdtype(host.dtype, np.floating):
        host = host.astype(np.float64)
    if check_finite and not np.all(np.isfinite(host)):
        raise ValueError(
            f"curve_fit: `{name}` must contain only finite values "
            f"(check_finite=True); it has {int(np.sum(~np.isfinite(host)))} NaN "
            "or inf. Remove them, or pass nan_policy='omit'."
        )
    return jnp.asarray(host)


def _bounds_arrays(bounds: Any, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(lower, upper) as float arrays of n, or None when every entry is infinite."""
    if bounds is None:
        return None
    if isinstance(bounds, scipy_types("Bounds")):
        lower, upper = bounds.lb, bounds.ub
    else:
        try:
            lower, upper = bounds
        except (TypeError, ValueError):
            raise ValueError(
                f"curve_fit: `bounds` must be (lower, upper) or scipy.optimize."
                f"Bounds, got {bounds!r}."
            ) from None
    if is_traced(lower, upper):
        return jnp.broadcast_to(lower, (n,)), jnp.broadcast_to(upper, (n,))
    lower = np.broadcast_to(np.asarray(lower, np.float64), (n,))
    upper = np.broadcast_to(np.asarray(upper, np.float64), (n,))
    if np.all(np.isinf(lower) & np.isinf(upper)):
        return None
    return lower, upper


def _feasible_start(bounds: tuple[np.ndarray, np.ndarray] | None, n: int) -> np.ndarray:
    """scipy's p0 when none is given: 1, or inside the bounds (the middle of a finite box,
    1 from a one-sided bound)."""
    p0 = np.ones(n)
    if bounds is None:
        return p0
    lower, upper = bounds
    lb_finite, ub_finite = np.isfinite(lower), np.isfinite(upper)
    both = lb_finite & ub_finite
    p0[both] = 0.5 * (lower[both] + upper[both])
    p0[lb_finite & ~ub_finite] = lower[lb_finite & ~ub_finite] + 1
    p0[~lb_finite & ub_finite] = upper[~lb_finite & ub_finite] - 1
    return p0


def _omit_nan(xdata: Any, ydata: Any, sigma: Any, nan_policy: str | None) -> tuple:
    """scipy's nan_policy: 'raise' on any NaN, 'omit' drops the data points (and sigma's
    rows and columns) with a NaN in x or y."""
    if nan_policy not in _NAN_POLICIES:
        if nan_policy == "propagate":
            raise ValueError(
                "`nan_policy='propagate'` is not supported by this function. "
                "curve_fit: use nan_policy='omit' or 'raise'."
            )
        raise ValueError(
            f"nan_policy must be one of {{None, 'raise', 'omit'}}; curve_fit got "
            f"nan_policy={nan_policy!r}."
        )
    if nan_policy is None:
        return xdata, ydata, sigma
    if is_traced(xdata, ydata, sigma):
        raise ValueError(
            "curve_fit: nan_policy needs concrete data (omitting points changes "
            "the number of residuals), but xdata, ydata or sigma is traced "
            "(jax.jit, vmap, grad); drop the NaNs before the transformation."
        )
    y = np.asarray(ydata)
    x = np.asarray(xdata) if isinstance(xdata, jax.Array) else None
    has_nan = np.isnan(y)
    if x is not None and x.ndim >= 1 and x.shape[-1] == y.size:
        x_nan = np.isnan(x)
        has_nan = has_nan | x_nan.any(axis=tuple(range(x_nan.ndim - 1)))
    if not has_nan.any():
        return xdata, ydata, sigma
    if nan_policy == "raise":
        raise ValueError(
            "The input contains nan values. curve_fit: nan_policy='raise' found "
            f"{int(has_nan.sum())} data points with NaN in xdata or ydata."
        )
    keep = ~has_nan
    if x is not None and x.ndim >= 1 and x.shape[-1] == y.size:
        xdata = jnp.asarray(x[..., keep])
    ydata = jnp.asarray(y[keep])
    if sigma is not None:
        s = np.asarray(sigma)
        if s.ndim == 1 and s.size == y.size:
            sigma = s[keep]
        elif s.ndim == 2:
            sigma = s[np.ix_(keep, keep)]
    return xdata, ydata, sigma


def _prepare(model, xdata, ydata, p0, sigma, bounds, check_finite, nan_policy) -> _Inputs:
    """scipy curve_fit's conversions and checks of its inputs, in its order."""
    if p0 is None:
        n = _n_parameters(model)
    else:
        p0 = jnp.asarray(p0)
        if p0.ndim == 0:
            p0 = p0[None]
        if p0.ndim != 1:
            raise ValueError(
                f"curve_fit: `p0` must be a 1-D array of parameters, got shape {p0.shape}."
            )
        n = p0.shape[0]
    box = _bounds_arrays(bounds, n)
    if p0 is None:
        p0 = jnp.asarray(_feasible_start(None if box is None or is_traced(box) else box, n))
    if not jnp.issubdtype(p0.dtype, jnp.floating):
        p0 = p0.astype(jnp.result_type(float))
    if check_finite is None:
        check_finite = nan_policy is None
    ydata = _float_data("ydata", ydata, check_finite)
    if isinstance(xdata, (list, tuple, np.ndarray, jax.Array)):
        # scipy converts only these; anything else (None, a pytree) reaches the model as is
        xdata = _float_data("xdata", xdata, check_finite)
    if ydata.size == 0:
        raise ValueError("`ydata` must not be empty! curve_fit got no data points.")
    xdata, ydata, sigma = _omit_nan(xdata, ydata, sigma, nan_policy)
    if sigma is not None:
        if not is_traced(sigma):
            _warn_cast("sigma", sigma)
            sigma = np.asarray(sigma, np.float64)
        size = int(np.prod(ydata.shape))
        if np.size(sigma) == 1:  # a scalar: one standard deviation for every point
            sigma = jnp.full((size,), jnp.ravel(jnp.asarray(sigma))[0], ydata.dtype)
        elif jnp.shape(sigma) == (size, size):
            if not is_traced(sigma):
                try:
                    np.linalg.cholesky(sigma)
                except np.linalg.LinAlgError:
                    raise ValueError(
                        "`sigma` must be positive definite (curve_fit: a 2-D "
                        "sigma is the covariance matrix of ydata)."
                    ) from None
            sigma = jnp.asarray(sigma)
        elif jnp.shape(sigma) == (size,):
            sigma = jnp.asarray(sigma)
        else:
            raise ValueError(
                f"`sigma` has incorrect shape. curve_fit: expected a scalar, "
                f"({size},) or ({size}, {size}); got {jnp.shape(sigma)}."
            )
    return _Inputs(xdata, ydata, sigma, p0, box)


def curve_fit_problem(
    model: Callable[..., Any],
    xdata: Any,
    ydata: Any,
    p0: Any = None,
    sigma: Any = None,
    bounds: Any = None,
) -> LeastSquaresProblem:
    """The :class:`~optsolve.LeastSquaresProblem` that :func:`curve_fit` solves: the
    residuals ``(model(xdata, *params) - ydata)`` whitened by ``sigma``, from ``p0``, with
    ``p = (xdata, ydata, sigma)`` (so new data reuse the compiled solve). For solving the
    fit with any algorithm and options: ``solve(curve_fit_problem(...), algorithm)``.
    Arguments as for :func:`curve_fit` (the data are converted as there, without its
    finiteness checks)."""
    inputs = _prepare(model, xdata, ydata, p0, sigma, bounds, False, None)
    return _problem(model, inputs)


def _problem(model: Callable[..., Any], inputs: _Inputs) -> LeastSquaresProblem:
    return LeastSquaresProblem(
        _residual_of(model),
        inputs.p0,
        (inputs.xdata, inputs.ydata, inputs.sigma),
        bounds=inputs.bounds,
    )


def _algorithm(method: str | None, algorithm: Any, bounded: bool, options: dict) -> Any:
    """scipy's method (None: 'lm' without bounds, 'trf' with them) as an optsolve algorithm,
    with the options that configure it taken out of ``options``."""
    from optsolve.backends.classical.least_squares import LevenbergMarquardt
    from optsolve.backends.scipy.least_squares import ScipyLeastSquares

    maxfev = options.pop("maxfev", None)
    if algorithm is not None:
        if method is not None:
            raise ValueError(
                f"curve_fit: give `method` or `algorithm`, not both; got "
                f"method={method!r} and algorithm={algorithm!r}."
            )
        if maxfev is not None:
            options["maxfev"] = maxfev  # solve names it as an unknown option
        return algorithm
    if method is None:
        method = "trf" if bounded else "lm"
    if method not in _METHODS:
        raise ValueError(
            f"curve_fit: `method` must be 'lm', 'trf' or 'dogbox' (or None), got {method!r}."
        )
    if method == "lm":
        if bounded:
            raise ValueError(
                "Method 'lm' only works for unconstrained problems. Use 'trf' or "
                "'dogbox' instead. (curve_fit got `bounds`.)"
            )
        if maxfev is not None:  # each iteration evaluates the residuals at least once
            options.setdefault("maxiters", int(maxfev))
        lm = {k: options.pop(k) for k in ("factor",) if k in options}
        return LevenbergMarquardt(**lm)
    scipy_options = {k: options.pop(k) for k in _LEAST_SQUARES_OPTIONS if k in options}
    if maxfev is not None:
        scipy_options.setdefault("max_nfev", maxfev)
    if scipy_options.get("max_nfev", 0) is None:
        del scipy_options["max_nfev"]
    return ScipyLeastSquares(method, **scipy_options)


def _ier(solution: Solution) -> int:
    """MINPACK's / least_squares' status for a solution: scipy's own where scipy ran, else
    1 (ftol), 2 (xtol) or 4 (gtol) from the test that stopped it, 5 at a budget, 0 else."""
    status = getattr(solution.original, "status", None)
    if isinstance(status, (int, np.integer)):
        return int(status)
    if is_traced(solution.retcode):  # under jax.jit: an array (1 converged, 5, or 0)
        code = solution.retcode
        return jnp.where(
            code == ReturnCode.SUCCESS, 1, jnp.where(code == ReturnCode.MAXITERS, 5, 0)
        )
    code = int(np.asarray(solution.retcode))
    if code == ReturnCode.MAXITERS:
        return 5
    if code != ReturnCode.SUCCESS:
        return 0
    return {1: 4, 2: 1, 11: 1, 3: 2, 12: 2}.get(int(np.asarray(solution.reason or 0)), 1)


def _infodict(problem: LeastSquaresProblem, solution: Solution, minpack: bool) -> dict:
    """scipy's infodict: nfev, njev, fvec (the whitened residuals at popt), and for 'lm'
    MINPACK's fjac (R of J's pivoted QR in its first n columns, transposed; zeros where
    MINPACK keeps its Householder vectors), ipvt and qtf; plus optsolve's solution."""
    x, p = jnp.asarray(solution.x), problem.p
    fvec = problem.residual(x, p)
    info = {
        "nfev": solution.stats.f_evals,
        "njev": solution.stats.grad_evals,
        "fvec": fvec,
        "solution": solution,
        "retcode": solution.retcode,
    }
    if minpack and not is_traced(x, p):
        jac = np.asarray(jax.jacfwd(problem.residual)(x, p), np.float64)
        m, n = jac.shape
        import scipy.linalg as sla  # here: `import optsolve` does not import scipy

        q, r, perm = sla.qr(jac, mode="economic", pivoting=True)
        fjac = np.zeros((n, m))
        fjac[:, : r.shape[0]] = r.T
        info.update(
            fjac=fjac,
            ipvt=(perm + 1).astype(np.int32),
            qtf=(q.T @ np.asarray(fvec, np.float64))[:n],
        )
    return info


def curve_fit(
    f: Callable[..., Any],
    xdata: Any,
    ydata: Any,
    p0: Any = None,
    sigma: Any = None,
    absolute_sigma: bool = False,
    check_finite: bool | None = None,
    bounds: Any = None,
    method: str | None = None,
    jac: Any = None,
    *,
    full_output: bool = False,
    nan_policy: str | None = None,
    algorithm: Any = None,
    **kwargs: Any,
) -> tuple:
    """Fit ``f(xdata, *params)`` to ``ydata`` by least squares: ``scipy.optimize.curve_fit``'s
    signature and semantics on optsolve's solvers.

    Minimises ``sum(((f(xdata, *params) - ydata) / sigma)**2)`` from ``p0``, with the
    Jacobian from JAX (``f`` is written with ``jax.numpy``). The fit works under ``jax.jit``
    and ``jax.vmap``, and ``jax.grad`` differentiates the fitted parameters with respect to
    ``xdata``, ``ydata`` and ``sigma`` (implicitly, at the solution). The covariance is
    :func:`~optsolve.covariance`'s: scipy's ``s^2 (J^T J)^-1``, inf with scipy's
    ``OptimizeWarning`` where it is indeterminate (a rank-deficient J, or no more data
    points than parameters), computed in float64 on the host for concrete inputs.

    Args:
      f: ``f(xdata, *params) -> array`` shaped like ``ydata`` (a bound method works).
      xdata: the independent variable: a list, tuple or array (converted to a float array,
        as scipy does), or anything else the model takes (None, a pytree), passed as is.
      ydata: the observations (array_like; a scalar broadcasts against f's output).
      p0: the starting parameters; None: one per parameter named in f's signature after
        xdata, 1 each (inside ``bounds``: their middle, or 1 from a one-sided bound).
      sigma: None (unit weights), a scalar or 1-D array of standard deviations of
        ``ydata``, or a 2-D covariance matrix (the residuals are whitened by its Cholesky
        factor).
      absolute_sigma: False: ``pcov`` is scaled by ``chi^2 / (m - n)``; True: sigma is
        absolute and ``pcov`` is ``(J^T J)^-1`` of the whitened residuals.
      check_finite: raise ValueError on NaN or inf in xdata / ydata (default: True unless
        ``nan_policy`` is given).
      bounds: None, ``(lower, upper)`` (scalars or arrays like p0) or
        ``scipy.optimize.Bounds``; p0 must lie within them.
      method: "lm" (default without bounds: :class:`~optsolve.LevenbergMarquardt`, Moré's
        algorithm as MINPACK's), "trf" (default with bounds) or "dogbox"
        (:class:`~optsolve.ScipyLeastSquares`).
      jac: None or one of scipy's finite-difference schemes ("2-point", "3-point", "cs"),
        which are accepted and ignored: JAX's exact Jacobian is used.
      full_output: return scipy's ``(popt, pcov, infodict, mesg, ier)``.
      nan_policy: None, "raise" (ValueError on a NaN) or "omit" (drop those data points;
        concrete data only).
      algorithm: any least-squares algorithm instead of ``method`` (optsolve's extension).
      **kwargs: ``maxfev`` (lm: the most iterations, each at least one evaluation; trf,
        dogbox: scipy's ``max_nfev``), least_squares' own options for trf / dogbox
        (``max_nfev``, ``x_scale``, ``loss``, ``f_scale``, ``tr_solver``, ``tr_options``,
        ``verbose``), ``factor`` for lm, and :func:`~optsolve.solve`'s options (maxiters,
        ftol, xtol, gtol, maxtime, callback, ...).

    Returns:
      ``(popt, pcov)``; with ``full_output``, ``(popt, pcov, infodict, mesg, ier)``:
      infodict holds ``nfev``, ``njev``, ``fvec`` (the whitened residuals at popt), for lm
      ``fjac``, ``ipvt``, ``qtf`` (from a pivoted QR of J at popt), and optsolve's
      ``solution`` and ``retcode``; mesg is the solution's message; ier is scipy's status
      (lm: 1 ftol, 2 xtol, 4 gtol).

    Raises:
      RuntimeError: (eagerly) "Optimal parameters not found" when the solver did not
        converge, as scipy does; under ``jax.jit`` nothing can be raised: read
        ``infodict["retcode"]``. A float32 fit that ends STALLED (no further progress at
        float32's precision) warns (OptimizeWarning) and returns instead.
      ValueError / TypeError: scipy's input errors (non-finite data, empty ydata, no
        parameters to infer, more parameters than data points for lm (TypeError), bounds
        with "lm", p0 outside the bounds, ``args=``, an unknown nan_policy or method).

    Differences from scipy, by design:
      1. f is traced by JAX: write it with ``jax.numpy``; ``jac`` cannot be a callable (the
         Jacobian is JAX's, exact), and finite-difference options (``epsfcn``, ``diff_step``)
         do not apply.
      2. "lm" is optsolve's Levenberg-Marquardt (Moré's algorithm, as MINPACK), not MINPACK
         itself: its iterates and counts differ slightly; ``maxfev`` bounds its iterations;
         infodict's ``fjac`` holds R only (MINPACK also stores Householder vectors).
      3. The data stay JAX arrays in JAX's dtype: without x64 they are float32 (warned
         once), and the fit runs in float32; its default tolerances scale to that precision.
      4. An indeterminate covariance is inf everywhere for every method (scipy's trf and
         dogbox return the pseudo-inverse's finite entries for a rank-deficient J).
      5. Under ``jax.jit`` / ``vmap`` / ``grad`` nothing is checked or raised (no NaN
         checks, no OptimizeWarning, no nan_policy) and mesg cannot leave the trace.

    Example:
      >>> popt, pcov = optsolve.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, y, [1.0, 0.5])
      >>> perr = jnp.sqrt(jnp.diag(pcov))
    """
    if "args" in kwargs:
        raise ValueError(
            "'args' is not a supported keyword argument. curve_fit calls "
            "f(xdata, *params); bind extra arguments with a closure or "
            "functools.partial."
        )
    if jac is not None and (callable(jac) or jac not in _FINITE_DIFFERENCES):
        raise TypeError(
            "curve_fit: `jac` must be None or '2-point', '3-point', 'cs' (ignored: "
            f"the Jacobian is JAX's, exact); got {jac!r}."
        )
    inputs = _prepare(f, xdata, ydata, p0, sigma, bounds, check_finite, nan_policy)
    options = dict(kwargs)
    algorithm = _algorithm(method, algorithm, inputs.bounds is not None, options)
    minpack = (
        type(algorithm).__name__ == "LevenbergMarquardt"
        or getattr(getattr(algorithm, "spec", None), "key", None) == "lm"
    )
    n, m = inputs.p0.shape[0], int(np.prod(inputs.ydata.shape))
    if minpack and m != 1 and n > m:
        raise TypeError(
            f"The number of func parameters={n} must not exceed the number of "
            f"data points={m} (curve_fit with method 'lm')."
        )
    if inputs.bounds is not None and not is_traced(inputs.p0, inputs.bounds):
        lower, upper = inputs.bounds
        if np.any(np.asarray(inputs.p0) < lower) or np.any(np.asarray(inputs.p0) > upper):
            raise ValueError(
                f"Initial guess is outside of provided bounds: curve_fit's `p0` "
                f"{np.asarray(inputs.p0).tolist()} must lie within `bounds`."
            )
    problem = _problem(f, inputs)
    solution = solve(problem, algorithm, **options)
    if not is_traced(solution.x) and not bool(np.asarray(solution.success)):
        low_precision = jnp.finfo(inputs.p0.dtype).eps > 1e-10
        if low_precision and int(np.asarray(solution.retcode)) == ReturnCode.STALLED:
            from scipy.optimize import OptimizeWarning  # scipy's, for scipy users' filters

            warnings.warn(
                f"curve_fit: the {inputs.p0.dtype} fit stopped where "
                f"{inputs.p0.dtype} resolves no further progress (retcode "
                "STALLED); popt is returned. Enable x64 for a tighter fit.",
                OptimizeWarning,
                stacklevel=2,
            )
        else:
            raise RuntimeError(f"Optimal parameters not found: {solution.message}")
    pcov = covariance(solution, problem, scale=not absolute_sigma)
    popt = solution.x
    if not full_output:
        return popt, pcov
    message = solution.message if not is_traced(solution.x) else ""
    return popt, pcov, _infodict(problem, solution, minpack), message, _ier(solution)
