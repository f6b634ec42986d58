"""The compiled driver shared by the JAX-native backends (optax family, classical methods).

A backend supplies a *solver* in one of two shapes:

- :class:`IterativeSolver` (``init`` / ``step``): a step returns the new iterate with its
  value and gradient (line-search methods compute them anyway);
- :class:`GradientStepSolver` (``init`` / ``update``): an update needs only the gradient at
  the current iterate, which the driver evaluates first (the optax loop's shape: evaluating
  at the top of the loop, not carrying the gradient across iterations, keeps it as fast as
  a hand-written ``fori_loop``).

The driver owns everything else, once for all of them: the loop, the non-finite check that
keeps the last finite iterate, the stopping tests (maxiters, gtol, ftol, xtol, maxtime; the
projected gradient where the problem has bounds), the user's callback and evaluation counts.
The loop is a ``lax.while_loop``, or, when the solution is differentiated by unrolling, a
``lax.scan`` of ``maxiters`` guarded steps with sqrt(N) checkpointing (reverse-mode
differentiable, memory O(sqrt(maxiters)) iterates; Griewank & Walther, "Evaluating
Derivatives", 2008, ch. 12).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.solve_api.host import call_user_callback, clock, report_progress, wants_grad_norm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import History, Solution, Stats

PyTree = Any


class Objective:
    """``f`` with ``p`` bound: what solvers evaluate. Built inside the trace.

    Args:
      f: ``f(x, p) -> scalar``.
      p: the hyperparameters.
      grad: optional user gradient ``grad(x, p)``; replaces ``jax.grad(f)``.
      hvp: optional user Hessian-vector product ``hvp(x, v, p)``; replaces
        forward-over-reverse differentiation of the gradient.
    """

    def __init__(self, f: Callable[[PyTree, PyTree], jax.Array], p: PyTree,
                 grad: Callable[[PyTree, PyTree], PyTree] | None = None,
                 hvp: Callable[[PyTree, PyTree, PyTree], PyTree] | None = None):
        self.f = f
        self.p = p
        self.user_grad = grad
        self.user_hvp = hvp

    @classmethod
    def from_problem(cls, problem: OptimizationProblem) -> "Objective":
        """The objective of ``problem``, honouring its optional ``grad`` and ``hvp``."""
        return cls(problem.f, problem.p, problem.grad, problem.hvp)

    def value(self, x: PyTree) -> jax.Array:
        return self.f(x, self.p)

    def grad(self, x: PyTree) -> PyTree:
        if self.user_grad is not None:
            return self.user_grad(x, self.p)
        return jax.grad(self.f)(x, self.p)

    def value_and_grad(self, x: PyTree) -> tuple[jax.Array, PyTree]:
        if self.user_grad is not None:
            return self.f(x, self.p), self.user_grad(x, self.p)
        return jax.value_and_grad(self.f)(x, self.p)

    def hvp(self, x: PyTree, v: PyTree) -> PyTree:
        """Hessian-vector product: the user's ``hvp`` if given, else forward-over-reverse
        differentiation of the gradient (the user's gradient where given)."""
        if self.user_hvp is not None:
            return self.user_hvp(x, v, self.p)
        return jax.jvp(self.grad, (x,), (v,))[1]


class Step(NamedTuple):
    """One solver step: the new iterate with its value and gradient, and what it cost."""

    x: PyTree
    f: jax.Array
    g: PyTree
    state: PyTree
    f_evals: jax.Array
    grad_evals: jax.Array
    failed: jax.Array  # the solver's own failure (e.g. a failed line search)
    # The solver's own "no further progress is possible" (e.g. a line search that finds no
    # decrease at rounding level); None means never.
    stalled: jax.Array | None = None


class IterativeSolver(Protocol):
    """What a JAX-native backend implements; the driver does the rest.

    ``detect_stall``: report STALLED when a step leaves x unchanged (classical methods);
    False for ML optimizers, where a zero step is legitimate (a warm-up schedule at 0).

    Optional attributes, read with ``getattr`` (absent means None):
      ``default_gtol``: the gtol used when ``solve`` got none (classical methods stop by
      themselves); ``default_maxiters``: likewise for maxiters; ``select_state`` (absent
      means True): False when a failed step's state is itself fit to keep (finite, its
      model reset), so the driver keeps it instead of selecting the previous state, which
      copies large states (quasi-Newton memories) every iteration.
    """

    detect_stall: bool

    def init(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree) -> PyTree: ...

    def step(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree,
             state: PyTree) -> Step: ...


class GradientStepSolver(Protocol):
    """A solver whose update needs only the gradient at the current iterate.

    The driver evaluates ``f`` and its gradient at each iterate, checks them, then calls
    ``update``; nothing is carried across iterations but the iterate and the state.
    """

    def init(self, objective: Objective, x: PyTree) -> PyTree: ...

    def update(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree,
               state: PyTree) -> tuple[PyTree, PyTree, jax.Array, jax.Array]:
        """The next iterate and state, and the evaluations of f and of the gradient the
        update made itself (a value-only line search's trials), beyond the driver's one."""


def _all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def inf_norm(tree: PyTree) -> jax.Array:
    """The largest absolute entry over all leaves of ``tree``."""
    leaves = jax.tree_util.tree_leaves(tree)
    dtype = jnp.result_type(*leaves)
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))


def projected_gradient(x: PyTree, g: PyTree, bounds: tuple[PyTree, PyTree] | None) -> PyTree:
    """``P(x - g) - x`` for the box ``bounds`` (``-g`` without bounds), the stationarity
    measure of bound-constrained problems (its inf-norm is L-BFGS-B's ``pgtol`` test)."""
    if bounds is None:
        return g
    lower, upper = bounds
    return jax.tree_util.tree_map(lambda xx, gg, lo, up: xx - jnp.clip(xx - gg, lo, up),
                                  x, g, lower, upper)


def _select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


_INT = jnp.int32


class _Rules:
    """The stopping tests of one run, built at trace time from the options and the solver."""

    def __init__(self, options: SolveOptions, solver: Any, bounds):
        self.options = options
        self.gtol = options.gtol if options.gtol is not None else getattr(
            solver, "default_gtol", None)
        self.xtol = options.get("xtol")
        maxiters = options.maxiters if options.maxiters is not None else getattr(
            solver, "default_maxiters", None)
        self.maxiters = jnp.asarray(
            maxiters if maxiters is not None else jnp.iinfo(_INT).max, _INT)
        self.bounds = bounds

    def converged(self, x, f, g, x_prev, f_prev, has_prev) -> jax.Array:
        """gtol on the (projected) gradient; ftol and xtol against the previous iterate."""
        converged = jnp.zeros((), bool)
        if self.gtol is not None:
            converged |= inf_norm(projected_gradient(x, g, self.bounds)) <= self.gtol
        if self.options.ftol is not None:
            # Only a step that moved x tests ftol: a rejected trust-region step, or a zero
            # update (a warm-up schedule at 0), leaves f unchanged without converging.
            moved = jnp.any(jnp.stack([jnp.any(a != b) for a, b in zip(
                jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(x_prev))]))
            scale = jnp.maximum(jnp.maximum(jnp.abs(f_prev), jnp.abs(f)), 1.0)
            converged |= has_prev & moved & (jnp.abs(f_prev - f) <= self.options.ftol * scale)
        if self.xtol is not None:
            # Only a step that moved x counts: a rejected trust-region step is not convergence.
            dx = inf_norm(jax.tree_util.tree_map(jnp.subtract, x, x_prev))
            converged |= has_prev & (dx > 0) & (dx <= self.xtol * jnp.maximum(inf_norm(x), 1.0))
        return converged

    def callback_stop(self, due, iteration, x, f, g) -> jax.Array:
        """Run the user's callback (and the progress bar) where due; True = stop."""
        callback, progress = self.options.callback, self.options.progress
        if callback is None and not progress:
            return jnp.zeros((), bool)
        grad_norm = lambda: inf_norm(projected_gradient(x, g, self.bounds))
        stop = jnp.zeros((), bool)
        if callback is not None:
            due_cb = due & (iteration % self.options.callback_every == 0)
            with_norm = wants_grad_norm(callback)
            # stop_gradient: a host call has no derivative, and an unrolled loop is differentiated
            args = lax.stop_gradient((due_cb, iteration, x, f) + ((grad_norm(),) if with_norm else ()))
            stop = lax.cond(due_cb, lambda: call_user_callback(callback, *args),
                            lambda: jnp.zeros((), bool))
        if progress:
            every = jnp.maximum(self.maxiters // 100, 1) if self.options.maxiters is not None \
                else self.options.callback_every
            due_bar = due & ((iteration % every == 0) | (iteration >= self.maxiters))
            args = lax.stop_gradient((due_bar, iteration, f, grad_norm()))
            stop |= lax.cond(due_bar, lambda: report_progress(*args), lambda: jnp.zeros((), bool))
        return stop

    def start_time(self, token) -> jax.Array:
        if self.options.maxtime is None:
            return jnp.zeros((), jnp.result_type(float))
        return clock(lax.stop_gradient(token))

    def out_of_time(self, token, t_start) -> jax.Array:
        if self.options.maxtime is None:
            return jnp.zeros((), bool)
        return clock(lax.stop_gradient(token)) - t_start >= self.options.maxtime

    @staticmethod
    def status(ok, converged, stalled, stop, at_maxiters, out_of_time) -> jax.Array:
        return jnp.select(
            [~ok, converged, stalled, stop, at_maxiters, out_of_time],
            [int(ReturnCode.FAILURE), int(ReturnCode.SUCCESS), int(ReturnCode.STALLED),
             int(ReturnCode.TERMINATED), int(ReturnCode.MAXITERS), int(ReturnCode.MAXTIME)],
            RUNNING,
        ).astype(_INT)


def _loop(cond, body, carry0, unroll_steps: int | None):
    """``while cond: body``; with ``unroll_steps``, a differentiable bounded equivalent."""
    if unroll_steps is None:
        return lax.while_loop(cond, body, carry0)

    def guarded(carry, _):
        return lax.cond(cond(carry), body, lambda c: c, carry), None

    chunk = max(1, math.isqrt(unroll_steps))
    n_chunks = -(-unroll_steps // chunk)

    @jax.checkpoint
    def run_chunk(carry, _):
        return lax.scan(guarded, carry, None, length=chunk)[0], None

    return lax.scan(run_chunk, carry0, None, length=n_chunks)[0]


def _unroll_steps(options: SolveOptions) -> int | None:
    if options.unroll is None:
        return None
    # maxiters updates plus the evaluation of the last iterate
    return options.unroll + 1


class _Start(NamedTuple):
    """Where a run starts: x0 and counters, or an earlier run's end (``resume``)."""

    x: PyTree
    state: PyTree | None
    iterations: jax.Array
    f_evals: jax.Array
    grad_evals: jax.Array


def _start(problem: OptimizationProblem, options: SolveOptions,
           init: Callable[[], PyTree]) -> _Start:
    """Where the run starts; ``init`` builds the algorithm's initial state, traced (for its
    structure) only to check a ``resume`` state against it."""
    zero = jnp.zeros((), _INT)
    resume = options.resume
    if resume is None:
        return _Start(problem.x0, None, zero, zero, zero)
    expected = jax.tree_util.tree_structure(jax.eval_shape(init))
    given = jax.tree_util.tree_structure(resume.state)
    if expected != given:
        raise ValueError(
            "solve: `resume` holds an optimizer state of structure "
            f"{given}, but this algorithm's state has structure {expected}; resume with the "
            "algorithm that produced it."
        )
    stats = resume.stats
    return _Start(resume.x, resume.state, jnp.asarray(stats.iterations, _INT),
                  jnp.asarray(stats.f_evals, _INT), jnp.asarray(stats.grad_evals, _INT))


class _Record(NamedTuple):
    objective: jax.Array
    grad_norm: jax.Array


def _record_init(options: SolveOptions, dtype) -> _Record | None:
    if not options.history:
        return None
    empty = jnp.full((options.history,), jnp.nan, dtype)
    return _Record(empty, empty)


def _record(record: _Record | None, index, f, gnorm, keep=True) -> _Record | None:
    if record is None:
        return None
    index = jnp.where(keep, index, record.objective.shape[0])  # out of range: dropped
    return _Record(record.objective.at[index].set(f, mode="drop"),
                   record.grad_norm.at[index].set(gnorm.astype(f.dtype), mode="drop"))


def _history(record: _Record | None) -> History | None:
    return None if record is None else History(record.objective, record.grad_norm)


class _Carry(NamedTuple):
    x: PyTree
    f: jax.Array
    g: PyTree
    state: PyTree
    iteration: jax.Array
    f_evals: jax.Array
    grad_evals: jax.Array
    status: jax.Array
    t_start: jax.Array
    record: _Record | None


def _run_stepping(solver: IterativeSolver, objective: Objective, problem: OptimizationProblem,
                  options: SolveOptions) -> Solution:
    """The loop for solvers whose steps return the new point's value and gradient."""
    rules = _Rules(options, solver, problem.bounds)
    x0 = problem.x0
    f0, g0 = objective.value_and_grad(x0)
    start = _start(problem, options, lambda: solver.init(objective, x0, f0, g0))
    if start.state is None:
        state0 = solver.init(objective, x0, f0, g0)
    else:
        x0, state0 = start.x, start.state
        f0, g0 = objective.value_and_grad(x0)
    gnorm = lambda x, g: inf_norm(projected_gradient(x, g, problem.bounds))
    status0 = _Rules.status(_all_finite((f0, g0)), rules.converged(x0, f0, g0, x0, f0, False),
                            False, False, rules.maxiters <= 0, False)
    record0 = _record(_record_init(options, f0.dtype), 0, f0, gnorm(x0, g0))
    one = jnp.ones((), _INT)
    carry0 = _Carry(x0, f0, g0, state0, jnp.zeros((), _INT), one, one, status0,
                    rules.start_time(f0), record0)

    def body(carry: _Carry) -> _Carry:
        step = solver.step(objective, carry.x, carry.f, carry.g, carry.state)
        ok = _all_finite((step.x, step.f, step.g)) & ~step.failed
        if getattr(solver, "select_state", True):
            x, f, g, state = _select(ok, (step.x, step.f, step.g, step.state),
                                     (carry.x, carry.f, carry.g, carry.state))
        else:
            x, f, g = _select(ok, (step.x, step.f, step.g), (carry.x, carry.f, carry.g))
            state = step.state
        iteration = carry.iteration + ok.astype(_INT)
        converged = rules.converged(x, f, g, carry.x, carry.f, True)
        stalled = jnp.zeros((), bool)
        if solver.detect_stall:
            same = jax.tree_util.tree_map(lambda a, b: jnp.all(a == b), step.x, carry.x)
            stalled = jnp.all(jnp.stack(jax.tree_util.tree_leaves(same)))
        if step.stalled is not None:
            stalled |= step.stalled
        stop = rules.callback_stop((carry.status == RUNNING) & ok, iteration, x, f, g)
        status = _Rules.status(ok, converged, stalled, stop, iteration >= rules.maxiters,
                               rules.out_of_time(f, carry.t_start))
        record = _record(carry.record, iteration, f, gnorm(x, g), keep=ok)
        return _Carry(x, f, g, state, iteration, carry.f_evals + step.f_evals.astype(_INT),
                      carry.grad_evals + step.grad_evals.astype(_INT), status, carry.t_start,
                      record)

    final = _loop(lambda c: c.status == RUNNING, body, carry0, _unroll_steps(options))
    return Solution(
        x=final.x, objective=final.f, retcode=final.status,
        stats=Stats(iterations=start.iterations + final.iteration,
                    f_evals=start.f_evals + final.f_evals,
                    grad_evals=start.grad_evals + final.grad_evals, time=None),
        original=final.state, state=final.state, history=_history(final.record),
    )


class _GradientCarry(NamedTuple):
    x: PyTree          # the iterate to evaluate next
    state: PyTree
    x_last: PyTree     # the last evaluated finite iterate, and its value
    f_last: jax.Array
    iteration: jax.Array  # index of x in this run
    f_evals: jax.Array
    grad_evals: jax.Array
    status: jax.Array
    t_start: jax.Array
    record: _Record | None


def _run_gradient_steps(solver: GradientStepSolver, objective: Objective,
                        problem: OptimizationProblem, options: SolveOptions) -> Solution:
    """The loop for solvers that need only the gradient at the current iterate."""
    rules = _Rules(options, solver, problem.bounds)
    start = _start(problem, options, lambda: solver.init(objective, problem.x0))
    x0 = start.x
    state0 = solver.init(objective, x0) if start.state is None else start.state
    f_dtype = jax.eval_shape(objective.value, x0).dtype
    zero = jnp.zeros((), _INT)
    carry0 = _GradientCarry(x0, state0, x0, jnp.zeros((), f_dtype), zero, zero, zero,
                            jnp.asarray(RUNNING, _INT), rules.start_time(zero),
                            _record_init(options, f_dtype))

    def body(carry: _GradientCarry) -> _GradientCarry:
        x, k = carry.x, carry.iteration
        f, g = objective.value_and_grad(x)
        ok = _all_finite((f, g))
        has_prev = k > 0
        converged = rules.converged(x, f, g, carry.x_last, carry.f_last, has_prev)
        stop = rules.callback_stop(ok & has_prev, k, x, f, g)
        status = _Rules.status(ok, converged, False, stop, k >= rules.maxiters,
                               rules.out_of_time(f, carry.t_start))
        running = status == RUNNING
        x_next, state, f_evals, grad_evals = lax.cond(
            running, lambda: solver.update(objective, x, f, g, carry.state),
            lambda: (x, carry.state, jnp.zeros((), _INT), jnp.zeros((), _INT)))
        # x0 is kept even when f(x0) is not finite: there is no earlier iterate to return.
        x_last, f_last = _select(ok | (k == 0), (x, f), (carry.x_last, carry.f_last))
        record = carry.record
        if record is not None:
            record = _record(record, k, f, inf_norm(projected_gradient(x, g, problem.bounds)),
                             keep=ok)
        return _GradientCarry(x_next, state, x_last, f_last, k + running.astype(_INT),
                              carry.f_evals + 1 + f_evals.astype(_INT),
                              carry.grad_evals + 1 + grad_evals.astype(_INT), status,
                              carry.t_start, record)

    final = _loop(lambda c: c.status == RUNNING, body, carry0, _unroll_steps(options))
    failed = final.status == int(ReturnCode.FAILURE)
    # On failure x_last is the previous iterate, one update before the failing one.
    iterations = jnp.where(failed & (final.iteration > 0), final.iteration - 1, final.iteration)
    return Solution(
        x=final.x_last, objective=final.f_last, retcode=final.status,
        stats=Stats(iterations=start.iterations + iterations,
                    f_evals=start.f_evals + final.f_evals,
                    grad_evals=start.grad_evals + final.grad_evals, time=None),
        original=final.state, state=final.state, history=_history(final.record),
    )


def _run(make_solver: Callable[[Any, OptimizationProblem], Any],
         problem: OptimizationProblem, algorithm: Any, options: SolveOptions) -> Solution:
    objective = Objective.from_problem(problem)
    solver = make_solver(algorithm, problem)
    if hasattr(solver, "update"):
        return _run_gradient_steps(solver, objective, problem, options)
    return _run_stepping(solver, objective, problem, options)


_run_compiled = jax.jit(_run, static_argnums=0)


def run_iterative(make_solver: Callable[[Any, OptimizationProblem], Any],
                  problem: OptimizationProblem, algorithm: Any,
                  options: SolveOptions) -> Solution:
    """Run ``make_solver(algorithm, problem)`` to a stop in one compiled loop.

    ``make_solver`` must be a module-level function (it keys the compilation cache); the
    algorithm's and the problem's numbers are traced, so new values reuse compiled code.
    The solver is an :class:`IterativeSolver` or, if it has ``update``, a
    :class:`GradientStepSolver`.
    """
    return _run_compiled(make_solver, problem, algorithm, options)
