"""The constrained family's algorithm classes, registered with ``solve``."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from optsolve.backends.constrained.augmented_lagrangian import (
    DEFAULT_TOLS,
    ALSolver,
    solve_augmented_lagrangian,
)
from optsolve.backends.constrained.interior_point import (
    DEFAULT_TOL,
    DENSE_KKT_SIZE,
    InteriorPointSolver,
    solve_interior_point,
)
from optsolve.backends.constrained.nlp import equality_rows, flat_problem_size
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass, static_field
from optsolve.solve_api.registry import (
    algorithm_classes,
    as_algorithm,
    register_algorithm,
    register_backend,
)


def _check(
    name: str,
    value: Any,
    low: float,
    high: float | None = None,
    owner: str = "InteriorPoint",
    closed_low: bool = False,
) -> None:
    """A concrete hyperparameter in (low, high) (open; ``[low, high)`` with
    ``closed_low``), else a ValueError naming it."""
    if value is None or isinstance(value, jax.core.Tracer) or jnp.ndim(value) != 0:
        return
    v = float(value)
    if not ((v >= low if closed_low else v > low) and (high is None or v < high)):
        opening = "[" if closed_low else "("
        span = f"> {low:g}" if high is None else f"in {opening}{low:g}, {high:g})"
        raise ValueError(f"{owner}: `{name}` must be {span}, got {value!r}.")


_IP_LINEAR_SOLVERS = ("auto", "dense", "condensed", "minres")


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
    dense up to 256 variables and constraint rows together; above that it is never formed:
    MINRES solves it on Hessian-vector and Jacobian products, and a curvature test along
    the step (Chiang & Zavala, Comput. Optim. Appl. 64 (2016), 327-354) stands in for the
    factorisation's inertia.

    Args:
      tol: the KKT tolerance (default 1e-8 in float64, 1e-5 in float32).
      acceptable_tol: the "acceptable" tolerance (default 1e-6).
      mu_init: the first barrier parameter (default 0.1).
      mu_linear_decrease: kappa_mu, mu's linear factor (default 0.2).
      mu_superlinear_power: theta_mu, mu's superlinear power (default 1.5).
      tau_min: the least fraction to the boundary (default 0.99).
      bound_push, bound_frac: how far x0 (and the slacks) are moved inside their bounds,
        absolute (times max(1, |bound|)) and as a fraction of the interval (default 1e-2).
      nlp_scaling_max_gradient: IPOPT's gradient-based scaling: f and each constraint
        row are scaled by ``min(1, g_max / |their gradient at the start|_inf)`` (at least
        1e-8; the matrix-free form scales f only), and ``tol`` is tested on the scaled
        problem (default 100; ``inf``: no scaling). The run converges only where the
        user's problem is feasible to 1e-6.
      bound_relax_factor: the inequality constraints' bounds are relaxed by this times
        max(1, |bound|) (below 1e-6; 0: none; default IPOPT's 1e-8, or ``tol`` where
        that is smaller), so that the
        interior stays nonempty where constraints meet. Unlike IPOPT, x's own bounds are
        never relaxed: f and g are evaluated inside them only.
      second_order_correction: try one second-order correction when the first trial step
        raises the violation (static; default True).
      linear_solver: the Newton system's solver (static): "dense" (an ``L D L^T``
        factorisation with IPOPT's inertia correction), "condensed" (the same with the
        inequality rows eliminated, ``W + Sigma + J_I^T D_I^-1 J_I`` bordered by the
        equality rows' Jacobian: n + m_E rows), "minres" (matrix-free), or "auto"
        (default: dense while n + m <= 256; condensed while n + m_E <= 256, which
        ``solve`` can tell only while the constraints' bounds are not traced; else
        matrix-free).

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
    # its own y for every constraint row (solve's Multipliers stage trusts them)
    gives_multipliers: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 3000
    resumable: ClassVar[bool] = True
    records_history: ClassVar[bool] = True
    compiled_driver: ClassVar[bool] = True
    # the Hessian, the Newton system and its L D L^T factor (n + m square each), unless
    # linear_solver says matrix-free (capabilities below)
    dense_matrices: ClassVar[int] = 3
    # the barrier terms and the factorisation's pivots span more than 16-bit floats resolve
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
    nlp_scaling_max_gradient: Any = 100.0
    bound_relax_factor: Any = None
    second_order_correction: bool = static_field(default=True)
    linear_solver: str = static_field(default="auto")
    # "condensed": the equality rows kept in the reduced system, found by specialised_for
    # while the problem is concrete (inside the compiled run its bounds are traced)
    _equality_rows: Any = static_field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.linear_solver not in _IP_LINEAR_SOLVERS:
            raise ValueError(
                "InteriorPoint: `linear_solver` must be one of "
                f"{', '.join(map(repr, _IP_LINEAR_SOLVERS))}, got "
                f"{self.linear_solver!r}."
            )
        _check("tol", self.tol, 0.0)
        _check("acceptable_tol", self.acceptable_tol, 0.0)
        _check("mu_init", self.mu_init, 0.0)
        _check("mu_linear_decrease", self.mu_linear_decrease, 0.0, 1.0)
        _check("mu_superlinear_power", self.mu_superlinear_power, 1.0, 2.0)
        _check("tau_min", self.tau_min, 0.0, 1.0)
        _check("bound_push", self.bound_push, 0.0)
        _check("bound_frac", self.bound_frac, 0.0, 0.5)
        _check("nlp_scaling_max_gradient", self.nlp_scaling_max_gradient, 0.0)
        # below what the outcome calls feasible
        _check("bound_relax_factor", self.bound_relax_factor, 0.0, 1e-6, closed_low=True)

    def make_solver(self, problem: OptimizationProblem) -> InteriorPointSolver:
        return InteriorPointSolver(self, problem)

    def specialised_for(self, problem: OptimizationProblem) -> InteriorPoint:
        """ "auto" made "condensed" where n + m_E <= 256 < n + m (m_E equality rows, known
        while the constraints' bounds are not traced); "condensed" told its equality rows."""
        if not problem.constraints or self.linear_solver not in ("auto", "condensed"):
            return self
        rows = equality_rows(problem)
        if self.linear_solver == "auto":
            n, m = flat_problem_size(problem)
            if rows is None or not n + rows.size <= DENSE_KKT_SIZE < n + m:
                return self
        specialised = self.replace(linear_solver="condensed")
        if rows is not None:
            object.__setattr__(specialised, "_equality_rows", tuple(int(i) for i in rows))
        return specialised

    def capabilities(self) -> dict[str, Any]:
        """The class's traits, ``dense_matrices`` as ``linear_solver`` says ("condensed":
        n x n ones; "auto": dense
        only below its size threshold, so no dense matrix grows with the problem)."""
        caps = super().capabilities()
        caps["dense_matrices"] = 3 if self.linear_solver in ("dense", "condensed") else 0
        return caps


register_algorithm(InteriorPoint)
register_backend(InteriorPoint, solve_interior_point)


def _default_inner() -> Algorithm:
    # families never import each other: the default inner method comes from the registry
    for cls in algorithm_classes():
        if cls.__name__ == "LBFGS":
            return cls()
    raise RuntimeError("AugmentedLagrangian: no LBFGS is registered (import optsolve).")


def _bounded_native(cls: type) -> bool:
    """A JAX-native method on f that iterates from a start and takes bounds."""
    traits = cls.traits()
    return bool(
        cls.compiled_driver
        and traits["takes_bounds"]
        and not traits["needs_residuals"]
        and not traits["takes_constraints"]
        and not traits.get("scalar_only")
    )


@pytree_dataclass
class AugmentedLagrangian(Algorithm):
    """An augmented Lagrangian method (Powell-Hestenes-Rockafellar) with ALGENCAN's
    safeguards, JAX-native and matrix-free: each outer iteration minimises the augmented
    Lagrangian over the bounds with a JAX-native bounded method (``LBFGS()`` by default),
    then updates the multipliers and the penalty. It runs under ``jax.jit`` and
    ``jax.vmap`` on the shared compiled driver, and ``jax.grad`` differentiates its
    solution through the KKT conditions.

    Minimises ``f(x)`` subject to box bounds (kept by the inner method) and general
    constraints ``lower <= g(x, p) <= upper`` (equalities where ``lower == upper``) in the
    penalty ``rho/2 |t - P(t)|^2``, ``t = g + lam / rho``, ``P`` the projection onto
    ``[lower, upper]``. Nothing larger than a vector is formed (the penalty's gradient is
    one vector-Jacobian product), so it suits problems with many variables; for small
    dense problems :class:`InteriorPoint` converges in fewer evaluations. See Andreani,
    Birgin, Martínez & Schuverdt, SIAM J. Optim. 18 (2007), 1286-1309 (ALGENCAN), and Conn,
    Gould & Toint, SIAM J. Numer. Anal. 28 (1991), 545-572;
    :mod:`optsolve.backends.constrained.augmented_lagrangian` says what is built.

    One iteration of ``solve`` is one outer iteration (a whole inner run). The run
    converges when ALGENCAN's feasibility-complementarity measure ``|V|_inf`` is at most
    ``feasibility_tol`` and the projected gradient of the Lagrangian at most
    ``optimality_tol`` times ``max(1, |grad f|_inf)``; ``ftol`` ends it only at a feasible
    point. Where the penalty passes ``rho_max`` with the constraints still violated, the
    run ends ``INFEASIBLE`` at the least violation it reached (the message says it); any
    run that ends outside the constraints by more than 1e-6 (relative) is ``INFEASIBLE``.
    ``sol.multipliers`` are the run's own, with optsolve's sign.

    Args:
      inner: the method for the subproblems: any JAX-native algorithm that takes bounds
        (``LBFGS()`` with its own line search or memory, ``GradientDescent()``; default
        ``LBFGS()``). Its defaults hold, but for gtol (the outer iteration's inner
        tolerance) and maxiters (``inner_maxiters``).
      feasibility_tol: the tolerance on |V|_inf (default 1e-8 in float64, 1e-4 in float32).
      optimality_tol: the tolerance on the projected Lagrangian gradient's infinity norm
        relative to max(1, |grad f|_inf), and the inner runs' last gtol (likewise)
        (default 1e-8 in float64, 1e-3 in float32).
      rho_init: the first penalty (default ALGENCAN's: 10 max(1, |f(x0)|) / max(1, 1/2
        |V(x0)|^2), clipped to [1e-8, 10]; ALGENCAN's upper clip is 1e8, for a Newton
        inner method).
      penalty_increase: gamma, rho's factor when |V| fell too little (default 10).
      infeasibility_decrease: tau, the fall of |V| that keeps rho (default 0.5).
      multiplier_bound: the safeguard, the shift's largest magnitude (default 1e20).
      acceptable_tol: the tolerance on the same scaled gradient that ends the run
        where the inner method can make no further progress (it stalls where it started),
        at a feasible point (default 1e-6 in float64, 1e-2 in float32).
      rho_max: the penalty past which a still-violated problem is infeasible (default
        1e12 in float64, 1e6 in float32).
      inner_maxiters: the inner runs' iteration budget (default 1000).

    Example:
      >>> cons = [optsolve.Constraint(lambda x, p: jnp.prod(x), lower=25.0),
      ...         optsolve.Constraint(lambda x, p: jnp.sum(x ** 2), lower=40.0, upper=40.0)]
      >>> prob = optsolve.OptimizationProblem(hs071, jnp.array([1.0, 5.0, 5.0, 1.0]),
      ...                                     bounds=(1.0, 5.0), constraints=cons)
      >>> sol = optsolve.solve(prob, optsolve.AugmentedLagrangian())   # f* = 17.0140173
    """

    family: ClassVar[str] = "constrained"
    takes_bounds: ClassVar[bool] = True
    takes_constraints: ClassVar[bool] = True
    gives_multipliers: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 100
    resumable: ClassVar[bool] = True
    records_history: ClassVar[bool] = True
    compiled_driver: ClassVar[bool] = True
    default_tols: ClassVar[dict[int, tuple]] = DEFAULT_TOLS
    float_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64")
    conditional_traits: ClassVar[dict[str, str]] = {
        "needs_hessian": "with an inner algorithm that needs Hessian products",
        "dense_matrices": "with an inner algorithm that holds dense matrices",
        "float_dtypes": "with an inner algorithm that takes them (float32, float64 at most)",
    }

    inner: Any = None
    feasibility_tol: Any = None
    optimality_tol: Any = None
    rho_init: Any = None
    penalty_increase: Any = 10.0
    infeasibility_decrease: Any = 0.5
    multiplier_bound: Any = 1e20
    rho_max: Any = None
    acceptable_tol: Any = None
    inner_maxiters: Any = 1000

    def __post_init__(self):
        if self.inner is not None:
            inner = as_algorithm(self.inner)
            if not _bounded_native(type(inner)):
                allowed = ", ".join(c.__name__ for c in algorithm_classes() if _bounded_native(c))
                raise TypeError(
                    f"AugmentedLagrangian: `inner` must be a JAX-native algorithm that takes "
                    f"bounds, got {type(inner).__name__}. Use one of: {allowed}."
                )
            object.__setattr__(self, "inner", inner)
        for name in (
            "feasibility_tol",
            "optimality_tol",
            "rho_init",
            "multiplier_bound",
            "rho_max",
            "acceptable_tol",
        ):
            _check(name, getattr(self, name), 0.0, owner="AugmentedLagrangian")
        _check("penalty_increase", self.penalty_increase, 1.0, owner="AugmentedLagrangian")
        _check(
            "infeasibility_decrease",
            self.infeasibility_decrease,
            0.0,
            1.0,
            owner="AugmentedLagrangian",
        )
        _check("inner_maxiters", self.inner_maxiters, 0.0, owner="AugmentedLagrangian")

    def inner_algorithm(self) -> Algorithm:
        """The subproblems' method (``LBFGS()`` unless given)."""
        return _default_inner() if self.inner is None else self.inner

    def capabilities(self) -> dict[str, Any]:
        """The class's traits, with the inner method's Hessian products, dense matrices
        and dtypes."""
        caps = dict(type(self).traits())
        inner = self.inner_algorithm().capabilities()
        for trait in ("needs_hessian", "dense_matrices"):
            caps[trait] = inner[trait]
        # its tolerances and penalties are set for float32 and float64
        caps["float_dtypes"] = tuple(
            d for d in inner["float_dtypes"] if d in ("float32", "float64")
        )
        return caps

    def make_solver(self, problem: OptimizationProblem) -> ALSolver:
        return ALSolver(self, problem)


register_algorithm(AugmentedLagrangian)
register_backend(AugmentedLagrangian, solve_augmented_lagrangian)
