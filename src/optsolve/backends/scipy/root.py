"""``ScipyRoot``: scipy.optimize.root on a RootProblem, with F and its Jacobian compiled
from JAX (the Jacobian handed to the methods that take one: hybr, lm).

The run is on the host: eager, or inside ``jax.pure_callback`` under ``jax.jit`` /
``jax.vmap`` (one solve per element). ``solve`` judges the result (SUCCESS only where
``max|F(x)| <= ftol``) and differentiates it by the implicit function theorem, as for the
JAX-native root finders (:mod:`optsolve.solve_api.roots`). scipy is imported on first use.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.scipy.compiled import eval_dtype
from optsolve.backends.scipy.residuals import residual_executables
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.pytree import freeze, is_traced, thaw
from optsolve.solve_api.registry import register_algorithm, register_backend
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution, Stats


@dataclasses.dataclass(frozen=True)
class RootSpec:
    """A ``scipy.optimize.root`` method: one row of the method table.

    Attributes:
      key: scipy's name (lower case), the name optsolve looks it up by.
      takes_jacobian: it is handed the exact Jacobian (``jax.jacfwd``, compiled).
      budget: scipy's option that solve's ``maxiters`` sets (MINPACK's and df-sane's count
        evaluations of F, the nonlin methods' and lm's iterations).
      out_of_budget: scipy's statuses that mean the budget ran out (MAXITERS).
      options: the method's own options accepted at construction (scipy's names; the
        tolerance and the budget are solve's, the Jacobian JAX's).
    """

    key: str
    takes_jacobian: bool
    budget: str
    out_of_budget: tuple[int, ...]
    options: tuple[str, ...]


_NONLIN = ("disp", "xatol", "tol_norm", "line_search", "jac_options")
ROOT_SPECS: dict[str, RootSpec] = {
    s.key: s
    for s in (
        RootSpec("hybr", True, "maxfev", (2,), ("col_deriv", "band", "eps", "factor", "diag")),
        RootSpec("lm", True, "maxiter", (5,), ("col_deriv", "gtol", "eps", "factor", "diag")),
        *(
            RootSpec(key, False, "maxiter", (2,), _NONLIN)
            for key in (
                "broyden1",
                "broyden2",
                "anderson",
                "linearmixing",
                "diagbroyden",
                "excitingmixing",
                "krylov",
            )
        ),
        RootSpec(
            "df-sane",
            False,
            "maxfev",
            (2,),
            ("fnorm", "disp", "eta_strategy", "sigma_eps", "sigma_0", "M", "line_search"),
        ),
    )
}
METHODS = tuple(ROOT_SPECS)
# set by solve (ftol, maxiters) rather than given here
_SOLVE_SETS = ("tol", "xtol", "ftol", "fatol", "maxiter", "maxfev", "nit", "callback", "jac")


class _NonFinite(Exception):
    """Raised from F on the host to stop scipy at a non-finite value."""


def _canonical(method: Any) -> str:
    key = method.lower() if isinstance(method, str) else None
    if key not in ROOT_SPECS:
        raise ValueError(
            f"ScipyRoot: `method` must be one of {', '.join(map(repr, METHODS))}; got {method!r}."
        )
    return key


class ScipyRoot(Algorithm):
    """``scipy.optimize.root`` on a :class:`~optsolve.RootProblem`: every method, with F
    compiled from JAX and, for hybr and lm, the exact Jacobian (``jax.jacfwd``).

    Args:
      method: "hybr" (default; MINPACK's Powell hybrid), "lm" (MINPACK's
        Levenberg-Marquardt), "broyden1", "broyden2", "anderson", "linearmixing",
        "diagbroyden", "excitingmixing", "krylov" (scipy's ``nonlin`` solvers) or "df-sane"
        (La Cruz, Martínez & Raydan 2006); case-insensitive.
      **scipy_options: the method's own ``options`` (``jac_options``, ``line_search``,
        ``diag``, ``factor``, ``M`` ...), except the tolerance and the budget, which come
        from ``solve``: ``ftol`` (max|F| <= ftol, the SUCCESS test) is the nonlin methods'
        and df-sane's ``fatol`` (MINPACK's methods stop on their own step test, scipy's
        default ``xtol``), ``maxiters`` the nonlin methods' ``maxiter`` and MINPACK's and
        df-sane's evaluation budget (``maxfev``; lm's ``maxiter``).

    As for :class:`~optsolve.ScipyMinimize`, each method is its own generated subclass, a
    row of the method table (``ScipyRoot("krylov")`` is an instance of
    ``ScipyRoot(method='krylov')``), listed in the catalog.

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
    spec: ClassVar[RootSpec]
    _classes: ClassVar[dict[str, type]] = {}

    def __new__(cls, method: str | None = None, **scipy_options: Any):
        if cls is ScipyRoot:
            cls = cls._classes[_canonical("hybr" if method is None else method)]
        return object.__new__(cls)

    def __init__(self, method: str | None = None, **scipy_options: Any):
        spec = type(self).spec
        if method is not None and _canonical(method) != spec.key:
            raise TypeError(f"{type(self).__name__}: got method={method!r}.")
        for name in scipy_options:
            if name in _SOLVE_SETS:
                raise TypeError(
                    f"ScipyRoot: `{name}` is not an option here: the tolerance and the budget "
                    "are solve's (solve(prob, alg, ftol=..., maxiters=...)), and the Jacobian "
                    "is JAX's."
                )
            if name not in spec.options:
                raise TypeError(
                    f"ScipyRoot(method={spec.key!r}) does not take the option `{name}`. Valid "
                    f"options: {', '.join(spec.options)}; the tolerance and the budget go to "
                    "solve: ftol, maxiters."
                )
        object.__setattr__(
            self, "_options", tuple(sorted((k, freeze(v)) for k, v in scipy_options.items()))
        )

    @property
    def method(self) -> str:
        return type(self).spec.key

    @property
    def scipy_options(self) -> tuple:
        """The scipy options given at construction, as (name, frozen value) pairs."""
        return self._options

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...).")

    def replace(self, **changes: Any) -> ScipyRoot:
        """A copy with the method or scipy options changed."""
        options = {k: thaw(v) for k, v in self._options}
        method = changes.pop("method", self.method)
        options.update(changes)
        return ScipyRoot(method, **options)

    def __repr__(self) -> str:
        args = "".join(f", {k}={thaw(v)!r}" for k, v in self._options)
        return f"ScipyRoot(method={self.method!r}{args})"

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self._options == other._options

    def __hash__(self) -> int:
        return hash((type(self), self._options))


def _make_class(spec: RootSpec) -> type:
    name = f"ScipyRoot(method={spec.key!r})"
    cls = type(
        name,
        (ScipyRoot,),
        {
            "spec": spec,
            "needs_gradient": spec.takes_jacobian,  # dF/dx (hybr, lm); the others use F alone
            "__doc__": f"ScipyRoot with method={spec.key!r}: see ScipyRoot.",
            "__module__": "optsolve",
            "__qualname__": name,
        },
    )
    jax.tree_util.register_pytree_node(
        cls, lambda a: ((), a._options), lambda aux, _, cls=cls: _unflatten_algorithm(cls, aux)
    )
    ScipyRoot._classes[spec.key] = cls
    register_algorithm(cls)
    return cls


def _unflatten_algorithm(cls: type, aux: tuple) -> Any:
    obj = object.__new__(cls)
    object.__setattr__(obj, "_options", aux)
    return obj


for _spec in ROOT_SPECS.values():
    _make_class(_spec)


def _scipy_options(algorithm: ScipyRoot, options: SolveOptions) -> dict[str, Any]:
    spec = algorithm.spec
    method = spec.key
    out = {k: thaw(v) for k, v in algorithm.scipy_options}
    if options.maxiters is not None:
        out[spec.budget] = int(options.maxiters)
    if options.gtol is not None and not spec.takes_jacobian:  # solve's ftol
        out["fatol"] = float(options.gtol)
        out["ftol"] = 0.0 if method == "df-sane" else np.inf
        if method != "df-sane":
            out.setdefault("xtol", np.inf)
            out.setdefault("xatol", np.inf)
    return out


# scipy.optimize._nonlin's message where its Jacobian inversion breaks down
_NONLIN_BREAKDOWN = "Jacobian inversion yielded zero vector"


def _run_host(problem: LeastSquaresProblem, algorithm: ScipyRoot, options: SolveOptions):
    """scipy.optimize.root on concrete inputs: (x flat, F at x, code, nit, nfev, njev,
    result or None, detail)."""
    import scipy.optimize  # imported on first use: `import optsolve` does not import scipy

    exe = residual_executables(problem, problem.p)
    residuals, jacobian = exe.residuals.bind(problem.p), exe.jacobian.bind(problem.p)
    x0 = np.concatenate(
        [np.ravel(np.asarray(leaf, np.float64)) for leaf in jax.tree_util.tree_leaves(problem.x0)]
    )
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
        result = scipy.optimize.root(
            fun,
            x0,
            method=method,
            jac=jac if algorithm.spec.takes_jacobian else None,
            options=_scipy_options(algorithm, options),
        )
    except _NonFinite:
        F = last["F"] if last["F"] is not None else np.full_like(x0, np.nan)
        return (
            last["x"],
            F,
            ReturnCode.FAILURE,
            last["nfev"],
            last["nfev"],
            last["njev"],
            None,
            "F (or its Jacobian) was not finite at a point scipy evaluated; x is "
            "the last point where F was finite",
        )
    except (ArithmeticError, np.linalg.LinAlgError, ValueError) as err:
        # scipy's nonlin line search overflows on a diverging run (excitingmixing with its
        # default alpha on a system whose Jacobian it has the wrong sign of); its Krylov
        # inversion raises ValueError where J is zero (F constant). A user's own ValueError
        # (raised from F, not scipy's) goes on unchanged.
        if isinstance(err, ValueError) and _NONLIN_BREAKDOWN not in str(err):
            raise
        F = last["F"] if last["F"] is not None else np.full_like(x0, np.nan)
        return (
            last["x"],
            F,
            ReturnCode.FAILURE,
            last["nfev"],
            last["nfev"],
            last["njev"],
            None,
            f"scipy stopped with {type(err).__name__}: {err}; x is the last point "
            "where F was finite",
        )
    status = int(getattr(result, "status", 0))
    if result.success:
        code = ReturnCode.SUCCESS
    elif (
        status in algorithm.spec.out_of_budget
        or "maxfev" in str(result.message)
        or any(
            # df-sane reports no status, only its message
            why in str(result.message).lower()
            for why in ("maximum number", "too many function evaluations")
        )
    ):
        code = ReturnCode.MAXITERS
    else:
        code = ReturnCode.STALLED
    x = np.asarray(result.x, np.float64)
    nfev = int(getattr(result, "nfev", last["nfev"]))
    nit = int(getattr(result, "nit", nfev))
    return (
        x,
        np.asarray(result.fun, np.float64),
        code,
        nit,
        nfev,
        int(getattr(result, "njev", last["njev"])),
        result,
        str(result.message),
    )


def _unflatten(x0: Any, flat: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(x0)
    out, start = [], 0
    for leaf in leaves:
        size = int(np.size(leaf))
        out.append(
            np.reshape(flat[start : start + size], np.shape(leaf)).astype(jnp.result_type(leaf))
        )
        start += size
    return jax.tree_util.tree_unflatten(treedef, out)


def solve_scipy_root(
    problem: LeastSquaresProblem, algorithm: ScipyRoot, options: SolveOptions, loop: Any = None
) -> Solution:
    """Run scipy.optimize.root; through ``jax.pure_callback`` when inputs are traced."""
    for name, given in (
        ("callback", options.callback is not None),
        ("maxtime", options.maxtime is not None),
    ):
        if given:
            raise ValueError(
                f"solve: ScipyRoot does not take `{name}` (scipy.optimize.root "
                "runs on the host without one); use NewtonRaphson or Broyden."
            )
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(problem.x0))
    if not is_traced(problem, options):
        x, F, code, nit, nfev, njev, result, detail = _run_host(problem, algorithm, options)
        return Solution(
            x=jax.device_put(_unflatten(problem.x0, x)),
            objective=jnp.asarray(0.5 * np.sum(np.square(F)), dtype),
            retcode=code,
            stats=Stats(iterations=nit, f_evals=nfev, grad_evals=njev),
            original=result,
            detail=detail,
        )
    x_leaves, x_def = jax.tree_util.tree_flatten(problem.x0)
    shapes = (
        [jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf)) for leaf in x_leaves]
        + [jax.ShapeDtypeStruct((), dtype)]
        + [jax.ShapeDtypeStruct((), jnp.int32)] * 4
    )

    def host_fn(prob, opts):
        x, F, code, nit, nfev, njev, _, _ = _run_host(prob, algorithm, opts)
        xs = jax.tree_util.tree_leaves(_unflatten(prob.x0, x))
        return (
            *xs,
            np.asarray(0.5 * np.sum(np.square(F)), dtype),
            *(np.asarray(int(v), np.int32) for v in (code, nit, nfev, njev)),
        )

    out = jax.pure_callback(host_fn, tuple(shapes), problem, options, vmap_method="sequential")
    n = len(x_leaves)
    objective, code, nit, nfev, njev = out[n:]
    return Solution(
        x=jax.tree_util.tree_unflatten(x_def, list(out[:n])),
        objective=objective,
        retcode=code,
        stats=Stats(iterations=nit, f_evals=nfev, grad_evals=njev),
    )


register_backend(ScipyRoot, solve_scipy_root)
