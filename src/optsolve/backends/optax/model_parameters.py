"""Raw optax transformations on an NNX model's trained leaves: a transformation whose mask
or labels are an ``nnx.State`` (as NNX users build them) gets the parameters in that form.

Its own module because both the raw transformation (:class:`OptaxTransform`, in
:mod:`~optsolve.backends.optax.backend`) and the members of a chain
(:mod:`~optsolve.backends.optax.compose`, which builds on the backend) wrap with it: kept
below both, neither has to import the other for it.
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from optsolve.solve_api.trainable import as_nnx_state, fit_to, holds_nnx_variables

PyTree = Any


def _refuses(init: Any, params: PyTree) -> bool:
    try:
        jax.eval_shape(init, params)
    except (ValueError, TypeError):
        return True
    return False


def on_model_parameters(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """A raw optax transformation that, where it refuses an NNX model's trained leaves as
    the module (its mask or labels are an ``nnx.State``, as NNX users build them), gets
    them as ``nnx.Optimizer`` hands them to optax: ``nnx.state(model, wrt)``. Its updates
    come back in the module's structure; any other parameters go through unchanged."""

    def as_state(params):
        # decided at trace time, from the structure: the same answer at init and update
        return holds_nnx_variables(params) and _refuses(tx.init, params)

    def init(params):
        return tx.init(as_nnx_state(params) if as_state(params) else params)

    def update(updates, state, params=None, **extra_args):
        like = updates if params is None else params
        if not as_state(like):
            return tx.update(updates, state, params, **extra_args)
        if "grad" in extra_args:
            extra_args["grad"] = as_nnx_state(extra_args["grad"])
        for name in ("value_fn", "obj_fn"):
            if name in extra_args:
                fn = extra_args[name]
                extra_args[name] = lambda p, *a, _fn=fn, **k: _fn(
                    fit_to(p, like, "params"), *a, **k
                )
        new, state = tx.update(
            as_nnx_state(updates),
            state,
            None if params is None else as_nnx_state(params),
            **extra_args,
        )
        return fit_to(new, updates, "updates"), state

    if isinstance(tx, optax.GradientTransformationExtraArgs):
        return optax.GradientTransformationExtraArgs(init, update)
    return optax.GradientTransformation(init, lambda u, s, p=None: update(u, s, p))
