"""scipy.optimize's input forms, converted to optsolve's: x0 as a list of numbers, bounds as
``scipy.optimize.Bounds`` or a list of per-variable ``(min, max)`` pairs, and constraints as
``LinearConstraint``, ``NonlinearConstraint`` or scipy's dicts."""

from __future__ import annotations

import numbers
from typing import Any

import jax.numpy as jnp
import numpy as np
import scipy.optimize as so

PyTree = Any


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _all_numbers(value: Any) -> bool:
    """A non-empty list (or nested lists) holding only real numbers."""
    if isinstance(value, list):
        return bool(value) and all(_all_numbers(v) for v in value)
    return _is_number(value)


def start_point(x0: PyTree) -> PyTree:
    """``x0`` as given, or a list of numbers (scipy's form) as one array."""
    if isinstance(x0, list) and _all_numbers(x0):
        return jnp.asarray(x0, dtype=jnp.result_type(float))
    return x0


def _is_pair(value: Any) -> bool:
    return (isinstance(value, (tuple, list)) and len(value) == 2
            and all(v is None or _is_number(v) for v in value))


def box(bounds: Any, x0: PyTree) -> Any:
    """``bounds`` in optsolve's form, ``(lower, upper)``: scipy's ``Bounds(lb, ub)``, or a
    list of one ``(min, max)`` pair per entry of an array ``x0`` (None for no bound), is
    converted; any other value is returned as it is."""
    if isinstance(bounds, so.Bounds):
        return np.asarray(bounds.lb, float), np.asarray(bounds.ub, float)
    if not (isinstance(bounds, list) and bounds and all(_is_pair(b) for b in bounds)):
        return bounds
    if not hasattr(x0, "shape"):
        return bounds  # a pytree x0: (lower, upper) in optsolve's form, as lists of pairs
    shape = np.shape(x0)
    if len(bounds) != int(np.prod(shape)):
        raise ValueError(
            f"OptimizationProblem: `bounds` as a list of (min, max) pairs (scipy's form) needs "
            f"one pair per entry of x0 ({int(np.prod(shape))}), got {len(bounds)} pairs; or "
            "give (lower, upper), each a scalar or an array like x0.")
    lower = np.array([-np.inf if lo is None else lo for lo, _ in bounds], float)
    upper = np.array([np.inf if up is None else up for _, up in bounds], float)
    return lower.reshape(shape), upper.reshape(shape)


def _linear(matrix: Any):
    a = jnp.asarray(matrix)
    return lambda x, p: a @ x


def _nonlinear(fun: Any, args: tuple = ()):
    return lambda x, p: fun(x, *args)


def constraint(item: Any, index: int, constraint_type: type) -> Any:
    """One entry of ``constraints`` as an optsolve ``Constraint`` (``constraint_type``):
    ``LinearConstraint(A, lb, ub)`` is ``lb <= A x <= ub``, ``NonlinearConstraint(fun, lb,
    ub)`` is ``lb <= fun(x) <= ub`` (fun written with jax.numpy: optsolve differentiates
    it; its ``jac`` and ``hess`` are not used), ``{"type": "eq" | "ineq", "fun": fun,
    "args": ()}`` is ``fun(x) == 0`` or ``fun(x) >= 0``. Any other value is returned as it
    is."""
    if isinstance(item, so.LinearConstraint):
        return constraint_type(_linear(item.A), lower=jnp.asarray(item.lb, float),
                               upper=jnp.asarray(item.ub, float))
    if isinstance(item, so.NonlinearConstraint):
        return constraint_type(_nonlinear(item.fun), lower=jnp.asarray(item.lb, float),
                               upper=jnp.asarray(item.ub, float))
    if isinstance(item, dict):
        kind, fun = item.get("type"), item.get("fun")
        if kind not in ("eq", "ineq") or not callable(fun):
            raise TypeError(
                f"OptimizationProblem: `constraints[{index}]` is a dict, which must be scipy's "
                "{'type': 'eq' or 'ineq', 'fun': callable, 'args': tuple}; got keys "
                f"{sorted(item)} with type={kind!r}. Or give an optsolve.Constraint.")
        g = _nonlinear(fun, tuple(item.get("args", ())))
        return constraint_type(g, lower=0.0, upper=0.0 if kind == "eq" else jnp.inf)
    return item
