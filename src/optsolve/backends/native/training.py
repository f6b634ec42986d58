"""Training on data: minimise f(x, p, batch) over a stream of minibatches.

Two ways to feed data, one compiled loop either way:

- an iterable of batches (a generator, a data loader, a list): the host gathers up to 32
  batches at a time (fewer where 32 would exceed 64 MiB) and runs them in one compiled call
  (a while loop over the stacked batches), so a step costs what it costs inside
  ``lax.scan``, not a Python dispatch; the next chunk is dispatched before the previous
  one's status is read;
- in-memory arrays with ``batch_size`` (and ``key`` to shuffle): each epoch is one compiled
  call, a permutation of the data then a while loop over its batches; a resumed run
  continues the stream at the epoch and batch where the earlier one stopped.

Each step is the shared driver's gradient step on that step's batch
(:func:`optsolve.backends.native.driver.stream_loop`), so the callback, the progress bar,
the history, the non-finite checks and the counts are those of every JAX-native run. A
non-finite loss or gradient ends the run with FAILURE at the latest finite iterate (the batch
is to blame, not the iterate, which came from a finite update). A KeyboardInterrupt returns
the last completed step with ``ReturnCode.INTERRUPTED``.

Steps are not guarded one by one (a conditional or a select over every parameter and state
leaf costs more than the rest of a small model's step): a step that stops the run still
applies its update. The host keeps the last two chunks' inputs; where a step stopped the
run, it replays that chunk up to the step (deterministic, with the callback and the progress
bar silent) to recover the step's start, x and optimizer state.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.native.driver import stopped_at
from optsolve.backends.native.training_steps import (
    Chunk,
    FlatCarry,
    Prepared,
    chunk_of_batches,
    epochs_chunk,
    init_carry,
    run_solution,
    stand_in_carry,
)
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import advance_progress, interrupt_requested
from optsolve.solve_api.options import DataSpec, SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import replace, tree_spec
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import History, Solution, Stats

PyTree = Any
CHUNK = 32  # the most batches of an iterable run per compiled call
CHUNK_BYTES = 64 * 2**20  # ... and the most bytes of stacked batches per call
EPOCH_SLOTS = 16  # the most epochs of in-memory data run per compiled call, ...
ORDER_SAMPLES = 2**16  # ... and the most samples in their orders (each call draws all)
# Chunks are also sized by time, so that a Ctrl-C (seen between chunks, with two in flight)
# and the progress bar respond within about 0.3 s: each takes about this long, from the
# seconds per step last read for its compiled call (in this run or an earlier one); the
# first of a call never run before takes a few steps.
_FIRST_STEPS, _CHUNK_SECONDS = 16, 0.15
_SECONDS_PER_STEP = BoundedCache(64)  # keyed on the compiled call (its cache holds 64 too)


def _steps_in(seconds: float, per_step: float | None) -> int:
    """The steps that take about ``seconds`` at ``per_step`` seconds each (a few where not
    known yet)."""
    if per_step is None:
        return _FIRST_STEPS
    return int(min(max(seconds / max(per_step, 1e-9), 1), 2**24))


@functools.cache
def _flags() -> tuple[jax.Array, jax.Array]:
    # device constants made once: an array made per call costs a dispatch
    return jnp.asarray(False), jnp.asarray(True)


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


def chunk_length(batch: Any) -> int:
    """Batches per compiled call: ``CHUNK``, or the largest power of two whose stacked
    batches fit in ``CHUNK_BYTES`` (at least 1). Each call costs a dispatch and a status
    read, so longer chunks serve small batches; the cap bounds the device memory."""
    # nbytes, not size times a numpy itemsize: a PRNG key's dtype is not a numpy one
    size = sum(
        leaf.nbytes if hasattr(leaf, "nbytes") else np.asarray(leaf).nbytes
        for leaf in jax.tree_util.tree_leaves(batch)
    )
    length = CHUNK
    while length > 1 and length * size > CHUNK_BYTES:
        length //= 2
    return length


class _IterableChunks:
    """Chunks of up to ``length`` same-shaped batches from an iterator, padded to
    ``length`` by repeating the last one (padding is never run) so that one compiled call
    serves all."""

    def __init__(self, batches: Iterator, run: Callable, length: int):
        self.batches, self.run, self.length = batches, run, length
        self.held = None  # a batch of another shape than the chunk it was read for
        self.interrupted = False  # Ctrl-C while reading: the batches read so far still run

    def next(self, most: int | None):
        group: list = []
        signature = None
        limit = self.length if most is None else min(self.length, most)
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
        padded = group + [group[-1]] * (self.length - len(group))
        return len(group), lambda carry, n, replay=False, begin=False: self.run(
            carry, padded, n, _flags()[replay], _flags()[begin]
        )


class _Epochs:
    """Chunks of up to ``slots`` epochs of in-memory data (one epoch with ``maxtime``,
    which the host checks between chunks). ``position``: the steps an earlier run took
    (``resume``), so that the stream continues at its epoch and batch; ``epochs`` passes
    from there."""

    def __init__(self, spec: DataSpec, run: Callable, slots: int, position: int):
        self.spec, self.run, self.slots = spec, run, slots
        size = jax.tree_util.tree_leaves(spec.source)[0].shape[0]
        self.n_batches = size // spec.batch_size
        self.position = position
        self.remaining = (spec.epochs if spec.epochs is not None else 1) * self.n_batches
        self.interrupted = False

    def next(self, most: int | None):
        if self.remaining <= 0 or self.n_batches == 0:
            return None
        first, lead = divmod(self.position, self.n_batches)
        n_epochs = min(self.slots, -(-(lead + self.remaining) // self.n_batches))
        count = min(n_epochs * self.n_batches - lead, self.remaining)
        count = count if most is None else min(count, most)
        self.position += count
        self.remaining -= count
        return count, lambda carry, n, replay=False, begin=False: self.run(
            carry,
            self.spec.source,
            self.spec.key,
            first,
            lead,
            n_epochs,
            n,
            _flags()[replay],
            _flags()[begin],
        )


class _Dispatched(NamedTuple):
    carry_in: Any  # the carry the chunk started from (a FlatCarry)
    start: Any  # its iteration (an int array, or 0)
    begin: bool  # the chunk made the run's first carry (carry_in stood in for it)
    run: Callable  # run(carry, n, replay=False, begin=False): the chunk's compiled call
    chunk: Chunk


def run_training(
    make_solver, problem: OptimizationProblem, algorithm: Any, options: SolveOptions
) -> Solution:
    """Train ``algorithm`` on ``options.data``; see the module docstring."""
    spec: DataSpec = options.data
    # the host checks maxtime between chunks; the compiled steps need no clock. The host
    # also moves the progress bar between chunks: a bar updated from inside the compiled
    # steps stops them at every update, which costs more than the steps of a short run
    loop_options = dataclasses.replace(
        options, data=None, maxtime=None, resume=None, progress=False, checkpoint=None
    )
    checkpoint = options.checkpoint
    # each chunk records its own steps: the first carry holds no record
    init_options = dataclasses.replace(loop_options, resume=options.resume, history=0)
    limit = int(options.maxiters) if options.maxiters is not None else None
    started = time.perf_counter()
    compiled = Prepared(make_solver, problem, algorithm, loop_options)
    # a fresh run's first chunk makes its first carry; a resumed one starts from its own
    fresh = options.resume is None

    def start(batch):
        if fresh:
            return stand_in_carry(make_solver, problem, algorithm, init_options, batch)
        return init_carry(make_solver, problem, algorithm, init_options, batch)

    if spec.in_memory:
        first = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct((spec.batch_size,) + a.shape[1:], a.dtype), spec.source
        )
        carry = start(first)
        size = jax.tree_util.tree_leaves(spec.source)[0].shape[0]
        slots = (
            1 if options.maxtime is not None else max(1, min(EPOCH_SLOTS, ORDER_SAMPLES // size))
        )
        resumed = options.resume.stats.iterations if options.resume is not None else None
        source = _Epochs(
            spec, compiled(epochs_chunk, spec.batch_size, slots), slots, int(resumed or 0)
        )
    else:
        batches = iter(_batches(spec))
        try:
            first = next(batches)
        except StopIteration:
            raise ValueError("solve: `data` holds no batch.") from None
        carry = start(first)
        source = _IterableChunks(
            _chain([first], batches), compiled(chunk_of_batches), chunk_length(first)
        )

    recent: list[_Dispatched] = []  # the last two chunks dispatched
    timing = getattr(source.run, "func", source.run)  # the compiled call, which its speed
    # steps of the next chunk; the last status read
    budget, read_at = _steps_in(_CHUNK_SECONDS, _SECONDS_PER_STEP.get(timing)), started
    records: list[tuple] = []  # with history: each chunk's records and step count
    dispatched = 0
    interrupted = out_of_time = False
    finish = compiled(run_solution)
    try:
        while True:
            most = budget if limit is None else min(budget, limit - dispatched)
            if checkpoint is not None:  # chunks end at the checkpoints
                to_next = checkpoint.steps_to_next(dispatched)
                most = to_next if most is None else min(most, to_next)
            unit = source.next(most)
            if unit is None:  # the data ran out, or a Ctrl-C came before any batch was read
                interrupted = source.interrupted
                break
            count, run = unit
            begin = fresh and not recent
            chunk = run(carry, count, begin=begin)
            at = recent[-1].chunk.iteration if recent else 0
            recent = recent[-1:] + [_Dispatched(carry, at, begin, run, chunk)]
            if options.history:
                records.append((chunk.records, chunk.executed))
            carry = chunk.carry
            dispatched += count
            if (
                checkpoint is not None
                and checkpoint.due(dispatched)
                and int(chunk.status) == RUNNING
            ):
                # written at once (one wait per checkpoint): a chunk dispatched first would
                # run before it, and a run killed there would lose it
                _write_checkpoint(checkpoint, finish, carry)
            # the previous chunk's status is read while this one runs (a chunk after a
            # stop runs no step)
            if len(recent) > 1:
                status = int(recent[0].chunk.status)  # waits for that chunk
                now = time.perf_counter()
                steps = int(recent[1].start) - int(recent[0].start)
                per_step = (now - read_at) / max(steps, 1)
                if read_at != started:  # the first read's time holds the compilation
                    _SECONDS_PER_STEP.put(timing, per_step)
                budget = _steps_in(_CHUNK_SECONDS, per_step)
                read_at = now
                if status != RUNNING:
                    break
            if options.progress and len(recent) > 1:
                done = recent[0].chunk
                advance_progress(int(done.iteration), float(done.f_last))
            if source.interrupted or interrupt_requested():
                interrupted = True
                break
            if options.maxtime is not None and time.perf_counter() - started >= options.maxtime:
                out_of_time = True
                break
            if limit is not None and dispatched >= limit:
                break
    except KeyboardInterrupt:
        interrupted = True
    if not recent:
        raise ValueError("solve: `data` holds no batch.")
    last = recent[-1].chunk.carry
    # dispatched before the statuses are read, so that it runs right after the last chunk
    # (a run that stopped early replays a chunk and finishes again)
    at_last = finish(last)
    final = _final_carry(recent)
    solution, summary = at_last if final is last else finish(final)
    solution = solution.unpack()
    status, reason, iterations, f_evals, grad_evals, skipped = (int(v) for v in np.asarray(summary))
    if status == RUNNING:
        # the data or the epochs ran out: the iteration budget was used up
        status = int(
            ReturnCode.INTERRUPTED
            if interrupted
            else ReturnCode.MAXTIME
            if out_of_time
            else ReturnCode.MAXITERS
        )
    history = None
    if options.history:
        counts = jax.device_get([n for _, n in records])
        parts = [
            jax.tree_util.tree_map(lambda a, n=n: a[:n], r) for (r, _), n in zip(records, counts)
        ]
        history = History(*jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *parts))
    stats = Stats(
        iterations=iterations,
        f_evals=f_evals,
        grad_evals=grad_evals,
        time=solution.stats.time,
        skipped=None if skipped < 0 else skipped,
    )
    return replace(
        solution,
        retcode=ReturnCode(status),
        reason=reason,
        stats=stats,
        history=history,
        original=solution.state,
    )


def _write_checkpoint(checkpoint, finish, carry) -> None:
    """A running chunk's end as the checkpoint."""
    solution, summary = finish(carry)
    solution = solution.unpack()
    _, _, iterations, f_evals, grad_evals, _ = (int(v) for v in np.asarray(summary))
    checkpoint.write(
        replace(
            solution,
            retcode=ReturnCode.INTERRUPTED,
            reason=None,
            history=None,
            original=solution.state,
            stats=Stats(iterations=iterations, f_evals=f_evals, grad_evals=grad_evals),
        )
    )


def _final_carry(recent: list[_Dispatched]):
    """The run's last carry: the last chunk's, or, where a step stopped the run, the stopped
    chunk replayed (silently) up to that step, whose update the step had applied."""
    for dispatched in recent:
        stopped = dispatched.chunk
        if int(stopped.status) == int(ReturnCode.TERMINATED):
            return stopped.carry  # the callback stops after a step's update, which it keeps
        if int(stopped.status) != RUNNING:
            steps = int(stopped.iteration) - int(dispatched.start)
            replayed = dispatched.run(dispatched.carry_in, steps, True, dispatched.begin).carry
            return FlatCarry.of(stopped_at(replayed.unpack(), stopped.carry.unpack()))
    return recent[-1].chunk.carry


def _chain(first: list, rest: Iterable):
    yield from first
    yield from rest
