"""Dense-matrix methods on large problems: refused before scipy allocates what cannot fit."""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp

from optsolve.solve_api.problem import OptimizationProblem

# Methods that hold n x n float64 matrices (BFGS's and SLSQP's quasi-Newton matrices, the
# dense Hessian optsolve builds for dogleg and trust-exact), and how many at once, roughly.
_DENSE_MATRICES = {"bfgs": 5, "slsqp": 3, "dogleg": 3, "trust-exact": 3}


def physical_memory() -> int | None:
    """This machine's memory in bytes, where the OS says (None elsewhere)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_dense_memory(problem: OptimizationProblem, algorithm: Any) -> None:
    """Refuse, before scipy allocates them, dense matrices that cannot fit in memory."""
    matrices = _DENSE_MATRICES.get(algorithm.spec.key)
    memory = physical_memory()
    if matrices is None or memory is None:
        return
    n = sum(math.prod(jnp.shape(leaf)) for leaf in jax.tree_util.tree_leaves(problem.x0))
    needed = matrices * 8 * n * n
    if needed > memory:
        raise MemoryError(
            f"solve: {type(algorithm).__name__} keeps dense {n} x {n} float64 matrices: about "
            f"{needed / 2**30:.0f} GiB for n = {n}, more than this machine's "
            f"{memory / 2**30:.0f} GiB. Use a limited-memory method, optsolve.LBFGS() or "
            "ScipyMinimize('L-BFGS-B'), or one on Hessian products, ScipyMinimize('Newton-CG') "
            "or ScipyMinimize('trust-krylov')."
        )
