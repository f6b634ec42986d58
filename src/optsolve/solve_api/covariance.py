"""Curvature at a solution: the covariance of fitted parameters.

For a least-squares fit it is ``s^2 (J^T J)^-1`` with ``s^2 = |r|^2 / (m - n)`` (scipy's
``curve_fit``); for a scalar objective the inverse Hessian (the asymptotic covariance of a
maximum-likelihood estimate when ``f`` is the negative log-likelihood).
"""

from __future__ import annotations

import dataclasses

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.least_squares import LeastSquaresProblem, jacobian_of
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.sense import to_minimisation
from optsolve.solve_api.solution import Solution

# Dense n x n matrices only: beyond this many parameters the matrix (and the n products
# that build it) is refused with an error that says so.
MAX_DENSE_PARAMETERS = 4096


def covariance(solution: Solution, problem: OptimizationProblem | None = None, *,
               scale: bool = True) -> jax.Array:
    """The covariance matrix of the parameters at ``solution.x``, dense (n x n).

    - Least squares (a :class:`~optsolve.LeastSquaresProblem`): ``s^2 (J^T J)^+`` with J
      the residuals' Jacobian at x and ``s^2 = |r|^2 / (m - n)`` the residual variance
      (m residuals, n parameters), as ``scipy.optimize.curve_fit`` defines it (its
      ``absolute_sigma=False``); ``scale=False`` leaves out ``s^2``. The pseudo-inverse
      comes from an SVD of J, dropping singular values below ``eps max(m, n) s_max``
      (scipy's rule); with ``m <= n`` and ``scale=True`` every entry is inf.
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
            "hand); pass it: covariance(sol, problem).")
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
            "products instead.")
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


def _least_squares_covariance(problem: LeastSquaresProblem, flat: jax.Array, unravel: Any,
                              scale: bool) -> jax.Array:
    def residuals(z):
        return ravel_pytree(problem.residual(unravel(z), problem.p))[0]

    r = residuals(flat)
    m, n = r.size, flat.size
    jac = jacobian_of(residuals, m, n)(flat)
    _, s, vt = jnp.linalg.svd(jac, full_matrices=False)
    threshold = jnp.finfo(s.dtype).eps * max(m, n) * s[0]
    inverse_s2 = jnp.where(s > threshold, 1.0 / jnp.where(s > 0, s, 1.0) ** 2, 0.0)
    cov = (vt.T * inverse_s2) @ vt
    if not scale:
        return cov
    if m <= n:
        return jnp.full((n, n), jnp.inf, cov.dtype)
    return cov * (jnp.sum(jnp.square(r)) / (m - n))
