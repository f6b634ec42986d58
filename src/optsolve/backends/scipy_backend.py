"""The scipy family: every method of ``scipy.optimize.minimize`` and scipy's global optimizers.

``ScipyMinimize(method="L-BFGS-B", **scipy_options)`` and
``ScipyGlobal(method="differential_evolution", **scipy_options)`` are immutable pytrees
(the method and its options are static aux data: scipy compiles nothing). Each method is
its own generated subclass, so the capability traits (bounds, constraints, derivatives)
are class attributes that ``solve``'s central checks and the "use one of these" lists
read; ``ScipyMinimize("BFGS")`` returns an instance of ``ScipyMinimize(method='BFGS')``,
a subclass of :class:`ScipyMinimize`.

Derivatives come from JAX (:mod:`.scipy_compiled`): one compiled value-and-gradient
evaluation per point (scipy's ``jac=True``), ``hessp`` for Newton-CG, trust-ncg,
trust-krylov and trust-constr, the dense ``hess`` for dogleg and trust-exact, constraint
Jacobians for SLSQP and trust-constr and the Lagrangian's Hessian for trust-constr;
nothing a method ignores is computed or passed.

The common options: ``maxiters`` is scipy's ``maxiter`` where that counts iterations
(counted by optsolve for TNC and COBYLA, whose budgets count evaluations, and
``niter`` / ``iters`` for basinhopping / shgo); ``gtol`` is scipy's own ``gtol`` where the
method has one (for Newton-CG, which has none, and the trust-region methods, whose
``gtol`` tests the 2-norm, optsolve tests ||grad||_inf after each iteration);
``ftol`` (relative change of the objective between iterations) is L-BFGS-B's own ``ftol``
(the same test) and elsewhere, like ``maxtime`` and the callback, is tested by optsolve
after each iteration, stopping scipy through
``StopIteration`` in ``callback(intermediate_result)`` (scipy >= 1.11) or, for TNC, shgo
and direct, whose callbacks cannot stop them, by an exception optsolve catches.
Numerical trouble (NaN/inf) gives FAILURE with the last finite iterate, never an exception;
a run that ends outside the constraints or bounds (by more than
``scipy_run.FEASIBILITY_TOL``, relative) is INFEASIBLE. The run itself is in
:mod:`.scipy_run`, the method tables in :mod:`.scipy_options` and :mod:`.scipy_retcodes`.

Inside ``jax.jit`` / ``jax.vmap`` the run goes through ``jax.pure_callback``
(``vmap_method="sequential"``: one scipy run per batch element); ``Solution.original``
(scipy's OptimizeResult) cannot cross a trace and is None there.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.scipy_options import (
    GLOBAL_SPECS, MINIMIZE_SPECS, MethodSpec, canonical_method, check_options, methods_with,
)
from optsolve.backends.scipy_run import run_host
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import tree_spec, freeze, is_traced, thaw
from optsolve.solve_api.registry import register_algorithm, register_backend
from optsolve.solve_api.solution import Solution, Stats

PyTree = Any


class _ScipyAlgorithm(Algorithm):
    """Common base: a method name and its scipy options, immutable, a pytree with no leaves."""

    family: ClassVar[str] = "scipy"
    stops_by_itself: ClassVar[bool] = True
    jittable: ClassVar[bool] = True
    vmappable: ClassVar[bool] = True
    spec: ClassVar[MethodSpec]
    _kind: ClassVar[str]
    _classes: ClassVar[dict[str, type]]

    def __new__(cls, method: str | None = None, **options: Any):
        if cls in (ScipyMinimize, ScipyGlobal):
            if method is None:
                raise TypeError(f"{cls.__name__}: `method` is required; one of "
                                f"{', '.join(repr(s.name) for s in cls._specs().values())}.")
            cls = cls._classes[canonical_method(cls._kind, method)]
        return object.__new__(cls)

    def __init__(self, method: str | None = None, **options: Any):
        spec = type(self).spec
        if method is not None and canonical_method(self._kind, method) != spec.key:
            raise TypeError(f"{type(self).__name__}: got method={method!r}.")
        local = None
        if spec.key == "basinhopping":
            local = options.pop("local", "L-BFGS-B")
            if isinstance(local, str):
                local = ScipyMinimize(local)
            if not isinstance(local, ScipyMinimize):
                raise TypeError(
                    "ScipyGlobal(method='basinhopping'): `local` must be a ScipyMinimize or a "
                    f"scipy.optimize.minimize method name, got {local!r}.")
        options = check_options(spec, options)
        if local is not None:
            options["local"] = local
        object.__setattr__(self, "_options", tuple(sorted(
            (k, freeze(v)) for k, v in options.items())))

    @classmethod
    def _specs(cls) -> dict[str, MethodSpec]:
        return MINIMIZE_SPECS if cls._kind == "minimize" else GLOBAL_SPECS

    @property
    def method(self) -> str:
        """The scipy method, spelled as scipy documents it."""
        return type(self).spec.name

    @property
    def options(self) -> dict[str, Any]:
        """The scipy options given at construction (a copy)."""
        return {k: thaw(v) for k, v in self._options}

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; build a new one instead.")

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.options.items())
        base = "ScipyMinimize" if self._kind == "minimize" else "ScipyGlobal"
        return f"{base}(method={self.method!r}{args})"

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and self._options == other._options

    def __hash__(self) -> int:
        return hash((type(self), self._options))


class ScipyMinimize(_ScipyAlgorithm):
    """A method of ``scipy.optimize.minimize``, with derivatives from JAX.

    Args:
      method: one of Nelder-Mead, Powell, CG, BFGS, Newton-CG, L-BFGS-B, TNC, COBYLA,
        COBYQA, SLSQP, trust-constr, dogleg, trust-ncg, trust-exact, trust-krylov
        (case-insensitive).
      **options: the method's own scipy options (``maxcor=20`` for L-BFGS-B, ...).
        Those ``solve`` owns are errors here: ``maxiter`` (use ``solve(maxiters=...)``),
        ``gtol`` where it maps to ``solve(gtol=...)`` and L-BFGS-B's ``ftol``; so are options scipy would
        ignore because JAX supplies exact derivatives (``eps``,
        ``finite_diff_rel_step``, ``workers``) and deprecated ones.

    Bounds go to Nelder-Mead, Powell, L-BFGS-B, TNC, COBYLA, COBYQA, SLSQP and
    trust-constr; :class:`optsolve.Constraint` s to COBYLA, COBYQA, SLSQP and
    trust-constr. A run that ends outside them by more than ``FEASIBILITY_TOL`` (1e-6,
    relative to max(1, |bound|)) is INFEASIBLE. The callback runs after each iteration
    (COBYQA: after each evaluation, as scipy calls it). ``Solution.original`` is scipy's
    ``OptimizeResult`` (None inside ``jax.jit`` / ``jax.vmap``). Reference: Nocedal &
    Wright, *Numerical Optimization* (2006), and scipy.optimize.minimize's documentation
    per method.

    Example:
      >>> sol = optsolve.solve(prob, optsolve.ScipyMinimize("L-BFGS-B", maxcor=20))
    """

    _kind = "minimize"
    _classes: ClassVar[dict[str, type]] = {}


class ScipyGlobal(_ScipyAlgorithm):
    """A global optimizer of scipy.optimize.

    Args:
      method: ``differential_evolution``, ``dual_annealing``, ``shgo``, ``direct`` (these
        four need finite bounds on every variable) or ``basinhopping``.
      **options: the method's own scipy options (``popsize``, ``rng``, ...). Not
        ``maxiter`` / ``niter`` / ``iters``: use ``solve(maxiters=...)``. For
        basinhopping, ``local`` is the local method: a :class:`ScipyMinimize` or a method
        name (default ``ScipyMinimize("L-BFGS-B")``), which receives the bounds and
        constraints and JAX derivatives.

    Local searches (dual_annealing, shgo, differential_evolution's polish, basinhopping)
    get JAX gradients. Reference: scipy.optimize's global optimization documentation.

    Example:
      >>> prob = OptimizationProblem(f, jnp.zeros(5), bounds=(-5.12, 5.12))
      >>> sol = optsolve.solve(prob, optsolve.ScipyGlobal("differential_evolution", rng=0))
    """

    _kind = "global"
    _classes: ClassVar[dict[str, type]] = {}


def _make_class(base: type, spec: MethodSpec) -> type:
    base_name = base.__name__
    name = f"{base_name}(method={spec.name!r})"
    cls = type(name, (base,), {
        "spec": spec,
        "needs_gradient": spec.needs_gradient,
        "needs_hessian": spec.hessian is not None,
        "takes_bounds": spec.takes_bounds,
        "takes_constraints": spec.takes_constraints,
        "__doc__": f"{base_name} with method={spec.name!r}: see {base_name}.",
        "__module__": "optsolve",
        "__qualname__": name,
    })
    jax.tree_util.register_pytree_node(
        cls, lambda a: ((), a._options), lambda aux, _, cls=cls: _unflatten(cls, aux))
    base._classes[spec.key] = cls
    register_algorithm(cls)
    return cls


def _unflatten(cls: type, aux: tuple) -> Any:
    obj = object.__new__(cls)
    object.__setattr__(obj, "_options", aux)
    return obj


for _spec in MINIMIZE_SPECS.values():
    _make_class(ScipyMinimize, _spec)
for _spec in GLOBAL_SPECS.values():
    _make_class(ScipyGlobal, _spec)


def _plain_options(options: SolveOptions) -> dict:
    def num(v, kind):
        return None if v is None else kind(np.asarray(v))
    return {"maxiters": num(options.maxiters, int), "maxtime": num(options.maxtime, float),
            "gtol": num(options.gtol, float), "ftol": num(options.ftol, float),
            "callback": options.callback, "callback_every": options.callback_every}


_F_DTYPES: dict = {}


def _objective_dtype(problem: OptimizationProblem):
    """f's output dtype; cached per (f, shapes, dtypes): tracing f costs more than scipy's setup."""
    try:
        key = (problem.f, tree_spec(problem.x0), tree_spec(problem.p), jax.config.jax_enable_x64)
        hash(key)
    except TypeError:
        key = None
    if key is None or key not in _F_DTYPES:
        x_spec = jax.tree_util.tree_map(
            lambda l: jax.ShapeDtypeStruct(np.shape(l), jnp.result_type(l)), problem.x0)
        p_spec = jax.tree_util.tree_map(
            lambda l: jax.ShapeDtypeStruct(
                np.shape(l), jnp.result_type(l),
                weak_type=bool(getattr(jax.typeof(l), "weak_type", False))), problem.p)
        dtype = jax.eval_shape(problem.f, x_spec, p_spec).dtype
        if key is None:
            return dtype
        if len(_F_DTYPES) > 1024:
            _F_DTYPES.clear()
        _F_DTYPES[key] = dtype
    return _F_DTYPES[key]


def solve_scipy(problem: OptimizationProblem, algorithm: _ScipyAlgorithm,
                options: SolveOptions) -> Solution:
    """Run a scipy-family algorithm; through ``jax.pure_callback`` when inputs are traced."""
    _check_early(problem, algorithm, options)
    f_dtype = _objective_dtype(problem)
    if not is_traced(problem, options):
        x, fun, code, nit, nfev, njev, result, host = run_host(
            problem, algorithm, _plain_options(options))
        # One transfer for x's leaves and the objective.
        x_tree, objective = jax.device_put((host.unravel_numpy(x), np.asarray(fun, f_dtype)))
        return Solution(
            x=x_tree, objective=objective, retcode=code,
            stats=Stats(iterations=nit, f_evals=nfev, grad_evals=njev, time=None),
            original=result,
        )
    return _solve_traced(problem, algorithm, options, f_dtype)


def _check_early(problem: OptimizationProblem, algorithm: _ScipyAlgorithm,
                 options: SolveOptions) -> None:
    """Errors known before running (so they are plain Python errors even under jit)."""
    spec = algorithm.spec
    gtol_spec = spec
    if spec.key == "basinhopping":
        local = algorithm.options["local"]
        gtol_spec = local.spec
        for what, trait, given in (("bounds", "takes_bounds", problem.has_bounds),
                                   ("constraints", "takes_constraints", problem.constraints)):
            if given and not getattr(local.spec, trait):
                raise ValueError(
                    f"solve: ScipyGlobal(method='basinhopping') passes the {what} to its "
                    f"local method, but local={local!r} does not take {what}. Use a local "
                    f"method that does: {', '.join(methods_with(trait))}.")
    if options.gtol is not None and not (gtol_spec.native_gtol or gtol_spec.key == "newton-cg"):
        why = "it uses no gradient" if not gtol_spec.needs_gradient else "it has no gradient test"
        raise ValueError(
            f"solve: {type(algorithm).__name__} does not take `gtol` (got gtol={options.gtol!r}): "
            f"{why}. Remove it (use ftol or maxiters), or use a method that tests the gradient: "
            f"{', '.join(s for s in methods_with('native_gtol'))}, Newton-CG.")
    if isinstance(algorithm, ScipyGlobal) and spec.key != "basinhopping" and problem.bounds is None:
        raise ValueError(
            f"solve: ScipyGlobal(method={spec.name!r}) searches a box, so it needs finite "
            "`bounds` on every variable; got bounds=None. Give them, e.g. "
            "OptimizationProblem(f, x0, bounds=(-5.0, 5.0)), or use "
            "ScipyGlobal(method='basinhopping'), which needs none."
        )


def _solve_traced(problem, algorithm, options, f_dtype) -> Solution:
    spec = algorithm.spec
    p_leaves = jax.tree_util.tree_leaves(problem.p)
    p_weak = tuple(bool(getattr(jax.typeof(l), "weak_type", False))
                   if not isinstance(l, (bool, int, float, complex)) else True
                   for l in p_leaves)
    x_leaves, x_def = jax.tree_util.tree_flatten(problem.x0)
    int_t = jnp.int32
    has_njev = spec.needs_gradient
    shapes = (
        [jax.ShapeDtypeStruct(np.shape(l), jnp.result_type(l)) for l in x_leaves]
        + [jax.ShapeDtypeStruct((), f_dtype)]
        + [jax.ShapeDtypeStruct((), int_t)] * (4 if has_njev else 3)
    )
    static_options = {"callback": options.callback, "callback_every": options.callback_every}

    def host_fn(prob, opts):
        plain = _plain_options(opts)
        plain.update(static_options)
        x, fun, code, nit, nfev, njev, _, host = run_host(prob, algorithm, plain, p_weak)
        xs = jax.tree_util.tree_leaves(host.unravel_numpy(x))
        ints = [nit, nfev] + ([njev] if has_njev else [])
        return (*xs, np.asarray(fun, f_dtype), np.asarray(int(code), np.int32),
                *(np.asarray(i, np.int32) for i in ints))

    out = jax.pure_callback(host_fn, tuple(shapes), problem, options, vmap_method="sequential")
    n = len(x_leaves)
    x = jax.tree_util.tree_unflatten(x_def, out[:n])
    fun, code, nit, nfev = out[n:n + 4]
    njev = out[n + 4] if has_njev else None
    return Solution(x=x, objective=fun, retcode=code,
                    stats=Stats(iterations=nit, f_evals=nfev, grad_evals=njev, time=None),
                    original=None)


register_backend(ScipyMinimize, solve_scipy)
register_backend(ScipyGlobal, solve_scipy)
