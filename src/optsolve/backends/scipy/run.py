"""One scipy run on concrete inputs: scipy called with JAX derivatives, optsolve's per-iteration
tests (:mod:`optsolve.backends.scipy.monitor`), and the result mapped to a ReturnCode with
optsolve's own rules on top of scipy's status (non-finite values, feasibility, the user's gtol).
Used by :mod:`optsolve.backends.scipy.backend` directly, or from inside ``jax.pure_callback``.

scipy is imported by the functions that call it, on the first run: ``import optsolve``
does not import it.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from optsolve.backends.scipy.compiled import FEASIBILITY_TOL, HostProblem
from optsolve.backends.scipy.monitor import Monitor, Stop
from optsolve.backends.scipy.multipliers import solver_multipliers
from optsolve.backends.scipy.options import MINIMIZE_SPECS, MethodSpec
from optsolve.backends.scipy.retcodes import (
    budget_option,
    global_retcode,
    least_squares_retcode,
    minimize_retcode,
    scipy_message,
    stopped_by_own_gtol,
)
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.stationarity import stationarity

if TYPE_CHECKING:
    from scipy.optimize import OptimizeResult

# How far above the constrained optimum (in f, relative to 1 + |f|) trust-constr's barrier
# subproblem may leave a run that it reports as a success (:func:`_barrier_left_open`).
BARRIER_GAP_TOL = 1e-6


def _flat(tree) -> np.ndarray:
    return np.concatenate(
        [np.ravel(np.asarray(leaf, np.float64)) for leaf in jax.tree_util.tree_leaves(tree)]
    )


def _bounds(problem: OptimizationProblem) -> tuple[np.ndarray, np.ndarray] | None:
    """The problem's bounds as two flat float64 vectors (x0's ravel order), or None."""
    if not problem.has_bounds:
        return None
    lower, upper = problem.bounds
    return _flat(lower), _flat(upper)


def _nonlinear_constraint(host: HostProblem, spec: MethodSpec) -> list:
    if not host.constraints:
        return []
    from scipy.optimize import NonlinearConstraint

    if spec.key in ("cobyla", "cobyqa", "differential_evolution"):
        return [NonlinearConstraint(host.cons, host.c_lower, host.c_upper)]
    if spec.key == "slsqp":
        # SLSQP takes equalities and inequalities as separate constraints (scipy warns
        # otherwise); both parts share one value-and-Jacobian evaluation.
        eq = host.c_lower == host.c_upper
        parts = []
        for mask in (eq, ~eq):
            if mask.any():
                parts.append(
                    NonlinearConstraint(
                        lambda x, m=mask: host.cons_value(x)[m],
                        host.c_lower[mask],
                        host.c_upper[mask],
                        jac=lambda x, m=mask: host.cons_jac(x)[m],
                    )
                )
        return parts
    kwargs = {"jac": host.cons_jac}
    if spec.key == "trust-constr":
        kwargs["hess"] = host.cons_hess
    return [NonlinearConstraint(host.cons_value, host.c_lower, host.c_upper, **kwargs)]


def _derivative_kwargs(host: HostProblem, spec: MethodSpec) -> dict:
    """fun / jac / hess / hessp for scipy.optimize.minimize: only what the method uses."""
    if not spec.needs_gradient:
        host.prepare(("f",))
        return {"fun": host.fun}
    host.prepare(("fg",))
    out = {"fun": host.fun_and_grad, "jac": True}
    if spec.hessian is not None:
        host.prepare((spec.hessian,))
        out[spec.hessian] = getattr(host, spec.hessian)
    return out


def _minimize(problem, algorithm, options, host, monitor, bounds) -> OptimizeResult:
    import scipy.optimize as so

    spec = algorithm.spec
    kwargs = _derivative_kwargs(host, spec)
    scipy_options = _tolerances(spec, algorithm.options, options["gtol"], options["ftol"])
    budget = iteration_budget(algorithm, options["maxiters"])
    if budget.by_solve:
        scipy_options[spec.maxiter_name] = budget.scipy_value
    if bounds is not None:
        kwargs["bounds"] = so.Bounds(*bounds)
    constraints = _nonlinear_constraint(host, spec)
    if constraints:
        host.prepare(("c",) if spec.key in ("cobyla", "cobyqa") else ("cj",))
        if spec.key == "trust-constr":
            host.prepare(("chvp",))
        kwargs["constraints"] = constraints
    callback = None
    if monitor.needed:
        callback = monitor.x_only() if spec.callback == "x" else monitor.intermediate()
    return so.minimize(
        x0=_start(host, bounds),
        method=spec.name,
        callback=callback,
        options=scipy_options,
        **kwargs,
    )


def _tolerances(spec: MethodSpec, method_options: dict, gtol, ftol) -> dict:
    """The method's scipy options with solve's gtol / ftol where scipy tests them itself."""
    out = dict(method_options)
    if gtol is not None and spec.native_gtol:
        out["gtol"] = gtol
    if ftol is not None and spec.native_ftol:
        # Same definition: it replaces scipy's default (2.2e-9) instead of adding a test.
        out["ftol"] = ftol
    elif ftol is not None and spec.constrained_ftol and "ftol" not in out:
        # SLSQP's own test, |f_k - f_k+1| < ftol absolute (1e-6 by default), would end the
        # run, with success, long before a user's tighter relative ftol holds.
        out["ftol"] = ftol
    elif gtol is not None and spec.native_ftol:
        # The user asked for a gradient test only: scipy's default ftol would end the run
        # first, with success, at a gradient far above gtol.
        out["ftol"] = 0.0
    return out


def _start(host: HostProblem, bounds) -> np.ndarray:
    # scipy clips (and some methods warn about) a start outside the bounds; do it openly.
    return host.x0 if bounds is None else np.clip(host.x0, bounds[0], bounds[1])


def _local_minimizer(
    host: HostProblem,
    local_spec: MethodSpec,
    local_options: dict,
    gtol: float | None,
    bounds,
    constraints,
) -> dict:
    kwargs = _derivative_kwargs(host, local_spec)
    kwargs.pop("fun")
    kwargs["method"] = local_spec.name
    options = _tolerances(local_spec, local_options, gtol, None)
    if options:
        kwargs["options"] = options
    if bounds is not None:
        from scipy.optimize import Bounds

        kwargs["bounds"] = Bounds(*bounds)
    if constraints:
        kwargs["constraints"] = constraints
    return kwargs


def _global(problem, algorithm, options, host, monitor, bounds) -> OptimizeResult:
    import scipy.optimize as so

    spec = algorithm.spec
    opts = dict(algorithm.options)
    budget = iteration_budget(algorithm, options["maxiters"])
    if budget.by_solve:
        opts[spec.maxiter_name] = budget.scipy_value
    if spec.key != "basinhopping" and (bounds is None or not np.all(np.isfinite(bounds))):
        raise ValueError(
            f"solve: ScipyGlobal(method={spec.name!r}) searches a box, so it needs finite "
            "`bounds` on every variable; got "
            f"{'no bounds' if bounds is None else 'bounds with infinite entries'}. Give them, "
            "e.g. OptimizationProblem(f, x0, bounds=(-5.0, 5.0)), or use "
            "ScipyGlobal(method='basinhopping'), which needs none."
        )
    box = None if bounds is None else so.Bounds(*bounds)
    constraints = _nonlinear_constraint(host, spec)
    if spec.key == "differential_evolution":
        host.prepare(("f", "fg"))

        def polish(_f, x, bounds=None, constraints=()):
            # scipy's polish is L-BFGS-B / trust-constr with finite differences; use JAX.
            method = "trust-constr" if constraints else "L-BFGS-B"
            extra = {}
            if constraints:
                host.prepare(("hessp", "cj", "chvp"))
                extra = {
                    "hessp": host.hessp,
                    "constraints": _nonlinear_constraint(host, MINIMIZE_SPECS["trust-constr"]),
                }
            return so.minimize(
                host.fun_and_grad, x, jac=True, method=method, bounds=bounds, **extra
            )

        if opts.get("polish", True) is True:
            opts["polish"] = polish
        if constraints:
            opts["constraints"] = constraints
        func = host.fun
        if vectorized_population(opts):
            # one vmapped compiled call per generation; scipy's vectorized mode needs
            # updating='deferred' (the same trial sequence as one point per call)
            opts.update(vectorized=True, updating="deferred")
            func = host.fun_batch
            if constraints:
                opts["constraints"] = [
                    so.NonlinearConstraint(host.cons_batch, host.c_lower, host.c_upper)
                ]
        else:
            opts.pop("vectorized", None)
        return so.differential_evolution(
            func, box, x0=_start(host, bounds), callback=monitor.intermediate(), **opts
        )
    if spec.key == "dual_annealing":
        host.prepare(("fg",))
        kwargs = {"method": "L-BFGS-B", "jac": host.grad, "bounds": box}
        return so.dual_annealing(
            host.value,
            box,
            x0=_start(host, bounds),
            minimizer_kwargs=kwargs,
            callback=monitor.x_f_flag(),
            **opts,
        )
    if spec.key == "shgo":
        host.prepare(("fg",))
        # scipy's own local search when given no minimizer_kwargs: SLSQP with ftol 1e-12
        # (its default, 1e-6, stops far from the local minima shgo refines).
        kwargs = {"method": "SLSQP", "jac": host.grad, "options": {"ftol": 1e-12}}
        if constraints:
            host.prepare(("cj",))
            kwargs["constraints"] = constraints
        if options["maxtime"] is not None:
            opts.setdefault("options", {})
            opts["options"] = {**opts["options"], "maxtime": options["maxtime"]}
        return so.shgo(
            host.value,
            box,
            constraints=constraints or None,
            minimizer_kwargs=kwargs,
            callback=monitor.x_only(),
            **opts,
        )
    if spec.key == "direct":
        host.prepare(("f",))
        return so.direct(host.fun, box, callback=monitor.x_only(), **opts)
    # basinhopping
    local = opts.pop("local")
    local_spec = local.spec
    local_constraints = _nonlinear_constraint(host, local_spec)
    if local_constraints:
        host.prepare(("c",) if local_spec.key in ("cobyla", "cobyqa") else ("cj",))
        if local_spec.key == "trust-constr":
            host.prepare(("chvp",))
    kwargs = _local_minimizer(
        host, local_spec, local.options, options["gtol"], bounds, local_constraints
    )
    func = host.fun_and_grad if local_spec.needs_gradient else host.fun
    return so.basinhopping(
        func,
        _start(host, bounds),
        minimizer_kwargs=kwargs,
        callback=monitor.x_f_flag(skip_first=True),
        **opts,
    )


def vectorized_population(options: dict) -> bool:
    """Whether differential_evolution evaluates each population in one call (f, and the
    constraints where there are any): asked for (``vectorized=True``), or by default
    where nothing changes but the speed, under ``updating='deferred'`` (the trial
    sequence, and so the result, is the same); ``vectorized=False`` opts out."""
    vectorized = options.get("vectorized")
    if vectorized is None:
        vectorized = options.get("updating") == "deferred"
    return bool(vectorized)


@dataclasses.dataclass(frozen=True)
class IterationBudget:
    """The iteration budget scipy runs under, and who set it.

    Attributes:
      value: in optsolve's count (``stats.iterations``), or None where scipy has none.
      scipy_value: the same in scipy's count (``MethodSpec.maxiter_offset`` added).
      by_solve: solve's ``maxiters`` set it (it goes to scipy as ``maxiter_name``).
      by_user: the user set it (solve's maxiters or the method's own option).
      label: who set it, in words, for the MAXITERS message.
    """

    value: int | None
    scipy_value: int | None
    by_solve: bool
    by_user: bool
    label: str


def iteration_budget(algorithm: Any, maxiters: int | None) -> IterationBudget:
    """The budget of ``spec.maxiter_name``: solve's ``maxiters`` where given and smaller
    than the method's own option (``MethodSpec.own_budget``), else the method's own,
    else scipy's default."""
    spec = algorithm.spec
    name = spec.maxiter_name
    owner = f"{type(algorithm).__name__.split('(')[0]}({spec.name!r})"
    if name is None:  # optsolve counts (TNC, COBYLA)
        return IterationBudget(
            maxiters, None, False, maxiters is not None, f"solve's maxiters={maxiters}"
        )
    own = algorithm.options.get(name) if spec.own_budget else None
    if maxiters is not None and (own is None or maxiters + spec.maxiter_offset < own):
        return IterationBudget(
            maxiters, maxiters + spec.maxiter_offset, True, True, f"solve's maxiters={maxiters}"
        )
    if own is not None:
        return IterationBudget(
            own - spec.maxiter_offset,
            own,
            False,
            True,
            f"the iteration budget `{name}={own}` of {owner}",
        )
    default = spec.parameters().get(name)
    default = None if default is None or not isinstance(default.default, int) else default.default
    return IterationBudget(
        None if default is None else default - spec.maxiter_offset,
        default,
        False,
        False,
        f"the iteration budget `{name}={default}` (scipy's default) of {owner}"
        if default is not None
        else f"scipy's iteration budget of {owner}",
    )


@dataclasses.dataclass
class HostRun:
    """What one scipy run gives back to the backend.

    Attributes:
      x: the flat float64 point returned; fun: the objective there.
      code: the ReturnCode; nit, nfev, njev: iterations and evaluations (njev None for
        derivative-free methods).
      result: scipy's OptimizeResult; host: the HostProblem (to unravel x).
      history: (objectives, grad_norms, metrics, evaluations, violations)
        (Monitor.history), or None.
      detail: scipy's message, then optsolve's notes where it stopped the run or changed
        the code.
      multipliers: the constraints' multipliers that the method computed at ``x``, flat
        and in optsolve's sign (:mod:`~optsolve.backends.scipy.multipliers`), or None.
    """

    x: np.ndarray
    fun: float
    code: ReturnCode
    nit: int
    nfev: int
    njev: int | None
    result: OptimizeResult
    host: HostProblem
    history: tuple | None  # Monitor.history's
    detail: str
    multipliers: np.ndarray | None = None


_STOPPED_BY_CALLBACK = "`callback` raised `StopIteration`."
# global methods that stop only when their iteration count is used up (or at maxfun)
_ENDS_ONLY_BY_ITERATIONS = ("dual_annealing", "basinhopping", "shgo")


def run_host(
    problem: OptimizationProblem,
    algorithm: Any,
    options: dict,
    p_weak: tuple[bool, ...] | None = None,
) -> HostRun:
    """Run scipy on concrete inputs (``options``: ``scipy_backend._plain_options``)."""
    spec = algorithm.spec
    host = HostProblem(problem, p_weak)
    host.reject = options.get("nonfinite") == "reject"
    bounds = _bounds(problem)
    own_maxiters = options["maxiters"] if spec.maxiter_name is None else None
    # Newton-CG has no gradient test; the trust-region methods test the 2-norm (>= the
    # infinity norm solve's gtol means), so optsolve tests the infinity norm itself.
    own_gtol = options["gtol"] if (spec.key == "newton-cg" or spec.gtol_2norm) else None
    monitor = Monitor(host, options, spec, own_maxiters, own_gtol, bounds)
    runner = _minimize if algorithm._kind == "minimize" else _global
    result = _run(runner, problem, algorithm, options, host, monitor, bounds)
    notes = [scipy_message(result)]
    if monitor.stopped_by is not None and notes[0] == _STOPPED_BY_CALLBACK:
        # scipy's message then only says that optsolve's callback stopped it
        notes[0] = f"stopped by {monitor.stopped_by}"
    # L-BFGS-B's ftol is the user's when given: its success is then the user's test too.
    gtol = None if spec.native_ftol and options["ftol"] is not None else options["gtol"]
    x, fun, code = _outcome(algorithm, result, monitor, host, bounds, gtol, notes)
    if result.get("nit"):
        monitor.count_first_iterations()  # a run that ended before its first callback
    nit = result.get("nit")
    if (
        nit is None
        or spec.monitor_counts
        or (monitor.reason is not None and not spec.callback_per_evaluation)
    ):
        # what the callback saw: scipy's nit counts otherwise here. (COBYQA's callback
        # counts evaluations: its nit stays scipy's, a callback stop's included.)
        nit = monitor.k
    budget = iteration_budget(algorithm, options["maxiters"])
    if (
        code == ReturnCode.SUCCESS
        and spec.key in _ENDS_ONLY_BY_ITERATIONS
        and budget.by_user
        and int(nit) >= budget.value
    ):
        # scipy calls the end of these methods' iteration budget a success; a budget the
        # user set (maxiters or the method's own) that ends the run is MAXITERS, as on
        # every other method
        code = ReturnCode.MAXITERS
    if (
        code == ReturnCode.MAXITERS
        and monitor.reason in (None, ReturnCode.MAXITERS)
        and budget_option(spec.key, result) in (None, spec.maxiter_name)
    ):
        notes.append(
            f"{budget.label} ended the run"
            + (
                "; dual_annealing has no convergence test: every run ends with its budget"
                if spec.key == "dual_annealing"
                else ""
            )
        )
    # (scipy's vectorized nfev counts calls of the population; optsolve counts points)
    nfev = host.n_f if host.batched else int(result.get("nfev", host.n_f))
    njev = None
    if spec.needs_gradient:
        njev = int(result["njev"]) if result.get("njev") is not None else host.n_g
    monitor.finish(int(nit), fun)
    history = None if monitor.objectives is None else monitor.history(x, fun)
    detail = "; ".join(n for n in notes if n)
    x, fun = monitor.kept(x, fun)
    # scipy's multipliers belong to its own point, not to one optsolve returned instead
    lam = (
        solver_multipliers(spec.key, result, host)
        if host.n_cons and np.array_equal(x, np.asarray(result.x, dtype=np.float64))
        else None
    )
    return HostRun(x, fun, code, int(nit), nfev, njev, result, host, history, detail, lam)


def _run(
    runner, problem, algorithm, options, host: HostProblem, monitor: Monitor, bounds
) -> OptimizeResult:
    """scipy's result, or optsolve's own where it stopped the run or scipy raised on
    numerical trouble (sets ``monitor.reason`` then). The user's exceptions propagate."""
    caught: list[warnings.WarningMessage] = []
    try:
        # scipy's run-time warnings (a failed line search, ...) are what its status and
        # message already say; they are kept in original.warnings, not re-raised.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = runner(problem, algorithm, options, host, monitor, bounds)
    except Stop:
        result = _own_result(monitor, host, "stopped by optsolve: " + monitor.reason.message)
    except (ValueError, TypeError) as err:
        # scipy's own complaint about NaN/inf values becomes FAILURE; anything else, and
        # anything the user's callback raised, propagates.
        if not host.nonfinite or monitor.user_raised:
            raise
        result = _own_result(monitor, host, f"scipy raised {type(err).__name__}: {err}")
        monitor.reason = ReturnCode.FAILURE
    except (ArithmeticError, np.linalg.LinAlgError) as err:
        if monitor.user_raised:
            raise
        result = _own_result(monitor, host, f"scipy raised {type(err).__name__}: {err}")
        monitor.reason = ReturnCode.FAILURE
    except KeyboardInterrupt:
        # Ctrl-C ends the run, not the program: the last completed iterate comes back.
        result = _own_result(monitor, host, "interrupted (KeyboardInterrupt)")
        monitor.reason = ReturnCode.INTERRUPTED
    result["warnings"] = [str(w.message) for w in caught]
    return result


def _outcome(
    algorithm,
    result: OptimizeResult,
    monitor: Monitor,
    host: HostProblem,
    bounds,
    gtol: float | None,
    notes: list[str],
) -> tuple[np.ndarray, float, ReturnCode]:
    """(x, f, ReturnCode) of the run; appends optsolve's reasons to ``notes``.

    Rules on top of scipy's status, in order: a stop optsolve requested wins; a non-finite
    evaluation anywhere in the run turns SUCCESS / MAXITERS / STALLED into FAILURE (with
    the last finite iterate); constraints violated at the end give INFEASIBLE, the
    violation in the message; trust-constr's success on its barrier subproblem short of
    the constrained optimum is STALLED (:func:`_barrier_left_open`); a success on a test
    of scipy's own at a gradient above ``gtol`` (the user's, None where every test scipy
    runs is one the user set) is STALLED.
    """
    spec = algorithm.spec
    if result.get("x") is None or result.get("fun") is None:
        # shgo found no feasible point ("Failed to find a feasible minimizer point"): it
        # returns none, so the run's own last point stands, and the rules below judge it
        result.x, result.fun = monitor.last or host.last_finite or (host.x0, np.nan)
    x = np.asarray(result.x, dtype=np.float64)
    fun = float(np.asarray(result.fun))
    if monitor.reason is not None:
        code = monitor.reason
        if monitor.last is not None:
            # The iterate the stopping test (or the user's callback) saw, whatever the
            # method then reports (PRIMA's COBYLA returns its best point, not its last).
            x, fun = monitor.last
    elif algorithm._kind == "least_squares":
        code = least_squares_retcode(result.status)
    elif algorithm._kind == "minimize":
        success = bool(result.get("success", True))
        if spec.key == "cobyla" and not success and "catol" not in algorithm.options:
            # scipy's flag judges COBYLA's maxcv by catol's default, sqrt(eps) ~ 1.5e-8
            # absolute, finer than COBYLA resolves a curved constraint at its default final
            # trust radius (tol = 1e-4: linear models over a simplex of that radius are off by
            # ~rho^2); the violation check below judges it as it judges every method. A catol
            # the user gave is the user's test: its verdict stands.
            success = True
            notes.append(
                f"optsolve judges the constraints by FEASIBILITY_TOL "
                f"({FEASIBILITY_TOL:g}, relative to max(1, |bound|)), not by "
                "COBYLA's default catol (sqrt(eps), absolute)"
            )
        code = minimize_retcode(spec.key, result.status, success)
    else:
        code = global_retcode(spec.key, result)
    if not (np.isfinite(fun) and np.all(np.isfinite(x))):
        code = ReturnCode.FAILURE
        last = monitor.last or host.last_finite
        x, fun = last if last is not None else (host.x0, fun)
    if host.nonfinite:
        notes.append(host.nonfinite_note())
    if host.nonfinite and not host.reject:
        if code in (ReturnCode.SUCCESS, ReturnCode.MAXITERS, ReturnCode.STALLED):
            code = ReturnCode.FAILURE
    elif (
        (bounds is not None or host.constraints)
        and code != ReturnCode.TERMINATED
        and (violation := host.violation(x, bounds)) > FEASIBILITY_TOL
    ):
        # Violated constraints at the end outrank why the method stopped (a failed line
        # search on incompatible constraints is SLSQP's usual way to say it), and the
        # message says by how much: scipy's own words rarely do.
        code = ReturnCode.INFEASIBLE
        notes.append(
            f"largest violation of the constraints and bounds at the returned point "
            f"{violation:.3g} (relative to max(1, |bound|)) > FEASIBILITY_TOL "
            f"{FEASIBILITY_TOL:g}"
        )
    elif code == ReturnCode.SUCCESS and _barrier_left_open(algorithm, result, notes):
        code = ReturnCode.STALLED
    elif (
        code == ReturnCode.SUCCESS
        and gtol is not None
        and monitor.reason is None
        and not host.constraints
        and not stopped_by_own_gtol(spec.key, result)
    ):
        code = _gtol_holds(x, host, bounds, gtol, notes)
    if code == ReturnCode.MAXITERS:
        option = budget_option(spec.key, result)
        if option is not None and option != spec.maxiter_name:
            notes.append(
                f"scipy's evaluation budget `{option}` ended the run, not maxiters: "
                f"raise it with {type(algorithm).__name__.split('(')[0]}("
                f"{spec.name!r}, {option}=...)"
            )
    return x, fun, code


def _barrier_left_open(algorithm, result: OptimizeResult, notes: list[str]) -> bool:
    """Whether trust-constr claimed success on its barrier subproblem, not on the problem.

    With inequalities or bounds trust-constr runs an interior-point method
    (``tr_interior_point``) whose ``gtol`` test (status 1) reads the optimality and the
    violation of the current barrier subproblem, at whatever barrier parameter mu it has
    reached (scipy 1.17, ``minimize_trustregion_constr``: only its ``xtol`` test, status
    2, also requires mu < ``barrier_tol``). The subproblem's optimum lies inside the
    feasible set, its objective above the constrained optimum's by about mu per active
    inequality (HS35 at scipy's defaults: mu 3.2e-5, f 3.2e-5 above f*); in the
    constrained census this made most of trust-constr's false SUCCESS. The success stands
    where that gap is within the objective's share of the contract, mu <=
    ``BARRIER_GAP_TOL`` (1 + |f|) (the census's "solved": within 1e-6 (1 + |f*|)), or
    within a larger ``barrier_tol`` the user gave. Appends why where it does not."""
    if (
        algorithm.spec.key != "trust-constr"
        or result.get("status") != 1
        or result.get("method") != "tr_interior_point"
    ):
        return False
    mu = result.get("barrier_parameter")
    bar = max(
        BARRIER_GAP_TOL * (1 + abs(float(result.get("fun", 0.0)))),
        algorithm.options.get("barrier_tol", 0.0),
    )
    if mu is None or mu <= bar:
        return False
    notes.append(
        f"trust-constr's gtol test held for its barrier subproblem with the barrier "
        f"parameter at {mu:.3g} > {bar:.3g}: the constrained optimum is not reached "
        f"(f is typically above it by about that much); a smaller gtol takes the "
        f"barrier further down, a larger barrier_tol accepts it"
    )
    return True


def _gtol_holds(
    x: np.ndarray, host: HostProblem, bounds, gtol: float, notes: list[str]
) -> ReturnCode:
    """SUCCESS if the user's gtol holds at x (projected inf-norm), else STALLED with a note."""
    g = host.peek(x)[1]
    norm = stationarity(x, g, bounds, xp=np)
    if norm <= gtol:
        return ReturnCode.SUCCESS
    notes.append(
        f"scipy's own convergence test stopped it; gradient inf-norm {norm:.3g} > gtol {gtol:.3g}"
    )
    return ReturnCode.STALLED


def _own_result(monitor: Monitor, host: HostProblem, message: str) -> OptimizeResult:
    from scipy.optimize import OptimizeResult

    x, f = monitor.last or host.last_finite or (host.x0, np.nan)
    return OptimizeResult(
        x=x,
        fun=f,
        nit=monitor.k,
        nfev=host.n_f,
        njev=host.n_g,
        success=False,
        status=None,
        message=message,
    )
