"""``lax.cond`` that, under ``jax.vmap``, runs only the branches some member of the batch
takes.

Under ``jax.vmap`` with a batched predicate, ``lax.cond`` becomes a select: both branches
run for every member, whatever the predicates. :func:`cond` returns the same values as
``lax.cond`` (unbatched, it *is* ``lax.cond``), but its batching rule looks at the batch's
predicates when the program runs: the true branch runs (over the whole batch) only if some
member takes it, the false branch only if some member does not, and the members' results
are selected as ``lax.cond``'s own rule selects them. Where one branch is rare, as an
iterative method's recovery phase, the batch pays for it only in the iterations where some
member takes it.

The batched program holds each branch once, as ``lax.cond``'s does, with two conds and
the select around them. Nested ``jax.vmap`` is handled level by level (the conds that
decide whether a branch runs are themselves :func:`cond`'s).

Derivatives (forward and reverse mode, batched or not) come from a custom JVP rule that
never meets the batching rule (which reverse mode could not transpose): each branch's JVP
with the tangents selected by the predicate. It runs both branches, so a derivative costs
what a batched ``lax.cond`` does.
"""

# Our own: JAX has no cond whose batching rule skips a branch no member takes (its
# custom_vmap is the means to write one; this is that rule).

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.core import eval_jaxpr
from jax.custom_batching import custom_vmap
from jax.dtypes import float0

PyTree = Any


def cond(pred: Any, true_fun: Callable, false_fun: Callable, *operands: PyTree) -> PyTree:
    """``true_fun(*operands)`` where ``pred`` holds, else ``false_fun(*operands)``.

    The same contract as ``jax.lax.cond`` (the branches return pytrees of one structure,
    shapes and dtypes), with a boolean ``pred``; under ``jax.vmap`` a branch that no member
    of the batch takes is not run (the module docstring). The branches may close over
    traced values, batched or not.

    Args:
      pred: a boolean scalar.
      true_fun, false_fun: the branches, functions of ``operands``.
      *operands: their arguments (pytrees of arrays).

    Returns:
      The chosen branch's result.
    """
    pred = jnp.asarray(pred)
    if pred.shape != () or pred.dtype != jnp.bool_:
        raise TypeError(f"cond: pred must be a boolean scalar, got {pred.dtype}{list(pred.shape)}")
    flat, in_tree = jax.tree_util.tree_flatten(operands)

    def flat_branch(fun):
        return lambda *leaves: fun(*jax.tree_util.tree_unflatten(in_tree, leaves))

    # each branch as a jaxpr whose closed-over values (tracers of any dtype included)
    # become explicit arguments: a batching rule sees only its arguments
    true_jaxpr, true_shape = jax.make_jaxpr(flat_branch(true_fun), return_shape=True)(*flat)
    false_jaxpr, false_shape = jax.make_jaxpr(flat_branch(false_fun), return_shape=True)(*flat)
    out_tree = jax.tree_util.tree_structure(true_shape)
    if out_tree != jax.tree_util.tree_structure(false_shape) or [
        (a.shape, a.dtype) for a in jax.tree_util.tree_leaves(true_shape)
    ] != [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(false_shape)]:
        raise TypeError(
            "cond: the branches must return the same structure, shapes and dtypes; "
            f"got {true_shape} and {false_shape}"
        )
    branches = (true_jaxpr.jaxpr, false_jaxpr.jaxpr)
    out = _cond(branches, pred, list(true_jaxpr.consts), list(false_jaxpr.consts), list(flat))
    return jax.tree_util.tree_unflatten(out_tree, out)


def _run(jaxpr: Any, consts: list, leaves: list) -> list:
    """One branch's flat result from its jaxpr, closed-over values and operands."""
    return eval_jaxpr(jaxpr, consts, *leaves)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def _cond(
    branches: tuple, pred: jax.Array, true_consts: list, false_consts: list, leaves: list
) -> list:
    return _batch_aware(branches)(pred, true_consts, false_consts, leaves)


@_cond.defjvp
def _cond_jvp(branches, primals, tangents):
    # The tangent is each branch's JVP with its input tangents zeroed where the other
    # branch is taken, then selected: linear in the tangents through selects alone, so that
    # reverse mode transposes it, batched or not (lax.cond's JVP, batched inside this
    # rule, would pass the tangents through stop_gradient, which does not transpose), and
    # a branch not taken (whose derivative may not be finite there) sends no cotangent back.
    pred, true_consts, false_consts, leaves = primals
    _, dtrue, dfalse, dleaves = tangents
    out = _cond(branches, *primals)

    def where(take, a, b):
        return a if a.dtype == float0 else lax.select(take, a, b)

    def tangent(jaxpr, consts, dconsts, take):
        zero = lambda d: where(take, d, jnp.zeros_like(d))
        return jax.jvp(
            lambda c, x: _run(jaxpr, c, x),
            (consts, leaves),
            (list(map(zero, dconsts)), list(map(zero, dleaves))),
        )[1]

    on_true = tangent(branches[0], true_consts, dtrue, pred)
    on_false = tangent(branches[1], false_consts, dfalse, ~pred)
    return out, [where(pred, a, b) for a, b in zip(on_true, on_false)]


def _batch_aware(branches: tuple) -> Any:
    """The custom_vmap function of one pair of branches: unbatched, ``lax.cond``."""
    true_jaxpr, false_jaxpr = branches

    @custom_vmap
    def select(pred, true_consts, false_consts, leaves):
        return lax.cond(
            pred,
            lambda c, _, x: _run(true_jaxpr, c, x),
            lambda _, c, x: _run(false_jaxpr, c, x),
            true_consts,
            false_consts,
            leaves,
        )

    @select.def_vmap
    def rule(axis_size, in_batched, pred, true_consts, false_consts, leaves):
        pred_b, true_b, false_b, leaves_b = in_batched
        axes = lambda batched: [0 if b else None for b in batched]

        def over_batch(jaxpr, consts_b):
            # every output batched (an unbatched one broadcast), whichever program runs
            return jax.vmap(
                lambda c, x: _run(jaxpr, c, x),
                in_axes=(axes(consts_b), axes(leaves_b)),
                axis_size=axis_size,
            )

        run_true, run_false = over_batch(true_jaxpr, true_b), over_batch(false_jaxpr, false_b)

        def only_true(tc, fc, x):
            return run_true(tc, x)

        def only_false(tc, fc, x):
            return run_false(fc, x)

        args = (true_consts, false_consts, leaves)
        if not pred_b:
            out = lax.cond(pred, only_true, only_false, *args)
        else:
            shapes = jax.eval_shape(run_true, true_consts, leaves)

            def skipped(tc, fc, x):
                # a branch no member takes: outputs of its shapes, which the select below
                # never picks
                return [jnp.zeros(a.shape, a.dtype) for a in shapes]

            # this module's cond, not lax.cond: under an outer vmap, `some` and `every` are
            # batched in turn. Each branch appears once in the program.
            some, every = jnp.any(pred), jnp.all(pred)
            on_true = cond(some, only_true, skipped, *args)
            on_false = cond(every, skipped, only_false, *args)
            out = [
                lax.select(
                    jnp.broadcast_to(pred.reshape(pred.shape + (1,) * (a.ndim - 1)), a.shape), a, b
                )
                for a, b in zip(on_true, on_false)
            ]
        return out, [True] * len(out)

    return select
