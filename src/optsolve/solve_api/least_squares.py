"""Residual problems: minimise ``0.5 |r(x, p)|^2`` for a residual function ``r``.

A :class:`LeastSquaresProblem` is an :class:`OptimizationProblem` whose objective is half the
squared norm of the residuals, so every scalar algorithm solves it too; the least-squares
algorithms (Gauss-Newton, Levenberg-Marquardt, scipy's ``least_squares``) use the residuals
and their Jacobian instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass, static_field

PyTree = Any


class HalfSquaredNorm:
    """``f(x, p) = 0.5 * sum(r(x, p)**2)`` over every leaf of the residual pytree.

    Equal to another one with the same residual function, so that two problems built from
    one residual share compiled code (the objective is static aux data)."""

    def __init__(self, residual: Callable[[PyTree, PyTree], PyTree]):
        self.residual = residual

    def __call__(self, x: PyTree, p: PyTree) -> jax.Array:
        leaves = jax.tree_util.tree_leaves(self.residual(x, p))
        # an array: check_residual refuses a residual without leaves, where sum() gives 0
        return cast(jax.Array, 0.5 * sum(jnp.sum(jnp.square(leaf)) for leaf in leaves))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, HalfSquaredNorm) and other.residual == self.residual

    def __hash__(self) -> int:
        return hash((HalfSquaredNorm, self.residual))

    def __repr__(self) -> str:
        return f"HalfSquaredNorm({self.residual!r})"


@pytree_dataclass
class LeastSquaresProblem(OptimizationProblem):
    """Minimise ``0.5 * |residual(x, p)|^2`` over ``x``, starting from ``x0``.

    The objective ``f`` is derived from the residuals (``prob.f(x, p)`` is
    ``0.5 * sum(r**2)``, scipy's ``least_squares`` cost), so any algorithm solves it:
    ``solve(prob, optsolve.LBFGS())``. :class:`~optsolve.GaussNewton`,
    :class:`~optsolve.LevenbergMarquardt` and :class:`~optsolve.ScipyLeastSquares` use the
    residuals and their Jacobian.

    Args:
      residual: ``residual(x, p) -> array``, or any pytree of real floating-point arrays
        (all of them residuals).
      x0: the starting point; any pytree of real floating-point arrays (a list of numbers
        is one array).
      p: hyperparameters or data (or None); differentiable through ``solve``.
      bounds: ``(lower, upper)`` as for :class:`OptimizationProblem`.

    Example:
      >>> import jax.numpy as jnp
      >>> t = jnp.linspace(0.0, 3.0, 20)
      >>> decay = lambda x, y: x[0] * jnp.exp(-x[1] * t) - y
      >>> prob = LeastSquaresProblem(decay, jnp.array([1.0, 0.5]), p=2.0 * jnp.exp(-1.3 * t))
    """

    residual: Callable[[PyTree, PyTree], PyTree] = static_field(default=None)

    def __init__(self, residual, x0, p=None, *, bounds=None):
        if not callable(residual):
            raise TypeError(
                "LeastSquaresProblem: `residual` must be a callable residual(x, p) -> array, "
                f"got {residual!r}."
            )
        super().__init__(HalfSquaredNorm(residual), x0, p, bounds=bounds)
        object.__setattr__(self, "residual", residual)

    def replace(self, **changes: Any) -> LeastSquaresProblem:
        """A new problem with some of ``residual``, ``x0``, ``p``, ``bounds`` changed."""
        # solve's internals pass grad/hvp/constraints unchanged (None) when they rebuild one
        for name in ("sense", "has_aux", "trainable"):  # solve's internals pass them unchanged
            if changes.pop(name, getattr(self, name)) != getattr(self, name):
                raise TypeError(
                    f"LeastSquaresProblem.replace: `{name}` cannot change (a sum of "
                    "squares is minimised); valid fields are residual, x0, p, bounds."
                )
        for name in ("grad", "hvp", "constraints"):
            if changes.get(name) is not None:
                raise TypeError(
                    f"LeastSquaresProblem.replace: a least-squares problem has no "
                    f"`{name}`; valid fields are residual, x0, p, bounds."
                )
            changes.pop(name, None)
        if "f" in changes:
            raise TypeError(
                "LeastSquaresProblem.replace: `f` is 0.5 * |residual|^2; replace "
                "`residual` instead (valid fields are residual, x0, p, bounds)."
            )
        unknown = set(changes) - {"residual", "x0", "p", "bounds"}
        if unknown:
            raise TypeError(
                f"LeastSquaresProblem.replace: unknown field(s) {sorted(unknown)}; "
                "valid fields are residual, x0, p, bounds."
            )
        fields = {
            "residual": self.residual,
            "x0": self.x0,
            "p": self.p,
            "bounds": self.bounds,
            **changes,
        }
        return LeastSquaresProblem(
            fields["residual"], fields["x0"], fields["p"], bounds=fields["bounds"]
        )


def jacobian_of(
    fn: Callable[[jax.Array], jax.Array], m: int, n: int
) -> Callable[[jax.Array], jax.Array]:
    """The dense Jacobian function of ``fn``: R^n -> R^m: forward mode (n passes) when
    m >= n, else reverse mode (m passes), the cheaper of the two."""
    return jax.jacfwd(fn) if m >= n else jax.jacrev(fn)


def residual_size(problem: LeastSquaresProblem) -> int:
    """The number of residuals (all leaves together), from the residual's shapes."""
    out = jax.eval_shape(problem.residual, problem.x0, problem.p)
    return sum(_size(leaf.shape) for leaf in jax.tree_util.tree_leaves(out))


def check_residual(problem: LeastSquaresProblem) -> None:
    """Raise a clear error unless ``residual(x0, p)`` is a pytree of real floating-point
    arrays with at least one entry."""
    out = jax.eval_shape(problem.residual, problem.x0, problem.p)
    leaves = jax.tree_util.tree_leaves(out)
    if not leaves or not all(hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves):
        raise TypeError(
            "LeastSquaresProblem: `residual(x, p)` must return an array (or a pytree of "
            f"arrays) of residuals, got {jax.tree_util.tree_structure(out)}."
        )
    for leaf in leaves:
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise TypeError(
                "LeastSquaresProblem: `residual(x, p)` must return real floating-point "
                f"residuals, got dtype {leaf.dtype}. Convert them, e.g. with .astype(float), "
                "or take jnp.abs / .real of complex ones (or stack real and imaginary parts)."
            )
    if sum(_size(leaf.shape) for leaf in leaves) == 0:
        raise ValueError(
            "LeastSquaresProblem: `residual(x, p)` returned no residuals (every array is empty)."
        )


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))
