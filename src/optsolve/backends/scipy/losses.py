"""scipy.optimize.least_squares's robust losses, written once for numpy and jax.numpy.

scipy minimises ``0.5 * sum(f_scale**2 * rho((r / f_scale)**2))`` over the residuals ``r``
(``_lsq/least_squares.py``: ``huber``, ``soft_l1``, ``cauchy``, ``arctan``,
``construct_loss_function``). :class:`RobustCost` is that cost as the objective of an
:class:`~optsolve.OptimizationProblem`: what the implicit adjoint differentiates and what
``Solution.objective`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any

LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")


def rho(z: Any, loss: str, xp: Any = jnp) -> Any:
    """scipy's rho(z) of ``loss`` at ``z = (r / f_scale)**2 >= 0``, with ``xp`` numpy or
    jax.numpy."""
    if loss == "linear":
        return z
    if loss == "soft_l1":
        return 2.0 * (xp.sqrt(1.0 + z) - 1.0)
    if loss == "huber":
        # sqrt of z only where it is taken: at z = 0 the discarded branch's derivative is
        # infinite, and a where() would turn its zero weight into a NaN gradient.
        return xp.where(z <= 1.0, z, 2.0 * xp.sqrt(xp.where(z <= 1.0, 1.0, z)) - 1.0)
    if loss == "cauchy":
        return xp.log1p(z)
    if loss == "arctan":
        return xp.arctan(z)
    raise ValueError(f"rho: unknown loss {loss!r}; one of {', '.join(LOSSES)}.")


def robust_cost(r: Any, loss: str, f_scale: float, xp: Any = jnp) -> Any:
    """``0.5 * sum(f_scale**2 * rho((r / f_scale)**2))`` for a flat residual vector ``r``:
    scipy's ``cost`` (``0.5 * sum(r**2)`` for the linear loss)."""
    if loss == "linear":
        return 0.5 * xp.sum(r * r)
    z = (r / f_scale) ** 2
    return 0.5 * f_scale**2 * xp.sum(rho(z, loss, xp))


class RobustCost:
    """``f(x, p)``: scipy's robust cost of ``residual(x, p)`` (all leaves of the residual
    pytree together).

    Equal to another one with the same residual, loss and f_scale, so that problems built
    from them share compiled code (an objective is static aux data)."""

    def __init__(self, residual: Callable[[PyTree, PyTree], PyTree], loss: str, f_scale: float):
        self.residual, self.loss, self.f_scale = residual, loss, float(f_scale)

    def __call__(self, x: PyTree, p: PyTree) -> jax.Array:
        leaves = jax.tree_util.tree_leaves(self.residual(x, p))
        return sum(robust_cost(jnp.ravel(leaf), self.loss, self.f_scale) for leaf in leaves)

    def _key(self) -> tuple:
        return (self.residual, self.loss, self.f_scale)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RobustCost) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash((RobustCost, *self._key()))

    def __repr__(self) -> str:
        return f"RobustCost({self.residual!r}, loss={self.loss!r}, f_scale={self.f_scale!r})"
