"""One scipy run on concrete inputs: scipy called with JAX derivatives, optsolve's
per-iteration tests (ftol, maxtime, the callback, ...), and the result mapped to a
ReturnCode. Used by :mod:`.scipy_backend` directly, or from inside ``jax.pure_callback``.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import jax
import numpy as np
import scipy.optimize as so
from scipy.optimize import Bounds, NonlinearConstraint, OptimizeResult

from optsolve.backends.scipy_compiled import HostProblem
from optsolve.backends.scipy_options import MINIMIZE_SPECS, MethodSpec
from optsolve.backends.scipy_retcodes import global_retcode, minimize_retcode
from optsolve.solve_api.host import wants_grad_norm
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import ReturnCode

# Constraints (and bounds) count as violated at the end beyond this, relative to
# max(1, |bound|): looser than the methods' own tolerances (COBYLA's catol = sqrt(eps),
# trust-constr's 1e-8), so a converged run is never reported INFEASIBLE by accident.
FEASIBILITY_TOL = 1e-6


class _Stop(Exception):
    """Raised from a callback that cannot stop scipy otherwise; caught around the run."""


class _Monitor:
    """optsolve's per-iteration tests: ftol, gtol (where optsolve runs it), maxiters
    (where counted by optsolve), maxtime and the user's callback; tracks the last
    finite iterate. ``reason`` is why it stopped the run (None when it did not).
    """

    def __init__(self, host: HostProblem, options: dict, spec: MethodSpec,
                 own_maxiters: int | None, own_gtol: float | None, bounds=None):
        self.host, self.spec, self.bounds = host, spec, bounds
        self.callback = options["callback"]
        self.every = options["callback_every"]
        self.pass_grad_norm = self.callback is not None and wants_grad_norm(self.callback)
        self.ftol = None if spec.native_ftol else options["ftol"]
        self.gtol = own_gtol
        self.maxiters = own_maxiters
        self.deadline = (None if options["maxtime"] is None
                         else time.perf_counter() + options["maxtime"])
        self.k = 0
        self.prev_f: float | None = None
        self.prev_x: np.ndarray | None = None
        self.last: tuple[np.ndarray, float] | None = None
        self.reason: ReturnCode | None = None

    @property
    def needed(self) -> bool:
        """Whether scipy must call the monitor: a per-iteration test or callback is on, or the
        method does not count its iterations (COBYLA reports no ``nit``). Otherwise scipy runs
        without a callback, which costs ~15 us an iteration for nothing."""
        return (self.callback is not None or self.ftol is not None or self.gtol is not None
                or self.maxiters is not None or self.deadline is not None
                or self.spec.key == "cobyla")

    def record(self, x: np.ndarray, f: float) -> bool:
        """Account one iteration at (x, f); True when the run must stop."""
        self.k += 1
        x = np.array(x, dtype=np.float64)
        if np.isfinite(f) and np.all(np.isfinite(x)):
            self.last = (x, float(f))
        # The user's callback sees every (every-th) iteration, the last one included; the
        # tests then decide in the compiled driver's order (iterative.py): convergence,
        # the callback's request, maxiters, maxtime.
        stop = False
        if self.callback is not None and self.k % self.every == 0:
            extra = (self._grad_norm(x),) if self.pass_grad_norm else ()
            stop = bool(self.callback(self.k, self.host.unravel_numpy(x), np.float64(f), *extra))
        converged = False
        # Only an iteration that moved x tests ftol: Nelder-Mead's best vertex or a rejected
        # trust-region step leave f unchanged without any convergence.
        moved = self.prev_x is not None and bool(np.any(x != self.prev_x))
        if self.ftol is not None and self.prev_f is not None and moved:
            scale = max(abs(self.prev_f), abs(f), 1.0)
            converged = abs(self.prev_f - f) <= self.ftol * scale
        if not converged and self.gtol is not None:
            converged = bool(np.max(np.abs(self.host.grad(x))) <= self.gtol)
        self.prev_f = float(f)
        self.prev_x = x
        if converged:
            self.reason = ReturnCode.SUCCESS
        elif stop:
            self.reason = ReturnCode.TERMINATED
        elif self.maxiters is not None and self.k >= self.maxiters:
            self.reason = ReturnCode.MAXITERS
        elif self.deadline is not None and time.perf_counter() >= self.deadline:
            self.reason = ReturnCode.MAXTIME
        return self.reason is not None

    def _grad_norm(self, x: np.ndarray) -> np.float64:
        """||grad f(x)||_inf for a four-argument callback (projected onto the bounds); NaN
        for derivative-free methods, which never compute a gradient."""
        if not self.spec.needs_gradient:
            return np.float64(np.nan)
        g = self.host.grad(x)  # the memo: the iterate is usually the last point evaluated
        if self.bounds is not None:
            lo, up = self.bounds
            g = np.where(((x <= lo) & (g > 0)) | ((x >= up) & (g < 0)), 0.0, g)
        return np.float64(np.max(np.abs(g), initial=0.0))

    # The callback shapes scipy's methods call.
    def intermediate(self):
        def callback(intermediate_result):  # scipy dispatches on this parameter name
            if self.record(intermediate_result.x, float(intermediate_result.fun)):
                raise StopIteration
        return callback

    def x_only(self):
        def callback(xk):
            f = self.host.value_at(np.asarray(xk), self.spec.needs_gradient)
            if self.record(xk, f):
                raise _Stop
        return callback

    def x_f_flag(self):
        def callback(x, f, _context):
            return self.record(x, float(f))
        return callback


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(leaf, np.float64))
                           for leaf in jax.tree_util.tree_leaves(tree)])


def _bounds(problem: OptimizationProblem) -> tuple[np.ndarray, np.ndarray] | None:
    """The problem's bounds as two flat float64 vectors (x0's ravel order), or None."""
    if not problem.has_bounds:
        return None
    lower, upper = problem.bounds
    return _flat(lower), _flat(upper)


def _nonlinear_constraint(host: HostProblem, spec: MethodSpec) -> list:
    if not host.constraints:
        return []
    if spec.key in ("cobyla", "cobyqa", "differential_evolution"):
        return [NonlinearConstraint(host.cons, host.c_lower, host.c_upper)]
    if spec.key == "slsqp":
        # SLSQP takes equalities and inequalities as separate constraints (scipy warns
        # otherwise); both parts share one value-and-Jacobian evaluation.
        eq = host.c_lower == host.c_upper
        parts = []
        for mask in (eq, ~eq):
            if mask.any():
                parts.append(NonlinearConstraint(
                    lambda x, m=mask: host.cons_value(x)[m], host.c_lower[mask],
                    host.c_upper[mask], jac=lambda x, m=mask: host.cons_jac(x)[m]))
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
    spec = algorithm.spec
    kwargs = _derivative_kwargs(host, spec)
    scipy_options = dict(algorithm.options)
    if options["maxiters"] is not None and spec.maxiter_name is not None:
        scipy_options[spec.maxiter_name] = options["maxiters"]
    if options["gtol"] is not None and spec.native_gtol:
        scipy_options["gtol"] = options["gtol"]
    if options["ftol"] is not None and spec.native_ftol:
        # Same definition: it replaces scipy's default (2.2e-9) instead of adding a test.
        scipy_options["ftol"] = options["ftol"]
    if bounds is not None:
        kwargs["bounds"] = Bounds(*bounds)
    constraints = _nonlinear_constraint(host, spec)
    if constraints:
        host.prepare(("c",) if spec.key in ("cobyla", "cobyqa") else ("cj",))
        if spec.key == "trust-constr":
            host.prepare(("chvp",))
        kwargs["constraints"] = constraints
    callback = None
    if monitor.needed:
        callback = monitor.x_only() if spec.callback == "x" else monitor.intermediate()
    return so.minimize(x0=_start(host, bounds), method=spec.name, callback=callback,
                       options=scipy_options, **kwargs)


def _start(host: HostProblem, bounds) -> np.ndarray:
    # scipy clips (and some methods warn about) a start outside the bounds; do it openly.
    return host.x0 if bounds is None else np.clip(host.x0, bounds[0], bounds[1])


def _local_minimizer(host: HostProblem, local_spec: MethodSpec, local_options: dict,
                     gtol: float | None, bounds, constraints) -> dict:
    kwargs = _derivative_kwargs(host, local_spec)
    kwargs.pop("fun")
    kwargs["method"] = local_spec.name
    options = dict(local_options)
    if gtol is not None and local_spec.native_gtol:
        options["gtol"] = gtol
    if options:
        kwargs["options"] = options
    if bounds is not None:
        kwargs["bounds"] = Bounds(*bounds)
    if constraints:
        kwargs["constraints"] = constraints
    return kwargs


def _global(problem, algorithm, options, host, monitor, bounds) -> OptimizeResult:
    spec = algorithm.spec
    opts = dict(algorithm.options)
    maxiters = options["maxiters"]
    if spec.maxiter_name is not None and maxiters is not None:
        opts[spec.maxiter_name] = maxiters
    if spec.key != "basinhopping" and (bounds is None or not np.all(np.isfinite(bounds))):
        raise ValueError(
            f"solve: ScipyGlobal(method={spec.name!r}) searches a box, so it needs finite "
            "`bounds` on every variable; got "
            f"{'no bounds' if bounds is None else 'bounds with infinite entries'}. Give them, "
            "e.g. OptimizationProblem(f, x0, bounds=(-5.0, 5.0)), or use "
            "ScipyGlobal(method='basinhopping'), which needs none."
        )
    box = None if bounds is None else Bounds(*bounds)
    constraints = _nonlinear_constraint(host, spec)
    if spec.key == "differential_evolution":
        host.prepare(("f", "fg"))

        def polish(_f, x, bounds=None, constraints=()):
            # scipy's polish is L-BFGS-B / trust-constr with finite differences; use JAX.
            method = "trust-constr" if constraints else "L-BFGS-B"
            extra = {}
            if constraints:
                host.prepare(("hessp", "cj", "chvp"))
                extra = {"hessp": host.hessp, "constraints": _nonlinear_constraint(
                    host, MINIMIZE_SPECS["trust-constr"])}
            return so.minimize(host.fun_and_grad, x, jac=True, method=method, bounds=bounds,
                               **extra)

        if opts.get("polish", True) is True:
            opts["polish"] = polish
        if constraints:
            opts["constraints"] = constraints
        return so.differential_evolution(host.fun, box, x0=_start(host, bounds),
                                          callback=monitor.intermediate(), **opts)
    if spec.key == "dual_annealing":
        host.prepare(("fg",))
        kwargs = {"method": "L-BFGS-B", "jac": host.grad, "bounds": box}
        return so.dual_annealing(host.value, box, x0=_start(host, bounds),
                                 minimizer_kwargs=kwargs, callback=monitor.x_f_flag(), **opts)
    if spec.key == "shgo":
        host.prepare(("fg",))
        kwargs = {"method": "SLSQP", "jac": host.grad}
        if constraints:
            host.prepare(("cj",))
            kwargs["constraints"] = constraints
        if options["maxtime"] is not None:
            opts.setdefault("options", {})
            opts["options"] = {**opts["options"], "maxtime": options["maxtime"]}
        return so.shgo(host.value, box, constraints=constraints or None,
                       minimizer_kwargs=kwargs, callback=monitor.x_only(), **opts)
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
    kwargs = _local_minimizer(host, local_spec, local.options, options["gtol"], bounds,
                              local_constraints)
    func = host.fun_and_grad if local_spec.needs_gradient else host.fun
    return so.basinhopping(func, _start(host, bounds), minimizer_kwargs=kwargs,
                           callback=monitor.x_f_flag(), **opts)


def run_host(problem: OptimizationProblem, algorithm: Any, options: dict,
             p_weak: tuple[bool, ...] | None = None) -> tuple:
    """Run scipy on concrete inputs.

    Returns:
      (x_flat float64, objective, ReturnCode, nit, nfev, njev or None, OptimizeResult, host).
    """
    spec = algorithm.spec
    host = HostProblem(problem, p_weak)
    bounds = _bounds(problem)
    own_maxiters = options["maxiters"] if spec.maxiter_name is None else None
    # Newton-CG has no gradient test; the trust-region methods test the 2-norm (>= the
    # infinity norm solve's gtol means), so optsolve tests the infinity norm itself.
    own_gtol = options["gtol"] if (spec.key == "newton-cg" or spec.gtol_2norm) else None
    monitor = _Monitor(host, options, spec, own_maxiters, own_gtol, bounds)
    runner = _minimize if algorithm._kind == "minimize" else _global
    caught: list[warnings.WarningMessage] = []
    try:
        # scipy's run-time warnings (a failed line search, ...) are what its status and
        # message already say; they are kept in original.warnings, not re-raised.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = runner(problem, algorithm, options, host, monitor, bounds)
    except _Stop:
        result = _own_result(monitor, host, "stopped by optsolve: " + monitor.reason.message)
    except (ValueError, TypeError) as err:
        if not host.nonfinite:
            raise
        result = _own_result(monitor, host, f"scipy raised {type(err).__name__}: {err}")
        monitor.reason = ReturnCode.FAILURE
    except (ArithmeticError, np.linalg.LinAlgError) as err:
        result = _own_result(monitor, host, f"scipy raised {type(err).__name__}: {err}")
        monitor.reason = ReturnCode.FAILURE
    except KeyboardInterrupt:
        # Ctrl-C ends the run, not the program: the last completed iterate comes back.
        result = _own_result(monitor, host, "interrupted (KeyboardInterrupt)")
        monitor.reason = ReturnCode.INTERRUPTED
    result["warnings"] = [str(w.message) for w in caught]

    x = np.asarray(result.x, dtype=np.float64)
    fun = float(np.asarray(result.fun))
    if monitor.reason is not None:
        code = monitor.reason
        if monitor.last is not None:
            # The iterate the stopping test (or the user's callback) saw, whatever the
            # method then reports (PRIMA's COBYLA returns its best point, not its last).
            x, fun = monitor.last
    elif algorithm._kind == "minimize":
        code = minimize_retcode(spec.key, result.status, bool(result.get("success", True)))
    else:
        code = global_retcode(spec.key, result)
    if not (np.isfinite(fun) and np.all(np.isfinite(x))):
        code = ReturnCode.FAILURE
        last = monitor.last or host.last_finite
        x, fun = (last if last is not None else (host.x0, fun))
    elif host.nonfinite and code in (ReturnCode.MAXITERS, ReturnCode.STALLED):
        # NaN/inf trial points kept scipy from converging: numerical trouble, not a budget.
        code = ReturnCode.FAILURE
    elif (bounds is not None or host.constraints) and code != ReturnCode.TERMINATED:
        # Violated constraints at the end outrank why the method stopped (a failed line
        # search on incompatible constraints is SLSQP's usual way to say it).
        if host.violation(x, bounds) > FEASIBILITY_TOL:
            code = ReturnCode.INFEASIBLE
    nit = int(result.get("nit", monitor.k) if result.get("nit") is not None else monitor.k)
    nfev = int(result.get("nfev", host.n_f))
    njev = None
    if spec.needs_gradient:
        njev = int(result["njev"]) if "njev" in result and result["njev"] is not None else host.n_g
    return x, fun, code, nit, nfev, njev, result, host


def _own_result(monitor: _Monitor, host: HostProblem, message: str) -> OptimizeResult:
    x, f = monitor.last or host.last_finite or (host.x0, np.nan)
    return OptimizeResult(x=x, fun=f, nit=monitor.k, nfev=host.n_f, njev=host.n_g,
                          success=False, status=None, message=message)
