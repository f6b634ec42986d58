"""Compiled JAX functions that host code (scipy) calls one point at a time, run inline.

JAX's CPU client hands every computation to a worker thread and returns at once. scipy
calls the objective from Python, waits for each result and does its own work in between,
so the worker has gone to sleep by the next call and waking it costs more than evaluating
a small objective (docs/benchmarks.md has the measurements). Nothing is gained from
asynchrony here, so on a CPU backend the function is compiled with ``jax.jit`` for the
device of a private CPU client created with synchronous dispatch (JAX's own setting,
``jax_cpu_enable_async_dispatch``, is process-wide) and runs in the calling thread. Creating
that client needs jaxlib's ``xla_client.make_cpu_client``; if it is missing or fails, the
function runs on JAX's default device instead, with the same numbers, only slower.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api.cache import BoundedCache

PyTree = Any
HostCall = Callable[..., list]

_lock = threading.Lock()
_device: list = []  # the private synchronous CPU client's device, created on first use

#: Set to False to always use JAX's default device (the tests compare both paths).
ENABLED = True

# id(array) -> (weak reference to a JAX array of p, its copy on the private device). JAX
# arrays are immutable, so identity is enough; copying data from the default device costs
# more than a small solve's evaluations, and p is usually the same data from solve to solve.
_MOVED_SIZE = 32
_moved = BoundedCache(_MOVED_SIZE)


def _sync_device():
    from jax._src.lib import xla_client

    with _lock:
        if not _device:
            _device.append(xla_client.make_cpu_client(asynchronous=False).devices()[0])
        return _device[0]


def _forget(key: int) -> None:
    """Drop the private copy of an array that no longer exists (a weakref callback: no lock,
    single dict operations are atomic)."""
    hit = _moved.peek(key)
    if hit is not None and hit[0]() is None:
        _moved.discard(key)


class HostExecutable:
    """``fn`` compiled ahead of time for fixed argument shapes; ``bind(p)`` gives a callable
    of numpy arrays.

    Args:
      fn: a function of some arrays and, last, the pytree ``p``.
      specs: ``jax.ShapeDtypeStruct`` of each array argument.
      p: an example ``p`` (its structure, shapes and dtypes, weak types included).

    Attributes:
      synchronous: True when it runs inline on the private synchronous CPU client.
    """

    def __init__(self, fn: Callable, specs: tuple, p: PyTree):
        self.synchronous = False
        self._sharding = None
        if ENABLED and jax.default_backend() == "cpu":
            try:
                self._sharding = jax.sharding.SingleDeviceSharding(_sync_device())
                self._compiled = (
                    jax.jit(
                        fn,
                        in_shardings=self._sharding,
                        out_shardings=self._sharding,
                    )
                    .lower(*specs, p)
                    .compile()
                )
                self.synchronous = True
            except Exception:  # noqa: BLE001 - no private client in this jaxlib: default device
                self._sharding = None
        if not self.synchronous:
            self._compiled = jax.jit(fn).lower(*specs, p).compile()
        self._single = self._compiled.out_tree.num_leaves == 1

    def bind(self, p: PyTree) -> HostCall:
        """A callable of the array arguments (numpy) with ``p`` fixed, returning the outputs
        as a list of numpy arrays."""
        compiled = self._compiled
        if self._sharding is not None:
            p = jax.tree_util.tree_map(self._to_device, p)
        else:  # numpy data once per solve, not on every call
            p = jax.tree_util.tree_map(
                lambda leaf: jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf, p
            )
        if self._single:
            return lambda *arrays: [np.asarray(compiled(*arrays, p))]
        return lambda *arrays: [np.asarray(o) for o in compiled(*arrays, p)]

    def _to_device(self, leaf: Any) -> Any:
        """A leaf of p on the private device: numpy data once per solve, JAX arrays once
        while they live; Python scalars stay as they are (converted on each call, as cheaply
        as jit does)."""
        if isinstance(leaf, (bool, int, float, complex)):
            return leaf
        if not isinstance(leaf, jax.Array):
            return jax.device_put(leaf, self._sharding)
        key = id(leaf)
        with _lock:
            hit = _moved.get(key)
            if hit is not None and hit[0]() is leaf:
                return hit[1]
        moved = jax.device_put(leaf, self._sharding)
        with _lock:
            _moved.put(key, (weakref.ref(leaf, lambda _, key=key: _forget(key)), moved))
        return moved
