"""``scipy.optimize.minimize_scalar`` in the scipy family: ``ScipyMinimizeScalar(method=...)``.

One row a method (:data:`SCALAR_SPECS`): its capability traits, its own options and the
names scipy gives them. As for :class:`~optsolve.ScipyMinimize`, each method is its own
generated subclass (``ScipyMinimizeScalar("bounded")`` is an instance of
``ScipyMinimizeScalar(method='bounded')``), so that the traits are class attributes that
``solve``'s central checks read; the method's options are static aux data.

The problem has one scalar x (x0 a 0-d array: trait ``scalar_only``), evaluated on the host
through the family's compiled evaluations (:mod:`optsolve.backends.scipy.compiled`).
``bounded`` searches ``bounds`` (finite: trait ``needs_bounds``); ``brent`` and ``golden``
take no bounds (scipy refuses them too, gh-10911) and search downhill from their
``bracket`` option, by default ``(x0, x0 + 1)``.

``minimize_scalar`` has no callback: optsolve calls ``solve``'s callback, and tests
``maxtime``, after each evaluation of f (the callback's ``k`` counts evaluations; a run it
stops counts its evaluations as its iterations). A non-finite value ends the run at once
with FAILURE and the best finite point evaluated. ``gtol`` and ``ftol`` are refused (scipy
tests neither; the tolerances are the methods' ``xtol`` / ``xatol`` options).

scipy is imported inside the functions that run it, so that ``import optsolve`` does not.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.host import wants_grad_norm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import freeze, is_traced, thaw
from optsolve.solve_api.registry import register_algorithm, register_backend
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution, Stats

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ScalarSpec:
    """A ``minimize_scalar`` method: scipy's name, its traits and its own options.

    Attributes:
      key: the lower-case name optsolve looks it up by (also scipy's).
      takes_bounds: it searches the problem's ``bounds`` (needed, finite).
      options: the method options accepted at construction (scipy's names).
      maxiter_doc: what scipy's ``maxiter`` (solve's ``maxiters``) counts.
    """

    key: str
    takes_bounds: bool
    options: tuple[str, ...]
    maxiter_doc: str


SCALAR_SPECS: dict[str, ScalarSpec] = {
    s.key: s
    for s in (
        ScalarSpec("brent", False, ("xtol", "bracket"), "iterations"),
        ScalarSpec("golden", False, ("xtol", "bracket"), "iterations"),
        # bounded's maxiter counts evaluations of f (its nit is that count too)
        ScalarSpec("bounded", True, ("xatol",), "evaluations"),
    )
}

# Options of minimize_scalar that solve owns or supplies, with where they come from.
_OWNED = {
    "maxiter": "set it with solve(..., maxiters=...)",
    "bounds": "bounds are set on the problem: OptimizationProblem(..., bounds=(lower, upper))",
    "tol": "use the method's own tolerance option",
    "args": "p is the problem's p",
    "disp": "optsolve reports through the Solution (retcode, message)",
    "callback": "pass it to solve: solve(..., callback=fn)",
}


def _canonical(method: Any) -> str:
    key = method.lower() if isinstance(method, str) else None
    if key not in SCALAR_SPECS:
        raise ValueError(
            f"ScipyMinimizeScalar: `method` must be one of {', '.join(map(repr, SCALAR_SPECS))}; "
            f"got {method!r}."
        )
    return key


def _check_options(spec: ScalarSpec, options: dict[str, Any]) -> dict[str, Any]:
    who = f"ScipyMinimizeScalar(method={spec.key!r})"
    for name, value in options.items():
        if name in spec.options:
            continue
        if name in _OWNED:
            tolerance = (
                f" ({', '.join(o for o in spec.options if 'tol' in o)})" if name == "tol" else ""
            )
            raise TypeError(
                f"{who}: `{name}` is not an option here: {_OWNED[name]}"
                f"{tolerance}; got {name}={value!r}."
            )
        raise TypeError(
            f"{who} does not take the option `{name}` (got {name}={value!r}). "
            f"Valid options: {', '.join(spec.options)}; common options go to "
            "solve: maxiters, maxtime, callback."
        )
    bracket = options.get("bracket")
    if bracket is not None and (
        not isinstance(bracket, (tuple, list)) or len(bracket) not in (2, 3)
    ):
        raise ValueError(
            f"{who}: `bracket` must be a pair (a, b) that starts scipy's downhill "
            f"search or a triple (a, b, c) with f(b) < f(a), f(c); got {bracket!r}."
        )
    for name in ("xtol", "xatol"):
        if name in options and not float(options[name]) >= 0:
            raise ValueError(f"{who}: `{name}` must be >= 0, got {options[name]!r}.")
    return dict(options)


class ScipyMinimizeScalar(Algorithm):
    """A method of ``scipy.optimize.minimize_scalar``: one scalar x, values only.

    Args:
      method: ``"brent"`` (Brent's method, from a bracket), ``"golden"`` (golden-section
        search, from a bracket) or ``"bounded"`` (Brent's method within the problem's
        finite ``bounds``: scipy's ``fminbound``); case-insensitive.
      **options: the method's own options: ``xtol`` (relative; brent: 1.48e-8, golden:
        1.49e-8) and ``bracket`` for brent and golden, a pair ``(a, b)`` that starts
        scipy's downhill bracket search (default ``(x0, x0 + 1)``) or a triple
        ``(a, b, c)`` with ``f(b) < f(a), f(c)``; ``xatol`` (absolute, default 1e-5) for
        bounded. ``maxiter`` is solve's ``maxiters`` (bounded counts evaluations with it).

    x0 must be a 0-d array. A result scipy reports as a success is SUCCESS; the end of
    ``maxiter`` MAXITERS; a non-finite value of f FAILURE at once, with the best finite
    point evaluated. The callback and ``maxtime`` are checked after every evaluation of f
    (its ``k`` counts them), ``resume=sol`` is a warm start from ``sol.x`` (the bracket
    search of brent and golden starts there; bounded always starts in the golden-section
    point of the box), and the counts add up. ``Solution.original`` is scipy's
    ``OptimizeResult`` (None inside ``jax.jit`` / ``jax.vmap``, where the run goes
    through ``jax.pure_callback``, one scipy run per batch element).

    Example:
      >>> prob = optsolve.OptimizationProblem(lambda x, p: (x - p) ** 2, jnp.array(0.0), 1.5,
      ...                                     bounds=(0.0, 4.0))
      >>> sol = optsolve.solve(prob, optsolve.ScipyMinimizeScalar("bounded", xatol=1e-8))
    """

    family: ClassVar[str] = "scipy"
    needs_gradient: ClassVar[bool] = False
    stops_by_itself: ClassVar[bool] = True
    resumable: ClassVar[bool] = True  # a warm start from sol.x
    jittable: ClassVar[bool] = True
    vmappable: ClassVar[bool] = True
    scalar_only: ClassVar[bool] = True
    needs_bounds: ClassVar[bool] = False
    spec: ClassVar[ScalarSpec]
    _classes: ClassVar[dict[str, type]] = {}

    def __new__(cls, method: str | None = None, **options: Any):
        if cls is ScipyMinimizeScalar:
            if method is None:
                raise TypeError(
                    "ScipyMinimizeScalar: `method` is required; one of "
                    f"{', '.join(map(repr, SCALAR_SPECS))}."
                )
            cls = cls._classes[_canonical(method)]
        return object.__new__(cls)

    def __init__(self, method: str | None = None, **options: Any):
        spec = type(self).spec
        if method is not None and _canonical(method) != spec.key:
            raise TypeError(f"{type(self).__name__}: got method={method!r}.")
        options = _check_options(spec, options)
        object.__setattr__(
            self, "_options", tuple(sorted((k, freeze(v)) for k, v in options.items()))
        )

    @classmethod
    def traits(cls) -> dict[str, Any]:
        """The class's traits, with ``scalar_only`` (x0 is one 0-d array) and
        ``needs_bounds`` (finite bounds: bounded)."""
        return {
            **super().traits(),
            "scalar_only": cls.scalar_only,
            "needs_bounds": cls.needs_bounds,
        }

    @property
    def method(self) -> str:
        return type(self).spec.key

    @property
    def options(self) -> dict[str, Any]:
        """The scipy options given at construction (a copy)."""
        return {k: thaw(v) for k, v in self._options}

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...).")

    def replace(self, **changes: Any) -> ScipyMinimizeScalar:
        """A copy with some scipy options changed (checked like a new construction)."""
        return type(self)(**{**self.options, **changes})

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"ScipyMinimizeScalar(method={self.method!r}{args})"

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self._options == other._options

    def __hash__(self) -> int:
        return hash((type(self), self._options))


def _make_class(spec: ScalarSpec) -> type:
    name = f"ScipyMinimizeScalar(method={spec.key!r})"
    cls = type(
        name,
        (ScipyMinimizeScalar,),
        {
            "spec": spec,
            "takes_bounds": spec.takes_bounds,
            "needs_bounds": spec.takes_bounds,
            "__doc__": f"ScipyMinimizeScalar with method={spec.key!r}: see ScipyMinimizeScalar.",
            "__module__": "optsolve",
            "__qualname__": name,
        },
    )
    jax.tree_util.register_pytree_node(
        cls, lambda a: ((), a._options), lambda aux, _, cls=cls: _unflatten(cls, aux)
    )
    ScipyMinimizeScalar._classes[spec.key] = cls
    register_algorithm(cls)
    return cls


def _unflatten(cls: type, aux: tuple) -> Any:
    obj = object.__new__(cls)
    object.__setattr__(obj, "_options", aux)
    return obj


for _spec in SCALAR_SPECS.values():
    _make_class(_spec)


# ------------------------------------------------------------------------------ the run


class _Stop(Exception):
    """Raised from an evaluation to end scipy's run with ``code``."""

    def __init__(self, code: ReturnCode, why: str):
        super().__init__(why)
        self.code, self.why = code, why


@dataclasses.dataclass
class _Run:
    x: float
    fun: float
    code: ReturnCode
    nit: int
    nfev: int
    result: Any
    detail: str
    host: Any


def _plain(options: SolveOptions) -> dict:
    def num(v, kind):
        return None if v is None else kind(np.asarray(v))

    return {
        "maxiters": num(options.maxiters, int),
        "maxtime": num(options.maxtime, float),
        "callback": options.callback,
        "callback_every": options.callback_every,
    }


def _run_host(
    problem: OptimizationProblem,
    algorithm: ScipyMinimizeScalar,
    plain: dict,
    p_weak: tuple[bool, ...] | None = None,
) -> _Run:
    """One minimize_scalar run on concrete inputs."""
    import scipy.optimize as so

    from optsolve.backends.scipy.compiled import HostProblem

    spec = algorithm.spec
    host = HostProblem(problem, p_weak)
    host.prepare(("f",))
    callback, every = plain["callback"], plain["callback_every"] or 1
    extra = (math.nan,) if callback is not None and wants_grad_norm(callback) else ()
    deadline = None if plain["maxtime"] is None else time.perf_counter() + plain["maxtime"]
    best: list = []  # (x, f) of the lowest finite value evaluated
    count = [0]

    def fun(x):
        xf = np.reshape(np.asarray(x, np.float64), (1,))
        f = host.fun(xf)
        count[0] += 1
        if not math.isfinite(f):
            raise _Stop(ReturnCode.FAILURE, host.nonfinite_note())
        if not best or f < best[0][1]:
            best[:] = [(float(xf[0]), f)]
        if (
            callback is not None
            and count[0] % every == 0
            and callback(count[0], host.unravel_numpy(xf), np.float64(f), *extra)
        ):
            raise _Stop(ReturnCode.TERMINATED, "stopped by the user's callback")
        if deadline is not None and time.perf_counter() >= deadline:
            raise _Stop(ReturnCode.MAXTIME, "stopped by optsolve's maxtime")
        return f

    options = {k: v for k, v in algorithm.options.items() if k != "bracket"}
    if plain["maxiters"] is not None:
        options["maxiter"] = plain["maxiters"]
    kwargs: dict[str, Any] = {"method": spec.key, "options": options}
    x0 = float(host.x0[0])
    if spec.takes_bounds:
        lower, upper = (
            float(np.ravel(np.asarray(jax.tree_util.tree_leaves(b)[0]))[0]) for b in problem.bounds
        )
        kwargs["bounds"] = (lower, upper)
    else:
        bracket = algorithm.options.get("bracket")
        kwargs["bracket"] = (x0, x0 + 1.0) if bracket is None else tuple(bracket)
    try:
        result = so.minimize_scalar(fun, **kwargs)
    except _Stop as stop:
        if not best:  # nothing finite evaluated: the start is the last good point
            best.append((x0, host.fun(host.x0)))
        x, f = best[0]
        result = so.OptimizeResult(
            x=x, fun=f, nit=count[0], nfev=host.n_f, success=False, message=stop.why
        )
        return _Run(x, f, stop.code, count[0], host.n_f, result, stop.why, host)
    except KeyboardInterrupt:
        x, f = best[0] if best else (x0, math.nan)
        result = so.OptimizeResult(
            x=x,
            fun=f,
            nit=count[0],
            nfev=host.n_f,
            success=False,
            message="interrupted (KeyboardInterrupt)",
        )
        return _Run(
            x,
            f,
            ReturnCode.INTERRUPTED,
            count[0],
            host.n_f,
            result,
            "interrupted (KeyboardInterrupt)",
            host,
        )
    x, f = float(np.ravel(result.x)[0]), float(np.ravel(result.fun)[0])
    nit = int(result.get("nit", count[0]))
    if result.success:
        code = ReturnCode.SUCCESS
    elif (plain["maxiters"] is not None and nit >= plain["maxiters"]) or "Maximum number" in str(
        result.message
    ):
        code = ReturnCode.MAXITERS
    else:
        code = ReturnCode.FAILURE
    if spec.takes_bounds and not kwargs["bounds"][0] <= x <= kwargs["bounds"][1]:
        code = ReturnCode.INFEASIBLE
    return _Run(x, f, code, nit, host.n_f, result, str(result.message).strip(), host)


def _check(
    problem: OptimizationProblem, algorithm: ScipyMinimizeScalar, options: SolveOptions
) -> None:
    name = type(algorithm).__name__
    for option, why in (
        ("gtol", "it uses no gradient"),
        ("ftol", "scipy's minimize_scalar has no test on f"),
    ):
        value = getattr(options, option)
        if value is not None:
            tolerance = " or ".join(f"`{o}`" for o in algorithm.spec.options if "tol" in o)
            raise ValueError(
                f"solve: {name} does not take `{option}` (got {option}={value}): {why}. "
                f"Remove it; its tolerance is the method option {tolerance}, e.g. "
                f"ScipyMinimizeScalar({algorithm.method!r}, {tolerance.strip('`')}=1e-10)."
            )


def solve_minimize_scalar(
    problem: OptimizationProblem,
    algorithm: ScipyMinimizeScalar,
    options: SolveOptions,
    loop: Any = None,
) -> Solution:
    """Run ``minimize_scalar``; through ``jax.pure_callback`` when inputs are traced.
    ``loop`` is unused (scipy's iterations run on the host)."""
    _check(problem, algorithm, options)
    resume = options.resume
    if resume is not None:
        problem = problem.replace(x0=resume.x)
    x_leaf, x_def = jax.tree_util.tree_flatten(problem.x0)
    x_dtype = jnp.result_type(x_leaf[0])
    f_dtype = jax.eval_shape(problem.f, problem.x0, problem.p).dtype
    if not is_traced(problem, options):
        run = _run_host(problem, algorithm, _plain(options))
        x, objective = jax.device_put((np.asarray(run.x, x_dtype), np.asarray(run.fun, f_dtype)))
        solution = Solution(
            x=jax.tree_util.tree_unflatten(x_def, [x]),
            objective=objective,
            retcode=run.code,
            stats=Stats(iterations=run.nit, f_evals=run.nfev, grad_evals=None, time=None),
            original=run.result,
            detail=_detail(run),
        )
    else:
        solution = _solve_traced(problem, algorithm, options, x_def, x_dtype, f_dtype)
    if resume is None:
        return solution
    before = resume.stats
    stats = solution.stats
    add = lambda now, earlier: (
        now
        if earlier is None
        else now
        + (int(earlier) if isinstance(now, int) else jnp.asarray(earlier).astype(now.dtype))
    )
    return dataclasses.replace(
        solution,
        stats=Stats(
            iterations=add(stats.iterations, before.iterations),
            f_evals=add(stats.f_evals, before.f_evals),
            grad_evals=None,
            time=None,
        ),
    )


def _detail(run: _Run) -> str:
    notes = [run.detail]
    if run.host.nonfinite and run.code != ReturnCode.FAILURE:
        notes.append(run.host.nonfinite_note())
    return "; ".join(n for n in notes if n)


def _solve_traced(problem, algorithm, options, x_def, x_dtype, f_dtype) -> Solution:
    """The host run inside ``jax.pure_callback``: x, objective, retcode and counts only."""
    p_weak = tuple(
        bool(getattr(jax.typeof(leaf), "weak_type", False))
        if not isinstance(leaf, (bool, int, float, complex))
        else True
        for leaf in jax.tree_util.tree_leaves(problem.p)
    )
    static = {"callback": options.callback, "callback_every": options.callback_every}
    shapes = (
        jax.ShapeDtypeStruct((), x_dtype),
        jax.ShapeDtypeStruct((), f_dtype),
        *(jax.ShapeDtypeStruct((), jnp.int32),) * 3,
    )

    def host_fn(prob, opts):
        plain = _plain(opts)
        plain.update(static)
        run = _run_host(prob, algorithm, plain, p_weak)
        return (
            np.asarray(run.x, x_dtype),
            np.asarray(run.fun, f_dtype),
            np.asarray(int(run.code), np.int32),
            np.asarray(run.nit, np.int32),
            np.asarray(run.nfev, np.int32),
        )

    x, fun, code, nit, nfev = jax.pure_callback(
        host_fn, shapes, problem, options, vmap_method="sequential"
    )
    return Solution(
        x=jax.tree_util.tree_unflatten(x_def, [x]),
        objective=fun,
        retcode=code,
        stats=Stats(iterations=nit, f_evals=nfev, grad_evals=None, time=None),
        original=None,
    )


register_backend(ScipyMinimizeScalar, solve_minimize_scalar)
