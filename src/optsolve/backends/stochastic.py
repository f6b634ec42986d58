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
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optsolve.backends.iterative import Objective, inf_norm
from optsolve.solve_api.capabilities import check_objective
from optsolve.solve_api.host import call_user_callback, report_progress, wants_grad_norm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import tree_spec
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import History, Solution, Stats

PyTree = Any
_INT = jnp.int32
_CHUNK = 16  # batches of an iterable run per compiled call
_EPOCH_SLOTS = 8  # epochs of in-memory data run per compiled call


@dataclasses.dataclass(frozen=True, eq=False)
class DataSpec:
    """How ``solve`` feeds data (see ``solve``'s ``data``, ``batch_size``, ``key``, ``epochs``)."""

    source: Any
    batch_size: int | None = None
    key: Any = None
    epochs: int | None = None

    @property
    def in_memory(self) -> bool:
        return self.batch_size is not None


class _TrainCarry(NamedTuple):
    x: PyTree
    state: PyTree
    iteration: jax.Array   # completed updates, counting a resumed run's
    steps: jax.Array       # steps (loss and gradient evaluations) of this run
    status: jax.Array
    objective: jax.Array   # the loss of the last completed step's batch


class _Chunk(NamedTuple):
    carry: _TrainCarry
    flags: jax.Array       # [status, steps run by this call, whether the last x is finite]
    records: tuple         # with ``history``: the batch losses and gradient norms, NaN-padded


def _train_step(solver, problem: OptimizationProblem, options: SolveOptions, x, state,
                steps, iteration, batch) -> tuple:
    """One training step: the loss and gradient at ``x`` on ``batch``, then the update.

    ``steps`` counts this run's steps and ``iteration`` all updates (a resumed run's too),
    this one included. Returns the new x and state, the batch loss, whether the callback
    (or the progress bar) asks to stop, and the loss and gradient norm for the history.
    """
    objective = Objective(lambda x, p: problem.f(x, p, batch), problem.p)
    f, g = objective.value_and_grad(x)
    x_new, state_new, _, _ = solver.update(objective, x, f, g, state)
    wants_norm = options.history or options.progress or (
        options.callback is not None and wants_grad_norm(options.callback))
    gnorm = inf_norm(g).astype(f.dtype) if wants_norm else None
    stop = jnp.zeros((), bool)
    if options.callback is not None:
        due = jnp.isfinite(f) & (steps % options.callback_every == 0)
        extra = (gnorm,) if wants_grad_norm(options.callback) else ()
        stop = lax.cond(due, lambda: call_user_callback(options.callback, due, iteration,
                                                        x_new, f, *extra),
                        lambda: jnp.zeros((), bool))
    if options.progress:
        stop |= report_progress(jnp.isfinite(f), iteration, f, gnorm)
    return x_new, state_new, f, stop, (f, gnorm)


class _Loop(NamedTuple):
    """What the compiled step loop carries: only what each step needs (counters and the
    status are derived once at the end; every extra operation in the body is paid per step)."""
    i: jax.Array       # steps run by this call
    x: PyTree
    state: PyTree
    f: jax.Array       # the last step's batch loss
    stop: jax.Array    # the callback (or the progress bar) asked to stop
    records: tuple     # with ``history``: batch losses and gradient norms, NaN-padded


def _start(carry: _TrainCarry, length: int, options) -> _Loop:
    f_dtype = carry.objective.dtype
    records = ((jnp.full((length,), jnp.nan, f_dtype),) * 2) if options.history else ()
    return _Loop(jnp.zeros((), _INT), carry.x, carry.state, jnp.zeros((), f_dtype),
                 jnp.zeros((), bool), records)


def _step_loop(solver, problem, options, carry: _TrainCarry, loop: _Loop, batches, offset,
               end) -> _Loop:
    """Steps ``loop.i`` .. ``end - 1`` on ``batches[i - offset]``, leaving early after a
    non-finite loss or a stop request."""
    def cond(loop):
        return (loop.i < end) & jnp.isfinite(loop.f) & ~loop.stop

    def body(loop):
        i = loop.i
        batch = jax.tree_util.tree_map(
            lambda a: lax.dynamic_index_in_dim(a, i - offset, keepdims=False), batches)
        x, state, f, stop, out = _train_step(solver, problem, options, loop.x, loop.state,
                                             carry.steps + i + 1, carry.iteration + i + 1,
                                             batch)
        records = loop.records
        if options.history:
            records = tuple(r.at[i].set(o) for r, o in zip(records, out))
        return _Loop(i + 1, x, state, f, stop, records)

    return lax.while_loop(cond, body, loop)


def _finish(carry: _TrainCarry, loop: _Loop) -> _Chunk:
    """The carry after ``loop``, with its status (FAILURE at a non-finite loss, TERMINATED
    at a stop request) and whether its last iterate is finite."""
    executed = loop.i
    status = jnp.where(~jnp.isfinite(loop.f), int(ReturnCode.FAILURE),
                       jnp.where(loop.stop, int(ReturnCode.TERMINATED), carry.status)
                       ).astype(_INT)
    carry = _TrainCarry(loop.x, loop.state, carry.iteration + executed, carry.steps + executed,
                        status, jnp.where(executed > 0, loop.f, carry.objective))
    x_finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf))
                                  for leaf in jax.tree_util.tree_leaves(loop.x)]))
    # one array, so that the host reads the chunk's outcome in one transfer
    flags = jnp.stack([status, executed, x_finite.astype(_INT)])
    return _Chunk(carry, flags, loop.records)


def _chunk_of_batches(solver, problem, options, carry, batches: list, n) -> _Chunk:
    """The first ``n`` of a list of same-shaped batches, stacked on the device."""
    stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *batches)
    n = jnp.where(carry.status == RUNNING, n, 0)
    loop = _step_loop(solver, problem, options, carry, _start(carry, len(batches), options),
                      stacked, 0, n)
    return _finish(carry, loop)


def _epochs(solver, problem, options, batch_size, slots, carry, data, key, first_epoch,
            n_epochs, n) -> _Chunk:
    """The first ``n`` steps of epochs ``first_epoch`` .. ``first_epoch + n_epochs - 1``
    (at most ``slots``, static): each a permutation of the data (in order without a key)
    cut into batches of ``batch_size``. Several epochs per call spare a dispatch and a
    status read per epoch."""
    size = jax.tree_util.tree_leaves(data)[0].shape[0]
    n_batches = size // batch_size
    n = jnp.where(carry.status == RUNNING, n, 0)

    def epoch_batches(epoch):
        order = jnp.arange(size) if key is None else jax.random.permutation(
            jax.random.fold_in(key, epoch), size)
        order = order[: n_batches * batch_size]
        return jax.tree_util.tree_map(
            lambda a: a[order].reshape((n_batches, batch_size) + a.shape[1:]), data)

    def cond(outer):
        e, loop = outer
        return (e < n_epochs) & (loop.i < n) & jnp.isfinite(loop.f) & ~loop.stop

    def body(outer):
        e, loop = outer
        offset = e * n_batches
        loop = _step_loop(solver, problem, options, carry, loop, epoch_batches(first_epoch + e),
                          offset, jnp.minimum(n, offset + n_batches))
        return e + 1, loop

    start = (jnp.zeros((), _INT), _start(carry, slots * n_batches, options))
    return _finish(carry, lax.while_loop(cond, body, start)[1])


_PREPARED: dict = {}


def _prepared(body, make_solver, problem, algorithm, options, *static):
    """``body`` compiled with the run's fixed arguments bound as a flat list of arrays.

    Flattening the problem, the algorithm and the options once per run, not once per call,
    keeps each dispatch cheap. ``body(solver, problem, options, *static, *args)``; compiled
    functions are cached by the fixed arguments' structure.
    """
    leaves, treedef = jax.tree_util.tree_flatten((problem, algorithm, options))
    key = (body, make_solver, treedef, static)
    compiled = _PREPARED.get(key)
    if compiled is None:
        def run(leaves, *args):
            problem, algorithm, options = jax.tree_util.tree_unflatten(treedef, leaves)
            solver = make_solver(algorithm, problem)
            return body(solver, problem, options, *static, *args)

        if len(_PREPARED) >= 64:  # bound the cache: each entry holds compiled code
            _PREPARED.pop(next(iter(_PREPARED)))
        compiled = _PREPARED[key] = jax.jit(run)
    return functools.partial(compiled, leaves)


def _init(solver, problem, options, batch_spec) -> _TrainCarry:
    """The run's first carry: x0, the optimizer state at x0, zero counters (compiled once).

    ``batch_spec`` (static: shapes and dtypes) stands for a batch; no data is needed.
    """
    if not hasattr(solver, "update"):
        raise ValueError(
            "solve: this transformation ends in a line search, which needs one deterministic "
            "objective; training on `data` takes update-only transformations "
            "(optsolve.Adam, optax.chain of plain transforms, ...)."
        )
    treedef, leaves = batch_spec
    python_zeros = {"bool": False, "int": 0, "float": 0.0, "complex": 0j}
    batch = jax.tree_util.tree_unflatten(treedef, [
        python_zeros[spec[1]] if spec[0] == "python" else jnp.zeros(spec[0], spec[1])
        for spec in leaves])
    objective = Objective(lambda x, p: problem.f(x, p, batch), problem.p)
    f_dtype = jax.eval_shape(objective.value, problem.x0).dtype
    zero = jnp.zeros((), _INT)
    return _TrainCarry(problem.x0, solver.init(objective, problem.x0), zero, zero,
                       jnp.asarray(RUNNING, _INT), jnp.full((), jnp.nan, f_dtype))


def _init_carry(make_solver, problem, algorithm, options, batch, resume) -> _TrainCarry:
    """The first carry; ``batch`` (arrays or ``jax.ShapeDtypeStruct`` leaves) gives shapes."""
    check_objective(problem, batch)
    spec = tree_spec(batch)
    carry = _prepared(_init, make_solver, problem, algorithm, options, spec)()
    if resume is None:
        return carry
    return carry._replace(x=resume.x, state=resume.state,
                          iteration=jnp.asarray(resume.stats.iterations, _INT),
                          objective=jnp.asarray(resume.objective, carry.objective.dtype))


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
    """Chunks of up to ``_CHUNK`` same-shaped batches from an iterator, padded to ``_CHUNK``
    by repeating the last one (padding is never run) so that one compiled call serves all."""

    def __init__(self, batches: Iterator, run_chunk: Callable):
        self.batches, self.run_chunk = batches, run_chunk
        self.held = None          # a batch of another shape than the chunk it was read for
        self.interrupted = False  # Ctrl-C while reading: the batches read so far still run

    def next(self, most: int | None):
        group: list = []
        signature = None
        limit = _CHUNK if most is None else min(_CHUNK, most)
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
        padded = group + [group[-1]] * (_CHUNK - len(group))
        return len(group), lambda carry, n: self.run_chunk(carry, padded, n)


class _Epochs:
    """Chunks of up to ``_EPOCH_SLOTS`` epochs of in-memory data (one epoch with ``maxtime``,
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
    carry: _TrainCarry
    status: int


def _settle(carry_in: _TrainCarry, run: Callable, chunk: _Chunk, records: list) -> _Settled:
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
                                        status=jnp.asarray(failure, _INT)), failure)


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
        carry = _init_carry(make_solver, problem, algorithm, loop_options, first, options.resume)
        slots = 1 if options.maxtime is not None else _EPOCH_SLOTS
        source = _Epochs(spec, _prepared(_epochs, make_solver, problem, algorithm, loop_options,
                                         spec.batch_size, slots), slots)
    else:
        batches = iter(_batches(spec))
        try:
            first = next(batches)
        except StopIteration:
            raise ValueError("solve: `data` holds no batch.") from None
        carry = _init_carry(make_solver, problem, algorithm, loop_options, first, options.resume)
        source = _IterableChunks(_chain([first], batches),
                                 _prepared(_chunk_of_batches, make_solver, problem, algorithm,
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
            if source.interrupted:
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
