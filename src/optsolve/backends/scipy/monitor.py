"""optsolve's side of a scipy run, called from scipy's callback after each iteration.

The :class:`Monitor` runs the tests scipy does not (ftol, the infinity-norm gtol where
scipy's differs, maxiters where scipy counts evaluations, maxtime, the user's callback),
records the history, advances the progress bar and counts the iterations where scipy's
``nit`` is not optsolve's count (``MethodSpec.monitor_counts``).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from optsolve.backends.scipy.compiled import FEASIBILITY_TOL, HostProblem
from optsolve.backends.scipy.options import MethodSpec
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import (
    advance_progress,
    progress_every,
    raise_if_interrupted,
    wants_grad_norm,
)
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.stationarity import stationarity

_JITTED = BoundedCache(64)


def _host_function(fn: Any):
    """``fn(x, p)`` compiled once per function, its values as float64 numpy arrays."""
    compiled = _JITTED.get_or_make(fn, lambda: jax.jit(fn))
    return lambda x, p: jax.tree_util.tree_map(
        lambda v: np.asarray(v, np.float64), jax.device_get(compiled(x, p))
    )


def _score(evaluation: Any) -> float:
    # evaluate's value is a score or (score, aux), as on the JAX-native path
    if isinstance(evaluation, (tuple, list)) and len(evaluation) == 2:
        evaluation = evaluation[0]
    if np.shape(evaluation) != ():
        raise TypeError(
            "solve: keep='best' ranks iterates by `evaluate`'s value, which must "
            "be a scalar score (lower is better) or a pair (score, aux)."
        )
    return float(evaluation)


class Stop(Exception):
    """Raised from a callback that cannot stop scipy otherwise; caught around the run."""


class Monitor:
    """optsolve's per-iteration tests, history and progress; tracks the last finite iterate.

    Args:
      host: the problem as scipy sees it.
      options: the plain options dict of the solve (see ``scipy_backend._plain_options``).
      spec: the method's spec.
      own_maxiters: maxiters where optsolve counts them, else None.
      own_gtol: gtol where optsolve tests the infinity norm itself, else None.
      bounds: the flat (lower, upper) bounds, or None.

    Attributes:
      k: iterations seen (callback calls).
      last: (x, f) of the last finite iterate seen, or None.
      reason: why the monitor stopped the run, or None.
      stopped_by: which test that was, in words ("optsolve's ftol test", ...), or None.
      user_raised: the user's callback raised (its exception must reach the user).
      objectives, grad_norms: the history (f and projected gradient inf-norm at x0 and
        each iterate) when ``options["history"]``, else None.
      metrics, evaluations: the history's metrics and evaluations (NaN where not due), one
        value per entry of ``objectives``, where asked for; else None.
      violations: the history's constraint violation (relative, as the INFEASIBLE
        verdict's) at the same iterates, for methods that take constraints; else None.
      best: (x, f, score) of the lowest-scoring iterate with ``keep="best"``, else None.
    """

    def __init__(
        self,
        host: HostProblem,
        options: dict,
        spec: MethodSpec,
        own_maxiters: int | None,
        own_gtol: float | None,
        bounds=None,
    ):
        self.host, self.spec, self.bounds = host, spec, bounds
        self.callback = options["callback"]
        self.every = options["callback_every"]
        self.pass_grad_norm = self.callback is not None and wants_grad_norm(self.callback)
        self.ftol = None if spec.native_ftol else options["ftol"]
        # how feasible a point must be for optsolve's ftol test to end a constrained run:
        # where the method's own test also takes ftol as its feasibility bar
        # (MethodSpec.constrained_ftol), that bar, else the end-of-run verdict's
        self.feasibility_bar = FEASIBILITY_TOL
        if spec.constrained_ftol and self.ftol is not None:
            self.feasibility_bar = min(FEASIBILITY_TOL, self.ftol)
        self.gtol = own_gtol
        self.maxiters = own_maxiters
        self.deadline = (
            None if options["maxtime"] is None else time.perf_counter() + options["maxtime"]
        )
        self.progress = bool(options.get("progress"))
        self.progress_every = progress_every(options["maxiters"])
        self.k = 0
        self.prev_f: float | None = None
        self.prev_x: np.ndarray | None = None
        self.last: tuple[np.ndarray, float] | None = None
        self.reason: ReturnCode | None = None
        self.stopped_by: str | None = None  # which of optsolve's tests set ``reason``
        self.user_raised = False
        self.objectives: list[float] | None = None
        self.grad_norms: list[float] | None = None
        history = bool(options.get("history"))
        self.metrics_fn = (
            _host_function(options["metrics"])
            if history and options.get("metrics") is not None
            else None
        )
        self.evaluate_fn = (
            _host_function(options["evaluate"]) if options.get("evaluate") is not None else None
        )
        self.eval_every = options.get("eval_every", 1)
        self.keep_best = options.get("keep") == "best"
        self.metrics: list | None = [] if self.metrics_fn is not None else None
        self.evaluations: list | None = [] if history and self.evaluate_fn is not None else None
        self.violations: list[float] | None = [] if history and spec.takes_constraints else None
        self.best: tuple[np.ndarray, float, float] | None = None
        self._not_evaluated = None  # evaluate's value with NaN leaves (iterates not due)
        if history or self.keep_best:
            f0, g0 = host.peek(host.x0, history and spec.needs_gradient)
            if history:
                self.objectives = [f0]
                self.grad_norms = [self._norm_of(host.x0, g0)]
                self._record_violation(host.x0)
            self._track(host.x0, f0, 0)
        if spec.first_iteration and (history or self.keep_best):
            # the initial simplex's evaluations: its best vertex is iteration 1's iterate
            host.watch_first = host.n + 1

    @property
    def needed(self) -> bool:
        """Whether scipy must call the monitor: a per-iteration test, callback, history or
        progress bar is on, or optsolve counts the method's iterations (COBYLA reports no
        ``nit``; see ``MethodSpec.monitor_counts``). Otherwise scipy runs without one."""
        return (
            self.callback is not None
            or self.ftol is not None
            or self.gtol is not None
            or self.maxiters is not None
            or self.deadline is not None
            or self.objectives is not None
            or self.progress
            or self.keep_best
            or self.spec.key == "cobyla"
            or self.spec.monitor_counts
        )

    def record(self, x: np.ndarray, f: float) -> bool:
        """Account one iteration at (x, f); True when the run must stop."""
        raise_if_interrupted()
        self.count_first_iterations()
        self.k += 1
        x = np.array(x, dtype=np.float64)
        if np.isfinite(f) and np.all(np.isfinite(x)):
            self.last = (x, float(f))
        grad_norm = None
        if self.objectives is not None:
            grad_norm = self.grad_norm(x)
            self.objectives.append(float(f))
            self.grad_norms.append(grad_norm)
            self._record_violation(x)
        if self.objectives is not None or self.keep_best:
            self._track(x, float(f), self.k)
        if self.progress and self.spec.callback_per_iteration and self.k % self.progress_every == 0:
            advance_progress(self.k, f, grad_norm)
        # The user's callback sees every (every-th) iteration, the last one included; the
        # tests then decide in the compiled driver's order (iterative.py): convergence,
        # the callback's request, maxiters, maxtime.
        stop = False
        if self.callback is not None and self.k % self.every == 0:
            extra = (
                (self.grad_norm(x) if grad_norm is None else grad_norm,)
                if self.pass_grad_norm
                else ()
            )
            try:
                stop = bool(
                    self.callback(self.k, self.host.unravel_numpy(x), np.float64(f), *extra)
                )
            except Exception:
                self.user_raised = True  # so that it propagates, whatever its type
                raise
        converged = self._converged(x, float(f))
        if converged:
            self.reason = ReturnCode.SUCCESS
        elif stop:
            self.reason, self.stopped_by = ReturnCode.TERMINATED, "the user's callback"
        elif self.maxiters is not None and self.k >= self.maxiters:
            self.reason, self.stopped_by = ReturnCode.MAXITERS, "optsolve's maxiters"
        elif self.deadline is not None and time.perf_counter() >= self.deadline:
            self.reason, self.stopped_by = ReturnCode.MAXTIME, "optsolve's maxtime"
        return self.reason is not None

    def count_first_iterations(self) -> None:
        """Count the iterations scipy performs before its first callback
        (``MethodSpec.first_iteration``), once, with their history entry: Nelder-Mead's
        initial simplex, whose iterate is its best vertex. Called at the first callback,
        or after a run that ended before any."""
        if self.k or not self.spec.first_iteration:
            return
        self.k = self.spec.first_iteration
        best = self.host.best_of_first
        if best is None:
            return
        x, f = best
        self.last = (x, f)
        if self.objectives is not None:
            self.objectives.append(f)
            self.grad_norms.append(self.grad_norm(x))
            self._record_violation(x)
        if self.objectives is not None or self.keep_best:
            self._track(x, f, self.k)

    def _record_violation(self, x: np.ndarray) -> None:
        if self.violations is not None:
            self.violations.append(self.host.violation(np.asarray(x, np.float64), self.bounds))

    def _track(self, x: np.ndarray, f: float, k: int) -> None:
        """Metrics, the evaluation where due, and the best iterate, at iterate ``k``."""
        point = None
        if self.metrics_fn is not None or self.evaluate_fn is not None:
            point = self.host.unravel_numpy(x)
        if self.metrics_fn is not None:
            self.metrics.append(self.metrics_fn(point, self.host.p))
        evaluation = None
        if self.evaluate_fn is not None and k % self.eval_every == 0:
            evaluation = self.evaluate_fn(point, self.host.p)
            if self._not_evaluated is None:
                self._not_evaluated = jax.tree_util.tree_map(
                    lambda v: np.full(np.shape(v), np.nan), evaluation
                )
        if self.evaluations is not None:
            self.evaluations.append(self._not_evaluated if evaluation is None else evaluation)
        if self.keep_best:
            score = (
                f
                if self.evaluate_fn is None
                else (None if evaluation is None else _score(evaluation))
            )
            if (
                score is not None
                and np.isfinite(score)
                and np.isfinite(f)
                and (self.best is None or score < self.best[2])
            ):
                self.best = (np.array(x, dtype=np.float64), f, score)

    def kept(self, x: np.ndarray, fun: float) -> tuple[np.ndarray, float]:
        """The iterate the run returns: (x, fun), or with ``keep="best"`` the best one seen
        where it scores lower than (x, fun)."""
        if self.best is None:
            return x, fun
        if self.evaluate_fn is None:
            score = fun
        else:
            score = _score(self.evaluate_fn(self.host.unravel_numpy(x), self.host.p))
        if np.isfinite(score) and np.isfinite(fun) and score <= self.best[2]:
            return x, fun
        return self.best[0], self.best[1]

    def _converged(self, x: np.ndarray, f: float) -> bool:
        """optsolve's own ftol and gtol tests at the new iterate."""
        converged = False
        # Only an iteration that moved x tests ftol: Nelder-Mead's best vertex or a rejected
        # trust-region step leave f unchanged without any convergence.
        moved = self.prev_x is not None and bool(np.any(x != self.prev_x))
        if self.ftol is not None and self.prev_f is not None and moved:
            scale = max(abs(self.prev_f), abs(f), 1.0)
            converged = abs(self.prev_f - f) <= self.ftol * scale and self._feasible(x)
            self.stopped_by = "optsolve's ftol test" if converged else None
        if not converged and self.gtol is not None:
            converged = bool(np.max(np.abs(self.host.grad(x))) <= self.gtol)
            self.stopped_by = "optsolve's gtol test (gradient inf-norm)" if converged else None
        self.prev_f = f
        self.prev_x = x
        return converged

    def _feasible(self, x: np.ndarray) -> bool:
        """Whether x satisfies the constraints and bounds (to ``feasibility_bar``): on a constrained
        problem f may be flat where they are violated (a constant objective, a feasibility problem),
        and a test on f alone would end the run there, INFEASIBLE, where the method would have gone
        on to a feasible optimum."""
        if not self.host.constraints and self.bounds is None:
            return True
        return self.host.violation(x, self.bounds) <= self.feasibility_bar

    def history(self, x: np.ndarray, fun: float) -> tuple:
        """(objectives, grad_norms, metrics, evaluations, violations) as float64 arrays
        (metrics and evaluations pytrees of them; those three None where not recorded),
        the last entry at the returned point
        (x, fun): differential_evolution's polish, direct's and basinhopping's best point
        and SLSQP's accepted iterate at maxiters differ from the last point the callback
        saw."""
        objectives = np.asarray(self.objectives, np.float64)
        grad_norms = np.asarray(self.grad_norms, np.float64)
        metrics, evaluations = self.metrics, self.evaluations
        violations = None if self.violations is None else np.asarray(self.violations, np.float64)
        if self.k > 0 and (self.last is None or not np.array_equal(self.last[0], x)):
            objectives[-1] = fun
            grad_norms[-1] = self.grad_norm(x)
            if violations is not None:
                violations[-1] = self.host.violation(x, self.bounds)
            point = self.host.unravel_numpy(x)
            if metrics:
                metrics = metrics[:-1] + [self.metrics_fn(point, self.host.p)]
            if evaluations and self.k % self.eval_every == 0:
                evaluations = evaluations[:-1] + [self.evaluate_fn(point, self.host.p)]
        stack = lambda values: (
            None if values is None else jax.tree_util.tree_map(lambda *v: np.stack(v), *values)
        )
        return objectives, grad_norms, stack(metrics), stack(evaluations), violations

    def finish(self, iterations: int, objective: float) -> None:
        """The bar's last update, to the run's final iteration count."""
        if self.progress:
            advance_progress(iterations, objective, None)

    def grad_norm(self, x: np.ndarray) -> float:
        """The projected gradient's inf-norm at x; NaN for derivative-free methods, which
        never compute a gradient."""
        if not self.spec.needs_gradient:
            return float("nan")
        return self._norm_of(x, self.host.peek(x, True)[1])

    def _norm_of(self, x: np.ndarray, g: np.ndarray | None) -> float:
        if g is None or not self.spec.needs_gradient:
            return float("nan")
        return stationarity(x, g, self.bounds, xp=np)

    # The callback shapes scipy's methods call.
    def intermediate(self):
        """``callback(intermediate_result)``: StopIteration stops scipy."""

        def callback(intermediate_result):  # scipy dispatches on this parameter name
            if self.record(intermediate_result.x, float(intermediate_result.fun)):
                raise StopIteration

        return callback

    def x_only(self):
        """``callback(xk)`` (TNC, shgo, direct): optsolve's own exception stops scipy."""

        def callback(xk):
            f = self.host.value_at(np.asarray(xk), self.spec.needs_gradient)
            if self.record(xk, f):
                raise Stop

        return callback

    def x_f_flag(self, skip_first: bool = False):
        """``callback(x, f, flag)`` (basinhopping, dual_annealing): True stops scipy.

        ``skip_first``: basinhopping calls it once before its first iteration, with the
        minimum of the initial local search; that call is no iteration."""
        calls = [0]

        def callback(x, f, _context):
            calls[0] += 1
            if skip_first and calls[0] == 1:
                return False
            return self.record(x, float(f))

        return callback
