"""What the JAX-native solvers evaluate: the objective with ``p`` bound, and the measures of
a gradient the driver and the solvers share (finiteness, infinity norm; the projected
gradient is :mod:`optsolve.solve_api.stationarity`'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import replace
from optsolve.solve_api.trainable import ModelObjective

PyTree = Any


class Objective:
    """``f`` with ``p`` (and a batch) bound: what solvers evaluate. Built inside the trace.

    Args:
      f: ``f(x, p[, batch]) -> scalar``.
      p: the hyperparameters.
      grad: optional user gradient ``grad(x, p)``; replaces ``jax.grad(f)``.
      hvp: optional user Hessian-vector product ``hvp(x, v, p)``; replaces
        forward-over-reverse differentiation of the gradient.
      batch: the batch a run on data evaluates f on (none on the full-batch path).
    """

    def __init__(
        self,
        f: Callable[..., jax.Array],
        p: PyTree,
        grad: Callable[[PyTree, PyTree], PyTree] | None = None,
        hvp: Callable[[PyTree, PyTree, PyTree], PyTree] | None = None,
        batch: tuple = (),
    ):
        self.f = f
        self.p = p
        self.user_grad = grad
        self.user_hvp = hvp
        self.batch = batch

    @classmethod
    def from_problem(cls, problem: OptimizationProblem) -> Objective:
        """The objective of ``problem``, honouring its optional ``grad`` and ``hvp``."""
        return cls(problem.f, problem.p, problem.grad, problem.hvp)

    def value(self, x: PyTree) -> jax.Array:
        return self.f(x, self.p, *self.batch)

    def grad(self, x: PyTree) -> PyTree:
        if self.user_grad is not None:
            return self.user_grad(x, self.p)
        return jax.grad(self.f)(x, self.p, *self.batch)

    def value_and_grad(self, x: PyTree) -> tuple[jax.Array, PyTree]:
        if self.user_grad is not None:
            return self.f(x, self.p), self.user_grad(x, self.p)
        return jax.value_and_grad(self.f)(x, self.p, *self.batch)

    def hvp(self, x: PyTree, v: PyTree) -> PyTree:
        """Hessian-vector product: the user's ``hvp`` if given, else forward-over-reverse
        differentiation of the gradient (the user's gradient where given)."""
        if self.user_hvp is not None:
            return self.user_hvp(x, v, self.p)
        return jax.jvp(self.grad, (x,), (v,))[1]

    def call(self, fn: Callable[..., Any], x: PyTree, batch: bool = True) -> Any:
        """``fn(x, p[, batch])``: a function of the objective's arguments (metrics, an
        evaluation), with the batch unless ``batch`` is False."""
        return fn(x, self.p, *(self.batch if batch else ()))

    # A model's state (a problem with ``trainable``: optsolve.solve_api.trainable)

    def mutates_state(self, x: PyTree) -> bool:
        """Whether f changes the carried leaves of a model in place (BatchNorm statistics in
        train mode, a Dropout's RNG counter), decided at trace time."""
        return isinstance(self.f, ModelObjective) and self.f.mutates(x, self.p, *self.batch)

    def with_state(self, carried: tuple) -> Objective:
        """This objective with the model's carried leaves ``carried``."""
        return Objective(
            self.f, replace(self.p, carried=carried), self.user_grad, self.user_hvp, self.batch
        )

    def value_grad_and_state(self, x: PyTree) -> tuple[jax.Array, PyTree, tuple]:
        """The value, the gradient and the carried leaves as f left them."""
        (f, carried), g = jax.value_and_grad(self.f.with_state, has_aux=True)(
            x, self.p, *self.batch
        )
        return f, g, carried


def all_finite(tree: PyTree) -> jax.Array:
    """True when every entry of every leaf of ``tree`` is finite."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def inf_norm(tree: PyTree) -> jax.Array:
    """The largest absolute entry over all leaves of ``tree``."""
    leaves = jax.tree_util.tree_leaves(tree)
    dtype = jnp.result_type(*leaves)
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))
