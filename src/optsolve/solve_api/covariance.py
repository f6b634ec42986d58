"""Curvature at a solution: the covariance of fitted parameters.

For a least-squares fit it is ``s^2 (J^T J)^-1`` with ``s^2 = |r|^2 / (m - n)`` (scipy's
``curve_fit``); for a scalar objective the inverse Hessian (the asymptotic covariance of a
maximum-likelihood estimate when ``f`` is the negative log-likelihood).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.least_squares import LeastSquaresProblem, jacobian_of
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced
from optsolve.solve_api.sense import to_minimisation
from optsolve.solve_api.solution import Solution

# Dense n x n matrices only: beyond this many parameters the matrix (and the n products
# that build it) is refused with an error that says so.
MAX_DENSE_PARAMETERS = 4096


def covariance(
    solution: Solution, problem: OptimizationProblem | None = None, *, scale: bool = True
) -> jax.Array:
    """The covariance matrix of the parameters at ``solution.x``, dense (n x n).

    - Least squares (a :class:`~optsolve.LeastSquaresProblem`): ``s^2 (J^T J)^+`` with J
      the residuals' Jacobian at x and ``s^2 = |r|^2 / (m - n)`` the residual variance
      (m residuals, n parameters), as ``scipy.optimize.curve_fit`` defines it (its
      ``absolute_sigma=False``); ``scale=False`` leaves out ``s^2``. The inverse comes from
      an SVD of J with its columns scaled to unit norm; where a singular value of that J is
      at or below ``eps max(m, n) s_max`` (scipy's cutoff, eps of the dtype J is computed
      in), the covariance is indeterminate and every entry is inf, as scipy's curve_fit
      (method "lm") gives it; so too with ``m <= n`` and ``scale=True``. For concrete
      inputs J and r come from JAX in x's dtype and are factorised in float64 NumPy (a
      float32 fit gets float64's resolution of J), and an indeterminate covariance warns
      (scipy's ``OptimizeWarning``); under a JAX transformation all of it runs in x's
      dtype and nothing warns.
    - A scalar objective: the inverse Hessian of f at x (for f a negative log-likelihood,
      the asymptotic covariance of the maximum-likelihood estimate; for a log-likelihood
      maximised with ``sense="max"``, of -f); ``scale`` is ignored.

    Standard errors are ``jnp.sqrt(jnp.diag(cov))``. Rows and columns follow x flattened
    by ``jax.flatten_util.ravel_pytree`` (x itself when it is one array). Works under
    ``jax.jit``, ``jax.vmap`` and ``jax.grad``.

    Args:
      solution: a Solution returned by :func:`~optsolve.solve`.
      problem: the problem it solves; by default the one ``solve`` attached to the
        solution (a Solution that left ``jax.jit`` holds none: pass it).
      scale: multiply by the residual variance ``s^2`` (least squares only; default True).

    Returns:
      An (n, n) array.

    Raises:
      ValueError: without a problem, or with more than ``MAX_DENSE_PARAMETERS`` parameters.
    """
    problem = problem if problem is not None else getattr(solution, "problem", None)
    if problem is None:
        raise ValueError(
            "covariance: this Solution holds no problem (it crossed jax.jit, or was built by "
            "hand); pass it: covariance(sol, problem)."
        )
    if isinstance(solution.x, list):  # an x0 given as a list of numbers: f takes one array
        solution = dataclasses.replace(solution, x=jnp.asarray(solution.x))
    # the curvature of what was minimised: -f for sense="max", f's value for has_aux
    problem = to_minimisation(problem)
    n = sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(solution.x))
    if n > MAX_DENSE_PARAMETERS:
        raise ValueError(
            f"covariance: x has {n} parameters; the dense {n} x {n} covariance is limited to "
            f"{MAX_DENSE_PARAMETERS} parameters (optsolve.solve_api.covariance."
            "MAX_DENSE_PARAMETERS). Compute the variances you need from Hessian-vector "
            "products instead."
        )
    if isinstance(problem, LeastSquaresProblem) and not is_traced(solution.x, problem):
        return _host_least_squares_covariance(problem, solution.x, scale)
    return _compiled_covariance(problem, solution.x, scale)


def _covariance(problem: OptimizationProblem, x: Any, scale: bool) -> jax.Array:
    flat, unravel = ravel_pytree(x)
    if isinstance(problem, LeastSquaresProblem):
        return _least_squares_covariance(problem, flat, unravel, scale)
    hessian = jax.hessian(lambda z: problem.f(unravel(z), problem.p))(flat)
    return jnp.linalg.pinv(0.5 * (hessian + hessian.T), hermitian=True)


# one compiled program per problem structure: eagerly, op-by-op dispatch of the Jacobian,
# the SVD and the products costs more than compiling them once
_compiled_covariance = jax.jit(_covariance, static_argnums=2)


def _least_squares_covariance(
    problem: LeastSquaresProblem, flat: jax.Array, unravel: Any, scale: bool
) -> jax.Array:
    cov, determinate, variance = _least_squares_pieces(problem, flat, unravel)
    n = flat.size
    if scale:
        cov = cov * variance
    return jnp.where(determinate, cov, jnp.full((n, n), jnp.inf, cov.dtype))


def _residuals_and_jacobian(
    problem: LeastSquaresProblem, flat: jax.Array, unravel: Any
) -> tuple[jax.Array, jax.Array]:
    def residuals(z):
        return ravel_pytree(problem.residual(unravel(z), problem.p))[0]

    r = residuals(flat)
    return r, jacobian_of(residuals, r.size, flat.size)(flat)


def _least_squares_pieces(problem, flat, unravel):
    """((J^T J)^+, whether J has full column rank, s^2 = |r|^2 / (m - n)) in x's dtype."""
    r, jac = _residuals_and_jacobian(problem, flat, unravel)
    m, n = jac.shape
    return (*_pseudo_inverse(jac, jnp), _variance(r, m, n, jnp))


def _pseudo_inverse(jac, xp, eps=None):
    """(J^T J)^-1 from an SVD of J with its columns scaled to unit norm (so that parameters
    of very different sizes, Misra1a's b1 ~ 240 and b2 ~ 5e-4, leave no spurious small
    singular value), and whether every singular value of that scaled J is above
    ``eps max(m, n) s_max`` (scipy's cutoff; eps: that of the dtype J was computed in).
    Below it, the direction is not resolved: its variance is indeterminate."""
    m, n = jac.shape
    eps = xp.finfo(jac.dtype).eps if eps is None else eps
    norms = xp.sqrt(xp.sum(jac * jac, axis=0))
    norms = xp.where(norms > 0, norms, 1.0)
    _, s, vt = xp.linalg.svd(jac / norms, full_matrices=False)
    determinate = (s.size == n) & xp.all(s > eps * max(m, n) * s[0]) & xp.all(xp.isfinite(s))
    safe = xp.where(s > 0, s, 1.0)
    cov = (vt.T / safe**2) @ vt
    return cov / norms[:, None] / norms[None, :], determinate


def _variance(r, m, n, xp):
    if m <= n:
        return xp.asarray(xp.inf, r.dtype)
    return xp.sum(r * r) / (m - n)


def _pieces_at(problem: LeastSquaresProblem, x: Any) -> tuple[jax.Array, jax.Array]:
    flat, unravel = ravel_pytree(x)
    return _residuals_and_jacobian(problem, flat, unravel)


_compiled_pieces = jax.jit(_pieces_at)


def _host_least_squares_covariance(problem: LeastSquaresProblem, x: Any, scale: bool) -> jax.Array:
    """The covariance from J and r computed by JAX (in x's dtype) and factorised in float64
    NumPy: float32's own SVD cannot resolve the singular values of an ill-conditioned J."""
    r, jac = _compiled_pieces(problem, x)
    eps = float(np.finfo(np.dtype(jac.dtype)).eps)
    r, jac = np.asarray(r, np.float64), np.asarray(jac, np.float64)
    m, n = jac.shape
    if np.all(np.isfinite(jac)):
        cov, determinate = _pseudo_inverse(jac, np, eps)
    else:
        cov, determinate = np.zeros((n, n)), False
    variance = _variance(r, m, n, np)
    if not determinate or (scale and not np.isfinite(variance)):
        why = (
            "J is rank-deficient at x, to the precision it was computed in"
            if not determinate
            else f"there are {m} residuals for {n} parameters, none left for the variance"
        )
        from scipy.optimize import OptimizeWarning  # scipy's, for scipy users' filters

        warnings.warn(
            f"Covariance of the parameters could not be estimated: {why}; its entries are inf.",
            OptimizeWarning,
            stacklevel=3,
        )
        return jnp.full((n, n), jnp.inf, jac.dtype)
    if scale:
        cov = cov * variance
    return jnp.asarray(cov.astype(jac.dtype))
