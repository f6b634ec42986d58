"""Maximisation and auxiliary outputs, handled once for every backend.

``solve`` hands the backends a problem to minimise, whose objective returns a value only:
``-f`` for ``sense="max"``, the value of ``(value, aux)`` for ``has_aux=True``. Afterwards
the solution is given back in the user's terms: the user's objective (and history), the
constraints' multipliers of the user's objective, and ``aux`` at the solution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from optsolve.solve_api.host import wants_grad_norm
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import replace
from optsolve.solve_api.solution import Solution

PyTree = Any


def _value_of(out: Any) -> Any:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError(
            "OptimizationProblem: with `has_aux=True`, f(x, p) must return a pair "
            f"(value, aux), got {type(out).__name__}."
        )
    return out[0]


class MinimisedObjective:
    """The objective as the backends minimise it: ``-value`` for maximisation, the value
    alone where ``f`` returns ``(value, aux)``. Equal to another one of the same ``f`` and
    flags, so that repeated solves share compiled code."""

    def __init__(self, f: Callable[..., Any], negate: bool, has_aux: bool):
        self.f, self.negate, self.has_aux = f, negate, has_aux

    def __call__(self, x: PyTree, p: PyTree, *batch: Any) -> Any:
        out = self.f(x, p, *batch)
        value = _value_of(out) if self.has_aux else out
        return -value if self.negate else value

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, MinimisedObjective)
            and other.f == self.f
            and (other.negate, other.has_aux) == (self.negate, self.has_aux)
        )

    def __hash__(self) -> int:
        return hash((MinimisedObjective, self.f, self.negate, self.has_aux))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"MinimisedObjective({self.f!r})"


class AuxOf:
    """The aux part of a ``has_aux`` objective: the metrics a run records at every iterate.
    Equal to another one of the same ``f``, so that repeated solves share compiled code."""

    def __init__(self, f: Callable[..., Any]):
        self.f = f

    def __call__(self, x: PyTree, p: PyTree, *batch: Any) -> Any:
        out = self.f(x, p, *batch)
        _value_of(out)
        return out[1]

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AuxOf) and other.f == self.f

    def __hash__(self) -> int:
        return hash((AuxOf, self.f))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"AuxOf({self.f!r})"


def recorded_metrics(problem: OptimizationProblem, metrics: Any, history: bool) -> Any:
    """What a run records as metrics: the user's ``metrics``, else aux of a ``has_aux``
    objective where a history is recorded."""
    if metrics is None and problem.has_aux and history:
        return AuxOf(problem.f)
    return metrics


class _Negated:
    """A user's ``grad`` or ``hvp`` of the objective, negated (for maximisation)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return jax.tree_util.tree_map(lambda v: -v, self.fn(*args))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Negated) and other.fn == self.fn

    def __hash__(self) -> int:
        return hash((_Negated, self.fn))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"_Negated({self.fn!r})"


class UserValueCallback:
    """The user's callback, given the user's objective (``-f`` undone) under maximisation."""

    def __init__(self, callback: Callable[..., Any]):
        self.callback = callback
        self.with_norm = wants_grad_norm(callback)

    def __call__(self, iteration, x, objective, *grad_norm):
        args = (iteration, x, -objective) + (grad_norm if self.with_norm else ())
        return self.callback(*args)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UserValueCallback) and other.callback == self.callback

    def __hash__(self) -> int:
        return hash((UserValueCallback, self.callback))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"UserValueCallback({self.callback!r})"


def is_plain(problem: OptimizationProblem) -> bool:
    """A minimisation of a value-only objective: nothing to translate."""
    return problem.sense == "min" and not problem.has_aux


def to_minimisation(problem: OptimizationProblem) -> OptimizationProblem:
    """The problem the backends solve: minimise a value-only objective."""
    if is_plain(problem):
        return problem
    negate = problem.sense == "max"
    return replace(
        problem,
        f=MinimisedObjective(problem.f, negate, problem.has_aux),
        grad=_Negated(problem.grad) if negate and problem.grad is not None else problem.grad,
        hvp=_Negated(problem.hvp) if negate and problem.hvp is not None else problem.hvp,
        sense="min",
        has_aux=False,
    )


def user_callback(problem: OptimizationProblem, callback: Any) -> Any:
    """The callback the backends call: the user's, seeing the user's objective."""
    if callback is None or problem.sense != "max":
        return callback
    return UserValueCallback(callback)


def in_user_terms(
    problem: OptimizationProblem, solution: Solution, on_data: bool = False
) -> Solution:
    """The solution of :func:`to_minimisation`'s problem in the terms of ``problem``: its
    objective and history of the user's ``f``, multipliers of the user's objective (the
    derivative of the optimal value with respect to a constraint's active bound is still
    ``-multipliers[j]``), and ``aux`` at ``x`` for ``has_aux`` (not ``on_data``, where aux
    belongs to a batch: each step's is in the history)."""
    if is_plain(problem):
        return solution
    changes: dict[str, Any] = {}
    if problem.sense == "max":
        negate = lambda tree: jax.tree_util.tree_map(lambda v: -v, tree)
        changes["objective"] = negate(solution.objective)
        if solution.history is not None:
            changes["history"] = replace(solution.history, objective=-solution.history.objective)
        if solution.multipliers is not None:
            changes["multipliers"] = negate(solution.multipliers)
    if problem.has_aux and not on_data:
        # on a copy of x: an NNX model's forward pass may change its state in place
        changes["aux"] = problem.f(jax.tree_util.tree_map(lambda v: v, solution.x), problem.p)[1]
    return replace(solution, **changes)
