"""The scipy family: every method of ``scipy.optimize.minimize`` and scipy's global optimizers.

``ScipyMinimize(method="L-BFGS-B", **scipy_options)`` and
``ScipyGlobal(method="differential_evolution", **scipy_options)`` are immutable pytrees
(the method and its options are static aux data: scipy compiles nothing). Each method is
its own generated subclass, so the capability traits (bounds, constraints, derivatives)
are class attributes that ``solve``'s central checks and the "use one of these" lists
read; ``ScipyMinimize("BFGS")`` returns an instance of ``ScipyMinimize(method='BFGS')``,
a subclass of :class:`ScipyMinimize`.

Derivatives come from JAX (:mod:`optsolve.backends.scipy.compiled`): one compiled value-and-gradient
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
(the same test); SLSQP's own (absolute) ``ftol`` also takes it; elsewhere ``ftol``, like
``maxtime`` and the callback, is tested by optsolve after each iteration, on a constrained
problem only at a feasible point (within ``FEASIBILITY_TOL``; for SLSQP, within ftol),
stopping scipy through
``StopIteration`` in ``callback(intermediate_result)`` (scipy >= 1.11) or, for TNC, shgo
and direct, whose callbacks cannot stop them, by an exception optsolve catches.
A non-finite f, gradient or Hessian at any evaluation gives FAILURE with the last finite
iterate (never SUCCESS or MAXITERS, never an exception), and ``Solution.detail`` says how
often, under ``solve(nonfinite="fail")``; under ``"reject"``, the default of the methods
that compare values (``MethodSpec.rejects_nonfinite``), the method sees +inf there and
passes over the point, the count still in the message; a run that ends outside the constraints or
bounds (by more than ``FEASIBILITY_TOL``, relative, in :mod:`optsolve.backends.scipy.compiled`) is
INFEASIBLE, its message stating the violation; trust-constr's success on its barrier subproblem
while the barrier still keeps it short of the constrained optimum is STALLED. ``Solution.detail`` is
scipy's message, then optsolve's notes where it stopped the run or changed the code. The run itself
is in :mod:`optsolve.backends.scipy.run` (optsolve's per-iteration side in
:mod:`optsolve.backends.scipy.monitor`), the method tables in :mod:`optsolve.backends.scipy.options`
and :mod:`optsolve.backends.scipy.retcodes`.

Inside ``jax.jit`` / ``jax.vmap`` the run goes through ``jax.pure_callback``
(``vmap_method="sequential"``: one scipy run per batch element); ``Solution.original``
(scipy's OptimizeResult) and ``detail`` cannot cross a trace and are None there, and
``history=True`` is refused (the history's length is only known at the end of the run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.scipy.compiled import eval_dtype
from optsolve.backends.scipy.memory import check_dense_memory
from optsolve.backends.scipy.options import (
    GLOBAL_SPECS,
    MINIMIZE_SPECS,
    MethodSpec,
    canonical_method,
    check_options,
    methods_with,
)
from optsolve.backends.scipy.run import run_host
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.kkt import constraint_size
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import freeze, is_traced, thaw, tree_spec
from optsolve.solve_api.registry import register_algorithm, register_backend
from optsolve.solve_api.solution import History, Solution, Stats

PyTree = Any


class _ScipyAlgorithm(Algorithm):
    """Common base: a method name and its scipy options, immutable, a pytree with no leaves."""

    family: ClassVar[str] = "scipy"
    stops_by_itself: ClassVar[bool] = True
    resumable: ClassVar[bool] = True  # a warm start from sol.x (scipy keeps no state)
    records_history: ClassVar[bool] = True  # eager solves only
    jittable: ClassVar[bool] = True
    vmappable: ClassVar[bool] = True
    rejects_nonfinite: ClassVar[bool] = False  # MethodSpec.rejects_nonfinite
    spec: ClassVar[MethodSpec]
    _kind: ClassVar[str]
    _classes: ClassVar[dict[str, type]]

    def __new__(cls, method: str | None = None, **options: Any):
        if cls in (ScipyMinimize, ScipyGlobal):
            if method is None:
                raise TypeError(
                    f"{cls.__name__}: `method` is required; one of "
                    f"{', '.join(repr(s.name) for s in cls._specs().values())}."
                )
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
                    f"scipy.optimize.minimize method name, got {local!r}."
                )
        options = check_options(spec, options)
        if local is not None:
            options["local"] = local
        object.__setattr__(
            self, "_options", tuple(sorted((k, freeze(v)) for k, v in options.items()))
        )

    @classmethod
    def traits(cls) -> dict[str, Any]:
        """The class's traits, with ``rejects_nonfinite``: the method can pass over a point
        where f is not finite (``solve(nonfinite="reject")``, its default)."""
        return {**super().traits(), "rejects_nonfinite": cls.rejects_nonfinite}

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
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...).")

    def replace(self, **changes: Any) -> _ScipyAlgorithm:
        """A copy with some scipy options changed (checked like a new construction)."""
        return type(self)(**{**self.options, **changes})

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
      **options: the method's own scipy options (``maxcor=20`` for L-BFGS-B, ...),
        evaluation budgets included (``maxfev``, ``maxfun``, and COBYLA's ``maxiter``,
        which counts evaluations). Those ``solve`` owns are errors here: ``maxiter``
        where it counts iterations (use ``solve(maxiters=...)``), ``gtol`` where it maps
        to ``solve(gtol=...)`` and L-BFGS-B's ``ftol``; so are options scipy would
        ignore because JAX supplies exact derivatives (``eps``,
        ``finite_diff_rel_step``, ``workers``) and deprecated ones.

    Bounds go to Nelder-Mead, Powell, L-BFGS-B, TNC, COBYLA, COBYQA, SLSQP and
    trust-constr; :class:`optsolve.Constraint` s to COBYLA, COBYQA, SLSQP and
    trust-constr. A run that ends outside them by more than ``FEASIBILITY_TOL`` (1e-6,
    relative to max(1, |bound|)) is INFEASIBLE. ``maxiters`` is scipy's ``maxiter`` as
    scipy counts iterations, and ``stats.iterations`` scipy's ``nit``. The callback runs
    after each iteration, except for COBYQA, which scipy calls back after each
    evaluation while counting trust-region iterations the callback cannot see: its
    callback's ``k`` counts evaluations (a stop at ``k`` is scipy's StopIteration at
    the k-th evaluation, ``stats.f_evals == k``), ``stats.iterations`` is scipy's ``nit``
    (callback stops included), ``maxiters`` its ``maxiter`` and ``maxfev`` its own
    option; it records no history. The MAXITERS message names the budget that ended
    the run. ``Solution.original`` is scipy's ``OptimizeResult`` (None inside
    ``jax.jit`` / ``jax.vmap``).

    Non-finite values: Nelder-Mead, Powell, COBYLA and COBYQA compare values, so by
    default (``solve(nonfinite="reject")``) a point where f is NaN or infinite is handed
    to them as +inf and passed over, the idiom of returning ``inf`` outside a feasible
    region; the message counts such points, and the run is never SUCCESS at one.
    ``nonfinite="fail"`` makes any such value a FAILURE, the gradient methods' only
    policy.

    SUCCESS means a tolerance holds at the returned point: the user's, or scipy's default
    when the user gave none. When ``solve(gtol=...)`` is given without ``ftol``, L-BFGS-B's
    own ftol test is turned off (ftol=0) so that gtol decides; where scipy still reports
    success on a test of its own (an xtol, ftol or xrtol the user did not ask for) and the
    gradient's projected infinity norm at the returned point exceeds gtol, the code is
    STALLED and ``Solution.detail`` names scipy's reason and the norm reached.

    ``history=True`` records f and the projected gradient inf-norm (NaN for
    derivative-free methods) at x0 and after each iteration, eager solves only.
    ``resume=sol`` is a warm start from ``sol.x``: scipy's internal state (L-BFGS memory,
    simplex) is not kept; the counts add the earlier run's. ``progress=True`` advances the
    bar about every maxiters // 100 iterations and at the end. Reference: Nocedal &
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
      **options: the method's own scipy options (``popsize``, ``rng``, ...), its own
        iteration budget included (``maxiter``; basinhopping's ``niter``, shgo's
        ``iters``), which ``solve(maxiters=...)``, where smaller, caps. For
        basinhopping, ``local`` is the local method: a :class:`ScipyMinimize` or a method
        name (default ``ScipyMinimize("L-BFGS-B")``), which receives the bounds and
        constraints and JAX derivatives.

    Local searches (dual_annealing, shgo, differential_evolution's polish, basinhopping)
    get JAX gradients; shgo's is scipy's own default (SLSQP, ftol 1e-12). basinhopping
    takes bounds, constraints and a gradient exactly when its local method does
    (:meth:`capabilities`). An iteration is what scipy's callback reports: a generation of
    differential_evolution (before its polish), a hop of basinhopping, an iteration of
    direct after its first two (which divide the box). ``history=True`` records f at each
    (the best point so far, or the hop's local minimum) except for dual_annealing and shgo,
    whose callbacks run per new minimum and per local-search iteration. ``resume=sol`` is a
    warm start from ``sol.x`` (scipy's internal state, population or annealing schedule,
    is not kept), and the counts add up. An iteration budget the user set (``maxiters``
    or the method's own) that ends the run is MAXITERS, its message naming the budget.
    dual_annealing has no convergence test: every run of it ends with its iteration
    budget (scipy's default ``maxiter=1000``), so it ends MAXITERS, saying so.
    basinhopping and shgo at the end of their default budget are SUCCESS as scipy
    reports it: the local searches' tolerance holds at the returned point. A point
    where f is not finite is passed over by default (``solve(nonfinite="reject")``: the
    method sees +inf; the message counts them; ``nonfinite="fail"`` makes it a FAILURE);
    a NaN gradient in a local search (differential_evolution's polish) rejects that
    trial point.

    differential_evolution with ``vectorized=True`` evaluates each generation's
    population (and the constraints, where there are any) in one vmapped compiled call
    instead of one call per point; scipy's vectorised mode needs ``updating='deferred'``,
    which it implies (``updating='immediate'`` with it is an error). It is also the default
    under ``updating='deferred'``, where it changes nothing but the speed: the same ``rng``
    gives the same trials and the same result (``vectorized=False`` opts out). It is not the
    default otherwise, because scipy's default ``updating='immediate'`` (each better trial
    enters the population at once) is a different search. ``stats.f_evals`` counts points;
    scipy's ``original.nfev`` and its ``maxfun`` then count calls. No other scipy global
    method takes a vectorised objective. Reference: scipy.optimize's global optimization
    documentation.

    Example:
      >>> prob = OptimizationProblem(f, jnp.zeros(5), bounds=(-5.12, 5.12))
      >>> sol = optsolve.solve(prob, optsolve.ScipyGlobal("differential_evolution", rng=0))
      >>> fast = optsolve.ScipyGlobal("differential_evolution", rng=0, vectorized=True)
    """

    _kind = "global"
    _classes: ClassVar[dict[str, type]] = {}

    def capabilities(self) -> dict[str, Any]:
        """The class's traits; basinhopping's bounds, constraints and gradient are its
        local method's (it passes them on, and only evaluates f otherwise)."""
        caps = super().capabilities()
        if type(self).spec.key == "basinhopping":
            local = self.options["local"].capabilities()
            for trait in ("takes_bounds", "takes_constraints", "needs_gradient"):
                caps[trait] = local[trait]
        return caps


def _make_class(base: type, spec: MethodSpec) -> type:
    base_name = base.__name__
    name = f"{base_name}(method={spec.name!r})"
    cls = type(
        name,
        (base,),
        {
            "spec": spec,
            "needs_gradient": spec.needs_gradient,
            "needs_hessian": spec.hessian is not None,
            "takes_bounds": spec.takes_bounds,
            "takes_constraints": spec.takes_constraints,
            "rejects_nonfinite": spec.rejects_nonfinite,
            # dual_annealing calls its callback per new best minimum and shgo per iteration of
            # its local searches: neither shows an iterate per iteration it counts.
            "records_history": spec.callback_per_iteration,
            "conditional_traits": {
                trait: f"with a `local` method that {what}"
                for trait, what in (
                    ("takes_bounds", "takes bounds"),
                    ("takes_constraints", "takes constraints"),
                )
            }
            if spec.key == "basinhopping"
            else {},
            "__doc__": f"{base_name} with method={spec.name!r}: see {base_name}.",
            "__module__": "optsolve",
            "__qualname__": name,
        },
    )
    jax.tree_util.register_pytree_node(
        cls, lambda a: ((), a._options), lambda aux, _, cls=cls: _unflatten(cls, aux)
    )
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
    """solve's options as Python numbers and flags for the host run (see ``run_host``)."""

    def num(v, kind):
        return None if v is None else kind(np.asarray(v))

    return {
        "maxiters": num(options.maxiters, int),
        "maxtime": num(options.maxtime, float),
        "gtol": num(options.gtol, float),
        "ftol": num(options.ftol, float),
        "xtol": num(options.get("xtol"), float),  # (least_squares takes it)
        "callback": options.callback,
        "callback_every": options.callback_every,
        "progress": bool(options.progress),
        "history": bool(options.history),
        "metrics": options.metrics,
        "evaluate": options.evaluate,
        "eval_every": options.eval_every,
        "keep": options.keep,
        "nonfinite": options.nonfinite,
    }


_F_DTYPES = BoundedCache(1024)


def _objective_dtype(problem: OptimizationProblem):
    """f's output dtype; cached per (f, shapes, dtypes): tracing f costs more than scipy's setup."""

    def trace():
        x_spec = jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf)), problem.x0
        )
        p_spec = jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(
                np.shape(leaf),
                jnp.result_type(leaf),
                weak_type=bool(getattr(jax.typeof(leaf), "weak_type", False)),
            ),
            problem.p,
        )
        return jax.eval_shape(problem.f, x_spec, p_spec).dtype

    try:
        key = (problem.f, tree_spec(problem.x0), tree_spec(problem.p), jax.config.jax_enable_x64)
    except TypeError:
        return trace()
    return _F_DTYPES.get_or_make(key, trace)


def solve_scipy(
    problem: OptimizationProblem,
    algorithm: _ScipyAlgorithm,
    options: SolveOptions,
    loop: Any = None,
    *,
    host_run=run_host,
) -> Solution:
    """Run a scipy-family algorithm; through ``jax.pure_callback`` when inputs are traced.
    ``loop`` is unused: scipy's iterations run on the host (no algorithm here unrolls).
    ``host_run``: the run on concrete inputs (least_squares has its own)."""
    _check_early(problem, algorithm, options)
    f_dtype = _objective_dtype(problem)
    resume = options.resume
    if resume is not None:
        # A warm start: scipy keeps no state between runs, only the point carries over.
        problem = problem.replace(x0=resume.x)
    if not is_traced(problem, options):
        run = host_run(problem, algorithm, _plain_options(options))
        # One transfer for x's leaves and the objective.
        x_tree, objective = jax.device_put(
            (run.host.unravel_numpy(run.x), np.asarray(run.fun, f_dtype))
        )
        history = None if run.history is None else History(*run.history)
        solution = Solution(
            x=x_tree,
            objective=objective,
            retcode=run.code,
            stats=Stats(iterations=run.nit, f_evals=run.nfev, grad_evals=run.njev, time=None),
            original=run.result,
            history=history,
            detail=run.detail,
            multipliers=None
            if run.multipliers is None
            else jnp.asarray(run.multipliers, run.host.dtype),
        )
    else:
        solution = _solve_traced(problem, algorithm, options, f_dtype, host_run)
    return solution if resume is None else _add_counts(solution, resume.stats)


def _add_counts(solution: Solution, earlier: Stats) -> Solution:
    """``solution`` with the earlier run's iterations and evaluations added to its own."""

    def add(now, before):
        if now is None or before is None:
            return now
        if isinstance(now, int):  # eager: both concrete
            return now + int(before)
        return now + jnp.asarray(before).astype(now.dtype)

    stats = solution.stats
    return dataclasses.replace(
        solution,
        stats=Stats(
            iterations=add(stats.iterations, earlier.iterations),
            f_evals=add(stats.f_evals, earlier.f_evals),
            grad_evals=add(stats.grad_evals, earlier.grad_evals),
            time=None,
        ),
    )


def _check_early(
    problem: OptimizationProblem, algorithm: _ScipyAlgorithm, options: SolveOptions
) -> None:
    """Errors known before running (so they are plain Python errors even under jit)."""
    spec = algorithm.spec
    # (basinhopping's bounds and constraints are checked centrally: see capabilities())
    gtol_spec = algorithm.options["local"].spec if spec.key == "basinhopping" else spec
    if options.gtol is not None and not (gtol_spec.native_gtol or gtol_spec.key == "newton-cg"):
        why = "it uses no gradient" if not gtol_spec.needs_gradient else "it has no gradient test"
        raise ValueError(
            f"solve: {type(algorithm).__name__} does not take `gtol` (got gtol={options.gtol}): "
            f"{why}. Remove it (use ftol or maxiters), or use a method that tests the gradient: "
            f"{', '.join(s for s in methods_with('native_gtol'))}, Newton-CG."
        )
    check_dense_memory(problem, algorithm)
    if isinstance(algorithm, ScipyGlobal) and spec.key != "basinhopping" and problem.bounds is None:
        raise ValueError(
            f"solve: ScipyGlobal(method={spec.name!r}) searches a box, so it needs finite "
            "`bounds` on every variable; got bounds=None. Give them, e.g. "
            "OptimizationProblem(f, x0, bounds=(-5.0, 5.0)), or use "
            "ScipyGlobal(method='basinhopping'), which needs none."
        )


def _solve_traced(problem, algorithm, options, f_dtype, host_run=run_host) -> Solution:
    """The host run inside ``jax.pure_callback``: x, objective, retcode and counts only."""
    if options.history:
        raise ValueError(
            f"solve: history=True with {type(algorithm).__name__} needs an eager solve (outside "
            "jax.jit / jax.vmap): scipy runs on the host and its number of iterations, the "
            "history's length, is only known at the end."
        )
    if options.keep == "best" or options.evaluate is not None:
        raise ValueError(
            f"solve: `evaluate` and keep='best' with {type(algorithm).__name__} need an eager "
            "solve (outside jax.jit / jax.vmap): scipy's iterates are followed on the host."
        )
    spec = algorithm.spec
    p_leaves = jax.tree_util.tree_leaves(problem.p)
    p_weak = tuple(
        bool(getattr(jax.typeof(leaf), "weak_type", False))
        if not isinstance(leaf, (bool, int, float, complex))
        else True
        for leaf in p_leaves
    )
    x_leaves, x_def = jax.tree_util.tree_flatten(problem.x0)
    int_t = jnp.int32
    has_njev = spec.needs_gradient
    shapes = (
        [jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf)) for leaf in x_leaves]
        + [jax.ShapeDtypeStruct((), f_dtype)]
        + [jax.ShapeDtypeStruct((), int_t)] * (4 if has_njev else 3)
    )
    static_options = {"callback": options.callback, "callback_every": options.callback_every}
    # the method's own multipliers, flat (NaN where it gave none: solve then uses its own)
    n_lam = constraint_size(problem, problem.x0) if spec.key in ("slsqp", "trust-constr") else 0
    if n_lam:
        shapes.append(jax.ShapeDtypeStruct((n_lam,), eval_dtype(problem.x0)))

    def host_fn(prob, opts):
        plain = _plain_options(opts)
        plain.update(static_options)
        run = host_run(prob, algorithm, plain, p_weak)
        xs = jax.tree_util.tree_leaves(run.host.unravel_numpy(run.x))
        ints = [run.nit, run.nfev] + ([run.njev] if has_njev else [])
        lam = (
            []
            if not n_lam
            else [
                np.asarray(
                    np.full(n_lam, np.nan) if run.multipliers is None else run.multipliers,
                    shapes[-1].dtype,
                )
            ]
        )
        return (
            *xs,
            np.asarray(run.fun, f_dtype),
            np.asarray(int(run.code), np.int32),
            *(np.asarray(i, np.int32) for i in ints),
            *lam,
        )

    out = jax.pure_callback(host_fn, tuple(shapes), problem, options, vmap_method="sequential")
    n = len(x_leaves)
    x = jax.tree_util.tree_unflatten(x_def, out[:n])
    fun, code, nit, nfev = out[n : n + 4]
    njev = out[n + 4] if has_njev else None
    return Solution(
        x=x,
        objective=fun,
        retcode=code,
        stats=Stats(iterations=nit, f_evals=nfev, grad_evals=njev, time=None),
        original=None,
        multipliers=out[-1] if n_lam else None,
    )


register_backend(ScipyMinimize, solve_scipy)
register_backend(ScipyGlobal, solve_scipy)
