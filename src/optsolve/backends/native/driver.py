"""The compiled driver shared by the JAX-native backends (optax family, classical methods).

A backend supplies a *solver*, an instance of one of two abstract shapes:

- :class:`SteppingSolver` (``init`` / ``step``): a step returns the new iterate with its
  value and gradient (line-search methods compute them anyway);
- :class:`GradientStepSolver` (``init`` / ``update``): an update needs only the gradient at
  the current iterate, which the driver evaluates first (the optax loop's shape: evaluating
  at the top of the loop, not carrying the gradient across iterations, keeps it as fast as
  a hand-written ``fori_loop``).

The driver owns everything else, once for all of them: the loop, the non-finite check that
keeps the last finite iterate, the stopping tests (maxiters, gtol, ftol, xtol, maxtime; the
projected gradient where the problem has bounds), the user's callback and progress bar,
the history (with the constraint violation where a stepping solver reports it), resuming,
the reason a run stopped and evaluation counts. Each loop is built as its parts (a first
carry, a body, the Solution of a carry), so that the same body runs as one
``lax.while_loop`` under the caller's transformations, in interruptible chunks for an eager
call (:mod:`optsolve.backends.native.chunked`), or in the loop the adjoint hands over
(:mod:`optsolve.solve_api.loops`: a checkpointed scan when the solution is differentiated by
unrolling).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from optsolve.backends.native.objective import Objective, all_finite
from optsolve.backends.native.protocol import (
    GradientStepSolver,
    NativeSolver,
    SteppingSolver,
    Update,
)
from optsolve.backends.native.rules import (
    INT,
    TRIAL_NONFINITE,
    X_NONFINITE,
    BaseCounts,
    Checks,
    Converged,
    Record,
    Rules,
    base_counts,
    empty_record,
    history_of,
    record_at,
    select,
    start_point,
    true_,
)
from optsolve.backends.native.tracking import Best, Tracker
from optsolve.solve_api.loops import Loop as LoopRunner
from optsolve.solve_api.loops import while_loop
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import Solution, Stats
from optsolve.solve_api.trainable import ModelPoint, state_mutation_error

PyTree = Any


class Loop(NamedTuple):
    """A run as its parts: ``init()`` the first carry, ``body(carry)`` one iteration (run
    only while ``running(carry)``: the loops test it), ``finish(carry)`` the Solution. Every
    carry has ``status`` and ``iteration`` fields."""

    init: Callable[[], Any]
    body: Callable[[Any], Any]
    finish: Callable[[Any], Solution]


def running(carry: Any) -> jax.Array:
    return carry.status == RUNNING


class _Carry(NamedTuple):
    x: PyTree
    f: jax.Array
    g: PyTree
    state: PyTree
    iteration: jax.Array
    f_evals: jax.Array
    grad_evals: jax.Array | None  # None: f_evals (a solver that evaluates both together)
    status: jax.Array
    reason: jax.Array
    t_start: jax.Array
    record: Record | None
    base: BaseCounts
    best: Best | None  # with keep="best"


def _stepping_loop(
    solver: SteppingSolver,
    objective: Objective,
    problem: OptimizationProblem,
    options: SolveOptions,
) -> Loop:
    """The loop for solvers whose steps return the new point's value and gradient."""
    rules = Rules(options, solver, problem.bounds)
    tracker = Tracker(options)
    together = solver.evaluates_together

    def init() -> _Carry:
        start = start_point(
            problem, options, lambda x: solver.init(objective, x, *objective.value_and_grad(x))
        )
        x0 = start.x
        if objective.mutates_state(x0):
            raise state_mutation_error("this configuration (its steps evaluate f at trial points)")
        f0, g0 = objective.value_and_grad(x0)
        state0 = solver.init(objective, x0, f0, g0) if start.state is None else start.state
        false = jnp.zeros((), bool)
        at_maxiters = rules.maxiters <= 0
        # maxiters=0 returns x0 with MAXITERS, even where it already meets a tolerance.
        converged = Converged(
            *(c & ~at_maxiters for c in rules.converged(x0, f0, g0, x0, f0, False))
        )
        checks = Checks(
            all_finite(f0),
            all_finite(g0),
            true_(),
            false,
            converged,
            false,
            false,
            at_maxiters,
            false,
        )
        status, reason = checks.verdict()
        ok0 = checks.ok
        evaluation, score = tracker.evaluation_at(objective, x0, ok0, f0.dtype)
        # the constraint violation, where the solver reports it (SteppingSolver.violation)
        violation0 = solver.violation(objective, x0, state0) if options.history else None
        record0 = record_at(
            empty_record(
                options,
                f0.dtype,
                specs=tracker.specs(objective, x0, f0.dtype),
                violation=violation0 is not None,
            ),
            0,
            f0,
            rules.grad_norm(x0, g0),
            metrics=tracker.metrics_at(objective, x0, f0.dtype),
            evaluation=evaluation,
            evaluated=ok0,
            violation=violation0,
        )
        zero, one = jnp.zeros((), INT), jnp.ones((), INT)
        best = tracker.update_best(
            tracker.first_best(x0, state0, None, f0.dtype), ok0, x0, state0, None, f0, score, zero
        )
        return _Carry(
            x0,
            f0,
            g0,
            state0,
            zero,
            one,
            None if together else one,
            status,
            reason,
            rules.start_time(f0),
            record0,
            base_counts(start),
            best,
        )

    def body(carry: _Carry) -> _Carry:
        step = solver.step(objective, carry.x, carry.f, carry.g, carry.state)
        f_ok = all_finite(step.f)
        g_ok = all_finite(step.g) if step.g_finite is None else step.g_finite
        x_ok = all_finite(step.x) if step.x_finite is None else step.x_finite
        ok = f_ok & g_ok & x_ok & ~step.failed
        if solver.keeps_point:
            x, f, g = step.x, step.f, step.g
        else:
            x, f, g = select(ok, (step.x, step.f, step.g), (carry.x, carry.f, carry.g))
        state = select(ok, step.state, carry.state) if solver.select_state else step.state
        iteration = carry.iteration + ok.astype(INT)
        stalled = jnp.zeros((), bool)
        if solver.detect_stall:
            same = jax.tree_util.tree_map(lambda a, b: jnp.all(a == b), step.x, carry.x)
            stalled = jnp.all(jnp.stack(jax.tree_util.tree_leaves(same)))
        if step.stalled is not None:
            stalled |= step.stalled
        stop = rules.callback_stop((carry.status == RUNNING) & ok, iteration, x, f, g)
        nonfinite_trials = (
            jnp.zeros((), bool) if step.nonfinite_trials is None else step.nonfinite_trials
        )
        # the solver's measure is that of its new x, which is x wherever it matters: a step
        # that is not ok fails the run, and neither the tests nor the history count it
        grad_norm = rules.grad_norm(x, g) if step.grad_norm is None else step.grad_norm
        converged = rules.converged(x, f, g, carry.x, carry.f, True, grad_norm)
        if step.reduction_converged is not None:
            converged = converged._replace(reduction=ok & step.reduction_converged)
        if step.radius_converged is not None:
            converged = converged._replace(radius=ok & step.radius_converged)
        checks = Checks(
            f_ok,
            g_ok,
            x_ok,
            step.failed,
            converged,
            stalled,
            stop,
            iteration >= rules.maxiters,
            rules.out_of_time(f, carry.t_start),
            nonfinite_trials,
        )
        status, reason = checks.verdict()
        due = ok & tracker.due(iteration)
        evaluation, score = tracker.evaluation_at(objective, x, due, f.dtype)
        record = record_at(
            carry.record,
            iteration,
            f,
            grad_norm,
            keep=ok,
            metrics=tracker.metrics_at(objective, x, f.dtype),
            evaluation=evaluation,
            evaluated=due,
            violation=step.violation,
        )
        best = tracker.update_best(carry.best, ok, x, state, None, f, score, iteration)
        grad_evals = None if together else carry.grad_evals + step.grad_evals.astype(INT)
        return _Carry(
            x,
            f,
            g,
            state,
            iteration,
            carry.f_evals + step.f_evals.astype(INT),
            grad_evals,
            status,
            reason,
            carry.t_start,
            record,
            carry.base,
            best,
        )

    def finish(final: _Carry) -> Solution:
        start = final.base
        x, state, _, f = tracker.kept(final.best, final.x, final.state, None, final.f)
        return Solution(
            x=x,
            objective=f,
            retcode=final.status,
            stats=Stats(
                iterations=start.iterations + final.iteration,
                f_evals=start.f_evals + final.f_evals,
                grad_evals=start.grad_evals + (final.f_evals if together else final.grad_evals),
                time=None,
            ),
            original=state,
            state=state,
            history=history_of(final.record),
            reason=final.reason,
        )

    return Loop(init, body, finish)


class _GradientCarry(NamedTuple):
    x: PyTree  # the iterate to evaluate next (the last evaluated one once stopped)
    state: PyTree
    carried: tuple | None  # a model's state that f changes in place (None where it changes none)
    x_prev: PyTree  # the iterate evaluated before x (updated only by running steps, so
    # a failure keeps the last good one; None where the host replays a failed run instead,
    f_last: jax.Array  # see replays_failures); the last finite value
    iteration: jax.Array  # index of x in this run
    f_evals: jax.Array
    grad_evals: jax.Array
    status: jax.Array
    reason: jax.Array
    t_start: jax.Array
    record: Record | None
    base: BaseCounts
    best: Best | None  # with keep="best"
    skips: tuple | None = None  # on data where steps may skip: (skipped, skipped in a row)


def _skips_itself(state: PyTree) -> bool:
    """Whether the optimizer's state is optax.apply_if_finite's, which skips non-finite
    updates itself (its skips are honoured: the run does not fail on them)."""
    found = lambda s: isinstance(s, optax.ApplyIfFiniteState)
    return any(found(s) for s in jax.tree_util.tree_leaves(state, is_leaf=found))


class StreamLoop(NamedTuple):
    """A gradient-step run whose objective may change at every step (a minibatch each):
    ``init(objective)`` the first carry (``objective`` gives shapes and the first state),
    ``step(carry, objective)`` one iteration, ``finish(carry)`` the Solution,
    ``new_record(carry, objective, length)`` the carry with an empty record of ``length``
    steps from its iteration on (a chunk's own). A carry that is still RUNNING when the data
    run out finishes at its latest iterate.

    A step always applies its update, even one that stops the run: the carry after a stop
    holds the stop's status and counts but an iterate one update too far. Running the same
    steps again up to the stopped one (deterministic) gives its start, x and state; with
    the stopped carry's status, reason, counts and last value it is the finished run
    (:func:`stopped_at`)."""

    init: Callable[[Objective], Any]
    step: Callable[[Any, Objective], Any]
    finish: Callable[[Any], Solution]
    new_record: Callable[[Any, Objective, int], Any]


def replays_failures(solver: NativeSolver, options: SolveOptions) -> bool:
    """Whether an eager full-batch run of ``solver`` keeps no previous iterate in its loop:
    where a step fails, the host runs the failed chunk again from its start up to the last
    good iterate (deterministic), instead of every step copying the iterate it leaves. Only
    for gradient steps whose run reads nothing else of the previous iterate (ftol, xtol)
    and that the host can run again unseen (no callback, progress bar, history, time limit,
    best-iterate tracking, metrics or evaluations)."""
    return (
        isinstance(solver, GradientStepSolver)
        and options.data is None
        and options.callback is None
        and not options.progress
        and not options.history
        and options.maxtime is None
        and options.keep == "last"
        and options.ftol is None
        and options.get("xtol") is None
        and options.metrics is None
        and options.evaluate is None
    )


def _gradient_parts(
    solver: GradientStepSolver,
    problem: OptimizationProblem,
    options: SolveOptions,
    stream: bool,
    guarded: bool = False,
    replayed: bool = False,
) -> StreamLoop:
    """``replayed``: a full-batch run that keeps no previous iterate (the host replays a
    failed run, see :func:`replays_failures`): a failed run's x is its failing iterate."""
    rules = Rules(options, solver, problem.bounds)
    tracker = Tracker(options)

    def new_record(carry: _GradientCarry, objective: Objective, length: int | None = None):
        dtype = carry.f_last.dtype
        specs = tracker.specs(objective, carry.x, dtype)
        first = None if length is None else carry.iteration
        return carry._replace(record=empty_record(options, dtype, length, first, specs))

    def init(objective: Objective) -> _GradientCarry:
        start = start_point(problem, options, lambda x: solver.init(objective, x))
        x0 = start.x
        state0 = solver.init(objective, x0) if start.state is None else start.state
        f_dtype = jax.eval_shape(objective.value, x0).dtype
        zero = jnp.zeros((), INT)
        carried = objective.p.carried if objective.mutates_state(x0) else None
        skipping = stream and (options.nonfinite == "skip" or _skips_itself(state0))
        carry = _GradientCarry(
            x0,
            state0,
            carried,
            None if replayed else x0,
            jnp.zeros((), f_dtype),
            zero,
            zero,
            zero,
            jnp.asarray(RUNNING, INT),
            zero,
            rules.start_time(zero),
            None,
            base_counts(start),
            tracker.first_best(x0, state0, carried, f_dtype),
            (zero, zero) if skipping else None,
        )
        return new_record(carry, objective)

    def step(carry: _GradientCarry, objective: Objective) -> _GradientCarry:
        x, k = carry.x, carry.iteration
        point, carried = x, None
        if carry.carried is not None:
            # the step evaluates f with the model's state as the previous step left it
            objective = objective.with_state(carry.carried)
            f, g, carried = objective.value_grad_and_state(x)
            point = ModelPoint(x, carry.carried)
        else:
            f, g = objective.value_and_grad(x)
        # On data a non-finite gradient is caught through the iterate its update makes (the
        # next loss, or finish's check of x): a reduction over g per step costs more there.
        f_ok, g_ok = all_finite(f), (true_() if stream else all_finite(g))
        gate, skips = None, carry.skips
        if skips is not None:
            # A step whose batch gives a non-finite loss or gradient skips its update (the
            # policy's gate; apply_if_finite gates its own) and fails the run only as the
            # (max_consecutive_skips + 1)-th skip in a row.
            g_ok = all_finite(g)
            finite = f_ok & g_ok
            in_a_row = jnp.where(finite, 0, skips[1] + 1).astype(INT)
            limit = options.max_consecutive_skips
            tolerated = ~finite & (in_a_row <= (10 if limit is None else limit))
            if options.nonfinite == "skip":
                gate = finite
            ok = finite
            f_ok, g_ok = f_ok | tolerated, g_ok | tolerated
        else:
            ok = f_ok & g_ok
        has_prev = k > 0
        false = jnp.zeros((), bool)
        # on data the callback sees each step's outcome (below), after its update
        stop = false if stream else rules.callback_stop(ok & has_prev, k, point, f, g)
        # x is finite here: an update to a non-finite x shows as a non-finite f first.
        # (Without a previous iterate, no ftol or xtol reads it: see replays_failures.)
        converged = rules.converged(
            x, f, g, x if replayed else carry.x_prev, carry.f_last, has_prev
        )
        # maxiters=0 returns x0 with MAXITERS, even where it already meets a tolerance.
        no_steps = rules.maxiters <= 0
        converged = Converged(*(c & ~no_steps for c in converged))
        checks = Checks(
            f_ok,
            g_ok,
            true_(),
            false,
            converged,
            false,
            stop,
            k >= rules.maxiters,
            rules.out_of_time(f, carry.t_start),
        )
        status, reason = checks.verdict()
        is_running = status == RUNNING
        zero = jnp.zeros((), INT)

        def hold():  # no update: x, the state and the model's state as they were
            return Update(x, carry.state, zero, zero, jnp.zeros((), bool))

        if stream and not guarded and gate is None:
            # On data every step updates: a conditional (or a select) per step costs more
            # than the step's own bookkeeping. The host undoes a stopped step's update by
            # replaying its chunk up to that step (see StreamLoop). A run inside the
            # caller's trace has no host to replay it: its steps are ``guarded``.
            upd, x_prev = solver.update(objective, x, f, g, carry.state), x
        elif stream and not guarded:
            upd = lax.cond(gate, lambda: solver.update(objective, x, f, g, carry.state), hold)
            x_prev = x
            if carried is not None:  # a skipped batch's statistics are not kept either
                carried = select(gate, carried, carry.carried)
        elif replayed:
            # no previous iterate: a stopped step keeps x as it is (the host replays a
            # failed run up to its last good iterate)
            upd, carried = lax.cond(
                is_running,
                lambda: (solver.update(objective, x, f, g, carry.state), carried),
                lambda: (hold(), carry.carried),
            )
            x_prev = None
        else:
            # x_prev moves only in the running branch: a stop keeps the previous good
            # iterate without a select over every parameter at every step.
            moves = is_running if gate is None else is_running & gate
            # a skipped step (running) took its batch: x is the iterate it evaluated; without
            # skips the branch runs only once stopped, where x_prev stays as it was
            held_prev = carry.x_prev if gate is None else select(is_running, x, carry.x_prev)
            upd, x_prev, carried = lax.cond(
                moves,
                lambda: (solver.update(objective, x, f, g, carry.state), x, carried),
                lambda: (hold(), held_prev, carry.carried),
            )
        # A failed update ends the run at x, which counts as completed (finish subtracts
        # the failing step, so the counter takes one more).
        status = jnp.where(upd.failed, int(ReturnCode.FAILURE), status).astype(INT)
        reason = jnp.where(upd.failed, TRIAL_NONFINITE, reason).astype(INT)
        if stream:
            # The callback sees step k + 1's outcome: the iterate after its update, with the
            # loss and gradient of the batch it trained on (as a training loop logs them),
            # so the last step is seen too; a stop keeps that update.
            after = upd.x if carry.carried is None else ModelPoint(upd.x, carried)
            stop = rules.callback_stop(status == RUNNING, k + 1, after, f, g, evaluated_at=x)
            status = jnp.where(stop, int(ReturnCode.TERMINATED), status).astype(INT)
        # x0's value is kept even when it is not finite: there is no earlier iterate.
        f_last = jnp.where(ok | (k == 0), f, carry.f_last)
        due = ok & tracker.due(k)
        evaluation, score = tracker.evaluation_at(objective, x, due, f.dtype)
        record = carry.record
        if record is not None:
            record = record_at(
                record,
                k,
                f,
                rules.grad_norm(x, g),
                keep=ok,
                metrics=tracker.metrics_at(objective, x, f.dtype),
                evaluation=evaluation,
                evaluated=due,
            )
        best = tracker.update_best(carry.best, ok, x, carry.state, carry.carried, f, score, k)
        # on data a stopped step (a failed update included) is undone: it counts no update
        advanced = is_running & ~upd.failed if stream else is_running | upd.failed
        if skips is not None:
            skips = (skips[0] + (is_running & ~ok).astype(INT), in_a_row)
        return _GradientCarry(
            upd.x,
            upd.state,
            carried,
            x_prev,
            f_last,
            k + advanced.astype(INT),
            carry.f_evals + 1 + upd.f_evals.astype(INT),
            carry.grad_evals + 1 + upd.grad_evals.astype(INT),
            status,
            reason,
            carry.t_start,
            record,
            carry.base,
            best,
            skips,
        )

    def finish(final: _GradientCarry) -> Solution:
        start = final.base
        failed = final.status == int(ReturnCode.FAILURE)
        status, reason = final.status, final.reason
        if stream:
            # On data a non-finite loss or gradient condemns the batch, not the iterate:
            # x is kept where finite (it came from a finite update), else the one before.
            x_ok = all_finite(final.x)
            keep_x = x_ok | (final.iteration == 0)
            x, iterations = select(
                keep_x, (final.x, final.iteration), (final.x_prev, final.iteration - 1)
            )
            status = jnp.where(x_ok, status, int(ReturnCode.FAILURE)).astype(INT)
            reason = jnp.where(x_ok | failed, reason, X_NONFINITE).astype(INT)
        else:
            # On failure x_prev is the previous iterate, one update before the failing one.
            # A run still going (a chunk's end) gives x and state after its last update,
            # whose value is not known yet (the chunked runner evaluates it once).
            back = failed & (final.iteration > 0)
            x = final.x if replayed else select(failed, final.x_prev, final.x)
            iterations = jnp.where(back, final.iteration - 1, final.iteration)
        best = final.best
        if stream and best is not None:  # the last update's iterate is a candidate too
            objective = Objective.from_problem(problem)
            if final.carried is not None:
                objective = objective.with_state(final.carried)
            best = tracker.final_best(
                best, objective, x, final.state, final.carried, final.f_last, iterations
            )
        x, state, carried, f = tracker.kept(best, x, final.state, final.carried, final.f_last)
        return Solution(
            x=x,
            objective=f,
            retcode=status,
            stats=Stats(
                iterations=start.iterations + iterations,
                f_evals=start.f_evals + final.f_evals,
                grad_evals=start.grad_evals + final.grad_evals,
                time=None,
                skipped=None if final.skips is None else final.skips[0],
            ),
            original=state,
            state=state,
            history=history_of(final.record),
            reason=reason,
            model_state=carried,
        )

    return StreamLoop(init, step, finish, new_record)


def _gradient_loop(
    solver: GradientStepSolver,
    objective: Objective,
    problem: OptimizationProblem,
    options: SolveOptions,
    replayed: bool = False,
) -> Loop:
    """The loop for solvers that need only the gradient at the current iterate
    (``replayed``: see :func:`_gradient_parts`)."""
    parts = _gradient_parts(solver, problem, options, stream=False, replayed=replayed)
    return Loop(
        lambda: parts.init(objective), lambda carry: parts.step(carry, objective), parts.finish
    )


def stopped_at(replayed: _GradientCarry, stopped: _GradientCarry) -> _GradientCarry:
    """The carry of a run on data that stopped: the iterate and state of ``replayed`` (the
    steps up to the stopped one, run again) with ``stopped``'s outcome."""
    return replayed._replace(
        status=stopped.status,
        reason=stopped.reason,
        f_evals=stopped.f_evals,
        grad_evals=stopped.grad_evals,
        f_last=stopped.f_last,
    )


def stream_loop(
    solver: NativeSolver, problem: OptimizationProblem, options: SolveOptions, guarded: bool = False
) -> StreamLoop:
    """The parts of a run on data (training on minibatches), for a gradient-step solver.
    ``guarded``: a step that stops the run applies no update (for a run inside the caller's
    trace, which the host cannot replay; see :class:`StreamLoop`)."""
    if not isinstance(solver, GradientStepSolver):
        raise ValueError(
            "solve: this transformation ends in a line search, which needs one deterministic "
            "objective; training on `data` takes update-only transformations "
            "(optsolve.Adam, optax.chain of plain transforms, ...)."
        )
    return _gradient_parts(solver, problem, options, stream=True, guarded=guarded)


def build_loop(
    make_solver: Callable[[Any, OptimizationProblem], NativeSolver],
    problem: OptimizationProblem,
    algorithm: Any,
    options: SolveOptions,
) -> Loop:
    """The parts of the run of ``make_solver(algorithm, problem)`` (inside a trace)."""
    return loop_of(make_solver(algorithm, problem), problem, options)


def loop_of(
    solver: NativeSolver,
    problem: OptimizationProblem,
    options: SolveOptions,
    replayed: bool = False,
) -> Loop:
    """The parts of the run of ``solver`` (inside a trace). ``replayed``: the host replays a
    failed run (only where :func:`replays_failures` holds), so the loop keeps no previous
    iterate and a failed run's x is its failing iterate."""
    objective = Objective.from_problem(problem)
    solver.bind_options(options)
    if isinstance(solver, GradientStepSolver):
        return _gradient_loop(solver, objective, problem, options, replayed)
    if isinstance(solver, SteppingSolver):
        return _stepping_loop(solver, objective, problem, options)
    raise TypeError(
        f"optsolve: {type(solver).__name__} is not a SteppingSolver or a GradientStepSolver."
    )


def run_whole(
    make_solver,
    problem: OptimizationProblem,
    algorithm: Any,
    options: SolveOptions,
    loop: LoopRunner | None = None,
) -> Solution:
    """The whole run in the caller's trace, in the loop the adjoint chose (a while loop by
    default; :class:`~optsolve.solve_api.loops.CheckpointedScan` when unrolling)."""
    parts = build_loop(make_solver, problem, algorithm, options)
    loop = while_loop if loop is None else loop
    return parts.finish(loop(running, parts.body, parts.init()))
