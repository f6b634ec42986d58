"""Checks of a problem and its options against an algorithm's capability traits.

One place for every "this algorithm cannot do that" error, run before dispatch, each
naming the algorithms that can.
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api.adjoint import UnrolledAdjoint
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.least_squares import LeastSquaresProblem, check_residual, residual_size
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, tree_spec
from optsolve.solve_api.registry import algorithm_classes
from optsolve.solve_api.root_problem import RootProblem, RootSystem, root_form, root_solver_names


def names_with(trait: str) -> str:
    """The registered algorithm classes with ``trait``, each with its condition if any."""

    def name(cls) -> str:
        condition = cls.conditional_traits.get(trait)
        return cls.__name__ if condition is None else f"{cls.__name__} ({condition})"

    names = [name(c) for c in algorithm_classes() if getattr(c, trait)]
    return ", ".join(names) if names else "(none installed)"


def check_capabilities(
    problem: OptimizationProblem,
    algorithm: Algorithm,
    options: SolveOptions,
    *,
    stops_with_data: bool = False,
    adjoint: Any = None,
) -> None:
    """Raise a clear error when ``algorithm`` cannot honour the problem, the options or the
    adjoint, naming the algorithms that can (the one place these traits are checked).

    ``stops_with_data``: a run on data, which ends with its epochs or batches.
    """
    name = type(algorithm).__name__
    caps = algorithm.capabilities()
    if caps["roots_only"] and not isinstance(problem, RootSystem):
        minimisers = ", ".join(
            c.__name__
            for c in algorithm_classes()
            if c.family == "classical" and root_form(c) is None
        )
        raise TypeError(
            f"solve: {name} solves root problems only (F(x, p) = 0); declare the problem as "
            "optsolve.RootProblem(F, x0, p), with F(x, p) -> array shaped like x. To "
            f"minimise an objective use another algorithm, e.g. {minimisers}."
        )
    if caps["needs_residuals"] and not isinstance(problem, LeastSquaresProblem):
        scalar = ", ".join(
            c.__name__
            for c in algorithm_classes()
            if not c.needs_residuals and c.family == "classical"
        )
        raise TypeError(
            f"solve: {name} works on residuals; declare the problem as "
            "optsolve.LeastSquaresProblem(residual, x0, p), with residual(x, p) -> array. "
            f"For a scalar objective use another algorithm, e.g. {scalar}."
        )
    if caps.get("scalar_only", False):
        check_scalar_problem(problem, name, caps.get("needs_bounds", False))
    if problem.has_bounds and not caps["takes_bounds"]:
        raise ValueError(
            f"solve: {name} does not support bounds. Either remove `bounds` from the problem or "
            f"use an algorithm that takes them: {names_with('takes_bounds')}."
        )
    if problem.constraints and not caps["takes_constraints"]:
        raise ValueError(
            f"solve: {name} does not support constraints. Either remove `constraints` from the "
            f"problem or use an algorithm that takes them: {names_with('takes_constraints')}."
        )
    if options.nonfinite == "reject" and not caps.get("rejects_nonfinite", False):
        can = ", ".join(
            c.__name__ for c in algorithm_classes() if c.traits().get("rejects_nonfinite")
        )
        raise ValueError(
            f"solve: nonfinite='reject' passes over points where f is not finite, which "
            f"{name} cannot (it needs finite values and gradients). Use nonfinite='fail', or "
            f"a method that can: {can}."
        )
    if options.resume is not None and not caps["resumable"]:
        raise ValueError(
            f"solve: {name} cannot resume from a Solution. Algorithms that can: "
            f"{names_with('resumable')}."
        )
    if options.history and not caps["records_history"]:
        raise ValueError(
            f"solve: {name} does not record a history. Algorithms that do: "
            f"{names_with('records_history')}."
        )
    tracked = [
        o
        for o, on in (
            ("evaluate", options.evaluate is not None),
            ("keep='best'", options.keep == "best"),
        )
        if on
    ]
    if tracked and not caps["records_history"]:
        raise ValueError(
            f"solve: {name} does not follow its iterates, which {' and '.join(tracked)} "
            f"need. Algorithms that do: {names_with('records_history')}."
        )
    if isinstance(adjoint, UnrolledAdjoint) and not caps["unrollable"]:
        raise ValueError(
            f"UnrolledAdjoint: {name} cannot be differentiated by unrolling its iterations. "
            "Use the default ImplicitAdjoint, or an algorithm that can be unrolled: "
            f"{names_with('unrollable')}."
        )
    if (
        not caps["stops_by_itself"]
        and not stops_with_data
        and all(getattr(options, o) is None for o in ("maxiters", "maxtime", "gtol", "ftol"))
    ):
        raise ValueError(
            f"solve: {name} has no convergence test of its own, so `maxiters` is required "
            "(or a stopping tolerance: gtol, ftol, maxtime); e.g. solve(prob, alg, maxiters=1000)."
        )
    check_dense_memory(problem, algorithm, caps, adjoint)
    check_float_dtypes(problem, algorithm, caps)


def check_solves_roots(algorithm: Algorithm) -> str:
    """The algorithm's ``solves_roots`` trait (how it solves a RootProblem); a TypeError
    naming the classes that solve them where it solves none."""
    form = root_form(algorithm)
    if form is None:
        raise TypeError(
            f"solve: {type(algorithm).__name__} does not solve root problems. Algorithms "
            f"that do: {root_solver_names()}. (To minimise |F|^2 with it instead, declare "
            "optsolve.LeastSquaresProblem(F, x0, p).)"
        )
    return form


def check_scalar_problem(problem: OptimizationProblem, name: str, needs_bounds: bool) -> None:
    """Raise a clear error unless ``problem`` suits a method over one scalar (trait
    ``scalar_only``): x0 one 0-d array and, where the method searches the box
    (``needs_bounds``), finite bounds on it."""
    leaves = jax.tree_util.tree_leaves(problem.x0)
    if len(leaves) != 1 or jnp.ndim(leaves[0]) != 0:
        given = (
            f"an array of shape {jnp.shape(leaves[0])}"
            if len(leaves) == 1
            else f"a pytree of {len(leaves)} arrays"
        )
        vector = ", ".join(
            c.__name__
            for c in algorithm_classes()
            if c.family == "classical"
            and not c.traits().get("scalar_only")
            and not c.needs_residuals
        )
        raise ValueError(
            f"solve: {name} minimises over one scalar, so `x0` must be a 0-d float array "
            f"(e.g. jnp.array(0.5)); got {given}. For a vector x use e.g. {vector}."
        )
    if not needs_bounds:
        return
    example = "OptimizationProblem(f, jnp.array(1.0), p, bounds=(0.0, 2.0))"
    if problem.bounds is None:
        raise ValueError(
            f"solve: {name} searches the interval given by `bounds`, so it needs finite "
            f"bounds=(lower, upper) on x; got bounds=None. E.g. {example}."
        )
    ends = [jax.tree_util.tree_leaves(b)[0] for b in problem.bounds]
    if not is_traced(ends) and not all(bool(np.all(np.isfinite(np.asarray(e)))) for e in ends):
        raise ValueError(
            f"solve: {name} searches the interval given by `bounds`, so both ends must be "
            f"finite; got bounds=({float(ends[0])}, {float(ends[1])}). E.g. {example}."
        )


_FLOAT_DTYPES = {"bfloat16", "float16", "float32", "float64"}


def check_float_dtypes(
    problem: OptimizationProblem, algorithm: Algorithm, caps: dict[str, Any]
) -> None:
    """Raise a TypeError, before the run, when x0 holds a floating-point dtype that the
    algorithm cannot compute in (its ``float_dtypes`` trait), naming classes that can."""
    taken = caps["float_dtypes"]
    if set(taken) >= _FLOAT_DTYPES:  # takes every one: x0 (a model, say) is not flattened
        return
    # arrays only: a model's x0 may hold functions (equinox activations) and Python numbers
    dtypes = {
        leaf.dtype
        for leaf in jax.tree_util.tree_leaves(problem.x0)
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)
    }
    refused = sorted({jnp.dtype(d).name for d in dtypes} - set(taken))
    if not refused:
        return
    able = [
        c.__name__
        for c in algorithm_classes()
        if refused[0] in c.float_dtypes and c.family == "classical" and not c.needs_hessian
    ][:4]
    raise TypeError(
        f"solve: {type(algorithm).__name__} cannot compute in {refused[0]} (x0's dtype); it "
        f"takes {', '.join(taken)}. Cast x0 (e.g. x0.astype(jnp.float32)), or use an "
        f"algorithm that takes {refused[0]}, e.g. {', '.join(able)} or an optax optimizer."
    )


def available_memory(on_device: bool) -> int | None:
    """The bytes a run may allocate: JAX's default device's limit for a compiled run (an
    accelerator's memory), else this machine's memory; None where neither is known."""
    if on_device:
        try:
            stats = jax.local_devices()[0].memory_stats()
        except Exception:  # noqa: BLE001  (a backend without memory statistics; the CPU's: None)
            stats = None
        if stats and stats.get("bytes_limit"):
            return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_dense_memory(
    problem: OptimizationProblem, algorithm: Algorithm, caps: dict[str, Any], adjoint: Any = None
) -> None:
    """Raise a MemoryError, before anything is allocated, when the dense matrices of the
    algorithm (its ``dense_matrices`` trait) or of a dense implicit adjoint under
    differentiation cannot fit in memory, naming the matrix-free choices."""
    matrices = caps.get("dense_matrices", 0)
    # the dense adjoint builds the Hessian (and its factorisation) only when differentiated
    adjoint_matrices = (
        3 if getattr(adjoint, "linear_solver", None) == "dense" and is_traced(problem.p) else 0
    )
    if not matrices and not adjoint_matrices:
        return
    leaves = jax.tree_util.tree_leaves(problem.x0)
    n = sum(math.prod(jnp.shape(leaf)) for leaf in leaves)
    on_device = caps["compiled_driver"]
    itemsize = (
        max(jnp.dtype(jnp.result_type(leaf)).itemsize for leaf in leaves) if on_device else 8
    )  # scipy works in float64
    memory = available_memory(on_device)
    if memory is None:
        return
    rows = (
        max(n, residual_size(problem))
        if caps["needs_residuals"] and isinstance(problem, LeastSquaresProblem)
        else n
    )
    needed = matrices * itemsize * n * rows
    where = "this device's" if on_device else "this machine's"
    if needed > memory:
        if getattr(problem, "constraints", None):
            fix = (
                "optsolve.InteriorPoint(linear_solver='minres') or "
                "optsolve.AugmentedLagrangian() (both matrix-free)"
            )
        elif caps["needs_residuals"]:
            fix = "linear_solver='cg' (matrix-free), or optsolve.LBFGS()"
        else:
            fix = (
                "optsolve.LBFGS() (limited memory), or Newton() / TrustRegion() (Hessian products)"
            )
        raise MemoryError(
            f"solve: {type(algorithm).__name__} keeps {matrices} dense {rows} x {n} matrices: "
            f"about {needed / 2**30:,.0f} GiB for n = {n}, more than {where} "
            f"{memory / 2**30:,.0f} GiB. Use {fix}."
        )
    needed = adjoint_matrices * itemsize * n * n
    if adjoint_matrices and needed > memory:
        raise MemoryError(
            f"solve: ImplicitAdjoint(linear_solver='dense') builds the dense {n} x {n} Hessian "
            f"to differentiate the solution: about {needed / 2**30:,.0f} GiB, more than "
            f"{where} {memory / 2**30:,.0f} GiB. Use linear_solver='cg' (Hessian products, "
            "the default)."
        )


def resume_point(problem: OptimizationProblem | RootProblem, solution: Any) -> Any:
    """The parts of ``solution`` a run continues from, checked against ``problem``."""
    from optsolve.solve_api.solution import Solution, Stats

    if solution is None:
        return None
    if not isinstance(solution, Solution):
        raise TypeError(
            f"solve: `resume` must be a Solution returned by solve, got {type(solution).__name__}."
        )
    expected = jax.tree_util.tree_structure(problem.x0)
    given = jax.tree_util.tree_structure(solution.x)
    if expected != given:
        raise ValueError(
            f"solve: `resume` holds x with structure {given}, but the problem's x0 has "
            f"structure {expected}; resume a run of the same problem."
        )
    stats = solution.stats
    return Solution(
        x=solution.x,
        objective=solution.objective,
        retcode=None,
        state=solution.state,
        stats=Stats(
            iterations=stats.iterations,
            f_evals=stats.f_evals,
            grad_evals=stats.grad_evals,
            time=None,
        ),
    )


def check_objective(problem: OptimizationProblem, *batch: Any) -> None:
    """Raise a clear error unless ``f(x0, p[, batch])`` is a real floating-point scalar.

    ``batch`` may hold arrays or ``jax.ShapeDtypeStruct`` leaves.
    """
    # jax's Config declares its flags at run time, not as attributes
    key = (
        problem.f,
        tree_spec(problem.x0),
        tree_spec(problem.p),
        tree_spec(batch),
        jax.config.jax_enable_x64,  # type: ignore[attr-defined]
    )
    if isinstance(problem, LeastSquaresProblem):
        _CHECKED.check_once(key, lambda: check_residual(problem))
        return
    # The check traces f once; cached per (f, shapes) so repeated solves pay nothing.
    _CHECKED.check_once(
        key, lambda: _check_objective_uncached(problem.f, problem.x0, problem.p, *batch)
    )


_CHECKED = BoundedCache(1024)


def _check_objective_uncached(f, x0, p, *batch) -> None:
    out = jax.eval_shape(f, x0, p, *batch)
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise TypeError(
            "OptimizationProblem: `f(x, p)` must return a scalar array, got "
            f"{jax.tree_util.tree_structure(out)}."
        )
    if out.shape != ():
        raise ValueError(
            f"OptimizationProblem: `f(x, p)` must return a scalar, got an array of shape "
            f"{out.shape}. Reduce it, e.g. with jnp.sum or jnp.mean."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        kind = "a complex" if jnp.issubdtype(out.dtype, jnp.complexfloating) else f"a {out.dtype}"
        raise TypeError(
            f"OptimizationProblem: `f(x, p)` must return a real floating-point scalar, got "
            f"{kind} value. Minimisation needs a real objective (e.g. take jnp.abs or .real)."
        )
