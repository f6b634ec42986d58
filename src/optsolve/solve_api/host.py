"""Host calls from inside compiled loops: the user's callback and the wall clock.

They use ``jax.pure_callback`` with ``vmap_method="sequential"``: io_callback's effects are
refused inside a ``while_loop`` whose predicate is batched, so it cannot serve ``jax.vmap``.
Under vmap a batched loop runs its body for finished elements too, so every call carries a
``due`` flag and the host skips the user's function where it is False.
"""

from __future__ import annotations

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


def call_user_callback(callback: Callable[..., Any], due: jax.Array, iteration: jax.Array,
                       x: Any, objective: jax.Array) -> jax.Array:
    """Where ``due``, run ``callback(iteration, x, objective)`` on the host.

    Returns a bool array, True where the callback asked to stop.
    """

    def host(is_due, it, xx, ff):
        if not bool(is_due):
            return np.asarray(False)
        stop = callback(int(it), xx, ff)
        return np.asarray(bool(stop) if stop is not None else False)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.bool_), due, iteration, x,
                             objective, vmap_method="sequential")
