"""How solutions are differentiated with respect to the problem's hyperparameters ``p``.

An adjoint wraps a backend's run; it knows nothing about backends, and backends know
nothing about differentiation. :class:`ImplicitAdjoint` (the default) differentiates the
optimality condition grad_x f(x*, p) = 0 by the implicit function theorem:

    H dx = -(d/dp grad_x f) dp,   H = hess_xx f(x*, p),

solved matrix-free with Hessian-vector products inside ``jax.lax.custom_linear_solve``, so
the same rule serves forward mode (``jax.jvp``, ``jax.jacfwd``) and, by transposition,
reverse mode (``jax.grad``, ``jax.vjp``, ``jax.jacrev``). See Blondel et al., "Efficient and
Modular Implicit Differentiation", NeurIPS 2022.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from optsolve.solve_api.forward_passes import by_forward_passes
from optsolve.solve_api.host import under_a_trace
from optsolve.solve_api.kkt import kkt_tangent
from optsolve.solve_api.linear_solve import CGStatus, cg, cgls, warn_singular
from optsolve.solve_api.loops import CheckpointedScan, while_loop
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, pytree_dataclass, replace, static_field
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.root_problem import RootProblem
from optsolve.solve_api.sensitivity import solution_tangent
from optsolve.solve_api.solution import Solution

PyTree = Any
Run = Callable[..., Solution]  # run(problem, algorithm, options[, loop=...])

_LINEAR_SOLVERS = ("cg", "gmres", "bicgstab", "dense")


def _is_array_leaf(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, int, bool))


def _zero_tangent(leaf: Any) -> Any:
    dtype = jnp.result_type(leaf)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.zeros(jnp.shape(leaf), dtype)
    return np.zeros(jnp.shape(leaf), jax.dtypes.float0)


def _is_symbolic_zero(leaf: Any) -> bool:
    return isinstance(leaf, SymbolicZero)


def _perturbed(tangent: PyTree) -> bool:
    """Whether some leaf of a custom_jvp tangent (symbolic zeros on) is being differentiated."""
    return any(
        not _is_symbolic_zero(leaf)
        for leaf in jax.tree_util.tree_leaves(tangent, is_leaf=_is_symbolic_zero)
    )


def _instantiated(tangent: PyTree, primal: PyTree, always: bool = False) -> PyTree | None:
    """The tangent with its symbolic zeros made arrays (float0 for integer leaves); None
    where no leaf is differentiated (unless ``always``)."""
    if not always and not _perturbed(tangent):
        return None
    return jax.tree_util.tree_map(
        lambda t, x: _zero_tangent(x) if _is_symbolic_zero(t) else t,
        tangent,
        primal,
        is_leaf=_is_symbolic_zero,
    )


def _held_by(fn: Any) -> list[Any]:
    """The values a callable carries: a closure's cells, a functools.partial's function and
    arguments, a bound method's object, a callable object's attributes."""
    held: list[Any] = []
    if isinstance(fn, functools.partial):
        held += [fn.func, fn.args, fn.keywords]
    if inspect.ismethod(fn):
        held += [fn.__self__, fn.__func__]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # an empty cell (a name not yet bound)
            continue
    if not (inspect.isroutine(fn) or inspect.isclass(fn) or inspect.ismodule(fn)):
        held.append(fn)  # a pytree module (equinox, flax) holds its values as leaves
        held += list(getattr(fn, "__dict__", {}).values())
    return held


def _closes_over_tracers(fn: Any, depth: int = 4) -> bool:
    """Whether ``fn`` (a closure, a functools.partial, a bound method, a callable object,
    or what they hold, ``depth`` levels down) holds a JAX tracer: a value of an enclosing
    jit, grad or vmap."""
    if fn is None or depth == 0:
        return False
    held = _held_by(fn)
    if is_traced(held):
        return True
    return any(
        (callable(value) or hasattr(value, "__dict__"))
        and not (inspect.isclass(value) or inspect.ismodule(value))
        and _closes_over_tracers(value, depth - 1)
        for value in jax.tree_util.tree_leaves(held)
        if value is not fn
    )


def _hoisted(problem: OptimizationProblem) -> OptimizationProblem:
    """The problem with values that its functions (``f``, ``grad``, ``hvp``, the
    constraints' ``g``) close over and that an enclosing transformation traces moved into p,
    so that the implicit rule, which differentiates with respect to p, sees them
    (jax.closure_convert; optimistix does the same for its root finds). The problem itself
    where nothing is closed over."""
    constraints = problem.constraints or ()
    residual = getattr(problem, "residual", None)
    # string keys throughout: p's pytree flattening sorts them; a residual problem's f is
    # derived from its residual, which is the function converted
    functions: dict[str, Callable[..., Any] | None] = (
        {"f": problem.f} if residual is None else {"residual": residual}
    )
    functions.update(
        {
            "grad": problem.grad,
            "hvp": problem.hvp,
            **{f"g{i}": c.g for i, c in enumerate(constraints)},
        }
    )
    if not any(_closes_over_tracers(fn) for fn in functions.values()):
        return problem
    x0, p = problem.x0, problem.p
    converted, consts = {}, {}
    for name, fn in functions.items():
        if fn is not None:
            example = (x0, x0, p) if name == "hvp" else (x0, p)
            converted[name], consts[name] = jax.closure_convert(fn, *example)

    def lift(name):
        if name not in converted:
            return None
        fn = converted[name]
        return lambda *args: fn(*args[:-1], args[-1][0], *args[-1][1][name])

    functions = {"f": lift("f")} if residual is None else {"residual": lift("residual")}
    return problem.replace(
        **functions,
        grad=lift("grad"),
        hvp=lift("hvp"),
        p=(p, consts),
        constraints=tuple(replace(c, g=lift(f"g{i}")) for i, c in enumerate(constraints)) or None,
    )


def _warn_not_converged(code) -> None:
    code = ReturnCode(int(code))
    if code != ReturnCode.SUCCESS:
        warnings.warn(
            f"optsolve: differentiating a solution whose retcode is {code.name}; the implicit "
            "gradient assumes x is a minimiser (grad_x f = 0) and may be inaccurate. Tighten "
            "gtol or raise maxiters.",
            RuntimeWarning,
            stacklevel=2,
        )


# Not jax.scipy's cg: it spends one Hessian-vector product on H 0 (b - A(x0) from the zero
# start), which costs as much as a gradient on data-bound objectives.
def _cg(
    matvec: Callable[[PyTree], PyTree],
    b: PyTree,
    tol: Any,
    maxiter: int,
    preconditioner: Callable[[PyTree], PyTree] | None = None,
) -> tuple[PyTree, jax.Array]:
    """Conjugate gradients from v = 0 until ``|b - H v| <= tol |b|``: :func:`cg` with a
    relative tolerance and H taken as positive semidefinite (Hestenes & Stiefel 1952;
    Nocedal & Wright, *Numerical Optimization*, 2006, Algorithms 5.2 and, with
    ``preconditioner``, 5.3). Where H is singular along a direction CG meets (b has a
    component in its null space: a reverse-mode cotangent reading a leaf f ignores), the
    minimum-norm least-squares solution ``H^+ b`` from :func:`cgls` replaces CG's, with a
    warning (:func:`_least_squares_fallback`).

    Returns:
      (v, the number of products with H made).
    """
    result = cg(
        matvec,
        b,
        rtol=tol,
        maxiter=maxiter,
        negative_curvature="singular",
        preconditioner=preconditioner,
    )
    return _least_squares_fallback(
        matvec, b, result.x, result.status == CGStatus.SINGULAR, tol, maxiter, result.matvecs
    )


def _least_squares_fallback(
    matvec: Callable[[jax.Array], jax.Array],
    b: jax.Array,
    v: jax.Array,
    singular: jax.Array,
    tol: Any,
    maxiter: int,
    matvecs: Any = 0,
) -> tuple[jax.Array, jax.Array]:
    """``v`` where the solve succeeded, else ``H^+ b`` (:func:`cgls`), warning once.

    Why minimum-norm: forward mode solves H dx = -B dp with B dp in the range of H (f does
    not change along a null direction, whatever p), and CG from 0 stays in the range, so it
    converges to the minimum-norm dx. Reverse mode solves H u = c for an output cotangent
    c, which may have a null component (the loss reads a leaf f ignores); H^+ c ignores
    it, and then u.B dp = c.H^+ B dp = c.dx: reverse mode equals forward mode.

    The fallback's right-hand side is 0 where the solve succeeded, which costs :func:`cgls`
    no product: the regular path makes the products it made before.

    Returns:
      (the solution, ``matvecs`` plus the fallback's products).
    """
    fallback = cgls(matvec, jnp.where(singular, b, jnp.zeros_like(b)), rtol=tol, maxiter=maxiter)
    warn_singular(singular)
    return jnp.where(singular, fallback.x, v), matvecs + fallback.matvecs


def _tangents(
    adjoint, problem, algorithm, x, state, p_dot, p_dot_or_zero, bounds_dot, constraints_dot
):
    """dx and d(objective) at the solution ``x`` (see :meth:`ImplicitAdjoint.apply`)."""
    # the optimality condition of what the algorithm minimised (a robust loss, say)
    problem = algorithm.minimised_problem(problem)
    if problem.constraints:
        dx = kkt_tangent(problem, x, p_dot, bounds_dot, constraints_dot)
    else:
        dx = adjoint.solution_tangent(
            problem, x, p_dot, bounds_dot, algorithm.inverse_hessian_estimate(problem, state)
        )
    _, dobjective = jax.jvp(problem.f, (x, problem.p), (dx, p_dot_or_zero))
    return dx, dobjective


# Compiled as one program: under an eager jax.grad the rule's primal half (active sets,
# Hessian products, the KKT matrix) would otherwise run, and compile, one operation at a time.
_compiled_tangents = jax.jit(_tangents)


@pytree_dataclass
class ImplicitAdjoint:
    """Implicit differentiation of x*(p) = argmin_x f(x, p) (the default adjoint).

    The linear system H v = b is solved matrix-free. Any dependence structure is handled:
    leaves of x that do not depend on p, leaves of p that x* ignores, integer and bool leaves
    of p (float0 cotangents), and values that ``f`` closes over instead of taking them as p
    (they are moved into p first, with ``jax.closure_convert``). Box bounds are
    differentiable inputs: an active coordinate moves with its bound and the free ones
    solve the reduced system. The gradient with respect to ``x0`` is zero (at a minimiser
    it does not move x*); differentiating with respect to the algorithm's own
    hyperparameters is an error that names :class:`UnrolledAdjoint`. Problems with general
    constraints are differentiated through their KKT conditions
    (:mod:`~optsolve.solve_api.kkt`), with respect to p in f and in the constraints, the box
    bounds, and the constraints' lower and upper bounds. That system is built from n
    Hessian-vector products and solved densely (null-space method, minimum-norm where it is
    degenerate): ``linear_solver``, ``tol``, ``maxiter`` and ``ridge`` apply only to
    problems without general constraints. The problem's ``grad`` and ``hvp`` are used on
    both paths where it gives them.

    Where H is singular (a leaf of x that f ignores, a flat direction such as the intercept
    of a softmax regression), the derivative is the minimum-norm one, with a
    RuntimeWarning (once per solve, also under ``vmap``): forward mode's right-hand side
    lies in the range of H and gets the minimum-norm solution; reverse mode's cotangent
    may not, and gets the minimum-norm least-squares solution ``H^+ c``, which ignores its
    component along the null space, so that both modes agree. CG detects the singular
    direction where its curvature vanishes and then runs CG on the normal equations
    (:func:`~optsolve.solve_api.linear_solve.cgls`); "gmres" and "bicgstab" check their
    residual with one product and fall back alike; "dense" solves by least squares
    (``jnp.linalg.lstsq``). A regular H costs CG no extra product.

    Where the run leaves an estimate of H^-1 in its state (optsolve's L-BFGS memory,
    :meth:`~optsolve.solve_api.algorithm.Algorithm.inverse_hessian_estimate`), CG is
    preconditioned with it (Morales & Nocedal, "Automatic preconditioning by limited memory
    quasi-Newton updating", SIAM J. Optim. 10, 2000).

    Args:
      linear_solver: "cg" (default; H is symmetric), "gmres", "bicgstab" or "dense"
        (builds H from n Hessian-vector products: for small n, or indefinite H). Not used
        with general constraints.
      tol: relative residual tolerance of the iterative solvers (default 1e-10 in float64,
        1e-5 in float32). Not used with general constraints.
      maxiter: iteration limit of the iterative solvers (default: 10 n). Not used with
        general constraints.
      ridge: adds ``ridge * I`` to H: regularises singular or nearly singular Hessians
        (flat directions of f) instead of taking the minimum-norm solution, and silences
        the warning. 0 by default. Not used with general constraints (a singular reduced
        Hessian gets the minimum-norm step there, with the same warning).
    """

    linear_solver: str = static_field(default="cg")
    tol: Any = None
    maxiter: int | None = static_field(default=None)
    ridge: Any = 0.0

    def __post_init__(self):
        if self.linear_solver not in _LINEAR_SOLVERS:
            raise ValueError(
                f"ImplicitAdjoint: `linear_solver` must be one of {', '.join(_LINEAR_SOLVERS)}, "
                f"got {self.linear_solver!r}."
            )

    def _solve(
        self,
        matvec: Callable[[jax.Array], jax.Array],
        b: jax.Array,
        preconditioner: Callable[[jax.Array], jax.Array] | None = None,
    ) -> jax.Array:
        """H v = b on flat vectors, with the configured linear solver (CG preconditioned
        by ``preconditioner`` where given); the minimum-norm least-squares solution
        ``H^+ b`` where H is singular and b has a component in its null space, with a
        warning (see :func:`_least_squares_fallback`)."""
        tol = self.tol if self.tol is not None else (1e-10 if b.dtype == jnp.float64 else 1e-5)
        if self.linear_solver == "dense":
            # lstsq's SVD cut-off (eps n relative) is the numerical rank: below it, H's
            # singular values are within the rounding of the products that built it
            v, _, rank, _ = jnp.linalg.lstsq(jax.jacfwd(matvec)(b), b)
            warn_singular(rank < b.size)
            return v
        maxiter = self.maxiter if self.maxiter is not None else 10 * b.size
        if self.linear_solver == "cg":
            return _cg(matvec, b, tol, maxiter, preconditioner)[0]
        solver = {
            "gmres": jax.scipy.sparse.linalg.gmres,
            "bicgstab": jax.scipy.sparse.linalg.bicgstab,
        }[self.linear_solver]
        v = solver(matvec, b, tol=tol, atol=0.0, maxiter=maxiter)[0]
        # jax.scipy's solvers return no status, and on a singular system give NaN or a
        # finite v far from a solution: one product checks the true residual. Their own
        # test is on a recurrence residual, which drifts from the true one: sqrt(tol)
        # allows for that.
        residual = jnp.linalg.norm(matvec(v) - b)
        singular = ~(residual <= jnp.sqrt(tol) * jnp.linalg.norm(b))  # also NaN
        return _least_squares_fallback(matvec, b, v, singular, tol, maxiter)[0]

    def solution_tangent(
        self,
        problem: OptimizationProblem,
        x: PyTree,
        p_dot: PyTree | None,
        bounds_dot: tuple[PyTree, PyTree] | None = None,
        inverse_hessian: Callable[[jax.Array], jax.Array] | None = None,
    ) -> PyTree:
        """dx at the solution ``x`` for the tangents of p and of the bounds
        (:func:`~optsolve.solve_api.sensitivity.solution_tangent`); ``inverse_hessian``, the
        run's own estimate of H^-1 (an L-BFGS memory), preconditions CG."""
        return solution_tangent(
            problem, x, p_dot, bounds_dot, self._solve, self.ridge, inverse_hessian
        )

    def apply(
        self, run: Run, problem: OptimizationProblem, algorithm: Any, options: Any
    ) -> Solution:
        """Run the backend with x*(p, bounds) differentiable by the implicit function theorem."""
        if not under_a_trace() and not is_traced(problem, algorithm):
            # an eager call's functions hold no tracer: there is no trace to hold one of
            return run(problem, algorithm, options)
        problem = _hoisted(problem)
        if not is_traced(problem, algorithm):
            # Only traced inputs can be differentiated: concrete ones skip the rule's cost.
            return run(problem, algorithm, options)

        def tangents(problem, algorithm, problem_dot, algorithm_dot, solution):
            if _perturbed(algorithm_dot):
                raise ValueError(
                    "ImplicitAdjoint: the solution is being differentiated with respect to the "
                    f"algorithm's own hyperparameters ({type(algorithm).__name__}). At a "
                    "minimiser x* does not depend on them, so the implicit derivative is zero; "
                    "to differentiate the iterate an algorithm actually returns (meta-learning "
                    "a learning rate, say), use solve(..., adjoint=UnrolledAdjoint())."
                )
            if solution.model_state is not None:
                raise ValueError(
                    "ImplicitAdjoint: f changes the model's state in place (BatchNorm "
                    "statistics, RNG counters), so the solution is not the minimiser of one "
                    "f(x, p) and has no implicit derivative; differentiate a model evaluated "
                    "in eval mode, or the iterations themselves with "
                    "solve(..., adjoint=UnrolledAdjoint())."
                )
            warn_each(_warn_not_converged, solution.retcode)
            p_dot = _instantiated(problem_dot.p, problem.p)
            bounds_dot = (
                None
                if problem.bounds is None
                else _instantiated(problem_dot.bounds, problem.bounds)
            )
            p_dot_or_zero = (
                p_dot if p_dot is not None else _instantiated(problem_dot.p, problem.p, always=True)
            )
            constraints_dot = (
                None
                if not problem.constraints
                else _instantiated(problem_dot.constraints, problem.constraints)
            )
            return _compiled_tangents(
                self,
                problem,
                algorithm,
                solution.x,
                solution.state,
                p_dot,
                p_dot_or_zero,
                bounds_dot,
                constraints_dot,
            )

        return with_tangent_rule(run, problem, algorithm, options, tangents)


def warn_each(warn: Callable[[Any], None], code: Any) -> None:
    """``warn(c)`` for every return code c in ``code`` (one, or a batch's), at run time
    where the codes are traced."""

    def warn_all(codes: Any) -> None:
        for ci in np.ravel(np.asarray(codes)):
            warn(ci)

    if isinstance(code, jax.core.Tracer):
        jax.debug.callback(warn_all, code)
    else:
        warn_all(code)


def with_tangent_rule(
    run: Run,
    problem: Any,
    algorithm: Any,
    options: Any,
    tangents: Callable[..., tuple[PyTree, jax.Array]],
    *,
    rule_differentiable: bool = False,
) -> Solution:
    """``run(problem, algorithm, options)``, its Solution differentiable by a rule rather
    than through the run: ``tangents(problem, algorithm, problem_dot, algorithm_dot,
    solution)`` gives the tangents (dx, d objective) of x and the objective; every other
    array of the Solution has a zero tangent. The Solution's leaves that are not arrays
    (messages, the backend's own result) pass beside the rule.

    ``rule_differentiable``: a derivative of the rule's output (a second derivative)
    differentiates the rule again rather than the run (the run's iterations may not be
    differentiable at all).
    """
    side: dict[str, Any] = {}

    def primal(problem, algorithm, options):
        solution = run(problem, algorithm, options)
        leaves, treedef = jax.tree_util.tree_flatten(solution)
        side["objects"] = [None if _is_array_leaf(leaf) else leaf for leaf in leaves]
        side["treedef"] = treedef
        return [leaf if _is_array_leaf(leaf) else None for leaf in leaves]

    differentiable = jax.custom_jvp(primal)

    def rebuilt(leaves):
        return jax.tree_util.tree_unflatten(
            side["treedef"],
            [obj if obj is not None else leaf for leaf, obj in zip(leaves, side["objects"])],
        )

    def jvp(primals, tangents_in):
        problem, algorithm, options = primals
        problem_dot, algorithm_dot, _ = tangents_in
        leaves = (differentiable if rule_differentiable else primal)(problem, algorithm, options)
        dx, dobjective = tangents(problem, algorithm, problem_dot, algorithm_dot, rebuilt(leaves))
        arrays_only = jax.tree_util.tree_unflatten(side["treedef"], leaves)
        tangent = jax.tree_util.tree_map(_zero_tangent, arrays_only)
        tangent = dataclasses.replace(tangent, x=dx, objective=dobjective)
        return leaves, side["treedef"].flatten_up_to(tangent)

    differentiable.defjvp(jvp, symbolic_zeros=True)
    return rebuilt(differentiable(problem, algorithm, options))


@pytree_dataclass
class UnrolledAdjoint:
    """Differentiate through the iterations themselves (for JAX-native algorithms).

    The loop runs as a ``lax.scan`` of ``maxiters`` guarded steps (steps after the stop change
    nothing), with sqrt(maxiters) checkpointing to bound memory, so reverse and forward mode
    see every update. Unlike :class:`ImplicitAdjoint` this gives the derivative of the
    iterate actually returned, converged or not, and derivatives with respect to the
    algorithm's own hyperparameters (learning rate, momentum) for meta-learning.

    Requires a concrete ``maxiters``. An optax transformation with a line search
    (``OptaxLBFGS``) loops inside each update in a way reverse mode cannot transpose: its
    derivatives come from forward passes, one per differentiated number
    (:mod:`~optsolve.solve_api.forward_passes`), in forward and reverse mode alike. scipy
    algorithms cannot be unrolled at all.
    """

    def apply(
        self, run: Run, problem: OptimizationProblem | RootProblem, algorithm: Any, options: Any
    ) -> Solution:
        """Run the backend in a differentiable bounded loop of ``maxiters`` steps (``solve``
        has checked that the algorithm can be unrolled)."""
        maxiters = options.maxiters
        if maxiters is None or isinstance(maxiters, jax.core.Tracer):
            raise ValueError(
                "UnrolledAdjoint: `maxiters` must be given as a Python int (the unrolled loop's "
                f"length is static), got {maxiters!r}."
            )
        for hazard in algorithm.unrolling_hazards():
            warnings.warn(f"optsolve: {hazard}", RuntimeWarning, stacklevel=3)
        if not algorithm.unrolls_by_forward_passes():
            # maxiters updates plus the evaluation of the last iterate
            return run(problem, algorithm, options, loop=CheckpointedScan(int(maxiters) + 1))
        # forward mode needs neither a bounded loop nor checkpoints: the plain while loop
        leaves, treedef = jax.tree_util.tree_flatten((problem, algorithm, options))
        return by_forward_passes(
            lambda *values: run(*jax.tree_util.tree_unflatten(treedef, values), loop=while_loop),
            leaves,
        )
