"""scipy.optimize's input forms, converted to optsolve's: x0 as a list of numbers (or an
integer NumPy array), bounds as ``scipy.optimize.Bounds`` or a list of per-variable
``(min, max)`` pairs, and constraints as ``LinearConstraint``, ``NonlinearConstraint`` or
scipy's dicts.

A list of numbers is one array inside ``f`` (scipy's convention), but it is also a pytree:
``solve`` gives ``sol.x`` back as a list of the same nesting (:class:`ListForm`), so that
the conversion never changes what comes back."""

from __future__ import annotations

import dataclasses
import functools
import numbers
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def scipy_types(*names: str) -> tuple[Any, ...]:
    """scipy.optimize's classes of these names, or none while scipy.optimize is not
    imported: a value of one of them exists only once its user has imported scipy.optimize,
    and so checking for them never imports scipy (which ``import optsolve`` does not).

    Typed Any, as scipy's classes are to a type checker (scipy ships no stubs): an instance
    has their attributes (``Bounds.lb``), not only ``object``'s."""
    module = sys.modules.get("scipy.optimize")
    return tuple(getattr(module, name) for name in names) if module is not None else ()


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _all_numbers(value: Any) -> bool:
    """A non-empty list (or nested lists) holding only real numbers."""
    if isinstance(value, list):
        return bool(value) and all(_all_numbers(v) for v in value)
    return _is_number(value)


@dataclasses.dataclass(frozen=True)
class ListForm:
    """The form of an x0 given as (nested) lists of numbers: their pytree structure and the
    shape of the array they make. Static (hashable) problem data.

    Attributes:
      treedef: the structure of the lists, one leaf per number.
      shape: the shape of the array inside ``f``.
    """

    treedef: Any
    shape: tuple[int, ...]

    def to_user(self, x: jax.Array) -> PyTree:
        """The array ``x`` (shape ``(..., *shape)``: leading axes of a batch are kept in
        each leaf) as lists in this form, one 0-d (or batch-shaped) array per number."""
        return jax.tree_util.tree_unflatten(self.treedef, _entries(x, len(self.shape)))

    def holds(self, x: PyTree) -> bool:
        """Whether ``x`` is lists in this form (a ``sol.x`` that :meth:`to_user` gave)."""
        return isinstance(x, list) and jax.tree_util.tree_structure(x) == self.treedef

    def to_array(self, x: PyTree) -> jax.Array:
        """Lists in this form (leaves of one shape, a batch's or none) as the array."""
        leaves = [jnp.asarray(leaf) for leaf in jax.tree_util.tree_leaves(x)]
        dtype = jnp.result_type(*leaves)
        if not jnp.issubdtype(dtype, jnp.floating):
            dtype = jnp.result_type(float)
        stacked = jnp.stack([leaf.astype(dtype) for leaf in leaves], axis=-1)
        return jnp.reshape(stacked, jnp.shape(leaves[0]) + self.shape)


@functools.partial(jax.jit, static_argnums=1)
def _entries(x: jax.Array, ndim: int) -> list[jax.Array]:
    # one compiled program per shape: an eager index per entry would dispatch (and, the
    # first time, compile) one program per number
    return [x[(Ellipsis,) + index] for index in np.ndindex(*jnp.shape(x)[jnp.ndim(x) - ndim :])]


def start_point(x0: PyTree) -> tuple[PyTree, ListForm | None]:
    """``x0`` as ``f`` receives it, and the form to give ``sol.x`` back in.

    Returns:
      ``(array, ListForm)`` for a list of numbers (scipy's form, nested lists included);
      ``(float array, None)`` for an integer NumPy array (scipy casts its x0 to float, as
      the list ``[3, 4]`` is); else ``(x0, None)``, x0 as given.
    """
    if isinstance(x0, list) and _all_numbers(x0):
        array = jnp.asarray(x0, dtype=jnp.result_type(float))
        return array, ListForm(jax.tree_util.tree_structure(x0), tuple(array.shape))
    if isinstance(x0, np.ndarray) and np.issubdtype(x0.dtype, np.integer):
        return jnp.asarray(x0, dtype=jnp.result_type(float)), None
    return x0, None


def inner(problem: Any, resume: Any) -> tuple[Any, Any]:
    """``solve``'s first stage: the problem without its :class:`ListForm` (so that a list
    and an array x0 share compiled programs), and ``resume``'s x as that problem's array
    (a Solution or a checkpoint's saved leaves, given back as lists)."""
    form = getattr(problem, "x0_form", None)
    if form is None:
        return problem, resume
    x: Any = getattr(resume, "x", None)  # a pytree, or a checkpoint's saved leaves
    saved = getattr(x, "leaves", None) if hasattr(x, "like") else None
    if (
        saved is not None
        and len(saved) == int(np.prod(form.shape))
        and all(np.ndim(leaf) == 0 for leaf in saved)
    ):
        x = x.like(form.to_user(problem.x0))  # a checkpoint of a run given back as lists
    if form.holds(x):
        resume = dataclasses.replace(resume, x=form.to_array(x))
    return problem.derived(x0_form=None), resume


def outer(problem: Any, solution: Any) -> Any:
    """The solution with ``x`` in the form ``problem``'s x0 was given in (lists for a list
    of numbers); ``solution`` itself otherwise."""
    form = getattr(problem, "x0_form", None)
    if form is None or form.holds(solution.x):
        return solution
    return dataclasses.replace(solution, x=form.to_user(solution.x))


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(v is None or _is_number(v) for v in value)
    )


def box(bounds: Any, x0: PyTree) -> Any:
    """``bounds`` in optsolve's form, ``(lower, upper)``: scipy's ``Bounds(lb, ub)``, or a
    list of one ``(min, max)`` pair per entry of an array ``x0`` (None for no bound), is
    converted; any other value is returned as it is."""
    if isinstance(bounds, scipy_types("Bounds")):
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
            "give (lower, upper), each a scalar or an array like x0."
        )
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
    if isinstance(item, scipy_types("LinearConstraint")):
        return constraint_type(
            _linear(item.A), lower=jnp.asarray(item.lb, float), upper=jnp.asarray(item.ub, float)
        )
    if isinstance(item, scipy_types("NonlinearConstraint")):
        return constraint_type(
            _nonlinear(item.fun),
            lower=jnp.asarray(item.lb, float),
            upper=jnp.asarray(item.ub, float),
        )
    if isinstance(item, dict):
        kind, fun = item.get("type"), item.get("fun")
        if kind not in ("eq", "ineq") or not callable(fun):
            raise TypeError(
                f"OptimizationProblem: `constraints[{index}]` is a dict, which must be scipy's "
                "{'type': 'eq' or 'ineq', 'fun': callable, 'args': tuple}; got keys "
                f"{sorted(item)} with type={kind!r}. Or give an optsolve.Constraint."
            )
        g = _nonlinear(fun, tuple(item.get("args", ())))
        return constraint_type(g, lower=0.0, upper=0.0 if kind == "eq" else jnp.inf)
    return item
