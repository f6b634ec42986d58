"""Derivatives of a run that only forward mode can see through, in either mode.

Some runs cannot be reverse-differentiated as written: optax's line searches loop with
``lax.while_loop``, which JAX cannot transpose, and ``optax.scale_by_lbfgs`` divides by zero
inside a ``jnp.where`` on its first step, whose cotangent is NaN (optax's L-BFGS is not
written to be backpropagated through, optax issue 1201). Forward mode sees through both.
:func:`by_forward_passes` wraps such a run in a ``custom_jvp`` whose rule computes the
Jacobian with respect to the differentiated inputs by forward passes (one per input
element, batched) and applies it to the tangents: a linear map that reverse mode can
transpose. The cost is one forward pass per differentiated number (a hyperparameter or two
is cheap; a large ``p`` is not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

PyTree = Any


def _is_zero(tangent: Any) -> bool:
    return isinstance(tangent, SymbolicZero)


def _differentiable(leaf: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)


def by_forward_passes(call: Callable[..., PyTree], leaves: list[Any]) -> PyTree:
    """``call(*leaves)``, differentiable in forward and reverse mode through forward passes
    only (see the module docstring).

    Args:
      call: a function of ``leaves`` returning a pytree (a Solution).
      leaves: its inputs, arrays and Python numbers.

    Returns:
      ``call(*leaves)``.
    """

    @jax.custom_jvp
    def run(*inputs):
        return call(*inputs)

    def rule(primals, tangents):
        moved = [i for i, t in enumerate(tangents) if not _is_zero(t)]
        if not moved:
            out = call(*primals)
            out_leaves, out_def = jax.tree_util.tree_flatten(out)
            return out, jax.tree_util.tree_unflatten(out_def, [_zero(o) for o in out_leaves])

        def of_moved(*values):
            args = list(primals)
            for i, value in zip(moved, values):
                args[i] = value
            out = call(*args)
            return [o for o in jax.tree_util.tree_leaves(out) if _differentiable(o)], out

        # jacobians[k][j]: output leaf k (float ones only) by moved input j; the run's own
        # output comes back as the auxiliary value (the primal pass, not one more run)
        jacobians, out = jax.jacfwd(of_moved, argnums=tuple(range(len(moved))), has_aux=True)(
            *(primals[i] for i in moved)
        )
        out_leaves, out_def = jax.tree_util.tree_flatten(out)
        float_outputs = iter(jacobians)
        out_tangents = []
        for o in out_leaves:
            if not _differentiable(o):
                out_tangents.append(_zero(o))
                continue
            blocks = next(float_outputs)
            total = jnp.zeros(jnp.shape(o), jnp.result_type(o))
            for block, j in zip(blocks, moved):
                t = jnp.asarray(tangents[j])
                total = total + jnp.tensordot(block, t.astype(block.dtype), axes=np.ndim(t))
            out_tangents.append(total)
        return out, jax.tree_util.tree_unflatten(out_def, out_tangents)

    run.defjvp(rule, symbolic_zeros=True)
    return run(*leaves)


def _zero(leaf: Any) -> Any:
    """A zero tangent for an output leaf (float0 for integer and bool leaves)."""
    if _differentiable(leaf):
        return jnp.zeros(jnp.shape(leaf), jnp.result_type(leaf))
    return np.zeros(np.shape(leaf), dtype=jax.dtypes.float0)
