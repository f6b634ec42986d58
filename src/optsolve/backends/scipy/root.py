"""``ScipyRoot``: scipy.optimize.root on a RootProblem, with F and its Jacobian compiled
from JAX (the Jacobian handed to the methods that take one: hybr, lm).

The run is on the host: eager, or inside ``jax.pure_callback`` under ``jax.jit`` /
``jax.vmap`` (one solve per element). ``solve`` judges the result (SUCCESS only where
``max|F(x)| <= ftol``) and differentiates it by the implicit function theorem, as for the
JAX-native root finders (:mod:`optsolve.solve_api.roots`). scipy is imported on first use.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.scipy.compiled import eval_dtype
from optsolve.backends.scipy.residuals import residual_executables
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.pytree import freeze, is_traced, pytree_dataclass, static_field, thaw
from optsolve.solve_api.registry import register_backend
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution, Stats

METHODS = ("hybr", "lm", "broyden1", "broyden2", "anderson", "linearmixing", "diagbroyden",
           "excitingmixing", "krylov", "df-sane")
_TAKES_JACOBIAN = ("hybr", "lm")
# solve's maxiters as each method's budget: MINPACK's and df-sane's count evaluations of F,
# the nonlin methods' iterations
_BUDGET = {"hybr": "maxfev", "lm": "maxiter", "df-sane": "maxfev"}
# the budget running out, by scipy's status (hybr 2, lm 5, nonlin 2)
_OUT_OF_BUDGET = {"hybr": (2,), "lm": (5,)}
# set by solve (ftol, maxiters) rather than given here
_SOLVE_SETS = ("tol", "xtol", "ftol", "fatol", "maxiter", "maxfev", "nit", "callback", "jac")


class _NonFinite(Exception):
    """Raised from F on the host to stop scipy at a non-finite value."""


# Not yet in the algorithm list (register_algorithm): docs/hooks.py's defaults table reads a
# scipy class's MethodSpec, which scipy.optimize.root has no row of yet
@pytree_dataclass
class ScipyRoot(Algorithm):
    """``scipy.optimize.root`` on a :class:`~optsolve.RootProblem`: every method, with F
    compiled from JAX and, for hybr and lm, the exact Jacobian (``jax.jacfwd``).

    Args:
      method: "hybr" (default; MINPACK's Powell hybrid), "lm" (MINPACK's
        Levenberg-Marquardt), "broyden1", "broyden2", "anderson", "linearmixing",
        "diagbroyden", "excitingmixing", "krylov" (scipy's ``nonlin`` solvers) or "df-sane"
        (La Cruz, Martínez & Raydan 2006), static.
      **scipy_options: the method's own ``options`` (``jac_options``, ``line_search``,
        ``diag``, ``factor``, ``M`` ...), except the tolerance and the budget, which come
        from ``solve``: ``ftol`` (max|F| <= ftol, the SUCCESS test) is the nonlin methods'
        and df-sane's ``fatol`` (MINPACK's methods stop on their own step test, scipy's
        default ``xtol``), ``maxiters`` the nonlin methods' ``maxiter`` and MINPACK's and
        df-sane's evaluation budget (``maxfev``; lm's ``maxiter``).

    A non-finite F ends the run with FAILURE at the last point where F was finite. No
    callback, history or resume (scipy runs on the host). ``sol.stats.f_evals`` is scipy's
    ``nfev``; ``iterations`` its ``nit`` where it reports one (the nonlin methods), else
    ``nfev``; ``sol.original`` is scipy's ``OptimizeResult`` (eager only), ``sol.detail``
    its message.

    Example:
      >>> prob = optsolve.RootProblem(lambda x, p: x ** 3 - p, jnp.ones(2), p=8.0)
      >>> sol = optsolve.solve(prob, optsolve.ScipyRoot("broyden1"))
    """

    family: ClassVar[str] = "scipy"
    needs_residuals: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = True
    float_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64")
    # a RootProblem only, handed over as its RootSystem (solve_api/roots.py)
    solves_roots: ClassVar[str] = "scipy"
    roots_only: ClassVar[bool] = True

    method: str = static_field(default="hybr")
    scipy_options: tuple = static_field(default=())

    def __init__(self, method: str = "hybr", **scipy_options: Any):
        key = method.lower() if isinstance(method, str) else None
        if key not in METHODS:
            raise ValueError(f"ScipyRoot: `method` must be one of {', '.join(map(repr, METHODS))}"
                             f"; got {method!r}.")
        for name in scipy_options:
            if name in _SOLVE_SETS:
                raise TypeError(
                    f"ScipyRoot: `{name}` is not an option here: the tolerance and the budget "
                    "are solve's (solve(prob, alg, ftol=..., maxiters=...)), and the Jacobian "
                    "is JAX's.")
        object.__setattr__(self, "method", key)
        object.__setattr__(self, "scipy_options", tuple(sorted(
            (k, freeze(v)) for k, v in scipy_options.items())))

    def replace(self, **changes: Any) -> "ScipyRoot":
        """A copy with the method or scipy options changed."""
        options = {k: thaw(v) for k, v in self.scipy_options}
        method = changes.pop("method", self.method)
        options.update(changes)
        return ScipyRoot(method, **options)

    def __repr__(self) -> str:
        args = "".join(f", {k}={thaw(v)!r}" for k, v in self.scipy_options)
        return f"ScipyRoot(method={self.method!r}{args})"


def _scipy_options(algorithm: ScipyRoot, options: SolveOptions) -> dict[str, Any]:
    method = algorithm.method
    out = {k: thaw(v) for k, v in algorithm.scipy_options}
    if options.maxiters is not None:
        out[_BUDGET.get(method, "maxiter")] = int(options.maxiters)
    if options.gtol is not None and method not in _TAKES_JACOBIAN:  # solve's ftol
        out["fatol"] = float(options.gtol)
        out["ftol"] = 0.0 if method == "df-sane" else np.inf
        if method != "df-sane":
            out.setdefault("xtol", np.inf)
            out.setdefault("xatol", np.inf)
    return out


def _run_host(problem: LeastSquaresProblem, algorithm: ScipyRoot, options: SolveOptions):
    """scipy.optimize.root on concrete inputs: (x flat, F at x, code, nit, nfev, njev,
    result or None, detail)."""
    import scipy.optimize  # imported on first use: `import optsolve` does not import scipy

    exe = residual_executables(problem, problem.p)
    residuals, jacobian = exe.residuals.bind(problem.p), exe.jacobian.bind(problem.p)
    x0 = np.concatenate([np.ravel(np.asarray(leaf, np.float64))
                         for leaf in jax.tree_util.tree_leaves(problem.x0)])
    last = {"x": x0, "F": None, "nfev": 0, "njev": 0}

    def fun(x):
        F = np.asarray(residuals(np.asarray(x, exe_dtype))[0], np.float64)
        last["nfev"] += 1
        if not np.all(np.isfinite(F)):
            raise _NonFinite
        last["x"], last["F"] = np.array(x, np.float64), F
        return F

    def jac(x):
        J = np.asarray(jacobian(np.asarray(x, exe_dtype))[0], np.float64)
        last["njev"] += 1
        if not np.all(np.isfinite(J)):
            raise _NonFinite
        return J

    exe_dtype = eval_dtype(problem.x0)  # what the compiled F takes (float64 with x64 on)
    if options.maxiters is not None and int(options.maxiters) == 0:
        F0 = fun(x0)
        return x0, F0, ReturnCode.MAXITERS, 0, 1, 0, None, "maxiters=0: x0 returned"
    method = algorithm.method
    try:
        result = scipy.optimize.root(fun, x0, method=method,
                                     jac=jac if method in _TAKES_JACOBIAN else None,
                                     options=_scipy_options(algorithm, options))
    except _NonFinite:
        F = last["F"] if last["F"] is not None else np.full_like(x0, np.nan)
        return (last["x"], F, ReturnCode.FAILURE, last["nfev"], last["nfev"], last["njev"],
                None, "F (or its Jacobian) was not finite at a point scipy evaluated; x is "
                      "the last point where F was finite")
    status = int(getattr(result, "status", 0))
    if result.success:
        code = ReturnCode.SUCCESS
    elif status in _OUT_OF_BUDGET.get(method, (2,)) or "maxfev" in str(result.message) or \
            "maximum number" in str(result.message).lower():
        code = ReturnCode.MAXITERS
    else:
        code = ReturnCode.STALLED
    x = np.asarray(result.x, np.float64)
    nfev = int(getattr(result, "nfev", last["nfev"]))
    nit = int(getattr(result, "nit", nfev))
    return (x, np.asarray(result.fun, np.float64), code, nit, nfev,
            int(getattr(result, "njev", last["njev"])), result, str(result.message))


def _unflatten(x0: Any, flat: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(x0)
    out, start = [], 0
    for leaf in leaves:
        size = int(np.size(leaf))
        out.append(np.reshape(flat[start:start + size], np.shape(leaf)).astype(
            jnp.result_type(leaf)))
        start += size
    return jax.tree_util.tree_unflatten(treedef, out)


def solve_scipy_root(problem: LeastSquaresProblem, algorithm: ScipyRoot,
                     options: SolveOptions, loop: Any = None) -> Solution:
    """Run scipy.optimize.root; through ``jax.pure_callback`` when inputs are traced."""
    for name, given in (("callback", options.callback is not None),
                        ("maxtime", options.maxtime is not None)):
        if given:
            raise ValueError(f"solve: ScipyRoot does not take `{name}` (scipy.optimize.root "
                             "runs on the host without one); use NewtonRaphson or Broyden.")
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(problem.x0))
    if not is_traced(problem, options):
        x, F, code, nit, nfev, njev, result, detail = _run_host(problem, algorithm, options)
        return Solution(x=jax.device_put(_unflatten(problem.x0, x)),
                        objective=jnp.asarray(0.5 * np.sum(np.square(F)), dtype),
                        retcode=code, stats=Stats(iterations=nit, f_evals=nfev,
                                                  grad_evals=njev),
                        original=result, detail=detail)
    x_leaves, x_def = jax.tree_util.tree_flatten(problem.x0)
    shapes = ([jax.ShapeDtypeStruct(np.shape(l), jnp.result_type(l)) for l in x_leaves]
              + [jax.ShapeDtypeStruct((), dtype)] + [jax.ShapeDtypeStruct((), jnp.int32)] * 4)

    def host_fn(prob, opts):
        x, F, code, nit, nfev, njev, _, _ = _run_host(prob, algorithm, opts)
        xs = jax.tree_util.tree_leaves(_unflatten(prob.x0, x))
        return (*xs, np.asarray(0.5 * np.sum(np.square(F)), dtype),
                *(np.asarray(int(v), np.int32) for v in (code, nit, nfev, njev)))

    out = jax.pure_callback(host_fn, tuple(shapes), problem, options, vmap_method="sequential")
    n = len(x_leaves)
    objective, code, nit, nfev, njev = out[n:]
    return Solution(x=jax.tree_util.tree_unflatten(x_def, list(out[:n])), objective=objective,
                    retcode=code, stats=Stats(iterations=nit, f_evals=nfev, grad_evals=njev))


register_backend(ScipyRoot, solve_scipy_root)
