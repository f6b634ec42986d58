"""Stationarity under box bounds, shared by the JAX-native driver's gtol test and history
and the scipy monitor; and the active set the implicit adjoint differentiates on.

A point x is stationary for ``min f`` over the box [lo, up] when the projected gradient
``x - P(x - g)`` vanishes (P the projection onto the box): its infinity norm is L-BFGS-B's
``pgtol`` test and optsolve's ``gtol`` test; without bounds it is ``g``. The coordinates
where it differs from ``g`` are those on a bound with the gradient pushing outward. The
adjoint's active set (:func:`active_sides`) also holds the coordinates that a Newton step
would carry past their bound, so that a run stopped a little inside an active bound still
has it held; the active set moves with its bound and carries no sensitivity to ``p``
(Nocedal & Wright, *Numerical Optimization*, 2006, section 16.7).

:func:`projected_gradient` and :func:`stationarity` take pytrees of JAX arrays
(``xp=jax.numpy``, the default) or flat numpy vectors (``xp=numpy``, for host code, where a
JAX call per iteration would cost a dispatch).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any
Bounds = tuple[PyTree, PyTree] | None


def projected_gradient(x: PyTree, g: PyTree, bounds: Bounds, xp: Any = jnp) -> PyTree:
    """``x - P(x - g)`` for the box ``bounds``; ``g`` itself without bounds."""
    if bounds is None:
        return g
    lower, upper = bounds
    return jax.tree_util.tree_map(
        lambda xx, gg, lo, up: xx - xp.clip(xx - gg, lo, up), x, g, lower, upper
    )


def stationarity(x: PyTree, g: PyTree, bounds: Bounds, xp: Any = jnp) -> Any:
    """The projected gradient's infinity norm (what ``gtol`` bounds)."""
    leaves = jax.tree_util.tree_leaves(projected_gradient(x, g, bounds, xp))
    if xp is jnp:
        dtype = jnp.result_type(*leaves)
        return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))
    return float(max(xp.max(xp.abs(leaf), initial=0.0) for leaf in leaves))


def active_sides(
    x: PyTree, g: PyTree, bounds: Bounds, curvature: PyTree, rtol: float = 1e-8
) -> tuple[PyTree, PyTree] | None:
    """Where a coordinate is held at its lower and at its upper bound: the gradient pushes
    outward and either x is within ``rtol * max(1, |x|)`` of the bound, or the Newton step
    along the coordinate, ``|g_i| / h_i``, would cross it (``|g_i| > gap_i * h_i``; any
    outward gradient where ``h_i <= 0``).

    The second test compares two lengths in x, so scaling f does not change it: a free
    coordinate of a slightly unconverged run, a step ``|g_i| / h_i`` from where it settles,
    is held only if that point lies past the bound; a barrier method's solution
    (trust-constr), ``mu / |g_i|`` inside an active bound on its central path, has the bound
    held once ``mu < g_i^2 / h_i``.

    Args:
      x: the point, a pytree.
      g: the gradient at x (of the Lagrangian, with general constraints), like x.
      bounds: ``(lower, upper)``, pytrees like x, or None.
      curvature: ``h``, like x: the Hessian's diagonal, or an estimate of it in f's units.
      rtol: the relative distance at which a point counts as on its bound.

    Returns:
      ``(at_lower, at_upper)``, pytrees of bools like x (None without bounds); a coordinate
      with lower == upper counts as held at its lower bound.
    """
    if bounds is None:
        return None
    lower, upper = bounds

    def held(gap, xi, gi, hi):  # one-sided: a point past its bound counts as on it
        newton_crosses = jnp.isfinite(gap) & (jnp.abs(gi) > gap * jnp.maximum(hi, 0.0))
        return (gap <= rtol * jnp.maximum(1.0, jnp.abs(xi))) | newton_crosses

    at_lower = jax.tree_util.tree_map(
        lambda xi, gi, hi, lo: held(xi - lo, xi, gi, hi) & (gi >= 0), x, g, curvature, lower
    )
    at_upper = jax.tree_util.tree_map(
        lambda xi, gi, hi, up, low: held(up - xi, xi, gi, hi) & (gi <= 0) & ~low,
        x,
        g,
        curvature,
        upper,
        at_lower,
    )
    return at_lower, at_upper
