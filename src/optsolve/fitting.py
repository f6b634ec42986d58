"""``curve_fit``: scipy's signature on optsolve's least-squares solvers.

A front end over the families (it picks a default algorithm from two of them), so it lives
beside the package's public names rather than in ``solve_api``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.covariance import covariance
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.pytree import is_traced
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


def curve_fit_problem(model: Callable[..., Any], xdata: Any, ydata: Any, p0: Any,
                      sigma: Any = None, bounds: Any = None) -> LeastSquaresProblem:
    """The :class:`~optsolve.LeastSquaresProblem` that :func:`curve_fit` solves: the
    residuals ``(model(xdata, *params) - ydata)`` whitened by ``sigma``, from ``p0``, with
    ``p = (xdata, ydata, sigma)`` (so new data reuse the compiled solve). For solving the
    fit with any algorithm and options: ``solve(curve_fit_problem(...), algorithm)``.
    Arguments as for :func:`curve_fit`."""
    p0 = jnp.asarray(p0)
    if not jnp.issubdtype(p0.dtype, jnp.floating):
        p0 = p0.astype(jnp.result_type(float))
    if p0.ndim != 1:
        raise ValueError(f"curve_fit: `p0` must be a 1-D array of parameters, got shape "
                         f"{p0.shape}.")
    if sigma is not None and jnp.ndim(sigma) not in (1, 2):
        raise ValueError(f"curve_fit: `sigma` must be None, a 1-D array of standard "
                         f"deviations or a 2-D covariance matrix, got shape {jnp.shape(sigma)}.")
    data = (xdata, ydata, None if sigma is None else jnp.asarray(sigma))
    return LeastSquaresProblem(_residual_of(model), p0, data, bounds=bounds)


def curve_fit(model: Callable[..., Any], xdata: Any, ydata: Any, p0: Any, sigma: Any = None,
              absolute_sigma: bool = False, bounds: Any = None, *, algorithm: Any = None,
              full_output: bool = False, **solve_options: Any) -> tuple:
    """Fit ``model(xdata, *params)`` to ``ydata`` by least squares, as
    ``scipy.optimize.curve_fit`` does, on optsolve's solvers.

    Minimises ``sum(((model(xdata, *params) - ydata) / sigma)**2)`` from ``p0``. Unlike
    scipy, ``p0`` is required (JAX traces the model with its shape), the model is written
    with ``jax.numpy``, and the Jacobian comes from JAX. The fit works under ``jax.jit`` and
    ``jax.vmap``, and ``jax.grad`` differentiates the fitted parameters with respect to
    ``xdata``, ``ydata`` and ``sigma`` (implicitly, at the solution).

    Args:
      model: ``model(xdata, *params) -> array`` shaped like ``ydata``.
      xdata: the independent variable: any pytree of arrays the model takes.
      ydata: the observations.
      p0: the starting parameters (a 1-D array or a list of numbers).
      sigma: None (unit weights), a 1-D array of standard deviations of ``ydata``, or a
        2-D covariance matrix of ``ydata`` (the residuals are then whitened by its
        Cholesky factor), as in scipy.
      absolute_sigma: False (default): ``pcov`` is scaled by the residual variance
        ``chi^2 / (m - n)`` (sigma gives relative weights); True: sigma is absolute and
        ``pcov`` is ``(J^T J)^-1`` of the whitened residuals.
      bounds: None, ``(lower, upper)`` (scalars or arrays like p0) or
        ``scipy.optimize.Bounds``; needs an algorithm that takes bounds.
      algorithm: the solver; default :class:`~optsolve.LevenbergMarquardt` without
        bounds and ``ScipyLeastSquares("trf")`` with them (scipy's choices).
      full_output: also return the :class:`~optsolve.Solution`.
      **solve_options: passed to :func:`~optsolve.solve` (maxiters, gtol, ftol, xtol, ...).

    Returns:
      ``(popt, pcov)``, or ``(popt, pcov, solution)`` with ``full_output``.

    Raises:
      RuntimeError: (eagerly) when the solver did not converge, as scipy does; under
        ``jax.jit`` nothing can be raised: read ``solution.retcode`` with ``full_output``.

    Example:
      >>> popt, pcov = optsolve.curve_fit(lambda t, a, k: a * jnp.exp(-k * t), t, y, [1.0, 0.5])
      >>> perr = jnp.sqrt(jnp.diag(pcov))
    """
    if algorithm is None:
        if bounds is None:
            from optsolve.backends.classical.least_squares import LevenbergMarquardt
            algorithm = LevenbergMarquardt()
        else:
            from optsolve.backends.scipy.least_squares import ScipyLeastSquares
            algorithm = ScipyLeastSquares("trf")
    problem = curve_fit_problem(model, xdata, ydata, p0, sigma, bounds)
    solution = solve(problem, algorithm, **solve_options)
    if not is_traced(solution.x) and not bool(np.asarray(solution.success)):
        raise RuntimeError(f"curve_fit: optimal parameters not found: {solution.message}")
    pcov = covariance(solution, problem, scale=not absolute_sigma)
    return (solution.x, pcov, solution) if full_output else (solution.x, pcov)
