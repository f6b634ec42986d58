"""The compiled driver shared by the JAX-native backends (optax family, classical methods).

A backend supplies a *solver*: an object with ``init`` and ``step`` (see
:class:`IterativeSolver`). The driver owns everything else, once for all of them: one
``lax.while_loop``, the non-finite check that keeps the last finite iterate, the stopping
tests (maxiters, gtol, ftol, xtol, maxtime; the projected gradient where the problem has
bounds), the user's callback and evaluation counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.solve_api.host import call_user_callback, clock
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.returncode import RUNNING, ReturnCode
from optsolve.solve_api.solution import Solution, Stats

PyTree = Any


class Objective:
    """``f`` with ``p`` bound: what solvers evaluate. Built inside the trace.

    Args:
      f: ``f(x, p) -> scalar``.
      p: the hyperparameters.
      grad: optional user gradient ``grad(x, p)``; replaces ``jax.grad(f)``.
      hvp: optional user Hessian-vector product ``hvp(x, v, p)``; replaces
        forward-over-reverse differentiation of the gradient.
    """

    def __init__(self, f: Callable[[PyTree, PyTree], jax.Array], p: PyTree,
                 grad: Callable[[PyTree, PyTree], PyTree] | None = None,
                 hvp: Callable[[PyTree, PyTree, PyTree], PyTree] | None = None):
        self.f = f
        self.p = p
        self.user_grad = grad
        self.user_hvp = hvp

    @classmethod
    def from_problem(cls, problem: OptimizationProblem) -> "Objective":
        """The objective of ``problem``, honouring its optional ``grad`` and ``hvp``."""
        return cls(problem.f, problem.p, getattr(problem, "grad", None),
                   getattr(problem, "hvp", None))

    def value(self, x: PyTree) -> jax.Array:
        return self.f(x, self.p)

    def grad(self, x: PyTree) -> PyTree:
        if self.user_grad is not None:
            return self.user_grad(x, self.p)
        return jax.grad(self.f)(x, self.p)

    def value_and_grad(self, x: PyTree) -> tuple[jax.Array, PyTree]:
        if self.user_grad is not None:
            return self.f(x, self.p), self.user_grad(x, self.p)
        return jax.value_and_grad(self.f)(x, self.p)

    def hvp(self, x: PyTree, v: PyTree) -> PyTree:
        """Hessian-vector product: the user's ``hvp`` if given, else forward-over-reverse
        differentiation of the gradient (the user's gradient where given)."""
        if self.user_hvp is not None:
            return self.user_hvp(x, v, self.p)
        return jax.jvp(self.grad, (x,), (v,))[1]


class Step(NamedTuple):
    """One solver step: the new iterate with its value and gradient, and what it cost."""

    x: PyTree
    f: jax.Array
    g: PyTree
    state: PyTree
    f_evals: jax.Array
    grad_evals: jax.Array
    failed: jax.Array  # the solver's own failure (e.g. a failed line search)
    # The solver's own "no further progress is possible" (e.g. a line search that finds no
    # decrease at rounding level); None means never.
    stalled: jax.Array | None = None


class IterativeSolver(Protocol):
    """What a JAX-native backend implements; the driver does the rest.

    ``detect_stall``: report STALLED when a step leaves x unchanged (classical methods);
    False for ML optimizers, where a zero step is legitimate (a warm-up schedule at 0).

    Optional attributes, read with ``getattr`` (absent means None):
      ``default_gtol``: the gtol used when ``solve`` got none (classical methods stop by
      themselves); ``default_maxiters``: likewise for maxiters.
    """

    detect_stall: bool

    def init(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree) -> PyTree: ...

    def step(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree,
             state: PyTree) -> Step: ...


class _Carry(NamedTuple):
    x: PyTree
    f: jax.Array
    g: PyTree
    state: PyTree
    iteration: jax.Array
    f_evals: jax.Array
    grad_evals: jax.Array
    status: jax.Array
    t_start: jax.Array


def _all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves]))


def inf_norm(tree: PyTree) -> jax.Array:
    """The largest absolute entry over all leaves of ``tree``."""
    leaves = jax.tree_util.tree_leaves(tree)
    dtype = jnp.result_type(*leaves)
    return jnp.max(jnp.stack([jnp.max(jnp.abs(leaf)).astype(dtype) for leaf in leaves]))


def projected_gradient(x: PyTree, g: PyTree, bounds: tuple[PyTree, PyTree] | None) -> PyTree:
    """``P(x - g) - x`` for the box ``bounds`` (``-g`` without bounds), the stationarity
    measure of bound-constrained problems (its inf-norm is L-BFGS-B's ``pgtol`` test)."""
    if bounds is None:
        return g
    lower, upper = bounds
    return jax.tree_util.tree_map(lambda xx, gg, lo, up: xx - jnp.clip(xx - gg, lo, up),
                                  x, g, lower, upper)


def _select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _run(make_solver: Callable[[Any, OptimizationProblem], IterativeSolver],
         problem: OptimizationProblem, algorithm: Any, options: SolveOptions) -> Solution:
    objective = Objective.from_problem(problem)
    solver = make_solver(algorithm, problem)
    x0 = problem.x0
    f0, g0 = objective.value_and_grad(x0)
    state0 = solver.init(objective, x0, f0, g0)
    int_t = jnp.int32
    gtol = options.gtol if options.gtol is not None else getattr(solver, "default_gtol", None)
    xtol = options.get("xtol")
    if options.maxiters is not None:
        maxiters = options.maxiters
    else:
        maxiters = getattr(solver, "default_maxiters", None)
    maxiters = jnp.asarray(maxiters if maxiters is not None else jnp.iinfo(int_t).max, int_t)
    bounds = problem.bounds

    def gnorm(x, g):
        return inf_norm(projected_gradient(x, g, bounds))

    status0 = jnp.asarray(RUNNING, int_t)
    if gtol is not None:
        status0 = jnp.where(gnorm(x0, g0) <= gtol, int(ReturnCode.SUCCESS), status0)
    status0 = jnp.where((status0 == RUNNING) & (maxiters <= 0), int(ReturnCode.MAXITERS), status0)
    status0 = jnp.where(_all_finite((f0, g0)), status0, int(ReturnCode.FAILURE))
    t_start = clock(f0) if options.maxtime is not None else jnp.zeros((), jnp.result_type(float))

    carry0 = _Carry(x0, f0, g0, state0, jnp.zeros((), int_t), jnp.ones((), int_t),
                    jnp.ones((), int_t), status0, t_start)

    def cond(carry: _Carry) -> jax.Array:
        return carry.status == RUNNING

    def body(carry: _Carry) -> _Carry:
        step = solver.step(objective, carry.x, carry.f, carry.g, carry.state)
        ok = _all_finite((step.x, step.f, step.g)) & ~step.failed
        x, f, g, state = _select(ok, (step.x, step.f, step.g, step.state),
                                 (carry.x, carry.f, carry.g, carry.state))
        iteration = carry.iteration + ok.astype(int_t)
        converged = jnp.zeros((), bool)
        if gtol is not None:
            converged |= gnorm(x, g) <= gtol
        if options.ftol is not None:
            scale = jnp.maximum(jnp.maximum(jnp.abs(carry.f), jnp.abs(f)), 1.0)
            converged |= jnp.abs(carry.f - f) <= options.ftol * scale
        if xtol is not None:
            # Only a step that moved x counts: a rejected trust-region step is not convergence.
            dx = inf_norm(jax.tree_util.tree_map(jnp.subtract, x, carry.x))
            converged |= (dx > 0) & (dx <= xtol * jnp.maximum(inf_norm(x), 1.0))
        stalled = jnp.zeros((), bool)
        if solver.detect_stall:
            same = jax.tree_util.tree_map(lambda a, b: jnp.all(a == b), step.x, carry.x)
            stalled = jnp.all(jnp.stack(jax.tree_util.tree_leaves(same)))
        if step.stalled is not None:
            stalled |= step.stalled
        stop = jnp.zeros((), bool)
        if options.callback is not None:
            due = (carry.status == RUNNING) & ok & (iteration % options.callback_every == 0)
            stop = lax.cond(
                due, lambda: call_user_callback(options.callback, due, iteration, x, f),
                lambda: jnp.zeros((), bool),
            )
        out_of_time = jnp.zeros((), bool)
        if options.maxtime is not None:
            out_of_time = clock(f) - carry.t_start >= options.maxtime
        status = jnp.select(
            [~ok, converged, stalled, stop, iteration >= maxiters, out_of_time],
            [int(ReturnCode.FAILURE), int(ReturnCode.SUCCESS), int(ReturnCode.STALLED),
             int(ReturnCode.TERMINATED), int(ReturnCode.MAXITERS), int(ReturnCode.MAXTIME)],
            RUNNING,
        ).astype(int_t)
        return _Carry(x, f, g, state, iteration, carry.f_evals + step.f_evals.astype(int_t),
                      carry.grad_evals + step.grad_evals.astype(int_t), status, carry.t_start)

    final = lax.while_loop(cond, body, carry0)
    return Solution(
        x=final.x, objective=final.f, retcode=final.status,
        stats=Stats(iterations=final.iteration, f_evals=final.f_evals,
                    grad_evals=final.grad_evals, time=None),
        original=final.state, state=final.state,
    )


_run_compiled = jax.jit(_run, static_argnums=0)


def run_iterative(make_solver: Callable[[Any, OptimizationProblem], IterativeSolver],
                  problem: OptimizationProblem, algorithm: Any,
                  options: SolveOptions) -> Solution:
    """Run ``make_solver(algorithm, problem)`` to a stop in one compiled ``while_loop``.

    ``make_solver`` must be a module-level function (it keys the compilation cache); the
    algorithm's and the problem's numbers are traced, so new values reuse compiled code.
    """
    return _run_compiled(make_solver, problem, algorithm, options)
