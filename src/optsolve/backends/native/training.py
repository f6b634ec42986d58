"""Training on data: minimise f(x, p, batch) over a stream of minibatches.

Two ways to feed data, one compiled loop either way:

- an iterable of batches (a generator, a data loader, a list): the host gathers up to 16
  batches at a time and runs them in one compiled call (a while loop over the stacked
  batches), so a step costs what it costs inside ``lax.scan``, not a Python dispatch; the
  next chunk is dispatched before the previous one's status is read;
- in-memory arrays with ``batch_size`` (and ``key`` to shuffle): each epoch is one compiled
  call, a permutation of the data then a while loop over its batches.

Steps are not guarded one by one (a select over every parameter and state leaf costs as much
as the step itself on small models): the loop leaves at a non-finite loss or at the
callback's stop, and a chunk reports whether its last iterate is finite. The host keeps each
chunk's input until its status is read, so on a failure it re-runs the chunk (deterministic)
up to the last good iterate. A KeyboardInterrupt returns the last completed step with
``ReturnCode.INTERRUPTED``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.native.training_steps import (
    INT, Chunk, TrainCarry, chunk_of_batches, epochs_chunk, init_carry, prepared,
)
from optsolve.solve_api.host import interrupt_requested
from optsolve.solve_api.options import DataSpec, SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import tree_spec
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import History, Solution, Stats

PyTree = Any
CHUNK = 16  # batches of an iterable run per compiled call
EPOCH_SLOTS = 8  # epochs of in-memory data run per compiled call


def _batches(spec: DataSpec) -> Iterable:
    source = spec.source
    epochs = spec.epochs if spec.epochs is not None else 1
    if epochs > 1 and iter(source) is source:
        raise ValueError(
            f"solve: `epochs={epochs}` needs data that can be iterated more than once (a list, "
            "a data loader), but `data` is a one-shot iterator (e.g. a generator)."
        )
    for _ in range(epochs):
        yield from source


class _IterableChunks:
    """Chunks of up to ``CHUNK`` same-shaped batches from an iterator, padded to ``CHUNK``
    by repeating the last one (padding is never run) so that one compiled call serves all."""

    def __init__(self, batches: Iterator, run_chunk: Callable):
        self.batches, self.run_chunk = batches, run_chunk
        self.held = None          # a batch of another shape than the chunk it was read for
        self.interrupted = False  # Ctrl-C while reading: the batches read so far still run

    def next(self, most: int | None):
        group: list = []
        signature = None
        limit = CHUNK if most is None else min(CHUNK, most)
        try:
            while len(group) < limit:
                if self.held is not None:
                    batch, self.held = self.held, None
                else:
                    batch = next(self.batches)
                if group and tree_spec(batch) != signature:
                    self.held = batch
                    break
                signature = signature or tree_spec(batch)
                group.append(batch)
        except StopIteration:
            pass
        except KeyboardInterrupt:
            self.interrupted = True
        if not group:
            return None
        padded = group + [group[-1]] * (CHUNK - len(group))
        return len(group), lambda carry, n: self.run_chunk(carry, padded, n)


class _Epochs:
    """Chunks of up to ``EPOCH_SLOTS`` epochs of in-memory data (one epoch with ``maxtime``,
    which the host checks between chunks)."""

    def __init__(self, spec: DataSpec, run_epochs: Callable, slots: int):
        self.spec, self.run_epochs, self.slots = spec, run_epochs, slots
        self.epoch, self.epochs = 0, spec.epochs if spec.epochs is not None else 1
        size = jax.tree_util.tree_leaves(spec.source)[0].shape[0]
        self.n_batches = size // spec.batch_size
        self.interrupted = False

    def next(self, most: int | None):
        if self.epoch >= self.epochs or self.n_batches == 0:
            return None
        first = self.epoch
        n_epochs = min(self.slots, self.epochs - first)
        self.epoch += n_epochs
        count = n_epochs * self.n_batches
        count = count if most is None else min(count, most)
        return count, lambda carry, n: self.run_epochs(carry, self.spec.source, self.spec.key,
                                                       first, n_epochs, n)


class _Settled(NamedTuple):
    carry: TrainCarry
    status: int


def _settle(carry_in: TrainCarry, run: Callable, chunk: Chunk, records: list) -> _Settled:
    """Read a dispatched chunk's status; on a failure, re-run it up to the last good iterate.

    The loss at x_j not finite: x_j is kept when it is finite, else x_{j-1} (its loss was
    finite). The chunk's last iterate not finite: the one before it.
    """
    status, executed, x_finite = (int(v) for v in np.asarray(chunk.flags))
    if chunk.records:
        records.append(tuple(r[:executed] for r in chunk.records))
    if status == RUNNING and x_finite:
        return _Settled(chunk.carry, RUNNING)
    if status == ReturnCode.TERMINATED:
        return _Settled(chunk.carry, status)
    if status == ReturnCode.FAILURE:
        good = run(carry_in, executed - 1)
        if not int(good.flags[2]):
            good = run(carry_in, executed - 2)
    else:
        good = run(carry_in, executed - 1)
    failure = int(ReturnCode.FAILURE)
    return _Settled(good.carry._replace(steps=chunk.carry.steps,
                                        status=jnp.asarray(failure, INT)), failure)


def run_training(make_solver, problem: OptimizationProblem, algorithm: Any,
                 options: SolveOptions) -> Solution:
    """Train ``algorithm`` on ``options.data``; see the module docstring."""
    spec: DataSpec = options.data
    loop_options = dataclasses.replace(options, data=None, resume=None)
    limit = int(options.maxiters) if options.maxiters is not None else None
    records: list = []
    start = time.perf_counter()

    if spec.in_memory:
        first = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct((spec.batch_size,) + a.shape[1:], a.dtype),
            spec.source)
        carry = init_carry(make_solver, problem, algorithm, loop_options, first, options.resume)
        slots = 1 if options.maxtime is not None else EPOCH_SLOTS
        source = _Epochs(spec, prepared(epochs_chunk, make_solver, problem, algorithm, loop_options,
                                         spec.batch_size, slots), slots)
    else:
        batches = iter(_batches(spec))
        try:
            first = next(batches)
        except StopIteration:
            raise ValueError("solve: `data` holds no batch.") from None
        carry = init_carry(make_solver, problem, algorithm, loop_options, first, options.resume)
        source = _IterableChunks(_chain([first], batches),
                                 prepared(chunk_of_batches, make_solver, problem, algorithm,
                                           loop_options))

    pending: list = []   # dispatched chunks whose status was not read yet, oldest first
    settled = _Settled(carry, RUNNING)
    dispatched = 0
    interrupted = out_of_time = False

    def settle_oldest() -> _Settled:
        carry_in, run, chunk = pending[0]
        result = _settle(carry_in, run, chunk, records)
        pending.pop(0)
        return result

    try:
        while settled.status == RUNNING:
            unit = source.next(None if limit is None else limit - dispatched)
            if unit is None:
                break
            count, run = unit
            pending.append((carry, run, run(carry, count)))
            carry = pending[-1][2].carry
            dispatched += count
            # one chunk in flight while the previous one's status is read
            while len(pending) > 1 and settled.status == RUNNING:
                settled = settle_oldest()
            if source.interrupted or interrupt_requested():
                interrupted = True
                break
            if options.maxtime is not None and time.perf_counter() - start >= options.maxtime:
                out_of_time = True
                break
            if limit is not None and dispatched >= limit:
                break
    except KeyboardInterrupt:
        interrupted = True
    while pending and settled.status == RUNNING:
        settled = settle_oldest()
    final, status = settled
    if interrupted and status == RUNNING:
        status = int(ReturnCode.INTERRUPTED)
    elif status == RUNNING:
        # the data or the epochs ran out: the iteration budget was used up
        status = int(ReturnCode.MAXTIME if out_of_time else ReturnCode.MAXITERS)
    history = None
    if options.history:
        objective = jnp.concatenate([r[0] for r in records]) if records else None
        grad_norm = jnp.concatenate([r[1] for r in records]) if records else None
        history = History(objective, grad_norm)
    return Solution(
        x=final.x, objective=final.objective, retcode=ReturnCode(status),
        stats=Stats(iterations=final.iteration, f_evals=final.steps, grad_evals=final.steps,
                    time=None),
        original=final.state, state=final.state, history=history,
    )


def _chain(first: list, rest: Iterable):
    yield from first
    yield from rest
