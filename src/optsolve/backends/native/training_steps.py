"""The compiled side of training on data: one step (loss, gradient, update, callback), the
step loop over a chunk of stacked batches or over whole epochs of in-memory data, and the
first carry. :mod:`optsolve.backends.native.training` runs these chunks from the host.

Steps are not guarded one by one (a select over every parameter and state leaf costs as much
as the step itself on small models): the loop leaves at a non-finite loss or at the
callback's stop, and a chunk reports whether its last iterate is finite.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.native.objective import Objective, inf_norm
from optsolve.backends.native.protocol import GradientStepSolver
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.capabilities import check_objective
from optsolve.solve_api.host import call_user_callback, report_progress, wants_grad_norm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import tree_spec
from optsolve.solve_api.returncode import RUNNING, ReturnCode

PyTree = Any
INT = jnp.int32


class TrainCarry(NamedTuple):
    x: PyTree
    state: PyTree
    iteration: jax.Array   # completed updates, counting a resumed run's
    steps: jax.Array       # steps (loss and gradient evaluations) of this run
    status: jax.Array
    objective: jax.Array   # the loss of the last completed step's batch


class Chunk(NamedTuple):
    carry: TrainCarry
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
    x_new, state_new = solver.update(objective, x, f, g, state)[:2]
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
        due = jnp.isfinite(f) & (iteration % options.progress_every == 0)
        stop |= lax.cond(due, lambda: report_progress(due, iteration, f, gnorm),
                         lambda: jnp.zeros((), bool))
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


def _start(carry: TrainCarry, length: int, options) -> _Loop:
    f_dtype = carry.objective.dtype
    records = ((jnp.full((length,), jnp.nan, f_dtype),) * 2) if options.history else ()
    return _Loop(jnp.zeros((), INT), carry.x, carry.state, jnp.zeros((), f_dtype),
                 jnp.zeros((), bool), records)


def _step_loop(solver, problem, options, carry: TrainCarry, loop: _Loop, batches, offset,
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


def _finish(carry: TrainCarry, loop: _Loop) -> Chunk:
    """The carry after ``loop``, with its status (FAILURE at a non-finite loss, TERMINATED
    at a stop request) and whether its last iterate is finite."""
    executed = loop.i
    status = jnp.where(~jnp.isfinite(loop.f), int(ReturnCode.FAILURE),
                       jnp.where(loop.stop, int(ReturnCode.TERMINATED), carry.status)
                       ).astype(INT)
    carry = TrainCarry(loop.x, loop.state, carry.iteration + executed, carry.steps + executed,
                        status, jnp.where(executed > 0, loop.f, carry.objective))
    x_finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf))
                                  for leaf in jax.tree_util.tree_leaves(loop.x)]))
    # one array, so that the host reads the chunk's outcome in one transfer
    flags = jnp.stack([status, executed, x_finite.astype(INT)])
    return Chunk(carry, flags, loop.records)


def chunk_of_batches(solver, problem, options, carry, batches: list, n) -> Chunk:
    """The first ``n`` of a list of same-shaped batches, stacked on the device."""
    stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *batches)
    n = jnp.where(carry.status == RUNNING, n, 0)
    loop = _step_loop(solver, problem, options, carry, _start(carry, len(batches), options),
                      stacked, 0, n)
    return _finish(carry, loop)


def epochs_chunk(solver, problem, options, batch_size, slots, carry, data, key, first_epoch,
            n_epochs, n) -> Chunk:
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

    start = (jnp.zeros((), INT), _start(carry, slots * n_batches, options))
    return _finish(carry, lax.while_loop(cond, body, start)[1])


_PREPARED = BoundedCache(64)  # each entry holds compiled code


def prepared(body, make_solver, problem, algorithm, options, *static):
    """``body`` compiled with the run's fixed arguments bound as a flat list of arrays.

    Flattening the problem, the algorithm and the options once per run, not once per call,
    keeps each dispatch cheap. ``body(solver, problem, options, *static, *args)``; compiled
    functions are cached by the fixed arguments' structure.
    """
    leaves, treedef = jax.tree_util.tree_flatten((problem, algorithm, options))
    key = (body, make_solver, treedef, static)

    def compile_run():
        def run(leaves, *args):
            problem, algorithm, options = jax.tree_util.tree_unflatten(treedef, leaves)
            solver = make_solver(algorithm, problem)
            return body(solver, problem, options, *static, *args)
        return jax.jit(run)

    return functools.partial(_PREPARED.get_or_make(key, compile_run), leaves)


def _init(solver, problem, options, batch_spec) -> TrainCarry:
    """The run's first carry: x0, the optimizer state at x0, zero counters (compiled once).

    ``batch_spec`` (static: shapes and dtypes) stands for a batch; no data is needed.
    """
    if not isinstance(solver, GradientStepSolver):
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
    zero = jnp.zeros((), INT)
    return TrainCarry(problem.x0, solver.init(objective, problem.x0), zero, zero,
                       jnp.asarray(RUNNING, INT), jnp.full((), jnp.nan, f_dtype))


def init_carry(make_solver, problem, algorithm, options, batch, resume) -> TrainCarry:
    """The first carry; ``batch`` (arrays or ``jax.ShapeDtypeStruct`` leaves) gives shapes."""
    check_objective(problem, batch)
    spec = tree_spec(batch)
    carry = prepared(_init, make_solver, problem, algorithm, options, spec)()
    if resume is None:
        return carry
    return carry._replace(x=resume.x, state=resume.state,
                          iteration=jnp.asarray(resume.stats.iterations, INT),
                          objective=jnp.asarray(resume.objective, carry.objective.dtype))
