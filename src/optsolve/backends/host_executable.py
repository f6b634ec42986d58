"""Compiled JAX functions that host code (scipy) calls one point at a time, run inline.

JAX's CPU client hands every computation to a worker thread and returns at once. scipy
calls the objective from Python, waits for each result and does its own work in between,
so the worker has gone to sleep by the next call and waking it costs more than evaluating
a small objective (measured: ~80 us added to each call of a 100-variable Rosenbrock
value-and-gradient interleaved with 30 us of numpy work, against ~15 us for the call
itself). Nothing is gained from asynchrony here, so on a CPU backend the function is
compiled for a private CPU client created with synchronous dispatch and executed in the
calling thread. jaxlib offers this only through internal modules; if any of them is
missing or behaves differently, or the function needs host callbacks or effects, the
function is compiled with ``jax.jit(...).lower(...).compile()`` instead, which gives
the same numbers, only slower.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

PyTree = Any
HostCall = Callable[..., list]

_lock = threading.Lock()
_client: list = []  # the private synchronous CPU client, created on first use

#: Set to False to always use JAX's ahead-of-time executables (tests compare both paths).
ENABLED = True


def _sync_client():
    from jax._src.lib import xla_client

    with _lock:
        if not _client:
            _client.append(xla_client.make_cpu_client(asynchronous=False))
        return _client[0]


class HostExecutable:
    """``fn`` compiled for fixed argument shapes; ``bind(p)`` gives a callable of numpy arrays.

    Args:
      fn: a function of some arrays and, last, the pytree ``p``.
      specs: ``jax.ShapeDtypeStruct`` of each array argument.
      p: an example ``p`` (its structure, shapes and dtypes, weak types included).

    Attributes:
      synchronous: True when the private synchronous client runs it.
    """

    def __init__(self, fn: Callable, specs: tuple, p: PyTree):
        lowered = jax.jit(fn, keep_unused=True).lower(*specs, p)
        self._n_arrays = len(specs)
        self._exe = None
        self.synchronous = False
        if ENABLED and jax.default_backend() == "cpu":
            try:
                self._compile_sync(lowered)
                self.synchronous = True
            except Exception:  # noqa: BLE001 - any change in jaxlib's internals: fall back
                self._exe = None
        if not self.synchronous:
            self._compiled = lowered.compile()

    def _compile_sync(self, lowered) -> None:
        from jax._src import compiler
        from jax._src.interpreters import mlir
        from jax._src.lib import _jax, xla_client

        args = lowered._lowering.compile_args
        if (args["host_callbacks"] or args["ordered_effects"] or args["unordered_effects"]
                or args["tuple_args"]):
            raise ValueError("needs JAX's own runtime")
        self._avals = [jax.core.ShapedArray(a.shape, a.dtype) for a in args["global_in_avals"]]
        client = _sync_client()
        self._device = client.devices()[0]
        self._sharding = jax.sharding.SingleDeviceSharding(self._device)
        self._put_one = _jax.batched_device_put
        options = compiler.get_compile_options(num_replicas=1, num_partitions=1, backend=client)
        self._exe = client.compile_and_load(
            mlir.module_to_bytecode(lowered.compiler_ir("stablehlo")),
            executable_devices=xla_client.DeviceList((self._device,)),
            compile_options=options,
        )
        # One round trip now, so that a jaxlib whose calls differ fails here, not mid-solve.
        zeros = [np.zeros(a.shape, a.dtype) for a in self._avals]
        self._exe.execute([self._put(z, a) for z, a in zip(zeros, self._avals)])

    def _put(self, value, aval):
        return self._put_one(aval, self._sharding, [np.asarray(value, aval.dtype)],
                             [self._device], True)

    def bind(self, p: PyTree) -> HostCall:
        """A callable of the array arguments (numpy) with ``p`` fixed; returns numpy outputs."""
        if not self.synchronous:
            compiled = self._compiled

            def call_jax(*arrays):
                out = compiled(*arrays, p)
                return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]

            return call_jax

        exe, put, n = self._exe, self._put, self._n_arrays
        array_avals = self._avals[:n]
        p_buffers = [put(leaf, aval) for leaf, aval in
                     zip(jax.tree_util.tree_leaves(p), self._avals[n:])]
        if n == 1:
            aval0 = array_avals[0]

            def call_one(x):
                return [np.asarray(o) for o in exe.execute([put(x, aval0), *p_buffers])]

            return call_one

        def call(*arrays):
            buffers = [put(a, aval) for a, aval in zip(arrays, array_avals)]
            return [np.asarray(o) for o in exe.execute(buffers + p_buffers)]

        return call
