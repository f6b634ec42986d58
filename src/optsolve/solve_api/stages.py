"""The stages between the user's call and the backend: each turns the call into what the
backends solve on the way in, and the Solution back into the user's terms on the way out.

``solve`` applies them in one list (:func:`enter`) and their inverses in reverse order
(:func:`leave`), so that a new transformation of problems is one more entry. Each stage is
made per call and keeps what its inverse needs.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from optsolve.solve_api import scipy_forms, sense, trainable
from optsolve.solve_api.checkpoint import SavedLeaves
from optsolve.solve_api.kkt import multipliers, per_constraint
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import is_traced, replace
from optsolve.solve_api.solution import Solution


@dataclasses.dataclass
class Call:
    """What travels through the stages: the problem, the resume point and the user's
    hooks, in the terms of the stage they have reached; then the algorithm, the options
    made from them, the adjoint and the run's length where known (``steps``)."""

    problem: OptimizationProblem
    resume: Any = None
    callback: Any = None
    metrics: Any = None
    evaluate: Any = None
    algorithm: Any = None
    options: Any = None
    adjoint: Any = None
    steps: int | None = None
    trains_model: bool = False


class Stage:
    """A transformation of the call (:meth:`enter`) with its inverse on the Solution
    (:meth:`leave`); the identity by default."""

    def enter(self, call: Call) -> Call:
        return call

    def leave(self, solution: Solution) -> Solution:
        return solution


class ScipyForms(Stage):
    """x0 given as scipy takes it (a list of numbers) runs as one array; ``sol.x`` comes
    back in x0's form (:mod:`~optsolve.solve_api.scipy_forms`)."""

    def enter(self, call: Call) -> Call:
        self.problem = call.problem
        problem, resume = scipy_forms.inner(call.problem, call.resume)
        return dataclasses.replace(call, problem=problem, resume=resume)

    def leave(self, solution: Solution) -> Solution:
        return scipy_forms.outer(self.problem, solution)


class Maximisation(Stage):
    """Every backend minimises a value-only f: ``sense="max"`` becomes -f and ``has_aux``
    drops aux; the objective, history, callback values and multipliers come back as f's
    own, and ``aux`` at x (:mod:`~optsolve.solve_api.sense`).

    Args:
      history: whether the run records a history (aux is recorded there by default).
      on_data: a run on data (aux then belongs to a batch: no aux at x).
    """

    def __init__(self, history: bool, on_data: bool):
        self.history, self.on_data = history, on_data

    def enter(self, call: Call) -> Call:
        self.problem = problem = call.problem
        resume = call.resume
        if resume is not None and problem.sense == "max" and isinstance(resume, Solution):
            resume = replace(resume, objective=-resume.objective)
        return dataclasses.replace(
            call,
            problem=sense.to_minimisation(problem),
            resume=resume,
            callback=sense.user_callback(problem, call.callback),
            metrics=sense.recorded_metrics(problem, call.metrics, self.history),
        )

    def leave(self, solution: Solution) -> Solution:
        return sense.in_user_terms(self.problem, solution, self.on_data)


class SavedResume(Stage):
    """A checkpoint's x (``optsolve.load(path)``) in the structure of the problem's x0,
    checked leaf by leaf."""

    def enter(self, call: Call) -> Call:
        resume = call.resume
        if isinstance(resume.x if resume is not None else None, SavedLeaves):
            resume = replace(resume, x=resume.x.like(call.problem.x0))
        return dataclasses.replace(call, resume=resume)


class ModelSplit(Stage):
    """A model whose ``trainable`` leaves are trained: the problem over those leaves, the
    rest carried through the run (BatchNorm statistics, RNG counters), and ``sol.x`` the
    whole model again (:mod:`~optsolve.solve_api.trainable`)."""

    split: trainable.Split | None = None

    def enter(self, call: Call) -> Call:
        problem, split, resume = trainable.inner(call.problem, call.resume)
        self.problem, self.split = problem, split
        if split is None:
            return call
        callback, metrics, evaluate = call.callback, call.metrics, call.evaluate
        if callback is not None:
            callback = trainable.ModelCallback(callback, split, problem.p.carried)
        metrics, evaluate = (
            None if fn is None or not callable(fn) else trainable.ModelObjective(fn, split)
            for fn in (metrics, evaluate)
        )
        return dataclasses.replace(
            call,
            problem=problem,
            resume=resume,
            callback=callback,
            metrics=metrics,
            evaluate=evaluate,
            trains_model=True,
        )

    def leave(self, solution: Solution) -> Solution:
        return trainable.outer(self.split, self.problem, solution)


class StartProjection(Stage):
    """x0 outside the box projected onto it (L-BFGS-B's convention), with a warning when it
    moved; where the box is traced, x0 is clipped without a check."""

    def enter(self, call: Call) -> Call:
        problem = call.problem
        bounds = problem.bounds
        if bounds is None or not problem.has_bounds:
            return call
        lower, upper = bounds
        if not is_traced(problem.x0, lower, upper):
            outside = any(
                bool(np.any((np.asarray(x) < np.asarray(lo)) | (np.asarray(x) > np.asarray(up))))
                for x, lo, up in zip(
                    *(jax.tree_util.tree_leaves(t) for t in (problem.x0, lower, upper))
                )
            )
            if not outside:
                return call
            warnings.warn(
                "solve: x0 lies outside the bounds; it was projected onto them (as "
                "scipy's L-BFGS-B does) and the run starts there.",
                UserWarning,
                stacklevel=4,
            )
        x0 = jax.tree_util.tree_map(lambda x, lo, up: jnp.clip(x, lo, up), problem.x0, lower, upper)
        return dataclasses.replace(call, problem=problem.replace(x0=x0))


_multipliers = jax.jit(multipliers)  # one compiled program per problem, not op-by-op eagerly


class Multipliers(Stage):
    """On the way out, the constraints' multipliers at the solution's x, one array per
    constraint, where the problem has general constraints: the backend's own (flat, in
    ``solution.multipliers``, NaN where it gave none) where it computed them, else the
    least-squares KKT multipliers; under differentiation the least-squares ones' derivative
    (the backend's carry none). For a method whose multipliers are complete
    (``gives_multipliers``: never NaN) that derivative is computed only where something is
    differentiated: the least-squares problem forms the dense Hessian and Jacobian, which a
    large problem's run never needs."""

    def enter(self, call: Call) -> Call:
        self.problem = call.problem
        self.complete = type(call.algorithm).gives_multipliers
        return call

    def leave(self, solution: Solution) -> Solution:
        problem = self.problem
        if not problem.constraints:
            return solution
        own = solution.multipliers
        if (
            own is not None
            and not is_traced(problem, solution.x)
            and bool(jnp.all(jnp.isfinite(own)))
        ):
            return replace(solution, multipliers=per_constraint(problem, problem.x0, own))
        if own is not None and self.complete and np.ndim(solution.retcode) == 0:
            flat = _with_least_squares_derivative(problem, solution.x, own)
            return replace(solution, multipliers=per_constraint(problem, problem.x0, flat))
        if np.ndim(solution.retcode) != 0:  # a batch solved eagerly under vmap
            lam = jax.vmap(_multipliers, in_axes=(None, 0))(problem, solution.x)
        else:
            lam = _multipliers(problem, solution.x)
        if own is None:
            return replace(solution, multipliers=lam)
        batch = jnp.shape(own)[:-1]
        least_squares = jnp.concatenate([jnp.reshape(part, batch + (-1,)) for part in lam], axis=-1)
        flat = jnp.where(
            jnp.isnan(own), least_squares, own + least_squares - lax.stop_gradient(least_squares)
        )
        return replace(solution, multipliers=per_constraint(problem, problem.x0, flat))


def _with_least_squares_derivative(
    problem: OptimizationProblem, x: Any, own: jax.Array
) -> jax.Array:
    """``own`` (flat multipliers), whose tangent is its own plus the least-squares KKT
    multipliers' at x: the value of ``own + ls - stop_gradient(ls)`` without computing ls
    unless a derivative is taken."""
    leaves, treedef = jax.tree_util.tree_flatten(problem)

    def least_squares(leaves_, x_):
        lam = _multipliers(jax.tree_util.tree_unflatten(treedef, leaves_), x_)
        return jnp.concatenate([jnp.ravel(part) for part in lam])

    @jax.custom_jvp
    def value(leaves_, x_, own_):
        return own_

    @value.defjvp
    def _tangent(primals, tangents):
        leaves_, x_, own_ = primals
        d_leaves, d_x, d_own = tangents
        _, d_ls = jax.jvp(least_squares, (leaves_, x_), (d_leaves, d_x))
        return own_, d_own + d_ls.astype(own_.dtype)

    return value(leaves, x, own)


def enter(stages: list[Stage], call: Call) -> Call:
    """``call`` through every stage, in order."""
    for stage in stages:
        call = stage.enter(call)
    return call


def leave(stages: list[Stage], solution: Solution) -> Solution:
    """``solution`` back through every stage's inverse, in reverse order."""
    for stage in reversed(stages):
        solution = stage.leave(solution)
    return solution
