"""The stage that says where the objective's batches come from: the full batch (one
deterministic f), in-memory arrays consumed inside the compiled loop, or an iterable the host
feeds between compiled chunks. It checks the call for that kind of run and sets the options
and the adjoint the run takes; the run itself is the same for every kind (``solve._run``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from optsolve.solve_api import host, trainable
from optsolve.solve_api.adjoint import ImplicitAdjoint
from optsolve.solve_api.capabilities import check_capabilities, check_objective, names_with
from optsolve.solve_api.options import DataSpec, InMemoryData
from optsolve.solve_api.pytree import FlatInputs, is_traced, replace
from optsolve.solve_api.solution import Solution
from optsolve.solve_api.stages import Call, Stage


class Batches(Stage):
    """The run's batches: ``data=None`` is the full batch; otherwise ``data`` with
    ``batch_size``, ``key`` and ``epochs`` as :func:`~optsolve.solve` documents them.

    ``enter`` needs the call's algorithm, options and adjoint; it sets ``call.steps`` (the
    run's length where known: the progress bar's total)."""

    def __init__(self, data: Any, batch_size: int | None, key: Any, epochs: int | None):
        self.data, self.batch_size, self.key, self.epochs = data, batch_size, key, epochs

    def enter(self, call: Call) -> Call:
        if self.data is None:
            return self._full_batch(call)
        return self._on_data(call)

    def _full_batch(self, call: Call) -> Call:
        for name, value in (
            ("batch_size", self.batch_size),
            ("key", self.key),
            ("epochs", self.epochs),
        ):
            if value is not None:
                raise ValueError(f"solve: `{name}` is only meaningful together with `data`.")
        problem, algorithm, opts = call.problem, call.algorithm, call.options
        if opts.history == -1 and type(algorithm).compiled_driver:
            raise ValueError(
                "solve: `history=True` needs `maxiters` as a Python int (the record's "
                f"length), got maxiters={opts.maxiters!r}."
            )
        adjoint = _check_adjoint(call.adjoint)
        check_capabilities(problem, algorithm, opts, adjoint=adjoint)
        if opts.checkpoint is not None and is_traced(problem, algorithm, opts):
            raise ValueError(
                "solve: `checkpoint` writes files between compiled chunks of an "
                "eager run; call solve outside jax.jit / jax.vmap / jax.grad."
            )
        check_objective(problem)
        if (
            call.trains_model
            and not algorithm.capabilities()["threads_model_state"]
            and trainable.mutates(problem)
        ):
            raise trainable.state_mutation_error(type(algorithm).__name__)
        steps = None if is_traced(opts.maxiters) or opts.maxiters is None else int(opts.maxiters)
        return dataclasses.replace(call, adjoint=adjoint, steps=steps)

    def _on_data(self, call: Call) -> Call:
        problem, algorithm, opts = call.problem, call.algorithm, call.options
        self._check(algorithm, opts)
        data, batch_size, key, epochs = self.data, self.batch_size, self.key, self.epochs
        check_capabilities(problem, algorithm, opts, stops_with_data=True, adjoint=call.adjoint)
        allowed = data_steps(data, batch_size, epochs, None)
        if (
            allowed is not None
            and opts.maxiters is not None
            and not is_traced(opts.maxiters)
            and int(opts.maxiters) > allowed
        ):
            warnings.warn(
                f"solve: maxiters={int(opts.maxiters)} exceeds the {allowed} steps that "
                f"epochs={1 if epochs is None else epochs} allow(s) over this data, so the run "
                "ends after those; raise `epochs` to take more steps.",
                UserWarning,
                stacklevel=5,
            )
        # an iterable (a generator) is not a pytree: only in-memory data may be traced
        traced = (
            FlatInputs(problem, algorithm).traced
            or is_traced(key)
            or (batch_size is not None and is_traced(data))
            or host.under_a_trace()
        )
        if batch_size is not None and (traced or call.adjoint is not None):
            return self._in_memory(call, batch_size)
        if traced:
            raise ValueError(
                "solve: an iterable of batches is fed by the host, so it cannot run inside "
                "jax.jit / jax.vmap / jax.grad; pass in-memory arrays with `batch_size` (the "
                "batches are then taken inside the compiled loop), or call solve outside."
            )
        if call.adjoint is not None:
            raise ValueError(
                "solve: `adjoint` applies to in-memory `data` with `batch_size` (consumed "
                "inside the compiled loop); an iterable of batches is fed by the host and is "
                f"not differentiated. Got adjoint={call.adjoint!r}."
            )
        # the host feeds the batches between compiled chunks; the default adjoint runs the
        # backend as it is there
        return dataclasses.replace(
            call,
            options=replace(opts, data=DataSpec(data, batch_size, key, epochs)),
            adjoint=ImplicitAdjoint(),
            steps=data_steps(data, batch_size, epochs, opts.maxiters),
        )

    def _check(self, algorithm, opts) -> None:
        """The errors of a call on data that does not fit it."""
        data, batch_size, epochs = self.data, self.batch_size, self.epochs
        name = type(algorithm).__name__
        if not algorithm.capabilities()["takes_data"]:
            condition = type(algorithm).conditional_traits.get("takes_data")
            why = (
                ""
                if condition is None
                else (
                    f" configured this way (only {condition}: a line search needs one "
                    "deterministic objective)"
                )
            )
            raise ValueError(
                f"solve: {name} does not train on `data`{why}. Algorithms that do: "
                f"{names_with('takes_data')}."
            )
        if opts.keep == "best" and opts.evaluate is None:
            raise ValueError(
                "solve: keep='best' on `data` needs `evaluate` (a score on held-out data): "
                "each step's loss is on another batch, so losses do not rank iterates."
            )
        for option in ("gtol", "ftol"):
            if getattr(opts, option) is not None:
                raise ValueError(
                    f"solve: `{option}` is not meaningful when training on `data` (each step "
                    "sees another batch); stop with maxiters, epochs, maxtime or the "
                    "callback."
                )
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"solve: `batch_size` must be a positive int, got {batch_size!r}.")
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"solve: `epochs` must be a positive int, got {epochs!r}.")
        if batch_size is None and self.key is not None:
            raise ValueError("solve: `key` shuffles in-memory data; it needs `batch_size`.")
        if batch_size is not None:
            sizes = {
                jnp.shape(a)[0] if jnp.ndim(a) else None for a in jax.tree_util.tree_leaves(data)
            }
            samples = next(iter(sizes)) if len(sizes) == 1 else None
            if samples is None:
                raise ValueError(
                    "solve: with `batch_size`, `data` must be a pytree of arrays sharing a "
                    f"leading dimension, got leading sizes {sorted(map(str, sizes))}."
                )
            if batch_size > samples:
                raise ValueError(f"solve: `batch_size`={batch_size} exceeds the number of samples.")
        elif not hasattr(data, "__iter__"):
            raise TypeError(
                f"solve: `data` must be an iterable of batches, or arrays with `batch_size`; "
                f"got {type(data).__name__}."
            )
        elif _in_memory_arrays(data):
            shapes = [tuple(jnp.shape(a)) for a in jax.tree_util.tree_leaves(data)]
            raise ValueError(
                f"solve: `data` is a {type(data).__name__} of arrays (shapes {shapes}), which "
                "would be read as an iterable of batches, one per element; to train on "
                "in-memory arrays cut into batches, pass `batch_size` (and `key` to shuffle), "
                "or pass a list of batches."
            )

    def _in_memory(self, call: Call, batch_size: int) -> Call:
        """Training on in-memory arrays inside one compiled loop (under jax.jit, jax.vmap,
        or jax.grad with UnrolledAdjoint): see :mod:`optsolve.backends.native.in_memory`."""
        opts, adjoint = call.options, call.adjoint
        data, epochs = self.data, self.epochs
        if adjoint is not None:
            _check_adjoint(adjoint)  # an adjoint object, or its error
        if isinstance(adjoint, ImplicitAdjoint):
            raise ValueError(
                "solve: ImplicitAdjoint does not apply to training on `data`: stochastic steps "
                "do not reach a minimiser of one f. Differentiate the steps themselves with "
                "adjoint=optsolve.UnrolledAdjoint()."
            )
        if opts.checkpoint is not None or opts.progress:
            option = "checkpoint" if opts.checkpoint is not None else "progress"
            raise ValueError(
                f"solve: `{option}` works between the compiled chunks of an eager run; a run "
                "on `data` inside jax.jit / jax.vmap / jax.grad or with an `adjoint` has none."
            )
        if opts.keep == "best":
            raise ValueError(
                "solve: keep='best' on `data` runs eagerly only; call solve "
                "outside jax.jit / jax.vmap / jax.grad, without `adjoint`."
            )
        size = jax.tree_util.tree_leaves(data)[0].shape[0]
        epochs = 1 if epochs is None else epochs
        steps = epochs * (size // batch_size)
        maxiters = opts.maxiters
        if maxiters is not None and not is_traced(maxiters):
            steps = min(steps, int(maxiters))
        # a resumed run may start inside an epoch: its steps then span one epoch more
        span = epochs + (opts.resume is not None)
        in_memory = InMemoryData(data, self.key, batch_size, steps, span, _sample_sharding(data))
        opts = replace(
            opts,
            data=None,
            in_memory=in_memory,
            maxiters=steps if maxiters is None or not is_traced(maxiters) else maxiters,
            history=steps if opts.history else 0,
        )
        problem, algorithm = call.problem, call.algorithm
        if adjoint is None:  # not differentiated: refused where a derivative is asked for
            problem, algorithm, opts = _guarded((problem, algorithm, opts))
            adjoint = _Plain()
        return dataclasses.replace(
            call, problem=problem, algorithm=algorithm, options=opts, adjoint=adjoint, steps=steps
        )


def _check_adjoint(adjoint: Any) -> Any:
    adjoint = ImplicitAdjoint() if adjoint is None else adjoint
    if not hasattr(adjoint, "apply"):
        raise TypeError(
            f"solve: `adjoint` must be an adjoint such as optsolve.ImplicitAdjoint(), got "
            f"{adjoint!r}."
        )
    return adjoint


def _no_derivative(value: Any) -> Any:
    """``value`` unchanged, refusing to be differentiated (see :meth:`Batches._in_memory`)."""
    return value


_no_derivative = jax.custom_jvp(_no_derivative)


@_no_derivative.defjvp
def _refuse(primals, tangents):
    raise ValueError(
        "solve: a run on `data` is differentiated through its steps: pass "
        "adjoint=optsolve.UnrolledAdjoint() (the implicit derivative assumes a minimiser of "
        "one f, which stochastic training does not reach)."
    )


def _guarded(tree: Any) -> Any:
    """``tree`` with each inexact leaf behind :func:`_no_derivative`."""
    return jax.tree_util.tree_map(
        lambda v: (
            _no_derivative(v)
            if isinstance(v, jax.Array) and jnp.issubdtype(v.dtype, jnp.inexact)
            else v
        ),
        tree,
    )


class _Plain:
    """The adjoint of a run that is not differentiated: the backend as it is."""

    @staticmethod
    def apply(run, problem, algorithm, options) -> Solution:
        return run(problem, algorithm, options)


def _sample_sharding(data: Any) -> Any:
    """The ``NamedSharding`` that splits every array of ``data`` over its sample axis (the
    batches keep it: data-parallel steps), or None (one device, traced arrays, or arrays
    sharded otherwise)."""
    shardings = {getattr(leaf, "sharding", None) for leaf in jax.tree_util.tree_leaves(data)}
    if len(shardings) != 1:
        return None
    sharding = shardings.pop()
    if (
        not isinstance(sharding, jax.sharding.NamedSharding)
        or not sharding.spec
        or sharding.spec[0] is None
        or any(axis is not None for axis in sharding.spec[1:])
    ):
        return None
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(sharding.spec[0]))


def _in_memory_arrays(data: Any) -> bool:
    """Whether ``data`` is a tuple or dict of arrays (``(X, y)``): in-memory data given
    without ``batch_size``, not batches (a list of batches is an iterable's usual form)."""
    if isinstance(data, dict):
        return True
    return (
        isinstance(data, tuple)
        and not hasattr(data, "_fields")
        and len(data) > 0
        and all(hasattr(a, "shape") and hasattr(a, "dtype") for a in data)
    )


def data_steps(data, batch_size, epochs, maxiters) -> int | None:
    """The steps a run on data takes, where known (the progress bar's total)."""
    epochs = 1 if epochs is None else epochs
    if batch_size is not None:
        steps = jax.tree_util.tree_leaves(data)[0].shape[0] // batch_size * epochs
    elif hasattr(data, "__len__"):
        steps = len(data) * epochs
    else:
        steps = None
    if maxiters is not None:
        steps = int(maxiters) if steps is None else min(steps, int(maxiters))
    return steps
