"""A constrained run's Solution (InteriorPoint, AugmentedLagrangian) in the method's own
terms: its multipliers, INFEASIBLE for a run that ends outside the constraints, and the
reason in words.

- ``Solution.multipliers``: the run's own y in the user's problem's terms (the state's
  ``multipliers()``: flat, optsolve's sign; the ``Multipliers`` stage of ``solve`` makes
  them one array per constraint).
- A run that ends with the constraints or bounds violated by more than 1e-6 (relative to
  max(1, |bound|), the scipy backend's ``FEASIBILITY_TOL``; 1e-4 in float32:
  ``nlp.FEASIBILITY_TOLS``) is INFEASIBLE whatever stopped
  it (a failure on non-finite values stays FAILURE, a callback's stop TERMINATED): the
  method's verdict of local infeasibility, a budget spent before feasibility, or a
  stop by ``gtol`` (the driver's test on the Lagrangian's gradient alone).
- The driver's reason codes for the method's own tests (``Step.reduction_converged``,
  ``Step.radius_converged``: words of Levenberg-Marquardt there) become "no reason" and
  ``FTOL``; for an eager run, ``Solution.detail`` says the KKT error, the violation and,
  for INFEASIBLE, that the point is the least violation found (each method's own
  ``describe_*`` words it).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.backends.constrained.nlp import feasibility_tol
from optsolve.backends.native.rules import FTOL, RADIUS_TOL, REDUCTION_TOL, TRIAL_NONFINITE
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, replace
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution

_INT = jnp.int32


def relative_violation(problem: OptimizationProblem, x: Any) -> jax.Array:
    """The largest violation of the bounds and constraints at ``x`` (a pytree like x0),
    relative to max(1, |bound|)."""
    from optsolve.backends.constrained.nlp import NLP
    from optsolve.backends.native.objective import Objective

    nlp = NLP(Objective.from_problem(problem), problem)
    return nlp.violation(ravel_pytree(x)[0])


def _verdict(problem: OptimizationProblem, x: Any, code: Any, reason: Any, state: Any) -> tuple:
    """The run's return code and reason in the method's terms, its relative violation and
    its multipliers (None without constraints); one member per row where ``code`` is
    batched (a batch solved eagerly under vmap)."""
    if jnp.ndim(code) != 0:
        violation = jax.vmap(lambda x: relative_violation(problem, x))(x)
    else:
        violation = relative_violation(problem, x)
    code, reason = jnp.asarray(code, _INT), jnp.asarray(reason, _INT)
    nonfinite = (
        (code == int(ReturnCode.FAILURE))
        & (reason >= 4)
        & (reason <= TRIAL_NONFINITE)
        & (reason != 7)
    )
    keeps = (code == int(ReturnCode.TERMINATED)) | (code == int(ReturnCode.INTERRUPTED)) | nonfinite
    infeasible = ~keeps & (violation > feasibility_tol(violation.dtype))
    code = jnp.where(infeasible, int(ReturnCode.INFEASIBLE), code).astype(_INT)
    reason = jnp.where(
        infeasible | (reason == REDUCTION_TOL), 0, jnp.where(reason == RADIUS_TOL, FTOL, reason)
    ).astype(_INT)
    multipliers = state.multipliers() if problem.constraints else None
    return code, reason, violation, multipliers


# an eager run's verdict in one compiled call, not op by op (inside a trace it is inlined)
_compiled_verdict = jax.jit(_verdict)


def finished(
    problem: OptimizationProblem, algorithm: Any, solution: Solution, describe: Any = None
) -> Solution:
    """The Solution of a run, in the method's terms (module docstring); ``describe(code,
    violation, state, reason)`` words an eager run's detail (default: the interior point's)."""
    state = solution.state
    batched = np.ndim(solution.retcode) != 0
    reason = jnp.asarray(0 if solution.reason is None else solution.reason, _INT)
    code, reason, violation, multipliers = _compiled_verdict(
        problem, solution.x, jnp.asarray(solution.retcode, _INT), reason, state
    )
    detail = solution.detail
    concrete = not batched and not is_traced(code, violation, state)
    if concrete:
        code_now = ReturnCode(int(code))
        describe = describe_interior_point if describe is None else describe
        detail = describe(code_now, float(violation), state, int(solution.reason or 0))
        code, reason = code_now, int(reason)
    return replace(solution, retcode=code, reason=reason, multipliers=multipliers, detail=detail)


def _detail(
    code: ReturnCode,
    violation: float,
    state: Any,
    reason: int,
    measures: str,
    infeasible_why: str,
    converged_why: str,
) -> str:
    """A run's detail in its method's words: why it is INFEASIBLE (the method's own verdict
    where ``state.infeasible``), or which test it converged by, then its measures."""
    if code == ReturnCode.INFEASIBLE:
        why = (
            infeasible_why
            if bool(state.infeasible)
            else "the run stopped before reaching a feasible point"
        )
        return f"{why}; the largest violation is {violation:.6e}; {measures}"
    if code == ReturnCode.SUCCESS and reason == REDUCTION_TOL:
        return f"{converged_why}; {measures}"
    return measures


def describe_interior_point(code: ReturnCode, violation: float, state: Any, reason: int) -> str:
    """An interior-point run's detail: its KKT error, violation and barrier parameter."""
    measures = (
        f"KKT error E_0 = {float(state.error):.2e}, constraint violation "
        f"{violation:.2e} (relative), barrier parameter mu = {float(state.mu):.1e}"
    )
    return _detail(
        code,
        violation,
        state,
        reason,
        measures,
        "the feasibility restoration converged to a stationary point of the "
        "violation: the constraints are locally infeasible, and this is the least "
        "violation it found",
        "the scaled KKT error E_0 is <= tol (IPOPT's test)",
    )


def describe_augmented_lagrangian(
    code: ReturnCode, violation: float, state: Any, reason: int
) -> str:
    """An augmented Lagrangian run's detail: its errors, penalty and inner iterations."""
    measures = (
        f"infeasibility-complementarity |V| = {float(state.infeasibility):.2e}, "
        f"KKT error {float(state.error):.2e}, constraint violation {violation:.2e} "
        f"(relative), penalty rho = {float(state.rho):.1e}, "
        f"{int(state.inner_iterations)} inner iterations"
    )
    return _detail(
        code,
        violation,
        state,
        reason,
        measures,
        "the penalty passed rho_max with the violation above tolerance: the "
        "constraints are locally infeasible, and this is the penalised problem's "
        "minimiser, the least violation reached",
        "|V| <= feasibility_tol and the scaled projected Lagrangian gradient <= "
        "optimality_tol (acceptable_tol where the inner method could go no further)",
    )
