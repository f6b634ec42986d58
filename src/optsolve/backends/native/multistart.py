"""Multistart: one algorithm run from many starts sampled in the problem's box, as one
vmapped compiled solve, and the best run returned.

``solve(prob, Multistart(LBFGS(), 64, jax.random.key(0)))`` samples 64 starts in the box
of ``prob.bounds``, runs the inner algorithm's backend from each of them under
``jax.vmap`` (one compiled program: the while loop runs until the last run stops, the
finished ones masked) and returns the best run: the lowest objective among the runs that
ended SUCCESS, else the lowest finite objective. Every run's start, x, objective, return
code and iterations are in ``sol.original`` (:class:`MultistartRuns`).

The derivative with respect to ``p`` is the inner runs' one rule, the adjoint ``solve``
wraps around this backend: implicit differentiation at the best run's solution (the best
run's index does not change under an infinitesimal change of p).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, pytree_dataclass, replace, static_field
from optsolve.solve_api.registry import (
    algorithm_classes,
    as_algorithm,
    backend_for,
    register_algorithm,
    register_backend,
)
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution, Stats

PyTree = Any

SAMPLERS = ("sobol", "uniform", "latin")


@pytree_dataclass
class MultistartRuns:
    """Every run of a :class:`Multistart` solve (``sol.original``), stacked along a leading
    axis of length ``n_starts``.

    Attributes:
      starts: the sampled starts, pytrees like x0.
      x: where each run ended, pytrees like x0.
      objective: f there (the minimised objective, as ``Solution.objective``).
      retcode: each run's return code (int32).
      iterations: each run's iterations.
      best: the index of the run returned in ``sol.x``.
    """

    starts: PyTree
    x: PyTree
    objective: Any
    retcode: Any
    iterations: Any
    best: Any


@register_algorithm
@pytree_dataclass
class Multistart(Algorithm):
    """Run a JAX-native algorithm from ``n_starts`` starts sampled in the problem's box, as
    one vmapped compiled solve, and return the best run.

    Args:
      algorithm: the inner algorithm, any JAX-native one (``LBFGS()``, ``BFGS()``,
        ``Newton()``, ``optsolve.Adam(1e-2)``, a raw optax transformation, ...).
      n_starts: how many starts (static: a new value compiles anew).
      key: a ``jax.random`` key (``jax.random.key(0)``) that draws the starts.
      sampler: how the starts fill the box, each mapped affinely from the unit cube:
        ``"sobol"`` (default): scrambled Sobol' points, ``scipy.stats.qmc.Sobol(n,
        scramble=True, rng=rng).random(n_starts)``; a power of two keeps their balance.
        ``"latin"``: ``scipy.stats.qmc.LatinHypercube(n, rng=rng).random(n_starts)``.
        For both, ``rng = numpy.random.default_rng(numpy.asarray(
        jax.random.key_data(key)).ravel())`` (drawn on the host, through
        ``jax.pure_callback``, so a traced key works too). ``"uniform"``:
        ``jax.random.uniform(key, (n_starts, n))``, drawn inside the compiled program.
        ``n`` is the number of variables (x0 flattened, leaves in order).

    The problem needs finite ``bounds`` on every variable: they are the box the starts
    are sampled in. An inner algorithm that takes bounds (``LBFGS``, ``GradientDescent``)
    keeps every run inside them; for one that does not, the runs are unconstrained
    (a run may leave the box) and the best run is differentiated as an unconstrained
    minimum. ``x0`` gives the structure and dtypes of x, not a start.

    Every common option applies to every run (``maxiters``, ``gtol``, ``ftol``,
    ``maxtime``); the callback is called for each run at each of its iterations (under
    ``jax.vmap``, one run after another). ``sol.retcode``, ``sol.state`` and
    ``sol.stats.iterations`` are the best run's; ``stats.f_evals`` and
    ``stats.grad_evals`` count all runs. ``maxiters=0`` returns x0, as for every
    algorithm (no iteration ran). There is no history, ``resume`` or checkpoint (a
    run's state is one of many), and an eager solve runs as one compiled call (no Ctrl-C
    between chunks, as for a solve inside ``jax.jit``).

    Derivatives with respect to ``p`` are implicit at the best run (the default
    :class:`~optsolve.ImplicitAdjoint`; with a problem's bounds as for the inner
    algorithm): ``jax.grad`` of a function of the best ``sol.x`` or ``sol.objective``.

    Reference: Ugray et al., "Scatter search and local NLP solvers: a multistart
    framework for global optimization", INFORMS J. Computing 19 (2007); Sobol',
    USSR Comput. Math. 7 (1967); McKay, Beckman & Conover, Technometrics 21 (1979).

    Example:
      >>> prob = OptimizationProblem(rastrigin, jnp.zeros(5), bounds=(-5.12, 5.12))
      >>> sol = optsolve.solve(prob, optsolve.Multistart(optsolve.LBFGS(), 256,
      ...                                                jax.random.key(0)))
      >>> sol.original.objective  # every run's objective
    """

    family: ClassVar[str] = "native"
    needs_gradient: ClassVar[bool] = True
    takes_bounds: ClassVar[bool] = True
    jittable: ClassVar[bool] = True
    vmappable: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = True
    unrollable: ClassVar[bool] = True
    # it does not start from x0: solve's maxiters=0 answer (x0) and no checkpoints
    compiled_driver: ClassVar[bool] = False
    conditional_traits: ClassVar[dict[str, str]] = {
        trait: "with an inner algorithm that " + what
        for trait, what in (
            ("stops_by_itself", "stops by itself"),
            ("unrollable", "can be unrolled"),
        )
    }

    algorithm: Any
    n_starts: int = static_field()
    key: Any
    sampler: str = static_field(default="sobol")

    def __post_init__(self):
        inner = as_algorithm(self.algorithm)

        def runs_from_a_start(cls) -> bool:
            # JAX-native (vmappable in one program), on f, iterating from x0 (the interval
            # methods search their bracket whatever the start)
            traits = cls.traits()
            return bool(
                cls.compiled_driver
                and not traits["needs_residuals"]
                and not traits.get("scalar_only")
            )

        if not runs_from_a_start(type(inner)):
            native = ", ".join(c.__name__ for c in algorithm_classes() if runs_from_a_start(c))
            raise TypeError(
                f"Multistart: `algorithm` must be a JAX-native algorithm that iterates from a "
                f"start on a scalar objective (its runs are vmapped in one compiled program), "
                f"got {type(inner).__name__}. Use one of: {native}."
            )
        object.__setattr__(self, "algorithm", inner)
        n = self.n_starts
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"Multistart: `n_starts` must be an integer >= 1, got {n!r}.")
        object.__setattr__(self, "n_starts", int(n))
        if self.sampler not in SAMPLERS:
            raise ValueError(
                f"Multistart: `sampler` must be one of "
                f"{', '.join(map(repr, SAMPLERS))}, got {self.sampler!r}."
            )
        dtype = getattr(self.key, "dtype", None)
        if dtype is None or not (
            jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
            or (dtype == np.uint32 and np.ndim(self.key) >= 1)
        ):
            raise TypeError(
                f"Multistart: `key` must be a jax.random key, e.g. "
                f"jax.random.key(0); got {self.key!r}."
            )

    @classmethod
    def traits(cls) -> dict[str, Any]:
        """The class's traits, with ``needs_bounds``: the starts are sampled in the box."""
        return {**super().traits(), "needs_bounds": True}

    def capabilities(self) -> dict[str, Any]:
        """The inner algorithm's traits where they describe each run (derivatives, stopping,
        unrolling, dtypes, options); its own: takes bounds (it needs them), no
        constraints, history, resume or data. Dense matrices: one set per run."""
        caps = dict(type(self).traits())
        inner = self.algorithm.capabilities()
        for trait in (
            "needs_gradient",
            "needs_hessian",
            "stops_by_itself",
            "unrollable",
            "float_dtypes",
            "extra_options",
            "jittable",
            "vmappable",
        ):
            caps[trait] = inner[trait]
        caps["dense_matrices"] = inner["dense_matrices"] * self.n_starts
        return caps

    def minimised_problem(self, problem: Any) -> Any:
        """The inner algorithm's, without the bounds where it does not take them (the box
        is then only where the starts come from)."""
        problem = self.algorithm.minimised_problem(problem)
        if not self.algorithm.capabilities()["takes_bounds"]:
            problem = problem.replace(bounds=None)
        return problem

    def inverse_hessian_estimate(self, problem: Any, state: Any):
        """The inner algorithm's, from the best run's state."""
        return self.algorithm.inverse_hessian_estimate(problem, state)

    def unrolls_by_forward_passes(self) -> bool:
        return self.algorithm.unrolls_by_forward_passes()

    def unrolling_hazards(self) -> list[str]:
        return self.algorithm.unrolling_hazards()


def _unit_samples(
    sampler: str, n_starts: int, n: int, key_data: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """``n_starts`` quasi-random points of the unit cube [0, 1)^n from scipy.stats.qmc."""
    from scipy.stats import qmc  # (scipy imported only where a QMC sampler runs)

    rng = np.random.default_rng(np.asarray(key_data).ravel())
    if sampler == "sobol":
        engine = qmc.Sobol(n, scramble=True, rng=rng)
        with warnings.catch_warnings():
            # "balance properties ... require n to be a power of 2": documented above
            warnings.simplefilter("ignore", UserWarning)
            u = engine.random(n_starts)
    else:
        u = qmc.LatinHypercube(n, rng=rng).random(n_starts)
    return np.asarray(u, dtype=dtype)


def sample_starts(problem: OptimizationProblem, algorithm: Multistart) -> jax.Array:
    """The starts, flat: shape (n_starts, n), in x0's flat dtype (inside a trace or not)."""
    flat0, _ = ravel_pytree(problem.x0)
    lower = ravel_pytree(problem.bounds[0])[0].astype(flat0.dtype)
    upper = ravel_pytree(problem.bounds[1])[0].astype(flat0.dtype)
    shape = (algorithm.n_starts, flat0.shape[0])
    key = algorithm.key
    if algorithm.sampler == "uniform":
        u = jax.random.uniform(key, shape, dtype=flat0.dtype)
    else:
        if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        dtype = np.dtype(flat0.dtype)
        u = jax.pure_callback(
            lambda k: _unit_samples(algorithm.sampler, shape[0], shape[1], k, dtype),
            jax.ShapeDtypeStruct(shape, flat0.dtype),
            key,
            vmap_method="sequential",
        )
    return lower[None, :] + u * (upper - lower)[None, :]


def _check_box(problem: OptimizationProblem) -> None:
    if problem.bounds is None:
        raise ValueError(
            "solve: Multistart samples its starts in the problem's box, so it needs finite "
            "`bounds` on every variable; got bounds=None. Give them, e.g. "
            "OptimizationProblem(f, x0, bounds=(-5.0, 5.0))."
        )
    if not is_traced(problem.bounds):
        for leaf in jax.tree_util.tree_leaves(problem.bounds):
            if not np.all(np.isfinite(np.asarray(leaf, np.float64))):
                raise ValueError(
                    "solve: Multistart samples its starts in the problem's box, so it needs "
                    "finite `bounds` on every variable; got an infinite bound."
                )


def _best(objective: jax.Array, retcode: jax.Array) -> jax.Array:
    """The index of the lowest objective among SUCCESS runs, else the lowest finite one
    (the first on ties; 0 where none is finite)."""
    finite = jnp.isfinite(objective)
    inf = jnp.asarray(jnp.inf, objective.dtype)
    success = finite & (retcode == int(ReturnCode.SUCCESS))
    among_success = jnp.argmin(jnp.where(success, objective, inf))
    among_finite = jnp.argmin(jnp.where(finite, objective, inf))
    return jnp.where(jnp.any(success), among_success, among_finite)


def _total(counts: Any) -> Any:
    return None if counts is None else jnp.sum(counts)


def run_multistart(
    problem: OptimizationProblem, algorithm: Multistart, options: SolveOptions, loop: Any = None
) -> Solution:
    """The runs under ``jax.vmap`` and the best of them (inside the caller's trace)."""
    inner = algorithm.algorithm
    backend = backend_for(inner)
    starts = sample_starts(problem, algorithm)
    _, unravel = ravel_pytree(problem.x0)
    inner_problem = problem
    if not inner.capabilities()["takes_bounds"]:
        inner_problem = problem.replace(bounds=None)
    # the bar is solve's own (moved once, at the end): not one update per run
    inner_options = replace(options, progress=False)

    def one(start):
        return backend(inner_problem.replace(x0=unravel(start)), inner, inner_options, loop)

    runs = jax.vmap(one)(starts)
    best = _best(runs.objective, runs.retcode)
    chosen = jax.tree_util.tree_map(lambda leaf: leaf[best], runs)
    stats = chosen.stats
    record = MultistartRuns(
        starts=jax.vmap(unravel)(starts),
        x=runs.x,
        objective=runs.objective,
        retcode=runs.retcode,
        iterations=runs.stats.iterations,
        best=best,
    )
    return replace(
        chosen,
        original=record,
        stats=Stats(
            iterations=stats.iterations,
            f_evals=_total(runs.stats.f_evals),
            grad_evals=_total(runs.stats.grad_evals),
            time=None,
            skipped=stats.skipped,
        ),
    )


_compiled = jax.jit(run_multistart, static_argnums=(3,))


def solve_multistart(
    problem: OptimizationProblem, algorithm: Multistart, options: SolveOptions, loop: Any = None
) -> Solution:
    """The backend of :class:`Multistart`: one compiled program (in the caller's trace, or
    compiled once per structure for an eager solve)."""
    _check_box(problem)
    if loop is not None or is_traced(problem, algorithm, options):
        return run_multistart(problem, algorithm, options, loop)
    return _compiled(problem, algorithm, options, None)


register_backend(Multistart, solve_multistart)
