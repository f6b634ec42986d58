"""``ScipyLeastSquares``: scipy.optimize.least_squares on a LeastSquaresProblem, with the
residuals and their Jacobian compiled from JAX.

One generated subclass per method (trf, dogbox, lm), as for ScipyMinimize, so that the
capability traits are class attributes; the run reuses the scipy family's machinery: the
host evaluations (:mod:`~optsolve.backends.scipy.residuals`, a
:class:`~optsolve.backends.scipy.compiled.HostProblem`), the per-iteration
:class:`~optsolve.backends.scipy.monitor.Monitor` (callback, maxiters, maxtime, history,
progress), the run's guard against non-finite values and Ctrl-C
(:func:`~optsolve.backends.scipy.run._run`), the outcome rules
(:func:`~optsolve.backends.scipy.run._outcome`), the status table
(:mod:`~optsolve.backends.scipy.retcodes`) and ``solve_scipy``'s eager / ``jax.pure_callback``
paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np

from optsolve.backends.scipy.backend import _make_class, _ScipyAlgorithm, solve_scipy
from optsolve.backends.scipy.losses import LOSSES, RobustCost
from optsolve.backends.scipy.monitor import Monitor, Stop
from optsolve.backends.scipy.options import (
    GLOBAL_SPECS,
    MINIMIZE_SPECS,
    MethodSpec,
    check_options,
)
from optsolve.backends.scipy.residuals import ResidualHost, number_of_residuals
from optsolve.backends.scipy.retcodes import scipy_message
from optsolve.backends.scipy.run import HostRun, _bounds, _outcome, _run, _start
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import freeze, is_traced, thaw
from optsolve.solve_api.registry import register_backend
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution

if TYPE_CHECKING:
    from scipy.optimize import OptimizeResult

_EPS = float(np.finfo(float).eps)

# gtol, ftol and xtol are solve's (scipy tests them, with scipy's definitions); maxiters is
# counted by optsolve (least_squares' only budget, max_nfev, counts evaluations and stays
# an option); the monitor always runs, since least_squares reports no iteration count.
_COMMON = dict(
    needs_gradient=True,
    native_gtol=True,
    native_ftol=True,
    native_xtol=True,
    maxiter_name=None,
    monitor_counts=True,
    owner="ScipyLeastSquares",
)
_LEAST_SQUARES = "scipy.optimize:least_squares"
LEAST_SQUARES_SPECS: dict[str, MethodSpec] = {
    s.key: s
    for s in (
        MethodSpec("trf", "trf", _LEAST_SQUARES, takes_bounds=True, **_COMMON),
        MethodSpec("dogbox", "dogbox", _LEAST_SQUARES, takes_bounds=True, **_COMMON),
        MethodSpec("lm", "lm", _LEAST_SQUARES, **_COMMON),
    )
}

_TRUST_REGION_ONLY = ("tr_solver", "tr_options")  # "relevant only for 'trf' and 'dogbox'"


def _canonical_method(method: Any) -> str:
    key = method.lower() if isinstance(method, str) else None
    if key not in LEAST_SQUARES_SPECS:
        hint = ""
        if key in MINIMIZE_SPECS or key in GLOBAL_SPECS:
            owner = "ScipyMinimize" if key in MINIMIZE_SPECS else "ScipyGlobal"
            hint = f" {method!r} is a method of {owner}, for a scalar objective."
        raise ValueError(
            f"ScipyLeastSquares: `method` must be one of 'trf', 'dogbox', 'lm'; "
            f"got {method!r}.{hint}"
        )
    return key


class ScipyLeastSquares(_ScipyAlgorithm):
    """``scipy.optimize.least_squares``: minimise ``0.5 * sum(rho(r(x, p)**2))`` over a
    :class:`~optsolve.LeastSquaresProblem`'s residuals r, with the exact Jacobian from JAX.

    One compiled residual evaluation and one compiled Jacobian (``jax.jacfwd`` when there
    are at least as many residuals as parameters, else ``jax.jacrev``) on x flattened to
    one vector (any pytree x0; a pytree of residuals is flattened too), passed to scipy as
    ``fun`` and ``jac=``: the run, its iterates and its counts are those of
    ``scipy.optimize.least_squares`` called by hand with that Jacobian.

    Args:
      method: "trf" (default; Branch, Coleman & Li, "A subspace, interior, and conjugate
        gradient method for large-scale bound-constrained minimization problems", SIAM J.
        Sci. Comput. 21, 1999), "dogbox" (Voglis & Lagaris, "A rectangular trust region
        dogleg approach for unconstrained and bound constrained nonlinear optimization",
        WSEAS 2004) or "lm" (MINPACK's Levenberg-Marquardt, Moré, "The Levenberg-Marquardt
        algorithm: implementation and theory", Numerical Analysis, LNM 630, 1978). trf and
        dogbox take bounds; lm takes none, needs at least as many residuals as parameters
        and the linear loss.
      loss: "linear" (default: 0.5 |r|^2), "soft_l1", "huber", "cauchy" or "arctan":
        scipy's rho, applied to ``(r / f_scale)**2``.
      f_scale: the robust loss's soft margin between inlier and outlier residuals
        (default 1.0; ignored by the linear loss, as in scipy).
      **scipy_options: least_squares' own options: ``x_scale``, ``max_nfev``,
        ``tr_solver`` and ``tr_options`` (trf, dogbox), ``verbose``. Not ``ftol``, ``gtol``
        or ``xtol`` (use ``solve(ftol=..., gtol=..., xtol=...)``), nor options that only
        tune finite differences (``diff_step``, ``jac_sparsity``).

    The tolerances: ``solve``'s ``gtol``, ``ftol`` and ``xtol`` (an option of ``solve``
    here, as for the other least-squares algorithms) are scipy's own, with scipy's
    definitions (gtol, trf: the inf-norm of the scaled gradient; dogbox: of the projected
    gradient; lm: the largest cosine between the residuals and the Jacobian's columns;
    ftol: the relative reduction of the cost; xtol: the step relative to x); one not given
    is scipy's default, 1e-8. A status of 1-4 (one of them holds) is SUCCESS. lm needs
    every tolerance >= machine epsilon: a smaller one (``gtol=0``: no gradient test) is
    raised to it; all three below it is a ValueError, as for trf and dogbox.
    ``maxiters`` counts iterations (trf, dogbox: scipy's own, one per callback; lm: the
    accepted steps, one per Jacobian MINPACK evaluates after x0) and ends the run with
    MAXITERS; scipy's evaluation budget ``max_nfev`` (default 100 n) ending it is
    MAXITERS too, with a note naming it. The callback, maxtime, history and progress run
    after each iteration (for lm, whose MINPACK driver takes no callback, when it asks for
    the Jacobian at a new point). Any non-finite residual or Jacobian entry gives FAILURE
    with the last finite iterate, and ``Solution.detail`` says how often; except lm's
    non-finite residuals at trial points after x0, which MINPACK rejects (its ratio test
    fails) and steps past, as scipy's run does: they are counted in the detail, and the
    run is SUCCESS where it ends at a stationary point (residuals nearly orthogonal to J's
    columns), FAILURE where MINPACK stopped against the edge of the non-finite region.
    Differences from scipy by design: x0 may be any pytree (a 2-D array is flattened, not
    refused), a complex x0 is refused centrally with TypeError (scipy: ValueError), and lm
    raises a tolerance below machine epsilon to it (scipy refuses it) unless all three are.

    Returns (through ``solve``): ``sol.objective`` is scipy's ``cost``,
    ``0.5 * sum(f_scale**2 * rho((r / f_scale)**2))`` (the robust cost, which is what is
    minimised); ``sol.stats.f_evals`` and ``grad_evals`` are scipy's ``nfev`` and ``njev``
    (residual and Jacobian evaluations); ``sol.original`` is scipy's ``OptimizeResult``
    (None inside ``jax.jit`` / ``jax.vmap``); ``sol.detail`` is scipy's message.
    ``jax.grad`` through the solution differentiates the optimality condition of that
    robust cost (:meth:`minimised_problem`). ``resume=sol`` is a warm start from ``sol.x``.

    Example:
      >>> t = jnp.linspace(0.0, 3.0, 20)
      >>> prob = LeastSquaresProblem(lambda x, y: x[0] * jnp.exp(-x[1] * t) - y,
      ...                            jnp.array([1.0, 0.5]), p=2.0 * jnp.exp(-1.3 * t))
      >>> sol = optsolve.solve(prob, optsolve.ScipyLeastSquares("trf", loss="soft_l1"))
    """

    needs_residuals: ClassVar[bool] = True
    extra_options: ClassVar[tuple[str, ...]] = ("xtol",)
    _kind = "least_squares"
    _classes: ClassVar[dict[str, type]] = {}

    def __new__(
        cls,
        method: str | None = None,
        loss: str = "linear",
        f_scale: float = 1.0,
        **scipy_options: Any,
    ):
        if cls is ScipyLeastSquares:
            cls = cls._classes[_canonical_method("trf" if method is None else method)]
        return object.__new__(cls)

    def __init__(
        self,
        method: str | None = None,
        loss: str = "linear",
        f_scale: float = 1.0,
        **scipy_options: Any,
    ):
        spec = type(self).spec
        if method is not None and _canonical_method(method) != spec.key:
            raise TypeError(f"{type(self).__name__}: got method={method!r}.")
        who = f"ScipyLeastSquares(method={spec.name!r})"
        if not isinstance(loss, str) or loss not in LOSSES:
            raise ValueError(
                f"{who}: `loss` must be one of {', '.join(map(repr, LOSSES))}; got loss={loss!r}."
            )
        if spec.key == "lm" and loss != "linear":
            raise ValueError(
                f"{who}: MINPACK's Levenberg-Marquardt minimises the plain sum "
                f"of squares, so `loss` must be 'linear'; got loss={loss!r}. Use "
                "method='trf' or 'dogbox' for a robust loss."
            )
        try:
            f_scale = float(f_scale)
        except (TypeError, ValueError):
            f_scale = None
        if f_scale is None or not np.isfinite(f_scale) or f_scale <= 0:
            raise ValueError(
                f"{who}: `f_scale` must be a positive finite number; got f_scale={f_scale!r}."
            )
        for name, value in scipy_options.items():
            if spec.key == "lm" and name in _TRUST_REGION_ONLY:
                raise TypeError(
                    f"{who}: `{name}` is not an option here: it only applies to "
                    f"the trust-region methods 'trf' and 'dogbox'; got "
                    f"{name}={value!r}."
                )
        options = check_options(spec, scipy_options)
        options.update(loss=loss, f_scale=f_scale)
        object.__setattr__(
            self, "_options", tuple(sorted((k, freeze(v)) for k, v in options.items()))
        )

    @property
    def loss(self) -> str:
        """The robust loss's name."""
        return dict(self._options)["loss"]

    @property
    def f_scale(self) -> float:
        """The robust loss's soft margin."""
        return dict(self._options)["f_scale"]

    def __repr__(self) -> str:
        defaults = {"loss": "linear", "f_scale": 1.0}
        args = "".join(
            f", {k}={thaw(v)!r}" for k, v in self._options if k not in defaults or v != defaults[k]
        )
        return f"ScipyLeastSquares(method={self.method!r}{args})"

    def minimised_problem(self, problem: Any) -> Any:
        """The problem scipy minimises: ``problem`` itself for the linear loss; for a robust
        one, a problem whose f is scipy's cost ``0.5 * sum(f_scale**2 * rho((r /
        f_scale)**2))`` (same x0, p and bounds), whose optimality condition the implicit
        adjoint differentiates."""
        residual = getattr(problem, "residual", None)
        if self.loss == "linear" or residual is None:
            return problem
        return OptimizationProblem(
            RobustCost(residual, self.loss, self.f_scale),
            problem.x0,
            problem.p,
            bounds=problem.bounds,
        )


for _spec in LEAST_SQUARES_SPECS.values():
    _make_class(ScipyLeastSquares, _spec)


# --------------------------------------------------------------------------- the run


def _trust_region_callback(monitor: Monitor):
    """trf's and dogbox's ``callback(intermediate_result)``, once per iteration; its ``fun``
    is the residual vector, its ``cost`` the objective."""

    def callback(intermediate_result):  # scipy dispatches on this parameter name
        if monitor.record(intermediate_result.x, float(intermediate_result.cost)):
            raise StopIteration

    return callback


def _lm_jacobian(host: ResidualHost, monitor: Monitor):
    """The Jacobian for lm, whose MINPACK driver (lmder) takes no callback.

    lmder evaluates the Jacobian once per iteration, at the point the previous iteration
    accepted: a call at a new point ends an iteration, so the monitor's tests run there,
    and ``Stop`` (an exception through MINPACK) ends the run with that iterate. scipy's own
    calls add none: the one at x0, and the one after lmder returns, at its final point
    (a point already recorded, or the step lmder accepted last, which this records)."""
    seen = [host.x0]

    def jac(x):
        if not np.array_equal(x, seen[0]):
            seen[0] = np.array(x, dtype=np.float64)
            if monitor.record(x, host.cost_at(x)):
                raise Stop
        return host.jacobian(x)

    return jac


def _call_least_squares(
    problem, algorithm, options, host: ResidualHost, monitor: Monitor, bounds
) -> OptimizeResult:
    """scipy.optimize.least_squares with solve's tolerances, optsolve's callback and the
    compiled residuals and Jacobian (a runner of ``scipy_run._run``)."""
    import scipy.optimize as so

    spec = algorithm.spec
    kwargs = algorithm.options  # scipy's own, loss and f_scale included
    for name in ("gtol", "ftol", "xtol"):
        if options[name] is not None:
            # lm refuses tolerances below machine epsilon; at it the test is as good as off
            kwargs[name] = max(options[name], _EPS) if spec.key == "lm" else options[name]
    if bounds is not None:
        kwargs["bounds"] = so.Bounds(*bounds)
    if spec.key == "lm":
        jac, callback = _lm_jacobian(host, monitor), None
    else:
        jac, callback = host.jacobian, _trust_region_callback(monitor)
    return so.least_squares(
        host.residuals, _start(host, bounds), jac=jac, method=spec.name, callback=callback, **kwargs
    )


def run_least_squares(
    problem: LeastSquaresProblem,
    algorithm: ScipyLeastSquares,
    options: dict,
    p_weak: tuple[bool, ...] | None = None,
) -> HostRun:
    """One least_squares run on concrete inputs (``options``: ``backend._plain_options``)."""
    spec = algorithm.spec
    host = ResidualHost(
        problem, algorithm.minimised_problem(problem), algorithm.loss, algorithm.f_scale, p_weak
    )
    host.rejects_nonfinite_trials = spec.key == "lm"
    bounds = _bounds(problem)
    monitor = Monitor(host, options, spec, options["maxiters"], None, bounds)
    result = _run(_call_least_squares, problem, algorithm, options, host, monitor, bounds)
    notes = [scipy_message(result)]
    if host.rejected:
        notes.append(
            f"the residuals were not finite at {host.rejected} of {host.n_f} "
            "evaluations, trial steps MINPACK rejected"
        )
    if monitor.stopped_by is not None and result.get("status") == -2:
        notes[0] = f"stopped by {monitor.stopped_by}"  # scipy only says its callback did
    from scipy.optimize import OptimizeResult

    # the outcome rules read the objective from `fun`, which least_squares gives the
    # residuals: a view with the cost there (sol.original stays scipy's own result)
    view = OptimizeResult(result)
    if "cost" in result:
        view["fun"] = result["cost"]
    # gtol=None: scipy's gtol is the user's, with scipy's definition (no second test here)
    x, fun, code = _outcome(algorithm, view, monitor, host, bounds, None, notes)
    if host.rejected and code == ReturnCode.SUCCESS:
        code = _judge_after_rejected_trials(host, x, notes)
    nit = monitor.k  # least_squares reports no iteration count
    nfev = int(result.get("nfev", host.n_f))
    njev = result.get("njev")
    njev = host.n_g if njev is None else int(njev)
    monitor.finish(nit, fun)
    history = None if monitor.objectives is None else monitor.history(x, fun)
    detail = "; ".join(n for n in notes if n)
    x, fun = monitor.kept(x, fun)
    return HostRun(x, fun, code, nit, nfev, njev, result, host, history, detail)


# After lm rejected non-finite trials, a stop on ftol / xtol may be MINPACK's trust region
# shrunk against the edge of the non-finite region rather than convergence: there the
# residuals keep an O(1) cosine with a column of J (0.37 in the tests), where a converged
# fit at scipy's default tolerances has about 1e-7.
_STATIONARY_COSINE = 1e-3


def _judge_after_rejected_trials(host: ResidualHost, x: np.ndarray, notes: list[str]) -> ReturnCode:
    """SUCCESS if x is stationary by scipy lm's gtol measure (the largest cosine between r
    and J's columns) to ``_STATIONARY_COSINE``, else FAILURE with a note."""
    xc = np.asarray(x, np.float64 if host._f64 else host.dtype)
    r = np.asarray(host._r(xc)[0], np.float64)
    jac = np.asarray(host._j(xc)[0], np.float64)
    norms = np.linalg.norm(jac, axis=0) * np.linalg.norm(r)
    cosine = float(np.max(np.abs(jac.T @ r) / np.where(norms > 0, norms, 1.0)))
    if cosine <= _STATIONARY_COSINE:
        return ReturnCode.SUCCESS
    notes.append(
        f"MINPACK stopped at the edge of the non-finite region, not at a stationary "
        f"point (the residuals' largest cosine with J's columns is {cosine:.2g})"
    )
    return ReturnCode.FAILURE


def _check_before_running(
    problem: OptimizationProblem, algorithm: ScipyLeastSquares, options: SolveOptions
) -> None:
    """Errors scipy would raise mid-run, raised first with the argument to change (plain
    Python errors, even under jax.jit)."""
    spec = algorithm.spec
    who = f"solve: ScipyLeastSquares(method={spec.name!r})"
    if not isinstance(problem, LeastSquaresProblem):
        return  # (refused centrally: needs_residuals)
    xtol = options.get("xtol")
    # a tolerance not given is scipy's default, 1e-8; trf and dogbox need one to stop, and
    # lm raises one below machine epsilon to it, so all of them below it is scipy's error
    given = {"ftol": options.ftol, "gtol": options.gtol, "xtol": xtol}
    if not is_traced(given) and all(v is not None and float(v) < _EPS for v in given.values()):
        raise ValueError(
            f"{who} needs one of ftol, xtol, gtol >= machine epsilon ({_EPS:.2e}) to stop; "
            f"got {', '.join(f'{k}={v!r}' for k, v in given.items())}. Give "
            "solve(..., gtol=1e-10), say."
        )
    if spec.key == "lm":
        m = number_of_residuals(problem)
        n = int(sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(problem.x0)))
        if m < n:
            raise ValueError(
                f"{who} needs at least as many residuals as parameters (MINPACK's "
                f"Levenberg-Marquardt); got {m} residuals for {n} parameters. Use "
                "ScipyLeastSquares('trf') or ScipyLeastSquares('dogbox')."
            )
        return
    if problem.has_bounds and not is_traced(problem.bounds):
        lower, upper = _bounds(problem)
        if np.any(lower >= upper):
            raise ValueError(
                f"{who} needs lower < upper on every variable (least_squares cannot hold one "
                f"fixed); got equal `bounds` at flat index "
                f"{int(np.flatnonzero(lower >= upper)[0])}. Remove that variable from x "
                "(fix it in p) or loosen its bounds."
            )


def solve_least_squares(
    problem: LeastSquaresProblem,
    algorithm: ScipyLeastSquares,
    options: SolveOptions,
    loop: Any = None,
) -> Solution:
    """The backend of ScipyLeastSquares: ``solve_scipy`` with the least_squares run."""
    _check_before_running(problem, algorithm, options)
    return solve_scipy(problem, algorithm, options, loop, host_run=run_least_squares)


register_backend(ScipyLeastSquares, solve_least_squares)
