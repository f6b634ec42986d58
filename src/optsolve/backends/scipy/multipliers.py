"""The Lagrange multipliers that scipy's constrained methods compute themselves, in
optsolve's convention.

optsolve's multiplier of constraint component j is the derivative of the optimal
objective with respect to its active bound, negated (:mod:`optsolve.solve_api.kkt`):
grad f + sum_j lambda_j grad g_j = 0 at a KKT point. trust-constr's ``v`` is already that
(its Lagrangian is f + v.c). SLSQP reports one nonnegative multiplier per row of the
old-style constraints scipy converts ours to (``scipy.optimize._constraints.
new_constraint_to_old``): the equality rows g - b = 0 first, then the inequality rows
g - lower >= 0 of the finite lower bounds, then upper - g >= 0 of the finite upper ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from optsolve.backends.scipy.compiled import HostProblem

if TYPE_CHECKING:
    from scipy.optimize import OptimizeResult


def solver_multipliers(method: str, result: OptimizeResult, host: HostProblem) -> np.ndarray | None:
    """The flat multipliers (one per constraint component, float64) that ``method``
    returned in ``result``; None where it returns none (then optsolve's least-squares
    ones serve) or where their count does not match the constraints."""
    m = host.n_cons
    if not m:
        return None
    if method == "trust-constr":
        v = result.get("v")
        # the NonlinearConstraint is the first of trust-constr's constraints (bounds last)
        if not v or np.size(v[0]) != m:
            return None
        return np.asarray(v[0], dtype=np.float64).reshape(m)
    if method == "slsqp":
        raw = result.get("multipliers")
        lower, upper = host.c_lower, host.c_upper
        eq = lower == upper
        below = ~eq & np.isfinite(lower)
        above = ~eq & np.isfinite(upper)
        rows = int(eq.sum() + below.sum() + above.sum())
        if raw is None or np.size(raw) != rows:
            return None
        raw = np.asarray(raw, dtype=np.float64).reshape(rows)
        lam = np.zeros(m)
        n_eq, n_below = int(eq.sum()), int(below.sum())
        lam[eq] = -raw[:n_eq]
        lam[below] -= raw[n_eq : n_eq + n_below]
        lam[above] += raw[n_eq + n_below :]
        return lam
    return None
