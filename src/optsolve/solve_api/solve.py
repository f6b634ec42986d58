"""``solve``: validate, dispatch on the algorithm's type, return one Solution."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api import host, plans, recompilation
from optsolve.solve_api.batches import Batches
from optsolve.solve_api.capabilities import resume_point
from optsolve.solve_api.checkpoint import Checkpoint
from optsolve.solve_api.options import as_callback, check_key, make_options
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import FlatInputs, is_traced, replace
from optsolve.solve_api.registry import algorithm_classes, as_algorithm, backend_for
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.root_problem import RootProblem
from optsolve.solve_api.roots import solve_root
from optsolve.solve_api.solution import History, Solution, Stats
from optsolve.solve_api.solve_signature import declare_solve_signature
from optsolve.solve_api.stages import (
    Call,
    Maximisation,
    ModelSplit,
    Multipliers,
    SavedResume,
    ScipyForms,
    Stage,
    StartProjection,
)
from optsolve.solve_api.stages import enter as enter_stages
from optsolve.solve_api.stages import leave as leave_stages
from optsolve.solve_api.stationarity import stationarity


def _eager(solution: Solution, elapsed: float, interrupted: bool = False) -> Solution:
    """An eager result in one set of types on every backend: a ReturnCode, Python ints.
    ``interrupted``: a Ctrl-C stopped the run from inside a host call."""

    def count(value):
        return None if value is None else int(value)

    stats = solution.stats
    scalars = (solution.retcode, solution.reason, stats.iterations, stats.f_evals, stats.grad_evals)
    if any(isinstance(s, jax.Array) for s in scalars):  # one transfer, not one each
        scalars = jax.device_get(scalars)
    code, reason, iterations, f_evals, grad_evals = scalars
    retcode, reason = ReturnCode(int(code)), count(reason)
    if interrupted and retcode in (ReturnCode.TERMINATED, ReturnCode.MAXTIME):
        retcode, reason = ReturnCode.INTERRUPTED, None
    skipped = stats.skipped
    if isinstance(skipped, jax.Array):
        skipped = int(skipped)
    return replace(
        solution,
        retcode=retcode,
        reason=reason,
        stats=replace(
            stats,
            iterations=count(iterations),
            f_evals=count(f_evals),
            grad_evals=count(grad_evals),
            time=elapsed,
            skipped=skipped,
        ),
    )


def _with_problem(solution: Solution, problem: OptimizationProblem) -> Solution:
    """The solution holding the problem it solves (not a pytree field: it goes no further
    than this Solution object), which :func:`~optsolve.covariance` reads."""
    object.__setattr__(solution, "problem", problem)
    return solution


def _checkpoint(finish: Callable[[Solution], Solution], algorithm, path, every, keep) -> Checkpoint:
    """The checkpoint hook of ``solve``'s ``checkpoint`` and ``checkpoint_every``;
    ``finish`` gives a Solution in the user's terms."""
    if path is None or every is None:
        raise ValueError(
            "solve: `checkpoint` (a file) and `checkpoint_every` (iterations) "
            "go together; give both."
        )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"solve: `checkpoint` must be a file path, got {path!r}.")
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"solve: `checkpoint_every` must be an integer >= 1, got {every!r}.")
    if not type(algorithm).compiled_driver:
        able = ", ".join(c.__name__ for c in algorithm_classes() if c.compiled_driver)
        raise ValueError(
            f"solve: {type(algorithm).__name__} cannot write checkpoints: its run is not "
            f"cut into the shared driver's chunks (scipy keeps its state inside scipy; a "
            f"wrapper such as Multistart runs as one compiled call), so a resumed run would "
            f"not continue exactly. Algorithms that can: {able}."
        )
    if keep == "best":
        raise ValueError(
            "solve: `checkpoint` saves the run's current iterate, which "
            "keep='best' does not return; use one or the other."
        )
    started = time.perf_counter()

    def to_user(solution: Solution) -> Solution:
        solution = replace(solution, retcode=ReturnCode.INTERRUPTED, reason=None, history=None)
        return finish(_eager(solution, time.perf_counter() - started))

    return Checkpoint(path, int(every), to_user)


def _no_iterations(problem: OptimizationProblem, opts) -> Solution:
    """The answer to ``maxiters=0``, without calling a backend: the start, unchanged."""
    resume = opts.resume
    x = problem.x0 if resume is None else resume.x
    if opts.history:
        f, g = jax.value_and_grad(problem.f)(x, problem.p)
        norm = stationarity(x, g, problem.bounds)

        def one(fn):  # one entry, ints as floats (as every record stores them)
            return (
                None
                if fn is None
                else jax.tree_util.tree_map(
                    lambda v: jnp.reshape(v, (1,) + jnp.shape(v)).astype(
                        jnp.result_type(v)
                        if jnp.issubdtype(jnp.result_type(v), jnp.inexact)
                        else f.dtype
                    ),
                    fn(x, problem.p),
                )
            )

        history = History(
            jnp.reshape(f, (1,)),
            jnp.reshape(norm, (1,)).astype(f.dtype),
            one(opts.metrics),
            one(opts.evaluate),
        )
    else:
        f, history = problem.f(x, problem.p), None
    base = resume.stats if resume is not None else Stats(0, 0, 0)
    zero = lambda v: 0 if v is None else v
    return Solution(
        x=x,
        objective=f,
        retcode=ReturnCode.MAXITERS,
        stats=Stats(
            iterations=zero(base.iterations),
            f_evals=zero(base.f_evals) + 1,
            grad_evals=zero(base.grad_evals) + (1 if opts.history else 0),
        ),
        state=None if resume is None else resume.state,
        history=history,
    )


def progress_bar(enabled: bool, total: int | None) -> contextlib.AbstractContextManager:
    """A tqdm bar that the compiled loop updates through ``host.report_progress`` (none
    where not ``enabled``)."""
    return _progress_bar(total) if enabled else contextlib.nullcontext()


@contextlib.contextmanager
def _progress_bar(total: int | None):
    try:
        from tqdm.auto import tqdm
    except ImportError as err:
        raise ImportError(
            "solve: `progress=True` needs tqdm; install it with `pip install optsolve[progress]`."
        ) from err
    bar = tqdm(total=total, unit="it", desc="optsolve")
    host.PROGRESS_BARS.append(bar)
    try:
        yield bar
    finally:
        host.PROGRESS_BARS.remove(bar)
        bar.close()


# the modules below solve (options, roots) read its keywords from here, not by importing it
@declare_solve_signature
def solve(
    problem: OptimizationProblem,
    algorithm: Any,
    *,
    maxiters: int | None = None,
    maxtime: float | None = None,
    gtol: float | None = None,
    ftol: float | None = None,
    callback: Callable[..., Any] | None = None,
    adjoint: Any = None,
    resume: Solution | None = None,
    history: bool = False,
    progress: bool = False,
    data: Any = None,
    batch_size: int | None = None,
    key: Any = None,
    epochs: int | None = None,
    metrics: Callable[..., Any] | None = None,
    evaluate: Callable[..., Any] | None = None,
    eval_every: int = 1,
    keep: str = "last",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    nonfinite: str | None = None,
    max_consecutive_skips: int = 10,
    **options: Any,
) -> Solution:
    """Minimise ``problem`` with ``algorithm`` and return a :class:`Solution`.

    Args:
      problem: an :class:`OptimizationProblem`.
      algorithm: an optsolve algorithm (``optsolve.Adam(1e-3)``, ...) or a raw
        ``optax.GradientTransformation``.
      maxiters: the most iterations; required for algorithms with no convergence test of
        their own (the optax family) unless gtol, ftol or maxtime is given.
      maxtime: the most wall-clock seconds.
      gtol: stop with SUCCESS once the gradient's infinity norm is <= gtol.
      ftol: stop with SUCCESS once the relative change of the objective is <= ftol.
      callback: ``callback(iteration, x, objective)``, called after every iteration (or
        every ``callback_every``-th); returning True stops the run with TERMINATED.
      resume: a Solution of an earlier run of the same algorithm on the same problem to
        continue from (iterate, optimizer state, step count): N steps then M more equal
        N + M steps. ``maxiters`` counts the new steps; stats count both runs. A
        checkpoint, ``optsolve.load(path)``, continues the run that wrote it exactly.
      history: record the objective and gradient norm at every iterate in
        ``sol.history`` (inside the compiled loop; needs ``maxiters``), and the metrics
        and evaluations below.
      metrics: ``metrics(x, p)`` (on ``data``: ``metrics(x, p, batch)``), any pytree of
        numbers, recorded at every iterate in ``sol.history.metrics`` inside the compiled
        loop (needs ``history=True``). Without it, a problem with ``has_aux=True`` records
        aux there.
      evaluate: ``evaluate(x, p)``, e.g. the loss or accuracy on held-out data: a scalar
        score (lower is better) or ``(score, aux)``, run at every ``eval_every``-th
        iterate, recorded in ``sol.history.evaluation`` and ranking iterates for
        ``keep="best"``.
      eval_every: iterations between evaluations (default 1).
      keep: ``"last"`` (default) returns the run's last iterate; ``"best"`` the one of
        lowest score (``evaluate``'s; without it the objective's, full batch only), with
        its optimizer state, so that ``resume=`` continues from there.
      checkpoint: a file (``.npz``) to which an eager run of a JAX-native algorithm writes
        its Solution so far (x, the optimizer state, the counts; no history) every
        ``checkpoint_every`` iterations, replacing the previous one atomically. A run
        killed mid-way continues exactly with ``resume=optsolve.load(checkpoint)`` (on
        in-memory data, at the same epoch and batch; an iterable must be given the
        batches it has not yet fed).
      checkpoint_every: iterations between checkpoints (of this run).
      progress: show a tqdm progress bar with the loss and gradient norm (needs the
        ``progress`` extra; updated from inside the compiled loop about 100 times a run,
        or, on ``data``, by the host between compiled chunks).
      data: train on data: the objective is then ``f(x, p, batch)``. Either an iterable of
        batches (any pytrees of numpy or JAX arrays: a list, a generator, a data loader;
        up to 32 batches of one shape, at most 64 MiB, run per compiled call), or, with
        ``batch_size``, a pytree of in-memory arrays sharing a leading dimension (up to 16
        epochs per compiled call, each a permutation of the data cut into batches). The run
        stops at ``maxiters`` steps, after ``epochs`` passes (default 1), or when the
        iterable is exhausted (MAXITERS: the budget is used up). ``sol.objective`` is then
        the loss of the last step's batch. A KeyboardInterrupt returns the last completed
        step with ``ReturnCode.INTERRUPTED``. In-memory data runs inside ``jax.jit``,
        ``jax.vmap`` and ``jax.grad`` (the batches are taken inside the compiled loop; the
        arrays and the key may be traced); an iterable is fed by the host, eagerly.
      batch_size: the batch size of in-memory ``data`` (a remainder is dropped each epoch).
      key: a ``jax.random`` key to shuffle in-memory data at every epoch (no shuffling if None).
      epochs: passes over ``data`` (re-iterable data or in-memory arrays).
      nonfinite: what a non-finite f (or gradient) does; None (default) is each
        method's own default: ``"reject"`` for the methods that can pass over a point
        (trait ``rejects_nonfinite``: scipy's derivative-free and global methods), else
        ``"fail"``. ``"fail"`` ends the run with FAILURE at the latest finite iterate (on
        ``data``: at that step). ``"reject"`` hands the method +inf at such a point, which
        it passes over (a region where f is ``inf`` on purpose); the message counts them
        and the run is never SUCCESS at one. On ``data``, ``"skip"`` skips the update of a
        step whose batch gives a non-finite loss or gradient (the batch is used up), counts
        it in ``sol.stats.skipped`` and the message, and ends the run with FAILURE only at
        the ``max_consecutive_skips + 1``-th skip in a row. An ``optax.apply_if_finite``
        transformation skips on its own: its skips are honoured the same way.
      max_consecutive_skips: see ``nonfinite`` (default 10).
      adjoint: how the solution is differentiated with respect to ``problem.p``
        (default :class:`ImplicitAdjoint`). Gradients with respect to ``x0`` are zero. On
        in-memory ``data`` only :class:`UnrolledAdjoint` applies (through the steps); a run
        on data is not differentiated otherwise, and a derivative is refused.
      **options: ``callback_every`` and algorithm-specific options; unknown ones are errors.

    Returns:
      A :class:`Solution`; ``retcode`` says why the run stopped. Numerical trouble gives
      ``ReturnCode.FAILURE`` with the last finite iterate, never an exception. For a problem
      with ``sense="max"`` every algorithm minimises ``-f``, and the objective, history and
      callback values are f's own; with ``has_aux=True``, ``sol.aux`` is aux at ``sol.x``.

    Example:
      >>> import jax.numpy as jnp, optsolve
      >>> prob = optsolve.OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(2), 1.0)
      >>> sol = optsolve.solve(prob, optsolve.Adam(0.1), maxiters=500)
    """
    if isinstance(problem, RootProblem):  # root finding's own path (solve_api/roots.py)
        return solve_root(**locals())
    if not isinstance(problem, OptimizationProblem):
        raise TypeError(
            "solve: `problem` must be an optsolve.OptimizationProblem, got "
            f"{type(problem).__name__}."
        )
    check_key(key)
    if resume is not None and not isinstance(resume, Solution):
        resume_point(problem, resume)  # its error
    algorithm = as_algorithm(algorithm)
    given = dict(
        maxiters=maxiters,
        maxtime=maxtime,
        gtol=gtol,
        ftol=ftol,
        history=history,
        progress=progress,
        eval_every=eval_every,
        keep=keep,
        nonfinite=nonfinite,
        max_consecutive_skips=max_consecutive_skips,
        **options,
    )
    planned, inputs = None, None
    if all(
        v is None
        for v in (
            callback,
            adjoint,
            resume,
            data,
            batch_size,
            epochs,
            metrics,
            evaluate,
            checkpoint,
            checkpoint_every,
        )
    ) and plans.may_stand_for(problem):
        inputs = FlatInputs(problem, algorithm)  # the plan's key, reused below
        planned = plans.key(inputs, given)
        plan = plans.lookup(planned)
        if plan is not None:  # the stages change nothing here: their checks passed before
            solution = _planned_run(plan, inputs, problem, algorithm)
            if solution is None:
                # the progress bar is the layers' (host calls update it from the loop)
                recorded = (
                    contextlib.nullcontext()
                    if plan.options.progress
                    else plans.recording(plan, problem, algorithm)
                )
                with recorded:
                    solution = _run(
                        plan.call(problem, algorithm),
                        inputs.including(plan.options, plan.options_flat),
                        planned=True,
                    )
            return _with_problem(solution, problem)

    # the call as the backends take it, one stage at a time, and each stage's inverse on
    # the Solution on the way back
    def finish(solution: Solution) -> Solution:
        """The solution in the terms of the user's problem, holding the problem it solves
        (which :func:`~optsolve.covariance` reads)."""
        return _with_problem(leave_stages(stages, solution), call.problem)

    stages = [
        ScipyForms(),
        Maximisation(history, on_data=data is not None),
        SavedResume(),
        ModelSplit(),
        Options(
            dict(
                maxiters=maxiters,
                maxtime=maxtime,
                gtol=gtol,
                ftol=ftol,
                history=history,
                progress=progress,
                eval_every=eval_every,
                keep=keep,
                **options,
            ),
            checkpoint,
            checkpoint_every,
            nonfinite,
            max_consecutive_skips,
            on_data=data is not None,
            finish=finish,
        ),
        Batches(data, batch_size, key, epochs),
        StartProjection(),
        Multipliers(),
    ]
    call = enter_stages(
        stages,
        Call(problem, resume, as_callback(callback), metrics, evaluate, algorithm, adjoint=adjoint),
    )
    plans.record(planned, call, problem, algorithm)
    return finish(_run(call, inputs))


class Options(Stage):
    """The call's options made and checked (the algorithm's own included), from the hooks
    and the resume point as the stages before made them; ``checkpoint`` writes the Solution
    in the user's terms (the stages' inverses)."""

    def __init__(
        self,
        given: dict,
        checkpoint,
        checkpoint_every,
        nonfinite,
        max_consecutive_skips,
        on_data: bool,
        finish: Callable[[Solution], Solution],
    ):
        self.given, self.checkpoint, self.every = given, checkpoint, checkpoint_every
        self.nonfinite, self.skips, self.on_data = nonfinite, max_consecutive_skips, on_data
        self.finish = finish

    def enter(self, call: Call) -> Call:
        algorithm, checkpoint = call.algorithm, self.checkpoint
        if checkpoint is not None or self.every is not None:
            checkpoint = _checkpoint(
                self.finish, algorithm, checkpoint, self.every, self.given.get("keep", "last")
            )
        opts = make_options(
            algorithm,
            callback=call.callback,
            resume=resume_point(call.problem, call.resume),
            metrics=call.metrics,
            evaluate=call.evaluate,
            checkpoint=checkpoint,
            **self.given,
        )
        opts = replace(
            opts, **_nonfinite_policy(algorithm, self.nonfinite, self.skips, on_data=self.on_data)
        )
        return dataclasses.replace(call, options=opts)


def _planned_run(
    plan: plans.Plan, inputs: FlatInputs, problem: OptimizationProblem, algorithm: Any
) -> Solution | None:
    """The call run by the run its plan holds (the backend's own, from the inputs' leaves:
    the layers of :func:`_run` did nothing for this structure but look it up), in eager
    terms; None where the plan holds no run or that run cannot take these inputs (the
    plan then drops it)."""
    run = plan.run
    if run is None:
        return None
    leaves = [leaf for flat, _ in inputs.flat for leaf in flat] + plan.options_flat[0]
    start = time.perf_counter()
    with host.HostCalls() as calls:
        solution = run(leaves, problem, algorithm)
    if solution is None:
        plan.runs.clear()
        return None
    return _eager(solution, time.perf_counter() - start, calls.interrupted)


def _run(call: Call, known: FlatInputs | None = None, planned: bool = False) -> Solution:
    """The run every call ends in: the algorithm's backend through the adjoint, in the
    caller's trace, or eagerly (progress bar, Ctrl-C, timing, one set of result types).

    ``known``: flattens made before, reused for the objects they hold; ``planned``: the
    call's structure has run before (:mod:`~optsolve.solve_api.plans`)."""
    problem, opts, adjoint = call.problem, call.options, call.adjoint
    algorithm = call.algorithm.specialised_for(problem)
    backend = backend_for(algorithm)
    # flattened once for the layers below
    inputs = FlatInputs(problem, algorithm, opts, known=known)
    traced = inputs.traced or host.under_a_trace()
    # a class trait (no configuration changes it): read once, not via capabilities()
    if (
        opts.maxiters is not None
        and not is_traced(opts.maxiters)
        and int(opts.maxiters) == 0
        and not type(algorithm).compiled_driver
    ):
        solution = _no_iterations(algorithm.minimised_problem(problem), opts)
        return solution if traced else _eager(solution, 0.0)
    if traced:
        return adjoint.apply(backend, problem, algorithm, opts)
    # the problem and the algorithm: the options' functions are the hooks
    if not planned:  # a planned structure has been noted: its key holds the note's
        recompilation.note(*inputs.first(2), (opts.callback, opts.metrics, opts.evaluate))
    start = time.perf_counter()
    with progress_bar(opts.progress, call.steps), host.HostCalls() as calls, inputs.reused():
        solution = adjoint.apply(backend, problem, algorithm, opts)
        # the results of one computation are ready together: a wait on a few leaves, not
        # a flatten of the whole Solution (a model's x and optimizer state); none where the
        # backend has read its results already
        if not all(_ready(v) for v in (solution.objective, solution.retcode)):
            jax.block_until_ready((solution.objective, solution.retcode))
        if opts.progress and np.ndim(solution.retcode) == 0:
            host.advance_progress(int(solution.stats.iterations), solution.objective)
    elapsed = time.perf_counter() - start
    if np.ndim(solution.retcode) != 0:  # a batch (a vmapped problem solved eagerly)
        return replace(solution, stats=replace(solution.stats, time=elapsed))
    return _eager(solution, elapsed, calls.interrupted)


def _ready(value: Any) -> bool:
    # jax's stub of Array lacks is_ready, which every concrete array has
    return not isinstance(value, jax.Array) or value.is_ready()  # type: ignore[attr-defined]


def _nonfinite_policy(algorithm, nonfinite, max_consecutive_skips, on_data: bool) -> dict:
    """``solve``'s ``nonfinite`` and ``max_consecutive_skips``, checked, as options."""
    if nonfinite not in (None, "fail", "skip", "reject"):
        raise ValueError(
            "solve: `nonfinite` must be None (the method's default), 'reject' "
            "(scipy's derivative-free and global methods), 'fail' or 'skip' (on "
            f"data), got {nonfinite!r}."
        )
    if nonfinite is None:  # the method's documented default (capabilities.py checks 'reject')
        nonfinite = "reject" if algorithm.capabilities().get("rejects_nonfinite") else "fail"
    if (
        isinstance(max_consecutive_skips, bool)
        or not isinstance(max_consecutive_skips, (int, np.integer))
        or max_consecutive_skips < 0
    ):
        raise ValueError(
            "solve: `max_consecutive_skips` must be an integer >= 0, got "
            f"{max_consecutive_skips!r}."
        )
    if nonfinite == "skip" and not on_data:
        raise ValueError(
            "solve: nonfinite='skip' skips the update of a batch with a non-finite loss; it "
            "needs `data` (full batch, the same point would fail again)."
        )
    return dict(nonfinite=nonfinite, max_consecutive_skips=int(max_consecutive_skips))
