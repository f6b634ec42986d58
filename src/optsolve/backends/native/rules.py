"""The stopping rules of the JAX-native driver, decided once for every solver: convergence
(gtol, ftol, xtol), non-finite values, stalls, the callback and progress bar, maxiters and
maxtime, the reason a run stopped; where a run starts (resume) and its history record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.native.objective import inf_norm
from optsolve.backends.native.protocol import NativeSolver
from optsolve.solve_api.checkpoint import SavedLeaves
from optsolve.solve_api.host import call_user_callback, clock, report_progress, wants_grad_norm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import History
from optsolve.solve_api.stationarity import stationarity

PyTree = Any
INT = jnp.int32

# Reason codes (optsolve.solve_api.returncode.REASONS).
(
    GTOL,
    FTOL,
    XTOL,
    F_NONFINITE,
    G_NONFINITE,
    X_NONFINITE,
    LS_FAILED,
    STALLED_STEP,
    TRIAL_NONFINITE,
    STALLED_NONFINITE,
    REDUCTION_TOL,
    RADIUS_TOL,
) = range(1, 13)


def select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class Converged(NamedTuple):
    gtol: jax.Array
    ftol: jax.Array
    xtol: jax.Array
    # a solver's own tests (Step.converged): Moré's relative-reduction and radius tests
    reduction: jax.Array | bool = False
    radius: jax.Array | bool = False

    def any(self) -> jax.Array:
        return self.gtol | self.ftol | self.xtol | self.reduction | self.radius


class Rules:
    """The stopping tests of one run, built at trace time from the options and the solver."""

    def __init__(self, options: SolveOptions, solver: NativeSolver, bounds):
        self.options = options
        self.gtol = options.gtol if options.gtol is not None else solver.default_gtol
        self.xtol = options.get("xtol")
        self.ftol = options.ftol
        if solver.tests_tolerances:  # its own ftol / xtol tests replace these
            self.xtol = self.ftol = None
        maxiters = options.maxiters if options.maxiters is not None else solver.default_maxiters
        self.maxiters = jnp.asarray(maxiters if maxiters is not None else jnp.iinfo(INT).max, INT)
        self.bounds = bounds

    def grad_norm(self, x, g) -> jax.Array:
        return stationarity(x, g, self.bounds)

    def converged(self, x, f, g, x_prev, f_prev, has_prev, grad_norm=None) -> Converged:
        """gtol on the (projected) gradient (``grad_norm``, where the caller has it);
        ftol and xtol against the previous iterate."""
        false = jnp.zeros((), bool)
        by_g = by_f = by_x = false
        if self.gtol is not None:
            by_g = (self.grad_norm(x, g) if grad_norm is None else grad_norm) <= self.gtol
        if self.ftol is not None:
            # Only a step that moved x tests ftol: a rejected trust-region step, or a zero
            # update (a warm-up schedule at 0), leaves f unchanged without converging.
            moved = jnp.any(
                jnp.stack(
                    [
                        jnp.any(a != b)
                        for a, b in zip(
                            jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(x_prev)
                        )
                    ]
                )
            )
            scale = jnp.maximum(jnp.maximum(jnp.abs(f_prev), jnp.abs(f)), 1.0)
            by_f = has_prev & moved & (jnp.abs(f_prev - f) <= self.ftol * scale)
        if self.xtol is not None:
            # Only a step that moved x counts: a rejected trust-region step is not convergence.
            dx = inf_norm(jax.tree_util.tree_map(jnp.subtract, x, x_prev))
            by_x = has_prev & (dx > 0) & (dx <= self.xtol * jnp.maximum(inf_norm(x), 1.0))
        return Converged(by_g, by_f, by_x)

    def callback_stop(self, due, iteration, x, f, g, evaluated_at=None) -> jax.Array:
        """Run the user's callback (and the progress bar) where due; True = stop.
        ``evaluated_at``: the point where ``f`` and ``g`` were evaluated, where it is not
        ``x`` (a step on data reports the iterate after its update with the loss and
        gradient of the batch it trained on)."""
        at = x if evaluated_at is None else evaluated_at
        callback, progress = self.options.callback, self.options.progress
        if callback is None and not progress:
            return jnp.zeros((), bool)
        if self.options.replay is not None:
            due = due & ~self.options.replay
        stop = jnp.zeros((), bool)
        if callback is not None:
            due_cb = due & (iteration % self.options.callback_every == 0)
            with_norm = wants_grad_norm(callback)
            # stop_gradient: a host call has no derivative, and an unrolled loop is differentiated
            args = lax.stop_gradient(
                (due_cb, iteration, x, f) + ((self.grad_norm(at, g),) if with_norm else ())
            )
            stop = lax.cond(
                due_cb, lambda: call_user_callback(callback, *args), lambda: jnp.zeros((), bool)
            )
        if progress:
            every = (
                jnp.maximum(self.maxiters // 100, 1)
                if self.options.maxiters is not None
                else self.options.progress_every
            )
            due_bar = due & ((iteration % every == 0) | (iteration >= self.maxiters))
            args = lax.stop_gradient((due_bar, iteration, f, self.grad_norm(at, g)))
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


class Checks(NamedTuple):
    """What one iteration found, in the order the status is decided."""

    f_finite: jax.Array
    g_finite: jax.Array
    x_finite: jax.Array
    failed: jax.Array
    converged: Converged
    stalled: jax.Array
    stop: jax.Array
    at_maxiters: jax.Array
    out_of_time: jax.Array
    nonfinite_trials: jax.Array | bool = False  # the step's trial points met non-finite values

    @property
    def ok(self) -> jax.Array:
        return self.f_finite & self.g_finite & self.x_finite & ~self.failed

    def verdict(self) -> tuple[jax.Array, jax.Array]:
        """(status, reason code): failure first, then convergence, a stall, the callback's
        stop, maxiters and maxtime; RUNNING when none holds."""
        conv = self.converged
        status = _first(
            [~self.ok, conv.any(), self.stalled, self.stop, self.at_maxiters, self.out_of_time],
            [
                int(ReturnCode.FAILURE),
                int(ReturnCode.SUCCESS),
                int(ReturnCode.STALLED),
                int(ReturnCode.TERMINATED),
                int(ReturnCode.MAXITERS),
                int(ReturnCode.MAXTIME),
            ],
            RUNNING,
        )
        nonfinite = jnp.asarray(self.nonfinite_trials)
        reason = _first(
            [
                ~self.f_finite,
                ~self.g_finite,
                ~self.x_finite,
                self.failed & nonfinite,
                self.failed,
                conv.gtol,
                conv.ftol,
                conv.xtol,
                conv.reduction,
                conv.radius,
                self.stalled & nonfinite,
                self.stalled,
            ],
            [
                F_NONFINITE,
                G_NONFINITE,
                X_NONFINITE,
                TRIAL_NONFINITE,
                LS_FAILED,
                GTOL,
                FTOL,
                XTOL,
                REDUCTION_TOL,
                RADIUS_TOL,
                STALLED_NONFINITE,
                STALLED_STEP,
            ],
            0,
        )
        return status, reason


def _first(conditions: list, codes: list[int], default: int) -> jax.Array:
    """The code of the first condition that holds (``default`` where none holds), an int32
    scalar. A chain of selects, not jnp.select: its argmax is a reduction, which in a loop
    runs as kernels of its own and keeps XLA's CPU backend from compiling a small loop
    whole as one kernel (its small-while-loop pass); selects fuse with their operands."""
    out = jnp.asarray(default, INT)
    for condition, code in zip(reversed(conditions), reversed(codes)):
        out = jnp.where(condition, jnp.asarray(code, INT), out)
    return out


def true_() -> jax.Array:
    return jnp.ones((), bool)


class StartPoint(NamedTuple):
    """Where a run starts: x0 and zero counters, or an earlier run's end (``resume``)."""

    x: PyTree
    state: PyTree | None
    iterations: jax.Array
    f_evals: jax.Array
    grad_evals: jax.Array


def start_point(
    problem: OptimizationProblem, options: SolveOptions, init: Callable[[PyTree], PyTree]
) -> StartPoint:
    """Where the run starts. ``resume``'s state is checked against ``init(x)``'s structure
    (traced only for that); a resume point without a state (a scipy run's, or one that
    stopped before any step) warm-starts from its x with a fresh state."""
    zero = jnp.zeros((), INT)
    resume = options.resume
    if resume is None:
        return StartPoint(problem.x0, None, zero, zero, zero)
    state = resume.state
    if isinstance(state, SavedLeaves):  # a checkpoint's: its structure is this algorithm's
        state = state.like(jax.eval_shape(init, resume.x))
    if state is not None:
        expected = jax.tree_util.tree_structure(jax.eval_shape(init, resume.x))
        given = jax.tree_util.tree_structure(state)
        if expected != given:
            raise ValueError(
                f"solve: `resume` holds the optimizer state of {_state_name(given)}, but "
                f"this algorithm's state is {_state_name(expected)}: resume with the "
                "algorithm (and configuration) that produced it, or pass resume=None."
            )
    stats = resume.stats
    count = lambda v: jnp.asarray(0 if v is None else v, INT)
    return StartPoint(
        resume.x, state, count(stats.iterations), count(stats.f_evals), count(stats.grad_evals)
    )


def _state_name(structure: Any) -> str:
    """A short name of an optimizer state's structure (its outermost node types), not the
    whole PyTreeDef, which runs to thousands of characters."""
    node = structure.node_data()
    kind = (
        node[0].__name__
        if node is not None and hasattr(node[0], "__name__")
        else type(structure).__name__
    )
    children = [c.node_data() for c in structure.children()][:3]
    inner = ", ".join(
        c[0].__name__ for c in children if c is not None and hasattr(c[0], "__name__")
    )
    return (
        f"{kind}({inner}{', ...' if structure.num_nodes > 4 else ''}) with "
        f"{structure.num_leaves} arrays"
    )


class BaseCounts(NamedTuple):
    """The counts of the run a resumed run continues (zero for a fresh one)."""

    iterations: jax.Array
    f_evals: jax.Array
    grad_evals: jax.Array


def base_counts(start: StartPoint) -> BaseCounts:
    return BaseCounts(start.iterations, start.f_evals, start.grad_evals)


class Record(NamedTuple):
    """The history: the value and gradient norm at iterates ``first``, ``first + 1``, ...
    (``first`` is not 0 in the chunk of a run on data that records only its own steps), the
    metrics and evaluations where asked for (pytrees of such records, or None), and the
    constraint violation where the solver reports it (``SteppingSolver.violation``; else
    None)."""

    objective: jax.Array
    grad_norm: jax.Array
    first: jax.Array | None = None  # None: 0
    metrics: PyTree = None
    evaluation: PyTree = None
    violation: jax.Array | None = None


def empty_record(
    options: SolveOptions,
    dtype,
    length: int | None = None,
    first: jax.Array | None = None,
    specs: tuple = (None, None),
    violation: bool = False,
) -> Record | None:
    """An all-NaN record of ``length`` entries (default ``options.history``), or None
    without a history. ``specs``: the shapes of one metrics value and one evaluation (see
    :mod:`optsolve.backends.native.tracking`), or None for those not recorded;
    ``violation``: whether it has a column for the constraint violation."""
    if not options.history:
        return None
    length = options.history if length is None else length
    empty = jnp.full((length,), jnp.nan, dtype)

    def fill(spec):
        return (
            None
            if spec is None
            else jax.tree_util.tree_map(
                lambda s: jnp.full((length,) + s.shape, jnp.nan, _float(s.dtype, dtype)), spec
            )
        )

    return Record(empty, empty, first, fill(specs[0]), fill(specs[1]), empty if violation else None)


def _float(dtype, default):
    # a recorded int or bool (a count, a flag) is stored as a float, so that NaN marks gaps
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else default


def record_at(
    record: Record | None,
    index,
    f,
    gnorm,
    keep=True,
    metrics=None,
    evaluation=None,
    evaluated=True,
    violation=None,
) -> Record | None:
    """``record`` with iterate ``index``'s entries; ``keep`` False drops them all,
    ``evaluated`` False the evaluation's. ``violation``: the constraint violation, for a
    record with that column (which then needs it)."""
    if record is None:
        return None
    if record.first is not None:
        index = index - record.first
    out_of_range = record.objective.shape[0]
    at = jnp.where(keep, index, out_of_range)  # out of range: dropped

    def put(rows, values, where):
        if rows is None:
            return None
        return jax.tree_util.tree_map(
            lambda r, v: r.at[where].set(jnp.asarray(v).astype(r.dtype), mode="drop"), rows, values
        )

    if record.violation is not None and violation is None:
        raise TypeError(
            "optsolve: a solver whose `violation` method reports the constraint "
            "violation must set `Step.violation` on every step too."
        )
    return Record(
        record.objective.at[at].set(f, mode="drop"),
        record.grad_norm.at[at].set(gnorm.astype(f.dtype), mode="drop"),
        record.first,
        put(record.metrics, metrics, at),
        put(record.evaluation, evaluation, jnp.where(evaluated, at, out_of_range)),
        put(record.violation, violation, at),
    )


def history_of(record: Record | None) -> History | None:
    return (
        None
        if record is None
        else History(
            record.objective, record.grad_norm, record.metrics, record.evaluation, record.violation
        )
    )
