"""``solve``: validate, dispatch on the algorithm's type, return one Solution."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import jax

from optsolve.solve_api.adjoint import ImplicitAdjoint
from optsolve.solve_api import host
from optsolve.solve_api.capabilities import check_capabilities, check_objective, resume_point
from optsolve.solve_api.options import make_options
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, replace
from optsolve.solve_api.registry import algorithm_classes, as_algorithm, backend_for
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution


def _solve_on_data(problem, algorithm, opts, data, batch_size, key, epochs) -> Solution:
    from optsolve.backends.stochastic import DataSpec
    name = type(algorithm).__name__
    if not algorithm.takes_data:
        raise ValueError(
            f"solve: {name} does not train on `data`. Algorithms that do: "
            f"{', '.join(c.__name__ for c in algorithm_classes() if c.takes_data)}."
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
    check_capabilities(problem, algorithm, opts, stops_with_data=True)
    if is_traced(problem, algorithm):
        raise ValueError(
            "solve: training on `data` runs a host loop over batches; call solve outside "
            "jax.jit / jax.vmap (the steps inside are compiled)."
        )
    opts = replace(opts, data=DataSpec(data, batch_size, key, epochs))
    start = time.perf_counter()
    with progress_bar(opts.progress, opts.maxiters):
        solution = backend_for(algorithm)(problem, algorithm, opts)
    elapsed = time.perf_counter() - start
    return replace(solution, retcode=ReturnCode(int(solution.retcode)),
                   stats=replace(solution.stats, time=elapsed))


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
          epochs: int | None = None, **options: Any) -> Solution:
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
        N + M steps. ``maxiters`` counts the new steps; stats count both runs.
      history: record the objective and gradient norm at every iterate in
        ``sol.history`` (inside the compiled loop; needs ``maxiters``).
      progress: show a tqdm progress bar with the loss and gradient norm (needs the
        ``progress`` extra; updated from inside the compiled loop about 100 times a run).
      data: train on data: the objective is then ``f(x, p, batch)``. Either an iterable of
        batches (any pytrees of numpy or JAX arrays: a list, a generator, a data loader;
        up to 16 batches of one shape run per compiled call), or, with ``batch_size``, a
        pytree of in-memory arrays sharing a leading dimension (up to 8 epochs per compiled
        call, each a permutation of the data cut into batches). The run stops
        at ``maxiters`` steps, after ``epochs`` passes (default 1), or when the iterable is
        exhausted (MAXITERS: the budget is used up). ``sol.objective`` is then the loss of
        the last step's batch. A KeyboardInterrupt returns the last completed step with
        ``ReturnCode.INTERRUPTED``.
      batch_size: the batch size of in-memory ``data`` (a remainder is dropped each epoch).
      key: a ``jax.random`` key to shuffle in-memory data at every epoch (no shuffling if None).
      epochs: passes over ``data`` (re-iterable data or in-memory arrays).
      adjoint: how the solution is differentiated with respect to ``problem.p``
        (default :class:`ImplicitAdjoint`). Gradients with respect to ``x0`` are zero.
      **options: ``callback_every`` and algorithm-specific options; unknown ones are errors.

    Returns:
      A :class:`Solution`; ``retcode`` says why the run stopped. Numerical trouble gives
      ``ReturnCode.FAILURE`` with the last finite iterate, never an exception.

    Example:
      >>> import jax.numpy as jnp, optsolve
      >>> prob = optsolve.OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(2), 1.0)
      >>> sol = optsolve.solve(prob, optsolve.Adam(0.1), maxiters=500)
    """
    if not isinstance(problem, OptimizationProblem):
        raise TypeError(
            f"solve: `problem` must be an optsolve.OptimizationProblem, got {type(problem).__name__}."
        )
    algorithm = as_algorithm(algorithm)
    opts = make_options(algorithm, maxiters=maxiters, maxtime=maxtime, gtol=gtol, ftol=ftol,
                        callback=callback, resume=resume_point(problem, resume),
                        history=history, progress=progress, **options)
    if data is not None:
        return _solve_on_data(problem, algorithm, opts, data, batch_size, key, epochs)
    for name, value in (("batch_size", batch_size), ("key", key), ("epochs", epochs)):
        if value is not None:
            raise ValueError(f"solve: `{name}` is only meaningful together with `data`.")
    if opts.history == -1:
        raise ValueError(
            "solve: `history=True` needs `maxiters` as a Python int (the record's length), "
            f"got maxiters={maxiters!r}."
        )
    check_capabilities(problem, algorithm, opts)
    check_objective(problem)
    backend = backend_for(algorithm)
    adjoint = ImplicitAdjoint() if adjoint is None else adjoint
    if not hasattr(adjoint, "apply"):
        raise TypeError(
            f"solve: `adjoint` must be an adjoint such as optsolve.ImplicitAdjoint(), got "
            f"{adjoint!r}."
        )
    if is_traced(problem, algorithm, opts):
        return adjoint.apply(backend, problem, algorithm, opts)
    start = time.perf_counter()
    with progress_bar(progress, maxiters):
        solution = jax.block_until_ready(adjoint.apply(backend, problem, algorithm, opts))
    elapsed = time.perf_counter() - start
    retcode = solution.retcode
    if not isinstance(retcode, ReturnCode) and jax.numpy.ndim(retcode) == 0:
        retcode = ReturnCode(int(retcode))
    return replace(solution, retcode=retcode, stats=replace(solution.stats, time=elapsed))
