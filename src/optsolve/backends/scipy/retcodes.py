"""How each scipy.optimize method's own status maps onto :class:`ReturnCode`.

One table per method, keyed on the ``status`` integer of scipy's ``OptimizeResult`` (the
meanings are scipy 1.17's, quoted from its sources next to each entry). A status missing
from its table maps to FAILURE. The rules on top of the tables are in
``scipy_run._outcome``: a stop that optsolve itself requested wins over scipy's status, a
non-finite value anywhere in the run is FAILURE, violated constraints at the end are
INFEASIBLE and a success on a test of scipy's own above the user's gtol is STALLED
(:func:`stopped_by_own_gtol`). :func:`budget_option` names an evaluation budget that ended
a run, and :func:`scipy_message` gives scipy's message as one string.
"""

from __future__ import annotations

from typing import Any

from optsolve.solve_api.returncode import ReturnCode

S, MI, MT, F, T, INF, ST = (
    ReturnCode.SUCCESS,
    ReturnCode.MAXITERS,
    ReturnCode.MAXTIME,
    ReturnCode.FAILURE,
    ReturnCode.TERMINATED,
    ReturnCode.INFEASIBLE,
    ReturnCode.STALLED,
)

# scipy.optimize._optimize: warnflag of the line-search methods (_status_message).
_LINE_SEARCH = {
    0: S,  # "Optimization terminated successfully."
    1: MI,  # "Maximum number of iterations has been exceeded."
    2: F,  # "Desired error not necessarily achieved due to precision loss." (line search)
    3: F,  # "NaN result encountered."
    99: T,  # "`callback` raised `StopIteration`."
}

# scipy.optimize._trustregion._minimize_trust_region (dogleg, trust-ncg, -exact, -krylov).
_TRUST_REGION = {
    0: S,  # "Optimization terminated successfully."
    1: MI,  # "Maximum number of iterations has been exceeded."
    2: ST,  # "A bad approximation caused failure to predict improvement."
    3: F,  # "A linalg error occurred, such as a non-psd Hessian."
    99: T,
}

METHOD_TABLES: dict[str, dict[int, ReturnCode]] = {
    "nelder-mead": {0: S, 1: MI, 2: MI, 99: T},  # 1: maxfev exceeded, 2: maxiter exceeded
    "powell": {0: S, 1: MI, 2: MI, 3: F, 4: INF, 99: T},  # 3: NaN, 4: "outside the bounds"
    "cg": _LINE_SEARCH,
    "bfgs": _LINE_SEARCH,
    # 3: "CG iterations didn't converge. The Hessian is not positive definite." or NaN.
    "newton-cg": {0: S, 1: MI, 2: F, 3: F, 5: T, 99: T},
    # _lbfgsb_py: 0 CONVERGENCE, 1 maxfun or maxiter reached, 2 ABNORMAL / WARNING / ERROR.
    "l-bfgs-b": {0: S, 1: MI, 2: F, 99: T},
    # _tnc.RCSTRINGS.
    "tnc": {
        -1: INF,  # "Infeasible (lower bound > upper bound)"
        0: S,  # "Local minimum reached (|pg| ~= 0)"
        1: S,  # "Converged (|f_n-f_(n-1)| ~= 0)"
        2: S,  # "Converged (|x_n-x_(n-1)| ~= 0)"
        3: MI,  # "Max. number of function evaluations reached"
        4: F,  # "Linear search failed"
        5: S,  # "All lower bounds are equal to the upper bounds"
        6: ST,  # "Unable to progress"
        7: T,  # "User requested end of minimization"
    },
    # scipy._lib.pyprima.common.infos (PRIMA's COBYLA).
    "cobyla": {
        0: S,  # SMALL_TR_RADIUS
        1: S,  # FTARGET_ACHIEVED
        2: F,  # TRSUBP_FAILED
        3: MI,  # MAXFUN_REACHED
        20: MI,  # MAXTR_REACHED
        -1: F,  # NAN_INF_X
        -2: F,  # NAN_INF_F
        -3: F,  # NAN_INF_MODEL
        6: INF,  # NO_SPACE_BETWEEN_BOUNDS
        7: ST,  # DAMAGING_ROUNDING
        8: F,  # ZERO_LINEAR_CONSTRAINT
        30: T,  # CALLBACK_TERMINATE
    },
    # scipy._lib.cobyqa.settings.ExitStatus.
    "cobyqa": {
        0: S,  # RADIUS_SUCCESS
        1: S,  # TARGET_SUCCESS
        2: S,  # FIXED_SUCCESS (all variables fixed by the bounds)
        3: T,  # CALLBACK_SUCCESS
        4: S,  # FEASIBLE_SUCCESS (feasibility problem solved)
        5: MI,  # MAX_EVAL_WARNING
        6: MI,  # MAX_ITER_WARNING
        -1: INF,  # INFEASIBLE_ERROR
        -2: F,  # LINALG_ERROR
    },
    # _slsqp_py.exit_modes.
    "slsqp": {
        0: S,  # "Optimization terminated successfully"
        2: INF,  # "More equality constraints than independent variables"
        3: F,  # "More than 3*n iterations in LSQ subproblem"
        4: INF,  # "Inequality constraints incompatible"
        5: F,  # "Singular matrix E in LSQ subproblem"
        6: F,  # "Singular matrix C in LSQ subproblem"
        7: F,  # "Rank-deficient equality constraint subproblem HFTI"
        8: F,  # "Positive directional derivative for linesearch"
        9: MI,  # "Iteration limit reached"
        99: T,
    },
    # _trustregion_constr.minimize_trustregion_constr.TERMINATION_MESSAGES.
    "trust-constr": {
        0: MI,  # "The maximum number of function evaluations is exceeded." (maxiter)
        1: S,  # "`gtol` termination condition is satisfied."
        2: S,  # "`xtol` termination condition is satisfied."
        3: T,  # "`callback` raised `StopIteration`."
        4: INF,  # "Constraint violation exceeds 'gtol'"
    },
    "dogleg": _TRUST_REGION,
    "trust-ncg": _TRUST_REGION,
    "trust-exact": _TRUST_REGION,
    "trust-krylov": _TRUST_REGION,
    # _direct_py: 1 maxfun, 2 maxiter, 3-5 success (f_min, vol_tol, len_tol), < 0 errors.
    "direct": {1: MI, 2: MI, 3: S, 4: S, 5: S},
}

# _lsq/least_squares.TERMINATION_MESSAGES: every method of least_squares (trf, dogbox, lm).
LEAST_SQUARES_TABLE: dict[int, ReturnCode] = {
    -2: T,  # "Stopped because `callback` function raised `StopIteration` or returned `True`"
    -1: F,  # "Improper input parameters status returned from `leastsq`"
    0: MI,  # "The maximum number of function evaluations is exceeded." (max_nfev)
    1: S,  # "`gtol` termination condition is satisfied."
    2: S,  # "`ftol` termination condition is satisfied."
    3: S,  # "`xtol` termination condition is satisfied."
    4: S,  # "Both `ftol` and `xtol` termination conditions are satisfied."
}


def global_retcode(method: str, result: Any) -> ReturnCode:
    """ReturnCode of a global method whose result carries ``success`` and a message.

    differential_evolution, dual_annealing, shgo and basinhopping report no status
    integer; their ``success`` flag and message say why they stopped.
    """
    if method == "direct":
        return METHOD_TABLES["direct"].get(int(result.status), F)
    message = result.message
    if isinstance(message, (list, tuple)):
        message = " ".join(str(m) for m in message)
    message = str(message).lower()
    if method == "dual_annealing":
        # dual annealing has no convergence test: scipy's success=True at the end of its
        # iteration budget ("Maximum number of iteration reached") claims none either, so
        # that end, like maxfun's, is MAXITERS.
        if "maximum number of function call" in message or "maximum number of iteration" in message:
            return MI
        return S if result.success else F
    if method == "differential_evolution":
        if result.success:
            return S
        if "maximum number" in message:
            return MI
        if "constraints" in message:
            return INF
        return F
    if method == "shgo":
        if result.success:
            return S
        if "max" in message:
            return MI
        return F
    if method == "basinhopping":
        # success is that of the local minimisation at the best point found.
        return S if result.success else F
    raise ValueError(f"global_retcode: unknown method {method!r}.")


def minimize_retcode(method: str, status: Any, success: bool = True) -> ReturnCode:
    """ReturnCode for scipy.optimize.minimize's ``status`` under ``method`` (lower case).

    ``success`` is the result's flag: COBYLA reports a converged status (a small trust
    region) with ``success=False`` when the constraint violation exceeds its ``catol``.
    """
    code = METHOD_TABLES[method].get(int(status), F)
    if method == "cobyla" and code is S and not success:
        return INF
    return code


def least_squares_retcode(status: Any) -> ReturnCode:
    """ReturnCode for scipy.optimize.least_squares' ``status`` (the same on every method)."""
    return LEAST_SQUARES_TABLE.get(int(status), F)


def scipy_message(result: Any) -> str:
    """scipy's message in full, as one string (some global methods give a list)."""
    message = result.get("message", "")
    if isinstance(message, (list, tuple)):
        return "; ".join(str(m) for m in message)
    return str(message)


# Where scipy's status says an evaluation budget (not the iteration limit maxiters maps to)
# ended the run: method -> (status, the option that sets the budget).
_BUDGET_STATUS = {
    "nelder-mead": (1, "maxfev"),  # "Maximum number of function evaluations has been exceeded."
    "powell": (1, "maxfev"),
    "tnc": (3, "maxfun"),  # "Max. number of function evaluations reached"
    "cobyla": (3, "maxiter"),  # MAXFUN_REACHED (COBYLA's maxiter counts evaluations)
    "cobyqa": (5, "maxfev"),  # MAX_EVAL_WARNING
    "direct": (1, "maxfun"),  # "Number of function evaluations done is larger than maxfun"
    **dict.fromkeys(("trf", "dogbox", "lm"), (0, "max_nfev")),  # least_squares' only budget
}
# Where only the message tells: method -> (words of the message, the option).
_BUDGET_MESSAGE = {
    "l-bfgs-b": ("evaluations exceeds limit", "maxfun"),  # "TOTAL NO. OF F,G EVALUATIONS ..."
    "dual_annealing": ("maximum number of function call", "maxfun"),
}


def budget_option(method: str, result: Any) -> str | None:
    """The scipy option whose evaluation budget ended the run, or None if none did."""
    if method in _BUDGET_STATUS:
        status, option = _BUDGET_STATUS[method]
        return option if result.get("status") == status else None
    if method in _BUDGET_MESSAGE:
        words, option = _BUDGET_MESSAGE[method]
        return option if words in scipy_message(result).lower() else None
    return None


def stopped_by_own_gtol(method: str, result: Any) -> bool:
    """Whether scipy's success is its own form of the gradient test solve's gtol maps to,
    measured in a way optsolve's projected inf-norm need not reproduce: TNC's scaled
    projected gradient, trust-constr's Lagrangian gradient with its barrier."""
    return (method, result.get("status")) in (("tnc", 0), ("trust-constr", 1))
