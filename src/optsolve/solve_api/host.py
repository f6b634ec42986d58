"""Host calls from inside compiled loops: the user's callback and the wall clock.

They use ``jax.pure_callback`` with ``vmap_method="sequential"``: io_callback's effects are
refused inside a ``while_loop`` whose predicate is batched, so it cannot serve ``jax.vmap``.
Under vmap a batched loop runs its body for finished elements too, so every call carries a
``due`` flag and the host skips the user's function where it is False.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Times are offsets from import so that float32 keeps millisecond resolution for days.
_T0 = time.perf_counter()


def clock(token: jax.Array) -> jax.Array:
    """Seconds since import, read on the host; ``token`` orders the read after its producer."""
    dtype = jnp.result_type(float)

    def host(_token):
        return np.asarray(time.perf_counter() - _T0, dtype=dtype)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), dtype), token,
                             vmap_method="sequential")


def wants_grad_norm(callback: Callable[..., Any]) -> bool:
    """Whether ``callback`` takes a fourth argument, the gradient norm: four positional
    parameters without defaults, or ``*args`` (a defaulted fourth one, as in
    ``lambda i, x, f, store=store: ...``, is the caller's own)."""
    try:
        params = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    return len(required) >= 4 or any(p.kind == p.VAR_POSITIONAL for p in params)


def call_user_callback(callback: Callable[..., Any], due: jax.Array, iteration: jax.Array,
                       x: Any, objective: jax.Array, grad_norm: jax.Array | None = None
                       ) -> jax.Array:
    """Where ``due``, run ``callback(iteration, x, objective[, grad_norm])`` on the host.

    Returns a bool array, True where the callback asked to stop.
    """

    def host(is_due, it, xx, ff, *gg):
        if not bool(is_due):
            return np.asarray(False)
        stop = callback(int(it), xx, ff, *gg)
        return np.asarray(bool(stop) if stop is not None else False)

    extra = () if grad_norm is None else (grad_norm,)
    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.bool_), due, iteration, x,
                             objective, *extra, vmap_method="sequential")


# The progress bars of the solves running now, innermost last (solve inside solve nests).
PROGRESS_BARS: list = []


def report_progress(due: jax.Array, iteration: jax.Array, objective: jax.Array,
                    grad_norm: jax.Array) -> jax.Array:
    """Where ``due``, move the innermost progress bar to ``iteration``; returns False."""

    def host(is_due, it, ff, gg):
        if bool(is_due) and PROGRESS_BARS:
            bar = PROGRESS_BARS[-1]
            bar.update(max(0, int(it) - bar.n))
            bar.set_postfix(loss=f"{float(ff):.6g}", grad_norm=f"{float(gg):.2e}", refresh=False)
        return np.asarray(False)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.bool_), due, iteration,
                             objective, grad_norm, vmap_method="sequential")
