"""The constrained family's algorithm classes, registered with ``solve``."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from optsolve.backends.constrained.interior_point import (
    DEFAULT_TOL, InteriorPointSolver, solve_interior_point,
)
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass, static_field
from optsolve.solve_api.registry import register_algorithm, register_backend


def _check(name: str, value: Any, low: float, high: float | None = None) -> None:
    """A concrete hyperparameter in (low, high) (open), else a ValueError naming it."""
    if value is None or isinstance(value, jax.core.Tracer) or jnp.ndim(value) != 0:
        return
    v = float(value)
    if not (v > low and (high is None or v < high)):
        span = f"> {low:g}" if high is None else f"in ({low:g}, {high:g})"
        raise ValueError(f"InteriorPoint: `{name}` must be {span}, got {value!r}.")


@pytree_dataclass
class InteriorPoint(Algorithm):
    """A primal-dual interior-point method with a filter line search, in the design of
    IPOPT, JAX-native: it runs under ``jax.jit`` and ``jax.vmap`` on the shared compiled
    driver, and ``jax.grad`` differentiates its solution through the KKT conditions.

    Minimises ``f(x)`` subject to box bounds and general constraints
    ``lower <= g(x, p) <= upper`` (equalities where ``lower == upper``): inequalities get
    slacks, bounds get multipliers z_L, z_U, and the barrier problem

        min f(x) - mu sum log(gaps to the bounds)   s.t.   c(x) - s = 0

    is solved approximately for a decreasing barrier parameter mu (monotone
    Fiacco-McCormick). Each step solves the primal-dual Newton system with the exact
    Hessian of the Lagrangian (dense, JAX) and an inertia correction, keeps the iterate
    inside the bounds by the fraction-to-the-boundary rule, and is accepted by a filter
    line search (optionally with a second-order correction). A step that the filter cannot
    accept starts a feasibility restoration: Levenberg-Marquardt on the constraint
    violation, inside the bounds. Where it ends at a stationary point of the violation the
    problem is locally infeasible, and the run ends ``INFEASIBLE`` at the least violation
    it found (the message says it). See Wächter & Biegler, "On the implementation of an
    interior-point filter line-search algorithm for large-scale nonlinear programming",
    Math. Programming 106 (2006), 25-57; :mod:`optsolve.backends.constrained.interior_point`
    says what of it is built and how.

    The run converges when IPOPT's scaled KKT error E_0 is at most ``tol`` (or at most
    ``acceptable_tol`` at 15 iterates in a row). ``solve``'s ``ftol`` ends it only at a
    feasible point; its ``gtol`` tests the (projected) gradient of the Lagrangian, which
    says nothing of complementarity: leave it unset unless that is what you want. Any run
    that ends outside the constraints by more than 1e-6 (relative) is ``INFEASIBLE``.
    ``sol.multipliers`` are the run's own, with optsolve's sign (``-multipliers[j]`` is the
    derivative of f* with respect to constraint j's active bound). The Newton system is
    dense: the method suits up to a few hundred variables and constraints.

    Args:
      tol: the KKT tolerance (default 1e-8 in float64, 1e-5 in float32).
      acceptable_tol: the "acceptable" tolerance (default 1e-6).
      mu_init: the first barrier parameter (default 0.1).
      mu_linear_decrease: kappa_mu, mu's linear factor (default 0.2).
      mu_superlinear_power: theta_mu, mu's superlinear power (default 1.5).
      tau_min: the least fraction to the boundary (default 0.99).
      bound_push, bound_frac: how far x0 (and the slacks) are moved inside their bounds,
        absolute (times max(1, |bound|)) and as a fraction of the interval (default 1e-2).
      second_order_correction: try one second-order correction when the first trial step
        raises the violation (static; default True).

    Example:
      >>> cons = [optsolve.Constraint(lambda x, p: jnp.prod(x), lower=25.0),
      ...         optsolve.Constraint(lambda x, p: jnp.sum(x ** 2), lower=40.0, upper=40.0)]
      >>> prob = optsolve.OptimizationProblem(hs071, jnp.array([1.0, 5.0, 5.0, 1.0]),
      ...                                     bounds=(1.0, 5.0), constraints=cons)
      >>> sol = optsolve.solve(prob, optsolve.InteriorPoint())   # f* = 17.0140173
    """

    family: ClassVar[str] = "constrained"
    needs_hessian: ClassVar[bool] = True
    takes_bounds: ClassVar[bool] = True
    takes_constraints: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 3000
    resumable: ClassVar[bool] = True
    records_history: ClassVar[bool] = True
    compiled_driver: ClassVar[bool] = True
    # the Hessian, the Newton system and its eigenvectors (n + m square each)
    dense_matrices: ClassVar[int] = 3
    # eigendecompositions: LAPACK has no 16-bit kernels
    float_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64")
    # the KKT tolerance ``tol`` defaults to, by itemsize of x's dtype (for the docs' table)
    default_tol: ClassVar[dict[int, float]] = DEFAULT_TOL

    tol: Any = None
    acceptable_tol: Any = 1e-6
    mu_init: Any = 0.1
    mu_linear_decrease: Any = 0.2
    mu_superlinear_power: Any = 1.5
    tau_min: Any = 0.99
    bound_push: Any = 1e-2
    bound_frac: Any = 1e-2
    second_order_correction: bool = static_field(default=True)

    def __post_init__(self):
        _check("tol", self.tol, 0.0)
        _check("acceptable_tol", self.acceptable_tol, 0.0)
        _check("mu_init", self.mu_init, 0.0)
        _check("mu_linear_decrease", self.mu_linear_decrease, 0.0, 1.0)
        _check("mu_superlinear_power", self.mu_superlinear_power, 1.0, 2.0)
        _check("tau_min", self.tau_min, 0.0, 1.0)
        _check("bound_push", self.bound_push, 0.0)
        _check("bound_frac", self.bound_frac, 0.0, 0.5)

    def make_solver(self, problem: OptimizationProblem) -> InteriorPointSolver:
        return InteriorPointSolver(self, problem)


register_algorithm(InteriorPoint)
register_backend(InteriorPoint, solve_interior_point)
