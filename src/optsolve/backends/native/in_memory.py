"""In-memory data consumed inside the compiled loop: training on data under ``jax.jit``,
``jax.vmap`` and ``jax.grad``.

The run is the shared driver's gradient step on data
(:func:`~optsolve.backends.native.driver.stream_loop`) in one loop of the caller's trace, which the
adjoint chooses (a ``lax.while_loop``, or a checkpointed scan for
:class:`~optsolve.solve_api.adjoint.UnrolledAdjoint`). Step ``s`` of the stream (counted from the
first run, so a resumed run continues at its epoch and batch) takes batch ``s % n_batches`` of epoch
``s // n_batches``: the rows ``order[e][b * batch_size : (b + 1) * batch_size]`` where ``order[e]``
is ``jax.random.permutation(fold_in(key, e), n)``, or the rows in order without a key. These are the
batches an eager run takes (:func:`~optsolve.backends.native.training_steps.epochs_chunk`), so both
runs agree.

The orders of every epoch the run spans are drawn before the loop (``epochs x n`` integers):
drawn inside it, a permutation would sit behind a conditional that ``jax.vmap`` turns into
a permutation at every step. The steps are guarded (a step that stops the run applies no
update): no host replays the run here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.native.driver import running, stopped_at, stream_loop
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.rules import INT, select
from optsolve.solve_api.loops import Loop as LoopRunner
from optsolve.solve_api.loops import while_loop
from optsolve.solve_api.options import InMemoryData, SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import replace
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import Solution

PyTree = Any


def _size(data: InMemoryData) -> int:
    return jax.tree_util.tree_leaves(data.arrays)[0].shape[0]


def epoch_orders(data: InMemoryData, first_epoch: jax.Array) -> jax.Array | None:
    """The sample order of epochs ``first_epoch`` .. ``first_epoch + data.epochs - 1``, the
    remainder dropped: an int array ``(data.epochs, n_batches * batch_size)``; None without
    a key (batches in order)."""
    if data.key is None:
        return None
    size, used = _size(data), data.batches_per_epoch * data.batch_size
    epochs = first_epoch + jnp.arange(data.epochs, dtype=jnp.result_type(first_epoch))
    return jax.vmap(lambda e: jax.random.permutation(jax.random.fold_in(data.key, e), size)[:used])(
        epochs
    )


def rows_of(arrays: PyTree, order: jax.Array | None, index: jax.Array, batch_size: int) -> PyTree:
    """Batch ``index`` of an epoch of ``arrays``: the rows ``order[index * batch_size :
    (index + 1) * batch_size]``, or those rows in place where ``order`` is None."""
    start = index * batch_size
    if order is None:
        return jax.tree_util.tree_map(
            lambda a: lax.dynamic_slice_in_dim(a, start, batch_size), arrays
        )
    rows = lax.dynamic_slice_in_dim(order, start, batch_size)
    return jax.tree_util.tree_map(lambda a: jnp.take(a, rows, axis=0), arrays)


def batch_at(
    data: InMemoryData, orders: jax.Array | None, step: jax.Array, first_epoch: jax.Array
) -> PyTree:
    """The batch of stream step ``step`` (``orders`` from :func:`epoch_orders`)."""
    epoch, index = jnp.divmod(step, data.batches_per_epoch)
    batch = rows_of(
        data.arrays,
        None
        if orders is None
        else lax.dynamic_index_in_dim(orders, epoch - first_epoch, keepdims=False),
        index,
        data.batch_size,
    )
    if data.sharding is not None:  # each device takes its share of the batch
        batch = jax.tree_util.tree_map(
            lambda b: lax.with_sharding_constraint(b, data.sharding), batch
        )
    return batch


def _on_batch(problem: OptimizationProblem, batch: PyTree) -> Objective:
    return Objective(problem.f, problem.p, batch=(batch,))


def run_in_memory(
    make_solver,
    problem: OptimizationProblem,
    algorithm: Any,
    options: SolveOptions,
    loop: LoopRunner | None = None,
) -> Solution:
    """The whole run on ``options.in_memory`` in the caller's trace, in ``loop`` (the
    adjoint's; a while loop by default). A run whose data ran out (``in_memory.steps``
    taken) ends with MAXITERS, as an eager one does."""
    data: InMemoryData = options.in_memory
    solver = make_solver(algorithm, problem)
    # Under the adjoint's loop (differentiated) a step that stops the run applies no update;
    # otherwise every step updates (a conditional per step costs more than the step's
    # bookkeeping) and a run that stopped runs its steps again up to the stop.
    replays = loop is None
    parts = stream_loop(solver, problem, options, guarded=not replays)
    head = jax.tree_util.tree_map(lambda a: a[: data.batch_size], data.arrays)
    carry = parts.init(_on_batch(problem, head))
    first_epoch = (carry.base.iterations // data.batches_per_epoch).astype(INT)
    orders = epoch_orders(data, first_epoch)

    def steps(parts, until):
        def step(c):
            batch = batch_at(data, orders, c.base.iterations + c.iteration, first_epoch)
            return parts.step(c, _on_batch(problem, batch))

        return lambda c: running(c) & (c.iteration < until), step

    if not replays:
        final = loop(*steps(parts, data.steps), carry)
    else:
        # One loop of steps, run from the first carry once, and where a step stopped the run
        # before its update counted (a callback's stop keeps the update) once more up to
        # that step, silently: the step's program is built once, not once per run.
        def must_replay(stopped):
            return ~running(stopped) & (stopped.status != int(ReturnCode.TERMINATED))

        def run_again(state):
            runs, stopped, _ = state
            again = runs == 1
            quiet = stream_loop(solver, problem, replace(options, replay=again))
            last = while_loop(*steps(quiet, jnp.where(again, stopped.iteration, data.steps)), carry)
            return runs + 1, select(again, stopped, last), last

        _, stopped, last = while_loop(
            lambda state: (state[0] == 0) | ((state[0] == 1) & must_replay(state[1])),
            run_again,
            (jnp.zeros((), INT), carry, carry),
        )
        final = select(
            must_replay(stopped), stopped_at(last, stopped)._replace(record=stopped.record), stopped
        )
    solution = parts.finish(final)
    ran_out = solution.retcode == RUNNING
    return replace(
        solution, retcode=jnp.where(ran_out, int(ReturnCode.MAXITERS), solution.retcode).astype(INT)
    )


run_in_memory_compiled = jax.jit(run_in_memory, static_argnums=(0, 4))
