"""Training on data: minimise f(x, p, batch) over a stream of minibatches.

Two ways to feed data, one compiled step either way:

- an iterable of batches (a generator, a data loader, a list): a host loop calls one compiled
  step per batch, without waiting for it (JAX dispatches asynchronously; the host reads the
  run's status every 16 steps);
- in-memory arrays with ``batch_size`` (and ``key`` to shuffle): each epoch is one compiled
  ``lax.scan`` over the batches of a permutation of the data.

The step is guarded: after a stop (maxiters, the callback, a non-finite loss, gradient or
update) further steps change nothing, so the last good iterate is kept. A KeyboardInterrupt
returns the last completed step with ``ReturnCode.INTERRUPTED``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.iterative import Objective, inf_norm
from optsolve.solve_api.capabilities import check_objective
from optsolve.solve_api.host import call_user_callback, report_progress, wants_grad_norm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import History, Solution, Stats

PyTree = Any
_INT = jnp.int32
_CHECK_EVERY = 16  # host reads of the run's status in the iterator loop


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


def _guarded_step(solver, problem: OptimizationProblem, options: SolveOptions, maxiters,
                  carry: _TrainCarry, batch) -> tuple[_TrainCarry, tuple]:
    """One training step; after a stop (or a non-finite value) it changes nothing.

    Selects, not a ``lax.cond``, keep finished runs unchanged: the step is always computed
    (the host stops within a few steps) and the common case pays no conditional.
    Returns the new carry and, with ``history``, the batch loss and gradient norm.
    """
    objective = Objective(lambda x, p: problem.f(x, p, batch), problem.p)
    f_dtype = carry.objective.dtype
    active = carry.status == RUNNING
    f, g = objective.value_and_grad(carry.x)
    x_new, state_new, _, _ = solver.update(objective, carry.x, f, g, carry.state)
    leaves = jax.tree_util.tree_leaves((f, g, x_new))
    ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))
    accept = active & ok
    iteration = carry.iteration + accept.astype(_INT)
    steps = carry.steps + active.astype(_INT)
    wants_norm = options.history or options.progress or (
        options.callback is not None and wants_grad_norm(options.callback))
    gnorm = inf_norm(g).astype(f_dtype) if wants_norm else None
    stop = jnp.zeros((), bool)
    if options.callback is not None:
        due = accept & (steps % options.callback_every == 0)
        extra = (gnorm,) if wants_grad_norm(options.callback) else ()
        stop = lax.cond(due, lambda: call_user_callback(options.callback, due, iteration,
                                                        x_new, f, *extra),
                        lambda: jnp.zeros((), bool))
    if options.progress:
        stop |= report_progress(accept, iteration, f, gnorm)
    status = jnp.select([~active, ~ok, stop, steps >= maxiters],
                        [carry.status, int(ReturnCode.FAILURE), int(ReturnCode.TERMINATED),
                         int(ReturnCode.MAXITERS)], RUNNING).astype(_INT)
    x, state = jax.tree_util.tree_map(lambda a, b: jnp.where(accept, a, b),
                                      (x_new, state_new), (carry.x, carry.state))
    new_carry = _TrainCarry(x, state, iteration, steps, status,
                            jnp.where(accept, f, carry.objective))
    if not options.history:
        return new_carry, ()
    nan = jnp.full((), jnp.nan, f_dtype)
    return new_carry, (jnp.where(active, f, nan), jnp.where(active, gnorm, nan))


_PREPARED: dict = {}


def _prepared(body, make_solver, problem, algorithm, options, maxiters, *static):
    """``body`` compiled with the run's fixed arguments bound as a flat list of arrays.

    Flattening the problem, the algorithm and the options once per run, not once per step
    or epoch, keeps each dispatch as cheap as a hand-written jitted step's. ``body(solver,
    problem, options, maxiters, *static, *args)``; compiled functions are cached by the
    fixed arguments' structure.
    """
    leaves, treedef = jax.tree_util.tree_flatten((problem, algorithm, options, maxiters))
    key = (body, make_solver, treedef, static)
    compiled = _PREPARED.get(key)
    if compiled is None:
        def run(leaves, *args):
            problem, algorithm, options, maxiters = jax.tree_util.tree_unflatten(treedef, leaves)
            solver = make_solver(algorithm, problem)
            return body(solver, problem, options, maxiters, *static, *args)

        if len(_PREPARED) >= 64:  # bound the cache: each entry holds compiled code
            _PREPARED.pop(next(iter(_PREPARED)))
        compiled = _PREPARED[key] = jax.jit(run)
    return functools.partial(compiled, leaves)


def _epoch(solver, problem, options, maxiters, batch_size, carry, data, key, epoch):
    """One epoch: a permutation of the data (in order without a key), scanned in batches."""
    n = jax.tree_util.tree_leaves(data)[0].shape[0]
    n_batches = n // batch_size
    order = jnp.arange(n) if key is None else jax.random.permutation(
        jax.random.fold_in(key, epoch), n)
    order = order[: n_batches * batch_size]
    batches = jax.tree_util.tree_map(
        lambda a: a[order].reshape((n_batches, batch_size) + a.shape[1:]), data)
    return lax.scan(lambda c, b: _guarded_step(solver, problem, options, maxiters, c, b),
                    carry, batches)


def _init(solver, problem, options, maxiters, batch):
    """The optimizer state at x0 and a zero of the objective's dtype (compiled once)."""
    if not hasattr(solver, "update"):
        raise ValueError(
            "solve: this transformation ends in a line search, which needs one deterministic "
            "objective; training on `data` takes update-only transformations "
            "(optsolve.Adam, optax.chain of plain transforms, ...)."
        )
    objective = Objective(lambda x, p: problem.f(x, p, batch), problem.p)
    f_dtype = jax.eval_shape(objective.value, problem.x0).dtype
    return solver.init(objective, problem.x0), jnp.zeros((), f_dtype)


def _init_carry(make_solver, problem, algorithm, options, maxiters, first_batch,
                resume) -> _TrainCarry:
    check_objective(problem, first_batch)
    init = _prepared(_init, make_solver, problem, algorithm, options, maxiters)
    state, f_zero = init(first_batch)
    zero = jnp.zeros((), _INT)
    if resume is not None:
        return _TrainCarry(resume.x, resume.state, jnp.asarray(resume.stats.iterations, _INT),
                           zero, jnp.asarray(RUNNING, _INT),
                           jnp.asarray(resume.objective, f_zero.dtype))
    return _TrainCarry(problem.x0, state, zero, zero, jnp.asarray(RUNNING, _INT),
                       jnp.full((), jnp.nan, f_zero.dtype))


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


def run_training(make_solver, problem: OptimizationProblem, algorithm: Any,
                 options: SolveOptions) -> Solution:
    """Train ``algorithm`` on ``options.data``; see the module docstring."""
    spec: DataSpec = options.data
    loop_options = dataclasses.replace(options, data=None, resume=None)
    maxiters = jnp.asarray(options.maxiters if options.maxiters is not None
                           else jnp.iinfo(_INT).max, _INT)
    records: list = []
    start = time.perf_counter()
    interrupted = out_of_time = False

    def time_up() -> bool:
        return options.maxtime is not None and time.perf_counter() - start >= options.maxtime

    if spec.in_memory:
        first = jax.tree_util.tree_map(lambda a: a[: spec.batch_size], spec.source)
        carry = _init_carry(make_solver, problem, algorithm, loop_options, maxiters, first,
                            options.resume)
        run_epoch = _prepared(_epoch, make_solver, problem, algorithm, loop_options, maxiters,
                              spec.batch_size)
        epochs = spec.epochs if spec.epochs is not None else 1
        # each unit of work is one compiled epoch; the status is read after every one
        units = ((lambda carry, epoch=epoch: run_epoch(carry, spec.source, spec.key, epoch))
                 for epoch in range(epochs))
        check_every = 1
    else:
        batches = iter(_batches(spec))
        try:
            first = next(batches)
        except StopIteration:
            raise ValueError("solve: `data` holds no batch.") from None
        carry = _init_carry(make_solver, problem, algorithm, loop_options, maxiters, first,
                            options.resume)
        step = _prepared(_guarded_step, make_solver, problem, algorithm, loop_options, maxiters)
        units = ((lambda carry, batch=batch: step(carry, batch))
                 for batch in _chain([first], batches))
        check_every = _CHECK_EVERY
    try:
        for count, unit in enumerate(units, start=1):
            carry, record = unit(carry)
            if options.history:
                records.append(record)
            if count % check_every == 0:
                if int(carry.status) != RUNNING:
                    break
                if time_up():
                    out_of_time = True
                    break
    except KeyboardInterrupt:
        interrupted = True
    carry = jax.block_until_ready(carry)
    status = int(carry.status)
    if interrupted:
        status = int(ReturnCode.INTERRUPTED)
    elif status == RUNNING:
        # the data or the epochs ran out: the iteration budget was used up
        status = int(ReturnCode.MAXTIME if out_of_time else ReturnCode.MAXITERS)
    history = None
    if options.history:
        objective = jnp.concatenate([jnp.ravel(r[0]) for r in records]) if records else None
        grad_norm = jnp.concatenate([jnp.ravel(r[1]) for r in records]) if records else None
        history = History(objective, grad_norm)
    return Solution(
        x=carry.x, objective=carry.objective, retcode=jnp.asarray(status, _INT),
        stats=Stats(iterations=carry.iteration, f_evals=carry.steps, grad_evals=carry.steps,
                    time=None),
        original=carry.state, state=carry.state, history=history,
    )


def _chain(first: list, rest: Iterable):
    yield from first
    yield from rest
