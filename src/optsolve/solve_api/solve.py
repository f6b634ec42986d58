"""``solve``: validate, dispatch on the algorithm's type, return one Solution."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optsolve.solve_api.adjoint import ImplicitAdjoint
from optsolve.solve_api import host, recompilation, trainable
from optsolve.solve_api.checkpoint import Checkpoint
from optsolve.solve_api.capabilities import (check_capabilities, check_objective, names_with,
                                             resume_point)
from optsolve.solve_api.kkt import multipliers, per_constraint
from optsolve.solve_api.options import (DataSpec, InMemoryData, as_callback, check_key,
                                        make_options)
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import FlatInputs, is_traced, replace
from optsolve.solve_api.registry import algorithm_classes, as_algorithm, backend_for
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import History, Solution, Stats
from optsolve.solve_api.stages import (Call, Maximisation, ModelSplit, SavedResume,
                                       ScipyForms)
from optsolve.solve_api.stages import enter as enter_stages
from optsolve.solve_api.stages import leave as leave_stages
from optsolve.solve_api.stationarity import stationarity


def _solve_on_data(problem, algorithm, opts, data, batch_size, key, epochs,
                   adjoint=None) -> Solution:
    name = type(algorithm).__name__
    if not algorithm.capabilities()["takes_data"]:
        condition = type(algorithm).conditional_traits.get("takes_data")
        why = "" if condition is None else (
            f" configured this way (only {condition}: a line search needs one deterministic "
            "objective)")
        raise ValueError(
            f"solve: {name} does not train on `data`{why}. Algorithms that do: "
            f"{names_with('takes_data')}."
        )
    for option in ("gtol", "ftol"):
        if getattr(opts, option) is not None:
            raise ValueError(
                f"solve: `{option}` is not meaningful when training on `data` (each step sees "
                "another batch); stop with maxiters, epochs, maxtime or the callback."
            )
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"solve: `batch_size` must be a positive int, got {batch_size!r}.")
    if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"solve: `epochs` must be a positive int, got {epochs!r}.")
    if batch_size is None and key is not None:
        raise ValueError("solve: `key` shuffles in-memory data; it needs `batch_size`.")
    if batch_size is not None:
        sizes = {jax.numpy.shape(a)[0] if jax.numpy.ndim(a) else None
                 for a in jax.tree_util.tree_leaves(data)}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                "solve: with `batch_size`, `data` must be a pytree of arrays sharing a leading "
                f"dimension, got leading sizes {sorted(map(str, sizes))}."
            )
        if batch_size > sizes.pop():
            raise ValueError(f"solve: `batch_size`={batch_size} exceeds the number of samples.")
    elif not hasattr(data, "__iter__"):
        raise TypeError(
            f"solve: `data` must be an iterable of batches, or arrays with `batch_size`; got "
            f"{type(data).__name__}."
        )
    elif _in_memory_arrays(data):
        shapes = [tuple(jax.numpy.shape(a)) for a in jax.tree_util.tree_leaves(data)]
        raise ValueError(
            f"solve: `data` is a {type(data).__name__} of arrays (shapes {shapes}), which "
            "would be read as an iterable of batches, one per element; to train on in-memory "
            "arrays cut into batches, pass `batch_size` (and `key` to shuffle), or pass a "
            "list of batches.")
    check_capabilities(problem, algorithm, opts, stops_with_data=True, adjoint=adjoint)
    allowed = _data_steps(data, batch_size, epochs, None)
    if allowed is not None and opts.maxiters is not None and not is_traced(opts.maxiters) \
            and int(opts.maxiters) > allowed:
        warnings.warn(
            f"solve: maxiters={int(opts.maxiters)} exceeds the {allowed} steps that "
            f"epochs={1 if epochs is None else epochs} allow(s) over this data, so the run "
            "ends after those; raise `epochs` to take more steps.", UserWarning, stacklevel=3)
    inputs = FlatInputs(problem, algorithm)  # flattened once for the layers below
    # an iterable (a generator) is not a pytree: only in-memory data may be traced
    traced = (inputs.traced or is_traced(key) or (batch_size is not None and is_traced(data))
              or host.under_a_trace())
    if batch_size is not None and (traced or adjoint is not None):
        return _solve_in_memory(problem, algorithm, opts, data, batch_size, key, epochs,
                                adjoint, traced)
    if traced:
        raise ValueError(
            "solve: an iterable of batches is fed by the host, so it cannot run inside "
            "jax.jit / jax.vmap / jax.grad; pass in-memory arrays with `batch_size` (the "
            "batches are then taken inside the compiled loop), or call solve outside.")
    if adjoint is not None:
        raise ValueError(
            "solve: `adjoint` applies to in-memory `data` with `batch_size` (consumed inside "
            "the compiled loop); an iterable of batches is fed by the host and is not "
            f"differentiated. Got adjoint={adjoint!r}.")
    recompilation.note(*inputs.first(2), (opts.callback, opts.metrics, opts.evaluate))
    total = _data_steps(data, batch_size, epochs, opts.maxiters)
    opts = replace(opts, data=DataSpec(data, batch_size, key, epochs))
    start = time.perf_counter()
    with progress_bar(opts.progress, total), host.HostCalls() as calls, inputs.reused():
        # the same path as every call; the default adjoint runs the backend as it is here
        solution = ImplicitAdjoint().apply(backend_for(algorithm), problem, algorithm, opts)
        if opts.progress:
            host.advance_progress(int(solution.stats.iterations), solution.objective)
    return _eager(solution, time.perf_counter() - start, calls.interrupted)


def _no_derivative(value: Any) -> Any:
    """``value`` unchanged, refusing to be differentiated (see :func:`_solve_in_memory`)."""
    return value


_no_derivative = jax.custom_jvp(_no_derivative)


@_no_derivative.defjvp
def _refuse(primals, tangents):
    raise ValueError(
        "solve: a run on `data` is differentiated through its steps: pass "
        "adjoint=optsolve.UnrolledAdjoint() (the implicit derivative assumes a minimiser of "
        "one f, which stochastic training does not reach).")


def _guarded(tree: Any) -> Any:
    """``tree`` with each inexact leaf behind :func:`_no_derivative`."""
    return jax.tree_util.tree_map(
        lambda v: _no_derivative(v) if isinstance(v, jax.Array) and
        jnp.issubdtype(v.dtype, jnp.inexact) else v, tree)


def _solve_in_memory(problem, algorithm, opts, data, batch_size, key, epochs, adjoint,
                     traced: bool) -> Solution:
    """Training on in-memory arrays inside one compiled loop (under jax.jit, jax.vmap, or
    jax.grad with UnrolledAdjoint): see :mod:`optsolve.backends.native.in_memory`."""
    if adjoint is not None:
        _check_adjoint(adjoint)  # an adjoint object, or its error
    if isinstance(adjoint, ImplicitAdjoint):
        raise ValueError(
            "solve: ImplicitAdjoint does not apply to training on `data`: stochastic steps do "
            "not reach a minimiser of one f. Differentiate the steps themselves with "
            "adjoint=optsolve.UnrolledAdjoint().")
    if opts.checkpoint is not None or opts.progress:
        option = "checkpoint" if opts.checkpoint is not None else "progress"
        raise ValueError(
            f"solve: `{option}` works between the compiled chunks of an eager run; a run on "
            "`data` inside jax.jit / jax.vmap / jax.grad or with an `adjoint` has none.")
    if opts.keep == "best":
        raise ValueError("solve: keep='best' on `data` runs eagerly only; call solve outside "
                         "jax.jit / jax.vmap / jax.grad, without `adjoint`.")
    size = jax.tree_util.tree_leaves(data)[0].shape[0]
    per_epoch = size // batch_size
    epochs = 1 if epochs is None else epochs
    steps = epochs * per_epoch
    maxiters = opts.maxiters
    if maxiters is not None and not is_traced(maxiters):
        steps = min(steps, int(maxiters))
    # a resumed run may start inside an epoch: its steps then span one epoch more
    span = epochs + (opts.resume is not None)
    in_memory = InMemoryData(data, key, batch_size, steps, span, _sample_sharding(data))
    opts = replace(opts, data=None, in_memory=in_memory,
                   maxiters=steps if maxiters is None or not is_traced(maxiters) else maxiters,
                   history=steps if opts.history else 0)
    if adjoint is None:  # not differentiated: refused where a derivative is asked for
        problem, algorithm, opts = _guarded((problem, algorithm, opts))
        adjoint = _Plain()
    start = time.perf_counter()
    solution = adjoint.apply(backend_for(algorithm), problem, algorithm, opts)
    if traced:
        return solution
    return _eager(solution, time.perf_counter() - start)


def _sample_sharding(data: Any) -> Any:
    """The ``NamedSharding`` that splits every array of ``data`` over its sample axis (the
    batches keep it: data-parallel steps), or None (one device, traced arrays, or arrays
    sharded otherwise)."""
    shardings = {getattr(leaf, "sharding", None) for leaf in jax.tree_util.tree_leaves(data)}
    if len(shardings) != 1:
        return None
    sharding = shardings.pop()
    if not isinstance(sharding, jax.sharding.NamedSharding) or not sharding.spec or \
            sharding.spec[0] is None or any(axis is not None for axis in sharding.spec[1:]):
        return None
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(
        sharding.spec[0]))


class _Plain:
    """The adjoint of a run that is not differentiated: the backend as it is."""

    @staticmethod
    def apply(run, problem, algorithm, options) -> Solution:
        return run(problem, algorithm, options)


def _in_memory_arrays(data: Any) -> bool:
    """Whether ``data`` is a tuple or dict of arrays (``(X, y)``): in-memory data given
    without ``batch_size``, not batches (a list of batches is an iterable's usual form)."""
    if isinstance(data, dict):
        return True
    return isinstance(data, tuple) and not hasattr(data, "_fields") and len(data) > 0 and all(
        hasattr(a, "shape") and hasattr(a, "dtype") for a in data)


def _data_steps(data, batch_size, epochs, maxiters) -> int | None:
    """The steps a run on data takes, where known (the progress bar's total)."""
    epochs = 1 if epochs is None else epochs
    if batch_size is not None:
        steps = jax.tree_util.tree_leaves(data)[0].shape[0] // batch_size * epochs
    elif hasattr(data, "__len__"):
        steps = len(data) * epochs
    else:
        steps = None
    if maxiters is not None:
        steps = int(maxiters) if steps is None else min(steps, int(maxiters))
    return steps


def _eager(solution: Solution, elapsed: float, interrupted: bool = False) -> Solution:
    """An eager result in one set of types on every backend: a ReturnCode, Python ints.
    ``interrupted``: a Ctrl-C stopped the run from inside a host call."""
    def count(value):
        return None if value is None else int(value)
    stats = solution.stats
    scalars = (solution.retcode, solution.reason, stats.iterations, stats.f_evals,
               stats.grad_evals)
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
        solution, retcode=retcode, reason=reason,
        stats=replace(stats, iterations=count(iterations), f_evals=count(f_evals),
                      grad_evals=count(grad_evals), time=elapsed, skipped=skipped))


def _with_problem(solution: Solution, problem: OptimizationProblem) -> Solution:
    """The solution holding the problem it solves (not a pytree field: it goes no further
    than this Solution object), which :func:`~optsolve.covariance` reads."""
    object.__setattr__(solution, "problem", problem)
    return solution


def _checkpoint(finish: Callable[[Solution], Solution], algorithm, path, every,
                keep) -> Checkpoint:
    """The checkpoint hook of ``solve``'s ``checkpoint`` and ``checkpoint_every``;
    ``finish`` gives a Solution in the user's terms."""
    if path is None or every is None:
        raise ValueError("solve: `checkpoint` (a file) and `checkpoint_every` (iterations) "
                         "go together; give both.")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"solve: `checkpoint` must be a file path, got {path!r}.")
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"solve: `checkpoint_every` must be an integer >= 1, got {every!r}.")
    if not type(algorithm).compiled_driver:
        able = ", ".join(c.__name__ for c in algorithm_classes() if c.compiled_driver)
        raise ValueError(
            f"solve: {type(algorithm).__name__} cannot write checkpoints: its state lives "
            f"inside scipy, so a resumed run would not continue exactly. Algorithms that can: "
            f"{able}.")
    if keep == "best":
        raise ValueError("solve: `checkpoint` saves the run's current iterate, which "
                         "keep='best' does not return; use one or the other.")
    started = time.perf_counter()

    def to_user(solution: Solution) -> Solution:
        solution = replace(solution, retcode=ReturnCode.INTERRUPTED, reason=None,
                           history=None)
        return finish(_eager(solution, time.perf_counter() - started))

    return Checkpoint(path, int(every), to_user)


def _check_adjoint(adjoint: Any) -> Any:
    adjoint = ImplicitAdjoint() if adjoint is None else adjoint
    if not hasattr(adjoint, "apply"):
        raise TypeError(
            f"solve: `adjoint` must be an adjoint such as optsolve.ImplicitAdjoint(), got "
            f"{adjoint!r}."
        )
    return adjoint


def _project_start(problem: OptimizationProblem) -> OptimizationProblem:
    """x0 projected onto the box (L-BFGS-B's convention), with a warning when it moved."""
    if not problem.has_bounds:
        return problem
    lower, upper = problem.bounds
    leaves = jax.tree_util.tree_leaves((problem.x0, lower, upper))
    if not is_traced(leaves):
        outside = any(bool(np.any((np.asarray(x) < np.asarray(lo)) | (np.asarray(x) > np.asarray(up))))
                      for x, lo, up in zip(*(jax.tree_util.tree_leaves(t)
                                             for t in (problem.x0, lower, upper))))
        if not outside:
            return problem
        warnings.warn("solve: x0 lies outside the bounds; it was projected onto them (as "
                      "scipy's L-BFGS-B does) and the run starts there.", UserWarning,
                      stacklevel=3)
    x0 = jax.tree_util.tree_map(lambda x, lo, up: jnp.clip(x, lo, up), problem.x0, lower, upper)
    return problem.replace(x0=x0)


_multipliers = jax.jit(multipliers)  # one compiled program per problem, not op-by-op eagerly


def _with_multipliers(problem: OptimizationProblem, solution: Solution) -> Solution:
    """The solution with the constraints' multipliers at its x, one array per constraint,
    where the problem has general constraints: the backend's own (flat, in
    ``solution.multipliers``, NaN where it gave none) where it computed them, else the
    least-squares KKT multipliers; under differentiation the least-squares ones' derivative
    (the backend's carry none)."""
    if not problem.constraints:
        return solution
    own = solution.multipliers
    traced = is_traced(problem, solution.x)
    if own is not None and not traced and bool(jnp.all(jnp.isfinite(own))):
        return replace(solution, multipliers=per_constraint(problem, problem.x0, own))
    if np.ndim(solution.retcode) != 0:  # a batch solved eagerly under vmap
        lam = jax.vmap(_multipliers, in_axes=(None, 0))(problem, solution.x)
    else:
        lam = _multipliers(problem, solution.x)
    if own is None:
        return replace(solution, multipliers=lam)
    batch = jnp.shape(own)[:-1]
    least_squares = jnp.concatenate([jnp.reshape(l, batch + (-1,)) for l in lam], axis=-1)
    flat = jnp.where(jnp.isnan(own), least_squares,
                     own + least_squares - lax.stop_gradient(least_squares))
    return replace(solution, multipliers=per_constraint(problem, problem.x0, flat))


def _no_iterations(problem: OptimizationProblem, opts) -> Solution:
    """The answer to ``maxiters=0``, without calling a backend: the start, unchanged."""
    resume = opts.resume
    x = problem.x0 if resume is None else resume.x
    if opts.history:
        f, g = jax.value_and_grad(problem.f)(x, problem.p)
        norm = stationarity(x, g, problem.bounds)
        def one(fn):  # one entry, ints as floats (as every record stores them)
            return None if fn is None else jax.tree_util.tree_map(
                lambda v: jnp.reshape(v, (1,) + jnp.shape(v)).astype(
                    jnp.result_type(v) if jnp.issubdtype(jnp.result_type(v), jnp.inexact)
                    else f.dtype), fn(x, problem.p))
        history = History(jnp.reshape(f, (1,)), jnp.reshape(norm, (1,)).astype(f.dtype),
                          one(opts.metrics), one(opts.evaluate))
    else:
        f, history = problem.f(x, problem.p), None
    base = resume.stats if resume is not None else Stats(0, 0, 0)
    zero = lambda v: 0 if v is None else v
    return Solution(x=x, objective=f, retcode=ReturnCode.MAXITERS,
                    stats=Stats(iterations=zero(base.iterations), f_evals=zero(base.f_evals) + 1,
                                grad_evals=zero(base.grad_evals) + (1 if opts.history else 0)),
                    state=None if resume is None else resume.state, history=history)


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int | None):
    """A tqdm bar that the compiled loop updates through ``host.report_progress``."""
    if not enabled:
        yield None
        return
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


def solve(problem: OptimizationProblem, algorithm: Any, *, maxiters: int | None = None,
          maxtime: float | None = None, gtol: float | None = None, ftol: float | None = None,
          callback: Callable[..., Any] | None = None, adjoint: Any = None,
          resume: Solution | None = None, history: bool = False, progress: bool = False,
          data: Any = None, batch_size: int | None = None, key: Any = None,
          epochs: int | None = None, metrics: Callable[..., Any] | None = None,
          evaluate: Callable[..., Any] | None = None, eval_every: int = 1,
          keep: str = "last", checkpoint: str | os.PathLike | None = None,
          checkpoint_every: int | None = None, nonfinite: str | None = None,
          max_consecutive_skips: int = 10, **options: Any) -> Solution:
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
        ``batch_size``, a pytree of in-memory arrays sharing a leading dimension (up to 8
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
    if not isinstance(problem, OptimizationProblem):
        raise TypeError(
            f"solve: `problem` must be an optsolve.OptimizationProblem, got {type(problem).__name__}."
        )
    check_key(key)
    if resume is not None and not isinstance(resume, Solution):
        resume_point(problem, resume)  # its error
    # the problem as the backends solve it, and each stage's inverse on the way back
    model = ModelSplit()
    stages = [ScipyForms(), Maximisation(history, on_data=data is not None), SavedResume(),
              model]
    call = enter_stages(stages, Call(problem, resume, as_callback(callback), metrics,
                                     evaluate))
    problem, resume = call.problem, call.resume
    callback, metrics, evaluate = call.callback, call.metrics, call.evaluate

    def finish(solution: Solution) -> Solution:
        """The solution in the terms of the user's problem, holding the problem it
        solves (which :func:`~optsolve.covariance` reads)."""
        return _with_problem(leave_stages(stages, solution), problem)

    if data is not None and keep == "best" and evaluate is None:
        raise ValueError(
            "solve: keep='best' on `data` needs `evaluate` (a score on held-out data): each "
            "step's loss is on another batch, so losses do not rank iterates.")
    algorithm = as_algorithm(algorithm)
    if checkpoint is not None or checkpoint_every is not None:
        checkpoint = _checkpoint(finish, algorithm, checkpoint, checkpoint_every, keep)
    opts = make_options(algorithm, maxiters=maxiters, maxtime=maxtime, gtol=gtol, ftol=ftol,
                        callback=callback, resume=resume_point(problem, resume),
                        history=history, progress=progress, metrics=metrics,
                        evaluate=evaluate, eval_every=eval_every, keep=keep,
                        checkpoint=checkpoint, **options)
    opts = replace(opts, **_nonfinite_policy(algorithm, nonfinite, max_consecutive_skips,
                                             on_data=data is not None))
    if data is not None:
        return finish(_solve_on_data(problem, algorithm, opts, data, batch_size, key,
                                     epochs, adjoint))
    for name, value in (("batch_size", batch_size), ("key", key), ("epochs", epochs)):
        if value is not None:
            raise ValueError(f"solve: `{name}` is only meaningful together with `data`.")
    return finish(_solve_full_batch(problem, algorithm, opts, adjoint,
                                    trains_model=model.split is not None))


def _nonfinite_policy(algorithm, nonfinite, max_consecutive_skips, on_data: bool) -> dict:
    """``solve``'s ``nonfinite`` and ``max_consecutive_skips``, checked, as options."""
    if nonfinite not in (None, "fail", "skip", "reject"):
        raise ValueError("solve: `nonfinite` must be None (the method's default), 'reject' "
                         "(scipy's derivative-free and global methods), 'fail' or 'skip' (on "
                         f"data), got {nonfinite!r}.")
    if nonfinite is None:  # the method's documented default (capabilities.py checks 'reject')
        nonfinite = "reject" if algorithm.capabilities().get("rejects_nonfinite") else "fail"
    if isinstance(max_consecutive_skips, bool) or not isinstance(
            max_consecutive_skips, (int, np.integer)) or max_consecutive_skips < 0:
        raise ValueError("solve: `max_consecutive_skips` must be an integer >= 0, got "
                         f"{max_consecutive_skips!r}.")
    if nonfinite == "skip" and not on_data:
        raise ValueError(
            "solve: nonfinite='skip' skips the update of a batch with a non-finite loss; it "
            "needs `data` (full batch, the same point would fail again).")
    return dict(nonfinite=nonfinite, max_consecutive_skips=int(max_consecutive_skips))


def _solve_full_batch(problem, algorithm, opts, adjoint, trains_model: bool) -> Solution:
    """One deterministic objective: checked, then run by the algorithm's backend through
    the adjoint, in the caller's trace or eagerly (progress, Ctrl-C, timing)."""
    maxiters, progress, checkpoint = opts.maxiters, opts.progress, opts.checkpoint
    # a class trait (no configuration changes it): read once, not via capabilities()
    compiled_driver = type(algorithm).compiled_driver
    if opts.history == -1 and compiled_driver:
        raise ValueError(
            "solve: `history=True` needs `maxiters` as a Python int (the record's length), "
            f"got maxiters={maxiters!r}."
        )
    adjoint = _check_adjoint(adjoint)
    check_capabilities(problem, algorithm, opts, adjoint=adjoint)
    if checkpoint is not None and is_traced(problem, algorithm, opts):
        raise ValueError("solve: `checkpoint` writes files between compiled chunks of an "
                         "eager run; call solve outside jax.jit / jax.vmap / jax.grad.")
    check_objective(problem)
    if trains_model and not algorithm.capabilities()["threads_model_state"] and \
            trainable.mutates(problem):
        raise trainable.state_mutation_error(type(algorithm).__name__)
    problem = _project_start(problem)
    backend = backend_for(algorithm)
    inputs = FlatInputs(problem, algorithm, opts)  # flattened once for the layers below
    traced = inputs.traced or host.under_a_trace()
    if (opts.maxiters is not None and not is_traced(opts.maxiters) and int(opts.maxiters) == 0
            and not compiled_driver):
        start = _no_iterations(algorithm.minimised_problem(problem), opts)
        solution = _with_multipliers(problem, start)
        return solution if traced else _eager(solution, 0.0)
    if traced:
        return _with_multipliers(problem, adjoint.apply(backend, problem, algorithm, opts))
    # the problem and the algorithm: the options' functions are the hooks
    recompilation.note(*inputs.first(2), (opts.callback, opts.metrics, opts.evaluate))
    start = time.perf_counter()
    with progress_bar(progress, maxiters), host.HostCalls() as calls, inputs.reused():
        solution = _with_multipliers(problem, adjoint.apply(backend, problem, algorithm, opts))
        # the results of one computation are ready together: a wait on a few leaves, not
        # a flatten of the whole Solution (a model's x and optimizer state)
        jax.block_until_ready((solution.objective, solution.retcode, solution.multipliers))
        if progress and np.ndim(solution.retcode) == 0:
            host.advance_progress(int(solution.stats.iterations), solution.objective)
    elapsed = time.perf_counter() - start
    if np.ndim(solution.retcode) != 0:  # a batch (a vmapped problem solved eagerly)
        return replace(solution, stats=replace(solution.stats, time=elapsed))
    return _eager(solution, elapsed, calls.interrupted)
