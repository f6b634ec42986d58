"""The one definition of stationarity under box bounds, shared by the JAX-native driver's
gtol test and history, the scipy monitor and the implicit adjoint's active set.

A point x is stationary for ``min f`` over the box [lo, up] when the projected gradient
``x - P(x - g)`` vanishes (P the projection onto the box): its infinity norm is L-BFGS-B's
``pgtol`` test and optsolve's ``gtol`` test; without bounds it is ``g``. The coordinates
where it differs from ``g`` are those held at a bound by a gradient pushing outward: the
active set, which carries no sensitivity to ``p`` (Nocedal & Wright, *Numerical
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


def free_mask(x: PyTree, g: PyTree, bounds: Bounds, rtol: float = 1e-8) -> PyTree | None:
    """1 where a coordinate is free, 0 where it is active: within ``rtol * max(1, |x|)`` of
    a bound with the gradient pushing outward (JAX arrays; None without bounds)."""
    if bounds is None:
        return None
    lower, upper = bounds

    def mask(xi, gi, lo, up):
        scale = rtol * jnp.maximum(1.0, jnp.abs(xi))
        at_lower = (xi - lo <= scale) & (gi >= 0)
        at_upper = (up - xi <= scale) & (gi <= 0)
        return jnp.where(at_lower | at_upper, 0.0, 1.0).astype(jnp.result_type(xi))

    return jax.tree_util.tree_map(mask, x, g, lower, upper)
