"""Running the compiled driver: whole inside the caller's trace, in chunks for an eager call.

An eager ``solve`` runs the loop of :mod:`optsolve.backends.native.driver` as a sequence of
calls of one compiled function, each advancing the carry by a budget of iterations (256 at
first for up to 10^4 variables, 16 beyond, then about a quarter of a second's worth,
measured on the previous chunk). Between chunks Python runs, so a KeyboardInterrupt is seen
within one chunk (within one iteration where the loop calls the host): the chunk in flight
finishes (nothing keeps computing afterwards) and its carry comes back as a Solution with
``INTERRUPTED``. The first
call starts from a zero carry of the right structure and initialises it inside the compiled
function, so every chunk shares one compilation.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optsolve.backends.native.compile_options import chunk_options, is_small, refused
from optsolve.backends.native.driver import loop_of, replays_failures, run_whole, running
from optsolve.backends.native.prepared import FlatCarry, Prepared, SharingLeaves, zeros_of
from optsolve.backends.native.protocol import GradientStepSolver
from optsolve.backends.native.rules import INT
from optsolve.solve_api import plans
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import interrupt_requested, under_a_trace
from optsolve.solve_api.loops import Loop as LoopRunner
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, leaf_spec, replace
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import Solution

# Iterations of the first chunk: small problems (most of which end within it) take more, so
# that they run in one call; large ones, whose iterations may each take long, take few.
_FIRST_BUDGET_SMALL, _FIRST_BUDGET_LARGE, _SMALL_SIZE = 256, 16, 10_000
_CHUNK_SECONDS = 0.25  # what later chunks aim at: the longest wait for a Ctrl-C
# a backend's own finish of a run's Solution: after(problem, algorithm, solution)
After = Callable[[OptimizationProblem, Any, Solution], Solution]
_TEMPLATES = BoundedCache(64)


def _chunk(
    solver,
    problem: OptimizationProblem,
    options: SolveOptions,
    first: jax.Array,
    carry_in: FlatCarry,
    budget: jax.Array,
):
    """``budget`` more iterations from ``carry_in`` (from the start where ``first``): the
    carry after them, the Solution there (``original`` None: the host sets it to the state,
    one output fewer; the return code, reason and counts None: they are the summary's),
    and :class:`_Summary`'s numbers stacked in one int array, which the host reads in one
    transfer."""
    loop = loop_of(solver, problem, options, replays_failures(solver, options))
    carry = lax.cond(first, lambda _: loop.init(), lambda c: c.unpack(), carry_in)
    end = carry.iteration + budget
    final = lax.while_loop(lambda c: running(c) & (c.iteration < end), loop.body, carry)
    solution = loop.finish(final)
    stats = solution.stats
    summary = jnp.stack(
        [
            jnp.asarray(v, INT)
            for v in (
                solution.retcode,
                solution.reason,
                stats.iterations,
                stats.f_evals,
                stats.grad_evals,
                final.iteration,
            )
        ]
    )
    # the summary's numbers go out once: as outputs of their own too, XLA would compute
    # each in a kernel of its own (the host puts them back, see _on_host)
    solution = replace(
        solution,
        original=None,
        retcode=None,
        reason=None,
        stats=replace(stats, iterations=None, f_evals=None, grad_evals=None),
    )
    carry = FlatCarry.of(final)
    return carry, SharingLeaves.of(solution, carry), summary


class _Summary(NamedTuple):
    """What the host reads of a chunk: the Solution's retcode, reason and counts, and the
    iterations of this run so far."""

    retcode: int
    reason: int
    iterations: int
    f_evals: int
    grad_evals: int
    done: int


def _on_host(solution: Solution, summary: _Summary) -> Solution:
    """A chunk's Solution (unpacked by :meth:`SharingLeaves.unpack`) with the host's
    numbers."""
    return replace(
        solution,
        original=solution.state,
        retcode=summary.retcode,
        reason=summary.reason,
        stats=replace(
            solution.stats,
            iterations=summary.iterations,
            f_evals=summary.f_evals,
            grad_evals=summary.grad_evals,
        ),
    )


_whole_compiled = jax.jit(run_whole, static_argnums=(0, 4))


def _first_carry(solver, problem: OptimizationProblem, options: SolveOptions) -> FlatCarry:
    return FlatCarry.of(loop_of(solver, problem, options, replays_failures(solver, options)).init())


def _template(prepared: Prepared) -> tuple[FlatCarry, int, bool]:
    """A zero carry with the structure, shapes and dtypes of the run's first carry, the
    first chunk's budget, and whether the run's arrays are small (see
    :func:`~optsolve.backends.native.compile_options.is_small`); cached: finding the carry
    traces the objective."""

    def make():
        program, shapes = jax.make_jaxpr(prepared(_first_carry), return_shape=True)()
        problem = jax.tree_util.tree_unflatten(prepared.treedef, prepared.leaves)[0]
        return (jax.tree_util.tree_map(zeros_of, shapes), _size(problem), is_small(program))

    try:
        key = (
            prepared.make_solver,
            prepared.treedef,
            tuple(leaf_spec(leaf) for leaf in prepared.leaves),
        )
        hash(key)
    except TypeError:
        template, size, small = make()
    else:
        template, size, small = _TEMPLATES.get_or_make(key, make)
    return template, _FIRST_BUDGET_SMALL if size <= _SMALL_SIZE else _FIRST_BUDGET_LARGE, small


_VALUES = BoundedCache(64)


def _interrupted(solution: Solution, make_solver, problem, algorithm) -> Solution:
    """A run stopped between chunks. A gradient-step run's carry holds x and the state
    after its last update, whose value is evaluated here (once), so that x, its value and
    the state belong together and ``resume=`` continues exactly."""
    if isinstance(make_solver(algorithm, problem), GradientStepSolver):
        value = _VALUES.get_or_make(problem.f, lambda: jax.jit(problem.f))
        stats, p = solution.stats, problem.p
        if solution.model_state is not None:  # the model's state as the run left it
            p = replace(p, carried=solution.model_state)
        solution = replace(
            solution,
            objective=value(solution.x, p),
            stats=replace(stats, f_evals=stats.f_evals + 1),
        )
    return replace(solution, retcode=ReturnCode.INTERRUPTED, reason=None)


def _size(problem: OptimizationProblem) -> int:
    return sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(problem.x0))


def _first_chunk(prepared: Prepared, most: int | None) -> tuple:
    """The first chunk's outputs (its carry, Solution and summary), its budget (at most
    ``most`` iterations where given), the compiled chunk, for the chunks after it, and the
    first carry it started from."""

    def run():
        template, budget, small = _template(prepared)
        budget = budget if most is None else min(budget, most)
        options = chunk_options(small)
        chunk = prepared(_chunk, compiler_options=options)
        try:
            return chunk(True, template, budget), budget, chunk, template
        except jax.errors.JaxRuntimeError as error:
            if not refused(error, options):
                raise
            chunk = prepared(_chunk)
            return chunk(True, template, budget), budget, chunk, template

    try:
        return run()
    except TypeError:
        # A cached template of another structure (module state changed since, or JAX's
        # caches were cleared): build it anew once; a second failure is the real error.
        if not _TEMPLATES:
            raise
        _TEMPLATES.clear()
        return run()


class _PlannedRun:
    """An eager run of one structure with its structure-only work done (the compiled chunk,
    the first carry and budget): what a plan keeps (:func:`optsolve.solve_api.plans.offer`)
    for later calls of that structure, called with the leaves of (problem, algorithm,
    options)."""

    def __init__(
        self,
        compiled,
        template,
        budget: int,
        make_solver,
        options: SolveOptions,
        after: After | None,
    ):
        self.compiled, self.template, self.budget = compiled, template, budget
        self.make_solver, self.options, self.after = make_solver, options, after

    def __call__(self, leaves: list, problem, algorithm) -> Solution | None:
        chunk = functools.partial(self.compiled, leaves)
        try:
            first = chunk(True, self.template, self.budget)
        except TypeError:  # a first carry that no longer fits: the layers' path instead
            return None
        solution = _chunks(
            lambda: (first, self.budget, chunk, self.template),
            self.make_solver,
            problem,
            algorithm,
            self.options,
            None,
        )
        return solution if self.after is None else self.after(problem, algorithm, solution)


def _status(summary: jax.Array, options: SolveOptions) -> _Summary:
    """The summary of the chunk in flight, once it has finished.

    Python runs a signal handler in the main thread only, and not while that thread waits
    inside JAX. Where the loop calls the host (a callback, the progress bar, maxtime), the
    wait is on a lock instead (interruptible), so that a Ctrl-C sets the flag those host
    calls read and the chunk stops at its next one rather than at its end.
    """
    if (
        not (options.callback is None and not options.progress and options.maxtime is None)
        and not summary.is_ready()
    ):
        finished = threading.Event()

        def wait():
            try:
                summary.block_until_ready()
            finally:
                finished.set()

        threading.Thread(target=wait, daemon=True).start()
        finished.wait()
    return _read(summary)


def _read(summary: jax.Array) -> _Summary:
    return _Summary(*(int(v) for v in np.asarray(summary)))


def _run_chunks(make_solver, problem, algorithm, options, after: After | None) -> Solution:
    # the checkpoint is the host's: kept out of the compiled chunk's (static) options
    checkpoint = options.checkpoint
    if checkpoint is not None:
        options = replace(options, checkpoint=None)
    prepared = Prepared(make_solver, problem, algorithm, options)

    def first() -> tuple:
        outputs, budget, chunk, template = _first_chunk(
            prepared, None if checkpoint is None else checkpoint.every
        )
        if checkpoint is None:  # what a later call of this structure may skip to
            plans.offer(
                _PlannedRun(chunk.func, template, budget, make_solver, options, after),
                problem,
                algorithm,
                options,
            )
        return outputs, budget, chunk, template

    return _chunks(first, make_solver, problem, algorithm, options, checkpoint)


def _chunks(first, make_solver, problem, algorithm, options: SolveOptions, checkpoint) -> Solution:
    """The run's chunks to its stop: ``first()`` dispatches the first one (its outputs,
    budget, the compiled chunk and the first carry it started from); between chunks the
    host reads the summary, answers a Ctrl-C and writes the checkpoints."""
    last = None  # the last completed chunk's Solution (the host's numbers not yet in) and summary
    # the last two chunks' starts, (first, carry in, iterations done): where a run that keeps
    # no previous iterate fails, one of them is run again up to its last good iterate
    starts: list = []

    def solution() -> Solution:  # rebuilt only where it is returned or written
        return _on_host(*last)

    try:
        carry, budget, chunk = None, None, None
        while True:
            started = time.perf_counter()
            if carry is None:
                (carry, in_flight, summary), budget, chunk, template = first()
                starts = [(True, template, 0)]
            else:
                starts = [starts[-1], (False, carry, last[1].done)]
                carry, in_flight, summary = chunk(False, carry, budget)
            try:
                # the Solution's structure rebuilt (a model's, in Python) while the chunk
                # computes
                unpacked = in_flight.unpack(carry)
                status = _status(summary, options)  # waits for the chunk
            except KeyboardInterrupt:
                # The chunk in flight ends within one chunk's time: wait for it, then stop.
                last = in_flight.unpack(carry), _read(summary)
                return (
                    solution()
                    if last[1].retcode != RUNNING
                    else _interrupted(solution(), make_solver, problem, algorithm)
                )
            last = unpacked, status
            if status.retcode != RUNNING:
                if (
                    status.retcode == ReturnCode.FAILURE
                    and status.done > 0
                    and replays_failures(make_solver(algorithm, problem), options)
                ):
                    last = _last_good(chunk, starts, *last), status
                return solution()
            if interrupt_requested():
                return _interrupted(solution(), make_solver, problem, algorithm)
            per_iteration = (time.perf_counter() - started) / budget
            budget = int(min(max(_CHUNK_SECONDS / max(per_iteration, 1e-9), 1), 2**30))
            if checkpoint is not None:  # chunks end at the checkpoints
                if checkpoint.due(status.done):
                    checkpoint.write(_interrupted(solution(), make_solver, problem, algorithm))
                budget = min(budget, checkpoint.steps_to_next(status.done))
    except KeyboardInterrupt:
        if last is None:  # during the first compilation: nothing ran yet
            raise
        return _interrupted(solution(), make_solver, problem, algorithm)


def _last_good(chunk, starts: list, failed: Solution, status: _Summary) -> Solution:
    """A failed run that kept no previous iterate (see
    :func:`~optsolve.backends.native.driver.replays_failures`), with its last good iterate
    as x: the chunk holding that iterate is run again from its start up to it (the same
    deterministic steps). Everything else is the failed run's, as a run that keeps its
    previous iterate returns it (under a trace): the outcome, the value at x, the counts and
    the state. A Ctrl-C meanwhile waits for that short run."""
    good = status.done - 1  # the iterate before the failing one (finish counts it so too)
    first, carry_in, done = next(start for start in reversed(starts) if start[2] <= good)
    carry, in_flight, _ = chunk(first, carry_in, good - done)
    while True:
        try:
            replayed = in_flight.unpack(carry)
            jax.block_until_ready(replayed.x)
            break
        except KeyboardInterrupt:
            continue
    return replace(failed, x=replayed.x)


def run_iterative(
    make_solver,
    problem: OptimizationProblem,
    algorithm: Any,
    options: SolveOptions,
    loop: LoopRunner | None = None,
    after: After | None = None,
) -> Solution:
    """Run ``make_solver(algorithm, problem)`` to a stop with the driver of
    :mod:`optsolve.backends.native.driver`.

    ``make_solver`` must be a module-level function (it keys the compilation cache); the
    algorithm's and the problem's numbers are traced, so new values reuse compiled code.
    Inside a JAX transformation, or in a ``loop`` the adjoint chose, the run is one loop in
    the caller's trace; an eager call runs in interruptible chunks of one compiled function.
    ``after(problem, algorithm, solution)``: the Solution in the method's own terms, where
    the backend has any (a later call of the structure that takes the run a plan holds
    applies it too).
    """
    if loop is not None or is_traced(problem, algorithm, options) or under_a_trace():
        solution = _whole_compiled(make_solver, problem, algorithm, options, loop)
    else:
        solution = _run_chunks(make_solver, problem, algorithm, options, after)
    return solution if after is None else after(problem, algorithm, solution)
