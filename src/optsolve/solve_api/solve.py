"""``solve``: validate, dispatch on the algorithm's type, return one Solution."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from optsolve.solve_api.capabilities import check_capabilities, check_objective
from optsolve.solve_api.options import make_options
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import replace
from optsolve.solve_api.registry import as_algorithm, backend_for
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution


def _is_traced(*trees: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


def solve(problem: OptimizationProblem, algorithm: Any, *, maxiters: int | None = None,
          maxtime: float | None = None, gtol: float | None = None, ftol: float | None = None,
          callback: Callable[..., Any] | None = None, **options: Any) -> Solution:
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
                        callback=callback, **options)
    check_capabilities(problem, algorithm, opts)
    check_objective(problem)
    backend = backend_for(algorithm)
    if _is_traced(problem, algorithm, opts):
        return backend(problem, algorithm, opts)
    start = time.perf_counter()
    solution = jax.block_until_ready(backend(problem, algorithm, opts))
    elapsed = time.perf_counter() - start
    retcode = solution.retcode
    if not isinstance(retcode, ReturnCode) and jax.numpy.ndim(retcode) == 0:
        retcode = ReturnCode(int(retcode))
    return replace(solution, retcode=retcode, stats=replace(solution.stats, time=elapsed))
