"""What each scipy method is and takes: its capability traits and its own options.

One :class:`MethodSpec` per method; the valid option names are read from scipy's own
solver signatures, so they follow the installed scipy. Options that scipy would accept and
then ignore (a finite-difference step when JAX supplies the gradient), options ``solve``
owns (``maxiter``, mapped ``gtol``) and deprecated ones are errors that say what to do.

The table names scipy's functions by path and imports them when their options are first
read, so that the scipy family's classes (and ``import optsolve``) do not import scipy.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any


@functools.cache
def scipy_function(path: str) -> Callable[..., Any]:
    """The scipy function at ``path`` ("module:name"), imported on first use."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@functools.cache
def _no_value() -> Any:
    """The marker scipy uses for deprecated keyword defaults."""
    try:
        from scipy._lib.deprecation import _NoValue
    except ImportError:  # pragma: no cover
        return object()
    return _NoValue


_O = "scipy.optimize:"
_M = "scipy.optimize._minimize:_minimize_"
_TRUST_REGION = "scipy.optimize._trustregion:_minimize_trust_region"


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A scipy method's traits and how optsolve's common options map onto it.

    Attributes:
      key: the lower-case name optsolve looks it up by.
      name: scipy's spelling.
      function: where the scipy function whose signature lists the method's options is,
        "module:name" (:meth:`parameters` imports it).
      needs_gradient: optsolve passes a JAX gradient.
      hessian: "hess" (dense), "hessp" (products) or None: what optsolve passes.
      takes_bounds, takes_constraints: honours the problem's bounds / constraints.
      native_gtol: scipy's own ``gtol`` option is solve's ``gtol``.
      gtol_2norm: scipy's ``gtol`` tests the gradient's 2-norm (the trust-region methods);
        optsolve then also tests solve's infinity norm after each iteration.
      native_ftol: scipy's own ``ftol`` option is solve's ``ftol`` (same definition:
        |f_k - f_{k+1}| / max(|f_k|, |f_{k+1}|, 1)); elsewhere optsolve tests it.
      native_xtol: scipy's own ``xtol`` option is ``solve(..., xtol=...)`` (least_squares).
      constrained_ftol: scipy's own ``ftol`` takes solve's ``ftol`` where the method's
        options give none, and is also its bar on the constraints (SLSQP's test requires
        them to hold to ftol): optsolve's relative ftol test then ends a constrained run
        only at a point feasible to ftol, not merely to FEASIBILITY_TOL (which left HS26
        1e-3 from its optimum at ftol=1e-10).
      maxiter_name: scipy's option counting iterations, or None (optsolve counts them).
      maxiter_offset: added to maxiters for scipy, whose count includes iterations the
        callback never sees: direct's first two iterations divide the box before its
        callback runs.
      monitor_counts: optsolve's iteration count is the number of callback calls (the
        monitor always runs): direct's ``nit`` counts more (see maxiter_offset); COBYQA
        calls its callback after each evaluation, and its ``nit`` counts trust-region
        iterations.
      first_iteration: the iterations scipy counts before its first callback, which the
        callback's numbering and the history include: Nelder-Mead's iteration 1 builds
        the initial simplex (its iterate: the simplex's best vertex), so its callback sees
        iterations 2, 3, ... and ``nit``, ``maxiter`` and optsolve's count agree.
      callback_per_iteration: scipy's callback runs once per iteration it counts (not
        dual_annealing: per new best minimum; not shgo: per local-search iteration; not
        COBYQA: per evaluation). Where False, no history is recorded and the progress bar
        moves once, at the end.
      callback_per_evaluation: scipy calls the callback after every evaluation (COBYQA),
        and its iteration count is not visible to it: the callback's count is the
        evaluations', ``stats.iterations`` is scipy's ``nit`` also after a callback stop.
      own_budget: the option ``maxiter_name`` is also the method's own, accepted at
        construction (the global methods: ``maxiter``, basinhopping's ``niter``, shgo's
        ``iters``); ``solve``'s maxiters, where smaller, caps it.
      rejects_nonfinite: the method compares values and can pass over a point where f is
        not finite (derivative-free and global methods): ``nonfinite="reject"``, its
        default, hands it such a value as +inf.
      callback: "intermediate" (callback(intermediate_result), StopIteration stops it) or
        "x" (callback(xk), which optsolve stops by an exception of its own).
      extra: option names valid beyond the function's signature.
      owner: the algorithm class errors name (ScipyMinimize or ScipyGlobal when empty).
    """

    key: str
    name: str
    function: str
    needs_gradient: bool
    hessian: str | None = None
    takes_bounds: bool = False
    takes_constraints: bool = False
    native_gtol: bool = False
    native_ftol: bool = False
    native_xtol: bool = False
    constrained_ftol: bool = False
    gtol_2norm: bool = False
    maxiter_name: str | None = "maxiter"
    maxiter_offset: int = 0
    monitor_counts: bool = False
    first_iteration: int = 0
    callback_per_iteration: bool = True
    callback_per_evaluation: bool = False
    own_budget: bool = False
    rejects_nonfinite: bool = False
    callback: str = "intermediate"
    extra: tuple[str, ...] = ()
    owner: str = ""

    def parameters(self) -> Mapping[str, inspect.Parameter]:
        """The parameters of scipy's function for the method (scipy imported here)."""
        return _parameters(self.function)


@functools.cache
def _parameters(path: str) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(scipy_function(path)).parameters


MINIMIZE_SPECS: dict[str, MethodSpec] = {
    s.key: s
    for s in (
        MethodSpec(
            "nelder-mead",
            "Nelder-Mead",
            _M + "neldermead",
            False,
            takes_bounds=True,
            first_iteration=1,
            rejects_nonfinite=True,
        ),
        MethodSpec(
            "powell", "Powell", _M + "powell", False, takes_bounds=True, rejects_nonfinite=True
        ),
        MethodSpec("cg", "CG", _M + "cg", True, native_gtol=True),
        MethodSpec("bfgs", "BFGS", _M + "bfgs", True, native_gtol=True),
        MethodSpec("newton-cg", "Newton-CG", _M + "newtoncg", True, hessian="hessp"),
        MethodSpec(
            "l-bfgs-b",
            "L-BFGS-B",
            _M + "lbfgsb",
            True,
            takes_bounds=True,
            native_gtol=True,
            native_ftol=True,
        ),
        # TNC's only budget is maxfun, and its callback(xk) cannot stop it.
        MethodSpec(
            "tnc",
            "TNC",
            _M + "tnc",
            True,
            takes_bounds=True,
            native_gtol=True,
            maxiter_name=None,
            callback="x",
        ),
        # COBYLA's maxiter counts function evaluations: it stays COBYLA's own option.
        MethodSpec(
            "cobyla",
            "COBYLA",
            _M + "cobyla",
            False,
            takes_bounds=True,
            takes_constraints=True,
            maxiter_name=None,
            rejects_nonfinite=True,
        ),
        # COBYQA's maxiter counts its trust-region iterations (scipy's nit); maxfev, its
        # evaluation budget, stays its own. Its callback runs after each evaluation.
        MethodSpec(
            "cobyqa",
            "COBYQA",
            _M + "cobyqa",
            False,
            takes_bounds=True,
            takes_constraints=True,
            callback_per_iteration=False,
            callback_per_evaluation=True,
            rejects_nonfinite=True,
        ),
        MethodSpec(
            "slsqp",
            "SLSQP",
            _M + "slsqp",
            True,
            takes_bounds=True,
            takes_constraints=True,
            constrained_ftol=True,
        ),
        MethodSpec(
            "trust-constr",
            "trust-constr",
            _M + "trustregion_constr",
            True,
            hessian="hessp",
            takes_bounds=True,
            takes_constraints=True,
            native_gtol=True,
        ),
        MethodSpec(
            "dogleg",
            "dogleg",
            _TRUST_REGION,
            True,
            hessian="hess",
            native_gtol=True,
            gtol_2norm=True,
        ),
        MethodSpec(
            "trust-ncg",
            "trust-ncg",
            _TRUST_REGION,
            True,
            hessian="hessp",
            native_gtol=True,
            gtol_2norm=True,
        ),
        MethodSpec(
            "trust-exact",
            "trust-exact",
            _TRUST_REGION,
            True,
            hessian="hess",
            native_gtol=True,
            gtol_2norm=True,
            extra=("subproblem_maxiter",),
        ),
        MethodSpec(
            "trust-krylov",
            "trust-krylov",
            _TRUST_REGION,
            True,
            hessian="hessp",
            native_gtol=True,
            gtol_2norm=True,
            extra=("inexact",),
        ),
    )
}

GLOBAL_SPECS: dict[str, MethodSpec] = {
    s.key: s
    for s in (
        MethodSpec(
            "differential_evolution",
            "differential_evolution",
            _O + "differential_evolution",
            True,
            takes_bounds=True,
            takes_constraints=True,
            own_budget=True,
            rejects_nonfinite=True,
            extra=("vectorized",),
        ),
        MethodSpec(
            "dual_annealing",
            "dual_annealing",
            _O + "dual_annealing",
            True,
            takes_bounds=True,
            callback_per_iteration=False,
            own_budget=True,
            rejects_nonfinite=True,
        ),
        MethodSpec(
            "shgo",
            "shgo",
            _O + "shgo",
            True,
            takes_bounds=True,
            takes_constraints=True,
            maxiter_name="iters",
            callback="x",
            callback_per_iteration=False,
            own_budget=True,
            rejects_nonfinite=True,
        ),
        # direct's callback starts at its third iteration (the first two divide the box).
        MethodSpec(
            "direct",
            "direct",
            _O + "direct",
            False,
            takes_bounds=True,
            callback="x",
            maxiter_offset=2,
            monitor_counts=True,
            own_budget=True,
            rejects_nonfinite=True,
        ),
        MethodSpec(
            "basinhopping",
            "basinhopping",
            _O + "basinhopping",
            True,
            takes_bounds=True,
            takes_constraints=True,
            maxiter_name="niter",
            extra=("local",),
            own_budget=True,
            rejects_nonfinite=True,
        ),
    )
}

# Arguments optsolve supplies itself, never options; the reason says where they come from.
_SUPPLIED = {
    "fun": "the objective is the problem's f",
    "func": "the objective is the problem's f",
    "x0": "the start is the problem's x0",
    "args": "p is the problem's p",
    "kwargs": "p is the problem's p",
    "jac": "derivatives come from JAX",
    "grad": "derivatives come from JAX",
    "hess": "derivatives come from JAX",
    "hessp": "derivatives come from JAX",
    "bounds": "bounds are set on the problem: OptimizationProblem(..., bounds=(lower, upper))",
    "constraints": (
        "constraints are set on the problem: "
        "OptimizationProblem(..., constraints=[optsolve.Constraint(...)])"
    ),
    "callback": "pass it to solve: solve(..., callback=fn), called as fn(iteration, x, objective)",
    "method": "the method is the first argument",
    "minimizer_kwargs": (
        "local searches get JAX derivatives from optsolve; choose "
        "basinhopping's local method with local=ScipyMinimize(...)"
    ),
    "subproblem": "the subproblem is fixed by the method",
    "vectorized": (
        "of scipy's methods only differential_evolution evaluates a population "
        "at once: ScipyGlobal('differential_evolution', vectorized=True)"
    ),
    "unknown_options": "",
    "trust_region_options": "",
}
_FINITE_DIFFERENCES = ("eps", "finite_diff_rel_step", "workers", "diff_step", "jac_sparsity")
_SOLVE_OWNED_ITER = ("maxiter", "niter", "iters")


def canonical_method(kind: str, method: Any) -> str:
    """The lookup key of ``method`` for ScipyMinimize ("minimize") or ScipyGlobal ("global")."""
    specs = MINIMIZE_SPECS if kind == "minimize" else GLOBAL_SPECS
    owner = "ScipyMinimize" if kind == "minimize" else "ScipyGlobal"
    key = method.lower() if isinstance(method, str) else None
    if key not in specs:
        other = GLOBAL_SPECS if kind == "minimize" else MINIMIZE_SPECS
        hint = ""
        if key in other:
            hint = (
                f" {method!r} is a method of "
                f"{'ScipyGlobal' if kind == 'minimize' else 'ScipyMinimize'}."
            )
        raise ValueError(
            f"{owner}: `method` must be one of {', '.join(s.name for s in specs.values())}; "
            f"got {method!r}.{hint}"
        )
    return key


def valid_options(spec: MethodSpec) -> tuple[str, ...]:
    """The option names the method takes through optsolve."""
    names = []
    for name, param in spec.parameters().items():
        if name in _SUPPLIED or param.kind is param.VAR_KEYWORD or param.default is _no_value():
            continue
        if name in _FINITE_DIFFERENCES and spec.needs_gradient:
            continue
        if name == "workers":
            continue
        if name == spec.maxiter_name and not spec.own_budget:
            continue
        if (
            name in _SOLVE_OWNED_ITER
            and name != spec.maxiter_name
            and spec.maxiter_name is not None
        ):
            continue  # (COBYLA's maxiter counts evaluations: it stays an option)
        if (
            (name == "gtol" and spec.native_gtol)
            or (name == "ftol" and spec.native_ftol)
            or (name == "xtol" and spec.native_xtol)
        ):
            continue
        if name == "inexact" or name == "subproblem_maxiter":
            continue  # only where listed in spec.extra
        names.append(name)
    return tuple(names) + spec.extra


def _owner(spec: MethodSpec) -> str:
    kind = spec.owner or ("ScipyMinimize" if spec.key in MINIMIZE_SPECS else "ScipyGlobal")
    return f"{kind}(method={spec.name!r})"


def check_options(spec: MethodSpec, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` if the method takes them all; otherwise an error naming the first bad one."""
    valid = valid_options(spec)
    who = _owner(spec)
    for name, value in options.items():
        if name in valid:
            continue
        if _SUPPLIED.get(name):
            raise TypeError(
                f"{who}: `{name}` is not an option here: {_SUPPLIED[name]}; got {name}={value!r}."
            )
        if name == "tol":
            raise TypeError(
                f"{who}: `tol` is not an option here: use solve's tolerances, "
                f"solve(..., gtol=..., ftol=...); got tol={value!r}."
            )
        if name in _SOLVE_OWNED_ITER or name == spec.maxiter_name:
            raise TypeError(
                f"{who}: `{name}` is set through solve's common option: "
                f"solve(..., maxiters={value!r}); got {name}={value!r} here."
            )
        if (
            (name == "gtol" and spec.native_gtol)
            or (name == "ftol" and spec.native_ftol)
            or (name == "xtol" and spec.native_xtol)
        ):
            raise TypeError(
                f"{who}: `{name}` is set through solve's common option: "
                f"solve(..., {name}={value!r})."
            )
        if name == "workers" and spec.key in GLOBAL_SPECS:
            raise TypeError(
                f"{who}: `workers` is not supported: scipy evaluates the objective in worker "
                "processes, which needs a picklable objective, and optsolve's compiled "
                f"objective cannot be pickled; got workers={value!r}. Remove it."
            )
        if name in _FINITE_DIFFERENCES and spec.needs_gradient:
            raise TypeError(
                f"{who}: `{name}` only tunes scipy's finite differences, which optsolve "
                f"never uses (JAX supplies exact derivatives), so scipy would ignore it; "
                f"got {name}={value!r}. Remove it."
            )
        if name == "workers":
            raise TypeError(
                f"{who}: `workers` is not supported (optsolve's compiled "
                f"objective is not picklable); got workers={value!r}."
            )
        param = spec.parameters().get(name)
        if param is not None and param.default is _no_value():
            raise TypeError(
                f"{who}: `{name}` is deprecated by scipy and would only warn; "
                f"got {name}={value!r}. Remove it."
            )
        raise TypeError(
            f"{who} does not take the option `{name}` (got {name}={value!r}). Valid options: "
            f"{', '.join(valid) or '(none)'}; common options go to solve: maxiters, maxtime, "
            "gtol, ftol, callback."
        )
    if "vectorized" in options and not isinstance(options["vectorized"], bool):
        raise TypeError(
            f"{who}: `vectorized` must be True or False, got vectorized={options['vectorized']!r}."
        )
    if options.get("vectorized") and options.get("updating", "deferred") != "deferred":
        raise TypeError(
            f"{who}: vectorized=True evaluates each generation's population in one call, "
            "which needs updating='deferred' (the population changes once per generation); "
            f"got updating={options['updating']!r}. Remove `updating` (vectorized=True "
            "implies 'deferred') or use vectorized=False."
        )
    return dict(options)


def methods_with(trait: str) -> list[str]:
    """scipy.optimize.minimize methods whose ``trait`` is true (for error messages)."""
    return [s.name for s in MINIMIZE_SPECS.values() if getattr(s, trait)]
