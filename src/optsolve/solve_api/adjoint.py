"""How solutions are differentiated with respect to the problem's hyperparameters ``p``.

An adjoint wraps a backend's run; it knows nothing about backends, and backends know
nothing about differentiation. :class:`ImplicitAdjoint` (the default) differentiates the
optimality condition grad_x f(x*, p) = 0 by the implicit function theorem:

    H dx = -(d/dp grad_x f) dp,   H = hess_xx f(x*, p),

solved matrix-free with Hessian-vector products inside ``jax.lax.custom_linear_solve``, so
the same rule serves forward mode (``jax.jvp``, ``jax.jacfwd``) and, by transposition,
reverse mode (``jax.grad``, ``jax.vjp``, ``jax.jacrev``). See Blondel et al., "Efficient and
Modular Implicit Differentiation", NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.linear_solve import cg
from optsolve.solve_api.loops import CheckpointedScan
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, pytree_dataclass, static_field
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution
from optsolve.solve_api.stationarity import free_mask

PyTree = Any
Run = Callable[..., Solution]  # run(problem, algorithm, options[, loop=...])

_LINEAR_SOLVERS = ("cg", "gmres", "bicgstab", "dense")


def _is_array_leaf(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, int, bool))


def _zero_tangent(leaf: Any) -> Any:
    dtype = jnp.result_type(leaf)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.zeros(jnp.shape(leaf), dtype)
    return np.zeros(jnp.shape(leaf), jax.dtypes.float0)


def _has_float_leaves(tree: PyTree) -> bool:
    return any(jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
               for leaf in jax.tree_util.tree_leaves(tree))


def _warn_not_converged(code) -> None:
    code = ReturnCode(int(code))
    if code != ReturnCode.SUCCESS:
        warnings.warn(
            f"optsolve: differentiating a solution whose retcode is {code.name}; the implicit "
            "gradient assumes x is a minimiser (grad_x f = 0) and may be inaccurate. Tighten "
            "gtol or raise maxiters.", RuntimeWarning, stacklevel=2,
        )


# Not jax.scipy's cg: it spends one Hessian-vector product on H 0 (b - A(x0) from the zero
# start), which costs as much as a gradient on data-bound objectives.
def _cg(matvec: Callable[[PyTree], PyTree], b: PyTree, tol: Any,
        maxiter: int) -> tuple[PyTree, jax.Array]:
    """Conjugate gradients from v = 0 until ``|b - H v| <= tol |b|``: :func:`cg` with a
    relative tolerance and H taken as positive definite (Hestenes & Stiefel 1952; Nocedal &
    Wright, *Numerical Optimization*, 2006, Algorithm 5.2).

    Returns:
      (v, the number of products with H made).
    """
    result = cg(matvec, b, rtol=tol, maxiter=maxiter)
    return result.x, result.matvecs


@pytree_dataclass
class ImplicitAdjoint:
    """Implicit differentiation of x*(p) = argmin_x f(x, p) (the default adjoint).

    The linear system H v = b is solved matrix-free. Gradients with respect to ``x0`` and to
    the algorithm's hyperparameters are zero: at a minimiser they do not move x*. Box bounds:
    active coordinates have zero sensitivity and the system is solved on the free ones.
    General constraints are not differentiated (a clear error says so).

    Args:
      linear_solver: "cg" (default; H is symmetric), "gmres", "bicgstab" or "dense"
        (builds H from n Hessian-vector products: for small n, or indefinite H).
      tol: relative residual tolerance of the iterative solvers (default 1e-10 in float64,
        1e-5 in float32).
      maxiter: iteration limit of the iterative solvers (default: 10 n).
      ridge: adds ``ridge * I`` to H. A documented fallback for singular or nearly singular
        Hessians (flat directions of f): the solution is then the minimum-norm-like
        regularised one. 0 by default.
    """

    linear_solver: str = static_field(default="cg")
    tol: Any = None
    maxiter: int | None = static_field(default=None)
    ridge: Any = 0.0

    def __post_init__(self):
        if self.linear_solver not in _LINEAR_SOLVERS:
            raise ValueError(
                f"ImplicitAdjoint: `linear_solver` must be one of {', '.join(_LINEAR_SOLVERS)}, "
                f"got {self.linear_solver!r}."
            )

    def _solve(self, matvec: Callable[[PyTree], PyTree], b: PyTree) -> PyTree:
        dtype = jnp.result_type(*jax.tree_util.tree_leaves(b))
        tol = self.tol if self.tol is not None else (1e-10 if dtype == jnp.float64 else 1e-5)
        if self.linear_solver == "dense":
            flat_b, unravel = ravel_pytree(b)
            matrix = jax.jacfwd(lambda v: ravel_pytree(matvec(unravel(v)))[0])(flat_b)
            return unravel(jnp.linalg.solve(matrix, flat_b))
        n = sum(jnp.size(leaf) for leaf in jax.tree_util.tree_leaves(b))
        maxiter = self.maxiter if self.maxiter is not None else 10 * n
        if self.linear_solver == "cg":
            return _cg(matvec, b, tol, maxiter)[0]
        solver = {"gmres": jax.scipy.sparse.linalg.gmres,
                  "bicgstab": jax.scipy.sparse.linalg.bicgstab}[self.linear_solver]
        return solver(matvec, b, tol=tol, atol=0.0, maxiter=maxiter)[0]

    def solution_tangent(self, problem: OptimizationProblem, x: PyTree, p_dot: PyTree) -> PyTree:
        """dx = -H^{-1} (d/dp grad_x f) p_dot at the solution ``x``, on the free coordinates."""
        grad_fn = problem.grad if problem.grad is not None else jax.grad(problem.f)
        g, rhs = jax.jvp(lambda p: grad_fn(x, p), (problem.p,), (p_dot,))
        mask = free_mask(x, g, problem.bounds)
        user_hvp = problem.hvp

        if user_hvp is not None:
            def hvp(v):
                return user_hvp(x, v, problem.p)
        else:
            # Linearise the gradient once: each product then costs a tangent pass only,
            # not a recomputation of the gradient's primal pass.
            _, hvp = jax.linearize(lambda y: grad_fn(y, problem.p), x)

        ridge = self.ridge

        def matvec(v):
            if mask is None:
                hv = hvp(v)
                return jax.tree_util.tree_map(lambda a, b: a + ridge * b, hv, v)
            masked = jax.tree_util.tree_map(jnp.multiply, mask, v)
            hv = hvp(masked)
            return jax.tree_util.tree_map(
                lambda m, a, b: m * a + (1 - m) * b + ridge * b, mask, hv, v)

        b = jax.tree_util.tree_map(jnp.negative, rhs)
        if mask is not None:
            b = jax.tree_util.tree_map(jnp.multiply, mask, b)
        return lax.custom_linear_solve(matvec, b, solve=lambda mv, bb: self._solve(mv, bb),
                                       symmetric=True)

    def apply(self, run: Run, problem: OptimizationProblem, algorithm: Any,
              options: Any) -> Solution:
        """Run the backend with x*(p) differentiable by the implicit function theorem."""
        if not _has_float_leaves(problem.p) or not is_traced(problem, algorithm):
            # Only traced inputs can be differentiated: concrete ones skip the rule's cost.
            return run(problem, algorithm, options)
        side: dict[str, Any] = {}

        def primal(problem, algorithm, options):
            solution = run(problem, algorithm, options)
            leaves, treedef = jax.tree_util.tree_flatten(solution)
            side["objects"] = [None if _is_array_leaf(l) else l for l in leaves]
            side["treedef"] = treedef
            return [l if _is_array_leaf(l) else None for l in leaves]

        differentiable = jax.custom_jvp(primal)

        @differentiable.defjvp
        def jvp(primals, tangents):
            problem, algorithm, options = primals
            if problem.constraints:
                raise NotImplementedError(
                    "optsolve: differentiating a solution with respect to p is not supported "
                    "for problems with general constraints (the KKT system is not implemented);"
                    " express simple constraints as bounds, or use finite differences."
                )
            leaves = primal(problem, algorithm, options)
            solution = jax.tree_util.tree_unflatten(side["treedef"], [
                obj if obj is not None else leaf for leaf, obj in zip(leaves, side["objects"])
            ])
            code = solution.retcode
            if isinstance(code, jax.core.Tracer):
                jax.debug.callback(lambda c: [_warn_not_converged(ci) for ci in np.ravel(c)],
                                   code)
            else:
                for ci in np.ravel(np.asarray(code)):
                    _warn_not_converged(ci)
            p_dot = tangents[0].p
            dx = self.solution_tangent(problem, solution.x, p_dot)
            _, dobjective = jax.jvp(problem.f, (solution.x, problem.p), (dx, p_dot))
            arrays_only = jax.tree_util.tree_unflatten(side["treedef"], leaves)
            tangent = jax.tree_util.tree_map(_zero_tangent, arrays_only)
            tangent = dataclasses.replace(tangent, x=dx, objective=dobjective)
            return leaves, side["treedef"].flatten_up_to(tangent)

        leaves = differentiable(problem, algorithm, options)
        return jax.tree_util.tree_unflatten(side["treedef"], [
            obj if obj is not None else leaf for leaf, obj in zip(leaves, side["objects"])
        ])


@pytree_dataclass
class UnrolledAdjoint:
    """Differentiate through the iterations themselves (for JAX-native algorithms).

    The loop runs as a ``lax.scan`` of ``maxiters`` guarded steps (steps after the stop change
    nothing), with sqrt(maxiters) checkpointing to bound memory, so reverse and forward mode
    see every update. Unlike :class:`ImplicitAdjoint` this gives the derivative of the
    iterate actually returned, converged or not, and derivatives with respect to the
    algorithm's own hyperparameters (learning rate, momentum) for meta-learning.

    Requires a concrete ``maxiters``. Transformations containing their own while loops
    (line searches, optax.lbfgs) cannot be reverse-differentiated this way; JAX says so.
    scipy algorithms cannot be unrolled at all.
    """

    def apply(self, run: Run, problem: OptimizationProblem, algorithm: Any,
              options: Any) -> Solution:
        """Run the backend in a differentiable bounded loop of ``maxiters`` steps (``solve``
        has checked that the algorithm can be unrolled)."""
        maxiters = options.maxiters
        if maxiters is None or isinstance(maxiters, jax.core.Tracer):
            raise ValueError(
                "UnrolledAdjoint: `maxiters` must be given as a Python int (the unrolled loop's "
                f"length is static), got {maxiters!r}."
            )
        # maxiters updates plus the evaluation of the last iterate
        return run(problem, algorithm, options, loop=CheckpointedScan(int(maxiters) + 1))
