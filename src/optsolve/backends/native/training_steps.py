"""The compiled side of training on data: the driver's gradient step
(:func:`optsolve.backends.native.driver.stream_loop`) run over a chunk of stacked batches or
over whole epochs of in-memory data, one batch per step. The driver owns the step: the
non-finite checks, the callback and progress bar, the history, the counts and the verdict;
this module only picks each step's batch. :mod:`optsolve.backends.native.training` runs
these chunks from the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.native.driver import StreamLoop, running, stream_loop
from optsolve.backends.native.in_memory import rows_of
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.prepared import FlatCarry, Prepared, zeros_of
from optsolve.backends.native.rules import INT
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.capabilities import check_objective
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import leaf_spec, replace, tree_spec

PyTree = Any


class Chunk(NamedTuple):
    carry: FlatCarry  # the driver's carry after the chunk (without its record)
    executed: jax.Array  # steps run by this call, a failing one included
    records: tuple  # with ``history``: this chunk's batch losses, gradient norms,
    # metrics and evaluations (None where not recorded)
    status: jax.Array  # the carry's status, iteration and last finite loss, which the
    iteration: jax.Array  # host reads
    f_last: jax.Array


def _on_batch(problem: OptimizationProblem, batch) -> Objective:
    return Objective(problem.f, problem.p, batch=(batch,))


class _Steps(NamedTuple):
    executed: jax.Array
    carry: Any


def _run_steps(parts: StreamLoop, problem, steps: _Steps, batches, offset, end) -> _Steps:
    """Steps while the run goes on and ``carry.iteration < end``, step k on
    ``batches[k - offset]``."""

    def body(steps: _Steps) -> _Steps:
        batch = jax.tree_util.tree_map(
            lambda a: lax.dynamic_index_in_dim(a, steps.carry.iteration - offset, keepdims=False),
            batches,
        )
        return _Steps(steps.executed + 1, parts.step(steps.carry, _on_batch(problem, batch)))

    return lax.while_loop(lambda s: running(s.carry) & (s.carry.iteration < end), body, steps)


def _begin(solver, problem, options, carry: FlatCarry, first, batch) -> Any:
    """The chunk's starting carry: ``carry``, or, where ``first`` (the first chunk of a run
    that does not resume), the run's first carry, made here (one compiled call fewer per
    run; ``carry`` is then a stand-in of the right shapes)."""
    starting = stream_loop(solver, problem, dataclasses.replace(options, history=0))
    fresh = lambda: starting.init(_on_batch(problem, batch))._replace(record=None)
    return lax.cond(first, fresh, carry.unpack)


def _start(parts: StreamLoop, carry, objective: Objective, length: int) -> _Steps:
    """The chunk's start: with ``history``, a record of its own ``length`` steps
    (``objective``, on one of its batches, gives the shapes of the metrics)."""
    return _Steps(jnp.zeros((), INT), parts.new_record(carry, objective, length))


def _finish(steps: _Steps) -> Chunk:
    # The chunk's Solution is built once, by run_solution, not by every chunk: each output
    # buffer of a compiled call costs its dispatch.
    carry, record = steps.carry, steps.carry.record
    records = (
        ()
        if record is None
        else (record.objective, record.grad_norm, record.metrics, record.evaluation)
    )
    return Chunk(
        FlatCarry.of(carry._replace(record=None)),
        steps.executed,
        records,
        carry.status,
        carry.iteration,
        carry.f_last,
    )


def _replaying(options: SolveOptions, replay) -> SolveOptions:
    # an argument, not a leaf fixed per run: one compiled function runs and replays
    return dataclasses.replace(options, replay=replay)


def chunk_of_batches(solver, problem, options, carry, batches: list, n, replay, begin) -> Chunk:
    """The first ``n`` of a list of same-shaped batches, stacked on the device
    (``replay``: a bool array, True while the host replays steps it ran before; ``begin``:
    a bool array, True where the run starts here, see :func:`_begin`)."""
    parts = stream_loop(solver, problem, _replaying(options, replay))
    stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *batches)
    first_batch = jax.tree_util.tree_map(lambda a: a[0], stacked)
    carry = _begin(solver, problem, options, carry, begin, first_batch)
    first = carry.iteration
    steps = _start(parts, carry, _on_batch(problem, first_batch), len(batches))
    return _finish(_run_steps(parts, problem, steps, stacked, first, first + n))


def epochs_chunk(
    solver,
    problem,
    options,
    batch_size,
    slots,
    carry,
    data,
    key,
    first_epoch,
    lead,
    n_epochs,
    n,
    replay,
    begin,
) -> Chunk:
    """The first ``n`` steps of epochs ``first_epoch`` .. ``first_epoch + n_epochs - 1``
    (at most ``slots``, static), from batch ``lead`` of the first (where a resumed run
    continues): each epoch a permutation of the data (in order without a key) cut into
    batches of ``batch_size``. Several epochs per call spare a dispatch and a status read
    per epoch. ``replay`` and ``begin`` as in :func:`chunk_of_batches`."""
    parts = stream_loop(solver, problem, _replaying(options, replay))
    one_batch = jax.tree_util.tree_map(lambda a: a[:batch_size], data)
    carry = _begin(solver, problem, options, carry, begin, one_batch)
    size = jax.tree_util.tree_leaves(data)[0].shape[0]
    n_batches = size // batch_size
    first = carry.iteration
    used = n_batches * batch_size
    # every slot's order, drawn together (the host keeps slots x samples small)
    orders = (
        None
        if key is None
        else jax.vmap(
            lambda e: jax.random.permutation(jax.random.fold_in(key, first_epoch + e), size)[:used]
        )(jnp.arange(slots, dtype=INT))
    )

    # one loop over the chunk's steps, each gathering its batch (as the run under jax.jit
    # does): a loop per epoch inside a loop over epochs runs slower
    def body(steps: _Steps) -> _Steps:
        epoch, index = jnp.divmod(lead + steps.carry.iteration - first, n_batches)
        batch = rows_of(
            data,
            None if orders is None else lax.dynamic_index_in_dim(orders, epoch, keepdims=False),
            index,
            batch_size,
        )
        return _Steps(steps.executed + 1, parts.step(steps.carry, _on_batch(problem, batch)))

    end = first + jnp.minimum(n, n_epochs * n_batches - lead)
    start = _start(parts, carry, _on_batch(problem, one_batch), slots * n_batches)
    return _finish(
        lax.while_loop(lambda s: running(s.carry) & (s.carry.iteration < end), body, start)
    )


def run_solution(solver, problem, options, carry) -> tuple[FlatCarry, jax.Array]:
    """The run's Solution from its last carry, flat (``unpack()`` it; ``original`` None:
    the host sets it to the state), and its retcode, reason and counts stacked in one int
    array (the host reads them in one transfer)."""
    solution = stream_loop(solver, problem, options).finish(carry.unpack())
    # ``original`` is the state: one output, not two (each output buffer costs the call)
    solution = replace(solution, original=None)
    stats = solution.stats
    skipped = -1 if stats.skipped is None else stats.skipped  # -1: no step may skip
    summary = jnp.stack(
        [
            jnp.asarray(v, INT)
            for v in (
                solution.retcode,
                solution.reason,
                stats.iterations,
                stats.f_evals,
                stats.grad_evals,
                skipped,
            )
        ]
    )
    return FlatCarry.of(solution), summary


def _init(solver, problem, options, batch_spec):
    """The run's first carry: x0 (or ``options.resume``'s point and state), the optimizer
    state, zero counters (compiled once). ``batch_spec`` (static: shapes and dtypes) stands
    for a batch; no data is needed."""
    treedef, leaves = batch_spec
    python_zeros = {"bool": False, "int": 0, "float": 0.0, "complex": 0j}
    batch = jax.tree_util.tree_unflatten(
        treedef,
        [
            python_zeros[spec[1]] if spec[0] == "python" else jnp.zeros(spec[0], spec[1])
            for spec in leaves
        ],
    )
    carry = stream_loop(solver, problem, options).init(_on_batch(problem, batch))
    return FlatCarry.of(carry._replace(record=None))


def init_carry(make_solver, problem, algorithm, options, batch):
    """The first carry; ``batch`` (arrays or ``jax.ShapeDtypeStruct`` leaves) gives shapes."""
    check_objective(problem, batch)
    return Prepared(make_solver, problem, algorithm, options)(_init, tree_spec(batch))()


_STAND_INS = BoundedCache(64)


def stand_in_carry(make_solver, problem, algorithm, options, batch) -> FlatCarry:
    """Zeros shaped like the run's first carry (cached per structure: finding the shapes
    traces the start), for a first chunk that makes the carry itself (:func:`_begin`)."""
    prepared = Prepared(make_solver, problem, algorithm, options)
    spec = tree_spec(batch)
    key = (make_solver, prepared.treedef, tuple(leaf_spec(leaf) for leaf in prepared.leaves), spec)

    def make():  # the objective checked once per structure and shapes, as the carry is found
        check_objective(problem, batch)
        return jax.tree_util.tree_map(zeros_of, jax.eval_shape(prepared(_init, spec)))

    return _STAND_INS.get_or_make(key, make)
