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

import threading
import time
from typing import Any

import jax
import numpy as np
from jax import lax

from optsolve.backends.native.driver import build_loop, run_whole, running
from optsolve.backends.native.protocol import GradientStepSolver
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import interrupt_requested
from optsolve.solve_api.loops import Loop as LoopRunner
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, replace, tree_spec
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import Solution

# Iterations of the first chunk: small problems (most of which end within it) take more, so
# that they run in one call; large ones, whose iterations may each take long, take few.
_FIRST_BUDGET_SMALL, _FIRST_BUDGET_LARGE, _SMALL_SIZE = 256, 16, 10_000
_CHUNK_SECONDS = 0.25     # what later chunks aim at: the longest wait for a Ctrl-C
_TEMPLATES = BoundedCache(64)


def _chunk(make_solver, problem: OptimizationProblem, algorithm: Any, options: SolveOptions,
           first: jax.Array, carry_in: Any, budget: jax.Array):
    """``budget`` more iterations from ``carry_in`` (from the start where ``first``)."""
    loop = build_loop(make_solver, problem, algorithm, options)
    carry = lax.cond(first, lambda _: loop.init(), lambda c: c, carry_in)
    end = carry.iteration + budget
    final = lax.while_loop(lambda c: running(c) & (c.iteration < end), loop.body, carry)
    return final, loop.finish(final)


_chunk_compiled = jax.jit(_chunk, static_argnums=0)
_whole_compiled = jax.jit(run_whole, static_argnums=(0, 4))


def zeros_of(spec: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros of ``spec``'s shape and dtype (a typed PRNG key included), placed once."""
    if jax.dtypes.issubdtype(spec.dtype, jax.dtypes.extended):  # typed PRNG keys
        return jax.random.key(0, impl=spec.dtype._impl) if spec.shape == () else \
            jax.random.split(jax.random.key(0, impl=spec.dtype._impl), spec.shape[0])
    # numpy's zeros, placed once: jnp.zeros would compile a kernel per new shape
    return jax.device_put(np.zeros(spec.shape, spec.dtype))


def _template(make_solver, problem, algorithm, options) -> Any:
    """A zero carry with the structure, shapes and dtypes of the run's first carry (cached:
    finding it traces the objective)."""
    def make():
        shapes = jax.eval_shape(
            lambda p, a, o: build_loop(make_solver, p, a, o).init(), problem, algorithm, options)
        return jax.tree_util.tree_map(zeros_of, shapes)

    try:
        key = (make_solver, tree_spec((problem, algorithm, options)))
    except TypeError:
        return make()
    return _TEMPLATES.get_or_make(key, make)


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
        solution = replace(solution, objective=value(solution.x, p),
                           stats=replace(stats, f_evals=stats.f_evals + 1))
    return replace(solution, retcode=ReturnCode.INTERRUPTED, reason=None)


def _first_budget(problem: OptimizationProblem) -> int:
    size = sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(problem.x0))
    return _FIRST_BUDGET_SMALL if size <= _SMALL_SIZE else _FIRST_BUDGET_LARGE


def _first_chunk(make_solver, problem, algorithm, options, budget):
    template = _template(make_solver, problem, algorithm, options)
    try:
        return _chunk_compiled(make_solver, problem, algorithm, options, True, template,
                               budget)
    except TypeError:
        # A cached template of another structure (module state changed since, or JAX's
        # caches were cleared): build it anew once; a second failure is the real error.
        if not _TEMPLATES:
            raise
        _TEMPLATES.clear()
        template = _template(make_solver, problem, algorithm, options)
        return _chunk_compiled(make_solver, problem, algorithm, options, True, template,
                               budget)


def _status(solution: Solution, options: SolveOptions) -> int:
    """The retcode of the chunk in flight, once it has finished.

    Python runs a signal handler in the main thread only, and not while that thread waits
    inside JAX. Where the loop calls the host (a callback, the progress bar, maxtime), the
    wait is on a lock instead (interruptible), so that a Ctrl-C sets the flag those host
    calls read and the chunk stops at its next one rather than at its end.
    """
    retcode = solution.retcode
    if (options.callback is None and not options.progress and options.maxtime is None) \
            or retcode.is_ready():
        return int(retcode)
    finished = threading.Event()

    def wait():
        try:
            retcode.block_until_ready()
        finally:
            finished.set()

    threading.Thread(target=wait, daemon=True).start()
    finished.wait()
    return int(retcode)


def _run_chunks(make_solver, problem, algorithm, options) -> Solution:
    # the checkpoint is the host's: kept out of the compiled chunk's (static) options
    checkpoint, options = options.checkpoint, replace(options, checkpoint=None)
    carry = None
    first, budget = True, _first_budget(problem)
    if checkpoint is not None:
        budget = min(budget, checkpoint.every)
    solution = None  # the last completed chunk's
    try:
        while True:
            started = time.perf_counter()
            if first:
                carry, solution_in_flight = _first_chunk(make_solver, problem, algorithm,
                                                         options, budget)
            else:
                carry, solution_in_flight = _chunk_compiled(make_solver, problem, algorithm,
                                                            options, False, carry, budget)
            try:
                status = _status(solution_in_flight, options)  # waits for the chunk
            except KeyboardInterrupt:
                # The chunk in flight ends within one chunk's time: wait for it, then stop.
                status = int(solution_in_flight.retcode)
                solution = solution_in_flight
                return solution if status != RUNNING else _interrupted(
                    solution, make_solver, problem, algorithm)
            solution, first = solution_in_flight, False
            if status != RUNNING:
                return solution
            if interrupt_requested():
                return _interrupted(solution, make_solver, problem, algorithm)
            per_iteration = (time.perf_counter() - started) / budget
            budget = int(min(max(_CHUNK_SECONDS / max(per_iteration, 1e-9), 1), 2 ** 30))
            if checkpoint is not None:  # chunks end at the checkpoints
                done = int(carry.iteration)
                if checkpoint.due(done):
                    checkpoint.write(_interrupted(solution, make_solver, problem, algorithm))
                budget = min(budget, checkpoint.steps_to_next(done))
    except KeyboardInterrupt:
        if solution is None:  # during the first compilation: nothing ran yet
            raise
        return _interrupted(solution, make_solver, problem, algorithm)


def run_iterative(make_solver, problem: OptimizationProblem, algorithm: Any,
                  options: SolveOptions, loop: LoopRunner | None = None) -> Solution:
    """Run ``make_solver(algorithm, problem)`` to a stop with the driver of :mod:`optsolve.backends.native.driver`.

    ``make_solver`` must be a module-level function (it keys the compilation cache); the
    algorithm's and the problem's numbers are traced, so new values reuse compiled code.
    Inside a JAX transformation, or in a ``loop`` the adjoint chose, the run is one loop in
    the caller's trace; an eager call runs in interruptible chunks of one compiled function.
    """
    if loop is not None or is_traced(problem, algorithm, options):
        return _whole_compiled(make_solver, problem, algorithm, options, loop)
    return _run_chunks(make_solver, problem, algorithm, options)
