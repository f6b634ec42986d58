"""The one definition of stationarity under box bounds, shared by the JAX-native driver's
gtol test and history, the scipy monitor and the implicit adjoint's active set.

A point x is stationary for ``min f`` over the box [lo, up] when the projected gradient
``x - P(x - g)`` vanishes (P the projection onto the box): its infinity norm is L-BFGS-B's
``pgtol`` test and optsolve's ``gtol`` test; without bounds it is ``g``. The coordinates
where it differs from ``g`` are those held at a bound by a gradient pushing outward: the
active set, which moves with its bound and carries no sensitivity to ``p`` (Nocedal & Wright, *Numerical
Optimization*, 2006, section 16.7).

Every function takes pytrees of JAX arrays (``xp=jax.numpy``, the default) or flat numpy
vectors (``xp=numpy``, for host code, where a JAX call per iteration would cost a dispatch).
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
    return jax.tree_util.tree_map(lambda xx, gg, lo, up: xx - xp.clip(xx - gg, lo, up),
                                  x, g, lower, upper)


def stationarity(x: PyTree, g: PyTree, bounds: Bounds, xp: Any = jnp) -> Any:
    """The projected gradient's infinity norm (what ``gtol`` bounds)."""
    leaves = jax.tree_util.tree_leaves(projected_gradient(x, g, bounds, xp))
    if xp is jnp:
        dtype = jnp.result_type(*leaves)
        return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))
    return float(max(xp.max(xp.abs(leaf), initial=0.0) for leaf in leaves))


def active_sides(x: PyTree, g: PyTree, bounds: Bounds,
                 rtol: float = 1e-8) -> tuple[PyTree, PyTree] | None:
    """Where a coordinate is held at its lower and at its upper bound, with the gradient
    pushing outward: within ``rtol * max(1, |x|)`` of it, or nearer to it than the gradient
    is large (gap < |g_i|). The second test is the interior-point indicator of El-Bakry,
    Tapia & Zhang ("A study of indicators for identifying zero variables in interior-point
    methods", SIAM Review 36, 1994): on the central path gap * multiplier = mu, and the
    multiplier of a bound is |g_i|, so a barrier method's solution (trust-constr) a little
    inside its active bounds still has them active. Pytrees of bools (None without bounds);
    a coordinate with lower == upper counts as held at its lower bound."""
    if bounds is None:
        return None
    lower, upper = bounds

    def held(gap, xi, gi):  # one-sided: a point past its bound counts as on it
        return (gap <= rtol * jnp.maximum(1.0, jnp.abs(xi))) | (gap < jnp.abs(gi))

    at_lower = jax.tree_util.tree_map(
        lambda xi, gi, lo: held(xi - lo, xi, gi) & (gi >= 0), x, g, lower)
    at_upper = jax.tree_util.tree_map(
        lambda xi, gi, up, low: held(up - xi, xi, gi) & (gi <= 0) & ~low, x, g, upper, at_lower)
    return at_lower, at_upper


def free_mask(x: PyTree, g: PyTree, bounds: Bounds, rtol: float = 1e-8) -> PyTree | None:
    """1 where a coordinate is free, 0 where it is active (:func:`active_sides`), in x's
    dtype (JAX arrays; None without bounds)."""
    sides = active_sides(x, g, bounds, rtol)
    if sides is None:
        return None
    return jax.tree_util.tree_map(
        lambda xi, lo, up: jnp.where(lo | up, 0.0, 1.0).astype(jnp.result_type(xi)), x, *sides)
