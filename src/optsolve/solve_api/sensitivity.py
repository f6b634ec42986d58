"""The tangent of a minimiser x*(p, bounds) of a problem without general constraints.

At x* the gradient vanishes on the free coordinates and each active coordinate equals its
bound. Differentiating both (Nocedal & Wright, *Numerical Optimization*, 2006, section 16.7;
Blondel et al., "Efficient and Modular Implicit Differentiation", NeurIPS 2022):

    dx_A = d(bound)_A,    H_FF dx_F = -(d/dp grad_x f)_F dp - H_FA dx_A,

with H the Hessian of f in x. Active and free come from
:func:`~optsolve.solve_api.stationarity.active_sides`: a coordinate is held where the
gradient pushes it outward and it is on its bound (where the driver's gtol test projects
the gradient) or the Newton step along it would cross the bound, with the Hessian's
diagonal as the curvature (exact for n <= 256, else estimated from one Hessian product,
:func:`coordinate_curvature`). The system is solved matrix-free on x flattened to one
vector: ``lax.custom_linear_solve`` transposes only when every entry of its right-hand side
is linear in the tangents, which a leaf of x that does not depend on p would break (its
entry of the right-hand side is a constant zero).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.stationarity import active_sides

PyTree = Any
Vector = jax.Array
# solve(matvec, b, preconditioner) -> v with H v = b (see solution_tangent's ``solve``)
LinearSolve = Callable[
    [Callable[[Vector], Vector], Vector, Callable[[Vector], Vector] | None], Vector
]

_EXACT_DIAGONAL_MAX = 256  # above this, n Hessian products for the diagonal cost too much


def _bound_tangent(
    x: PyTree, sides: tuple[PyTree, PyTree], bounds_dot: tuple[PyTree, PyTree]
) -> PyTree:
    """d(bound) on the active coordinates (the lower bound's tangent where x is held at its
    lower bound, the upper's where at its upper), 0 on the free ones."""
    at_lower, at_upper = sides
    lower_dot, upper_dot = bounds_dot
    return jax.tree_util.tree_map(
        lambda xi, lo, up, dlo, dup: jnp.where(lo, dlo, jnp.where(up, dup, 0.0)).astype(
            jnp.result_type(xi)
        ),
        x,
        at_lower,
        at_upper,
        lower_dot,
        upper_dot,
    )


def hessian_product(problem: OptimizationProblem, x: PyTree) -> Callable[[PyTree], PyTree]:
    """v -> H v at ``x``: the user's ``hvp`` where given, else the gradient linearised once
    (each product then costs a tangent pass, not a recomputation of the gradient)."""
    hvp = problem.hvp
    if hvp is not None:
        return lambda v: hvp(x, v, problem.p)
    grad_fn = problem.grad if problem.grad is not None else jax.grad(problem.f)
    return jax.linearize(lambda y: grad_fn(y, problem.p), x)[1]


def coordinate_curvature(
    hvp_flat: Callable[[jax.Array], jax.Array], x: PyTree, g: PyTree, bounds: tuple[PyTree, PyTree]
) -> PyTree:
    """The curvature of f along each coordinate, for the active-set test of
    :func:`~optsolve.solve_api.stationarity.active_sides`.

    Args:
      hvp_flat: v -> H v on x flattened to one vector.
      x: the solution.
      g: the gradient at x, like x.
      bounds: the box (lower, upper), pytrees like x.

    Returns:
      A pytree like x: the Hessian's diagonal (n products) where x has at most 256 entries;
      above that, for every coordinate, the Rayleigh quotient ``d.Hd / d.d`` of the gradient
      ``d`` restricted to the coordinates it pushes towards a finite bound (one product).
    """
    flat_x, unravel = ravel_pytree(x)
    n = flat_x.size
    if n <= _EXACT_DIAGONAL_MAX:
        return unravel(jax.vmap(lambda e: jnp.dot(e, hvp_flat(e)))(jnp.eye(n, dtype=flat_x.dtype)))
    lower, upper = bounds
    outward = ravel_pytree(
        jax.tree_util.tree_map(
            lambda gi, lo, up: ((gi > 0) & jnp.isfinite(lo)) | ((gi < 0) & jnp.isfinite(up)),
            g,
            lower,
            upper,
        )
    )[0]
    # released, the candidates would move along -d; the curvature along it scales with f as H_ii
    d = jnp.where(outward, ravel_pytree(g)[0], 0.0).astype(flat_x.dtype)
    dd = jnp.dot(d, d)
    rayleigh = jnp.dot(d, hvp_flat(d)) / jnp.where(dd > 0, dd, 1.0)
    return unravel(jnp.full_like(flat_x, rayleigh))


def solution_tangent(
    problem: OptimizationProblem,
    x: PyTree,
    p_dot: PyTree | None,
    bounds_dot: tuple[PyTree, PyTree] | None,
    solve: LinearSolve,
    ridge: Any = 0.0,
    inverse_hessian: Callable[[jax.Array], jax.Array] | None = None,
) -> PyTree:
    """dx at the minimiser ``x`` for tangents ``p_dot`` of p and ``bounds_dot`` of the
    bounds (None where that input is not differentiated).

    Args:
      problem: the problem solved (its p and bounds are the primal values).
      x: the solution.
      p_dot: the tangent of ``problem.p`` (zeros, or float0 for integer leaves, where a
        leaf is not differentiated), or None.
      bounds_dot: the tangents of ``problem.bounds`` (lower, upper), or None.
      solve: ``solve(matvec, b, preconditioner)`` for H v = b on flat vectors (symmetric
        H; ``preconditioner`` v -> M v, M ~ H^-1, or None). It must give the minimum-norm
        least-squares solution where H is singular: ``lax.custom_linear_solve`` transposes
        with the same solve (``symmetric=True``), and only then does reverse mode, whose
        cotangent may have a component in H's null space, equal forward mode.
      ridge: added to H's diagonal (regularises a singular H instead).
      inverse_hessian: the run's own estimate of v -> H^-1 v on flat vectors (an L-BFGS
        memory), the solver's preconditioner (restricted to the free coordinates), or None.

    Returns:
      dx, a pytree like x.
    """
    grad_fn = problem.grad if problem.grad is not None else jax.grad(problem.f)
    if p_dot is None:
        g = grad_fn(x, problem.p)
        rhs = None
    else:
        g, rhs = jax.jvp(lambda p: grad_fn(x, p), (problem.p,), (p_dot,))
    if rhs is None and (problem.bounds is None or bounds_dot is None):
        return jax.tree_util.tree_map(jnp.zeros_like, x)

    flat_x, unravel = ravel_pytree(x)
    hvp = hessian_product(problem, x)

    def hvp_flat(v: jax.Array) -> jax.Array:
        return ravel_pytree(hvp(unravel(v)))[0]

    b = -ravel_pytree(rhs)[0] if rhs is not None else jnp.zeros_like(flat_x)
    if problem.bounds is None:

        def ridged(v):
            return hvp_flat(v) + ridge * v

        return unravel(
            lax.custom_linear_solve(
                ridged, b, solve=lambda mv, rhs: solve(mv, rhs, inverse_hessian), symmetric=True
            )
        )

    sides = active_sides(x, g, problem.bounds, coordinate_curvature(hvp_flat, x, g, problem.bounds))
    assert sides is not None  # None only without bounds
    free = (
        1.0
        - ravel_pytree(
            jax.tree_util.tree_map(lambda lo, up: (lo | up).astype(flat_x.dtype), *sides)
        )[0]
    )

    def matvec(v):
        return free * (hvp_flat(free * v) + ridge * v) + (1.0 - free) * v

    if bounds_dot is not None:
        flat_dbound = ravel_pytree(_bound_tangent(x, sides, bounds_dot))[0]
        b = free * (b - hvp_flat(flat_dbound)) + flat_dbound
    else:
        b = free * b
    preconditioner = (
        None
        if inverse_hessian is None
        else (lambda v: free * inverse_hessian(free * v) + (1.0 - free) * v)
    )
    return unravel(
        lax.custom_linear_solve(
            matvec, b, solve=lambda mv, rhs: solve(mv, rhs, preconditioner), symmetric=True
        )
    )
