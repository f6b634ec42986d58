"""Return codes shared by every backend."""

from __future__ import annotations

import enum


class ReturnCode(enum.IntEnum):
    """Why a solve stopped. Every backend's own status is mapped onto these.

    An ``IntEnum``, so inside ``jax.jit`` a Solution carries it as an int32 array and
    ``sol.retcode == ReturnCode.SUCCESS`` works on arrays and on members alike.
    ``ReturnCode.X.message`` is a readable explanation.
    """

    SUCCESS = 0
    MAXITERS = 1
    MAXTIME = 2
    FAILURE = 3
    TERMINATED = 4
    INFEASIBLE = 5
    STALLED = 6
    INTERRUPTED = 7

    @property
    def message(self) -> str:
        return _MESSAGES[self]

    def __str__(self) -> str:
        return f"ReturnCode.{self.name}"


_MESSAGES = {
    ReturnCode.SUCCESS: "converged: a stopping tolerance (gtol, ftol, ...) was met",
    ReturnCode.MAXITERS: (
        "stopped at maxiters (or, training on data, after its epochs or at its end) without "
        "meeting a convergence tolerance; increase maxiters or set gtol/ftol if convergence "
        "was expected"
    ),
    ReturnCode.MAXTIME: "stopped after maxtime seconds without meeting a convergence tolerance",
    ReturnCode.FAILURE: (
        "numerical failure (non-finite objective or gradient, or a failed line search); "
        "sol.x is the last finite iterate"
    ),
    ReturnCode.TERMINATED: "stopped by the callback returning True; sol.x is the current iterate",
    ReturnCode.INFEASIBLE: "the constraints are violated at the returned point",
    ReturnCode.STALLED: "no further progress was possible (step too small to change x or f)",
    ReturnCode.INTERRUPTED: "interrupted (KeyboardInterrupt); sol.x is the last completed step",
}

# Internal marker for "still running" inside compiled loops; never returned to users.
RUNNING = -1


# Why a JAX-native run stopped, beyond its ReturnCode: the driver carries one of these codes
# (an int, so it can leave jit) and ``Solution.message`` spells it out.
REASONS = {
    0: "",
    1: "the gradient's infinity norm (projected onto the bounds) is <= gtol",
    2: "the relative change of the objective is <= ftol",
    3: "the step is <= xtol relative to max(|x|_inf, 1)",
    4: "the objective is not finite at the next iterate",
    5: "the gradient is not finite at the next iterate",
    6: "the next iterate is not finite",
    7: "the line search found no acceptable step",
    8: "no progress beyond rounding: the step no longer changes x, or 10 iterations "
    "lowered neither f nor the gradient norm",
    9: "the line search met a non-finite objective or gradient at its trial points",
    10: "no step short of the non-finite objective or gradient values met at the trial "
    "points changes x beyond rounding",
    11: "the relative reduction of the sum of squares (Levenberg-Marquardt: the actual and "
    "the predicted one) is <= ftol",
    12: "the step (Levenberg-Marquardt: the trust region, in the scaled norm) is <= xtol "
    "relative to the norm of x",
    13: "F(a) and F(b) must have different signs: the bracket (a, b) holds no sign change of F",
}

# The reason of a bracketing root solve whose bracket holds no sign change (set by
# optsolve.solve_api.roots, not the driver).
BRACKET_SIGN = 13


def reason_text(code: int) -> str:
    """The text of a :data:`REASONS` code ("" for none or an unknown code)."""
    return REASONS.get(int(code), "")
