"""The problem a user declares: objective, starting point, hyperparameters, bounds, constraints."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api import scipy_forms
from optsolve.solve_api import trainable as trainable_leaves
from optsolve.solve_api.pytree import freeze, pytree_dataclass, replace, static_field

PyTree = Any


def _is_concrete(value: Any) -> bool:
    return not isinstance(value, jax.core.Tracer)


@pytree_dataclass
class Constraint:
    """A general constraint ``lower <= g(x, p) <= upper`` (elementwise).

    Args:
      g: ``g(x, p) -> array``; a scalar or a 1-D array of constraint values.
      lower: lower bound(s); ``-inf`` for none. Equality where ``lower == upper``.
      upper: upper bound(s); ``inf`` for none.

    Example:
      >>> import jax.numpy as jnp
      >>> c = Constraint(lambda x, p: x[0] + x[1], lower=1.0, upper=1.0)  # x0 + x1 == 1
    """

    g: Callable[[PyTree, PyTree], jax.Array] = static_field()
    lower: Any = -jnp.inf
    upper: Any = jnp.inf

    def __post_init__(self):
        if not callable(self.g):
            raise TypeError(f"Constraint: `g` must be a callable g(x, p) -> array, got {self.g!r}.")
        lo, up = self.lower, self.upper
        if _is_concrete(lo) and _is_concrete(up) and np.any(np.asarray(lo) > np.asarray(up)):
            raise ValueError(
                f"Constraint: `lower` must be <= `upper` elementwise, got lower={lo!r}, "
                f"upper={up!r}."
            )

    @property
    def is_equality(self) -> bool:
        return bool(np.all(np.asarray(self.lower) == np.asarray(self.upper)))


def _check_takes_x_and_p(f: Callable[..., Any], name: str, form: str) -> None:
    """Raise a clear error when ``f`` is a Python function that cannot take ``(x, p)``: read
    from its code object (free), callables without one (partials, jitted functions, modules)
    are called as they are."""
    code = getattr(f, "__code__", None)
    if (
        code is None
        or inspect.ismethod(f)
        or code.co_flags & inspect.CO_VARARGS
        or code.co_argcount >= 2
    ):
        return
    label = getattr(f, "__name__", "f")
    raise TypeError(
        f"OptimizationProblem: `{name}` must be {form}, taking x and the hyperparameters p "
        f"(None when there are none); got {label}{inspect.signature(f)}. Write "
        f"lambda x, p: ..., and pass p= to the problem to use it."
    )


def _check_x0(x0: PyTree) -> None:
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(
            "OptimizationProblem: `x0` must contain at least one array, got an empty pytree."
        )
    hint = trainable_leaves.untrainable_hint(x0)
    if hint is not None:
        raise ValueError(hint)
    for path, leaf in jax.tree_util.tree_leaves_with_path(x0):
        where = "x0" + jax.tree_util.keystr(path)
        if not (hasattr(leaf, "dtype") or isinstance(leaf, (bool, int, float, complex))):
            raise TypeError(
                f"OptimizationProblem: leaf {where} of `x0` is a {type(leaf).__name__}, not an "
                "array. To train a model that holds other leaves (an equinox module's "
                "activation functions), say which leaves are trained: trainable="
                "eqx.is_inexact_array, an nnx filter such as nnx.Param, or a pytree of bools."
            )
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            kind = "complex" if jnp.issubdtype(dtype, jnp.complexfloating) else str(dtype)
            raise TypeError(
                f"OptimizationProblem: `x0` must hold real floating-point arrays (float32 or "
                f"float64), but leaf {where} has dtype {kind}. Convert it, e.g. "
                "jnp.asarray(x0, dtype=jnp.float32); or, if it is model state that is not "
                "trained (an RNG counter, a step count), leave it out of the training with "
                "`trainable=` (an nnx filter such as nnx.Param, a predicate such as "
                "eqx.is_inexact_array, or a pytree of bools)."
            )


def _normalize_bound(bound: Any, x0: PyTree, fill: float, name: str) -> PyTree:
    """A bound given as None, a scalar or a pytree like x0, returned as a pytree like x0."""
    x0_leaves, x0_def = jax.tree_util.tree_flatten(x0)
    if bound is None:
        return jax.tree_util.tree_unflatten(
            x0_def, [jnp.full(jnp.shape(leaf), fill, jnp.result_type(leaf)) for leaf in x0_leaves]
        )
    if (
        isinstance(bound, list)
        and len(x0_leaves) == 1
        and all(isinstance(b, (int, float, np.number)) or b is None for b in bound)
    ):
        # scipy's form for an array x0: one number per entry (None: no bound)
        bound = np.asarray([fill if b is None else b for b in bound], dtype=float)
    if isinstance(bound, (int, float, np.number)) or (
        hasattr(bound, "shape") and jnp.ndim(bound) == 0
    ):
        return jax.tree_util.tree_unflatten(
            x0_def,
            [jnp.full(jnp.shape(leaf), bound, jnp.result_type(leaf)) for leaf in x0_leaves],
        )
    try:
        b_leaves = x0_def.flatten_up_to(bound)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"OptimizationProblem: `bounds` {name} must be None, a scalar, or a pytree with the "
            f"structure of x0 ({x0_def}); got {jax.tree_util.tree_structure(bound)}."
        ) from err
    out = []
    for xl, bl in zip(x0_leaves, b_leaves):
        if bl is None:
            bl = fill
        if jnp.ndim(bl) != 0 and jnp.shape(bl) != jnp.shape(xl):
            raise ValueError(
                f"OptimizationProblem: `bounds` {name} has a leaf of shape {jnp.shape(bl)} where "
                f"x0 has shape {jnp.shape(xl)}; each bound must be a scalar or match x0's shape."
            )
        out.append(jnp.broadcast_to(jnp.asarray(bl, jnp.result_type(xl)), jnp.shape(xl)))
    return jax.tree_util.tree_unflatten(x0_def, out)


@pytree_dataclass
class OptimizationProblem:
    """Minimise a scalar objective ``f(x, p)`` over ``x``, starting from ``x0``.

    An immutable pytree: ``x0``, ``p``, ``bounds`` and the constraints' bounds are leaves,
    ``f`` is static. ``prob.replace(p=new_p)`` gives a new problem without recompilation.

    Args:
      f: the objective, ``f(x, p) -> scalar`` (real floating point).
      x0: the starting point; any pytree of real floating-point arrays (nested dicts,
        tuples, lists, a flax params dict). A list of numbers (scipy's form, nested lists
        included) is one array inside ``f`` and ``prob.x0``, and ``sol.x`` comes back as
        lists of the same nesting; an integer NumPy array is cast to float, as scipy does.
      p: hyperparameters, any pytree (or None); differentiable through ``solve``.
      bounds: ``(lower, upper)``, each None, a scalar or a pytree shaped like x0; None or
        +-inf entries mean unbounded. Stored normalised, as two pytrees shaped like x0.
        scipy's forms are converted: ``scipy.optimize.Bounds(lb, ub)``, or, for an array
        x0, a list of one ``(min, max)`` pair per entry (None for no bound).
      constraints: a sequence of :class:`Constraint`; scipy's ``LinearConstraint``,
        ``NonlinearConstraint`` (its ``fun`` written with jax.numpy; optsolve
        differentiates it) and ``{"type": "eq" | "ineq", "fun": ..., "args": ...}`` dicts
        are converted.
      grad: optional ``grad(x, p) -> pytree like x``, the gradient of ``f`` in ``x``; when
        given, the JAX-native backends use it instead of automatic differentiation.
      hvp: optional ``hvp(x, v, p) -> pytree like x``, the Hessian of ``f`` at ``x`` times
        ``v``; when given, second-order methods use it instead of forward-over-reverse
        differentiation of the gradient.
      sense: "min" (default) or "max": maximise f instead. Every algorithm then minimises
        ``-f``; ``sol.objective``, the history and the callback's objective are f's own.
      has_aux: f returns ``(value, aux)``, any pytree aux (metrics, predictions); the
        algorithms use the value, and ``sol.aux`` holds aux at the solution.
      trainable: which leaves of x0 are trained, where x0 is a model that holds more than
        parameters (:mod:`~optsolve.solve_api.trainable`): an nnx filter for a flax NNX
        module (``nnx.Param``), a predicate ``leaf -> bool`` (``eqx.is_inexact_array``),
        or a pytree of bools shaped like x0 (or a prefix of it). The other leaves are
        carried, not optimised (bounds are then scalars, or pytrees shaped like the trained
        leaves: the model with None elsewhere, as ``eqx.filter`` gives it): f receives the whole
        model, and state f changes in place (an NNX BatchNorm's statistics in train mode, a
        Dropout's RNG counter) is carried from step to step by the algorithms that evaluate f once
        per step (the optax family) and returned in ``sol.x``. None (default): every leaf is trained
        and must be a floating-point array.
      x0_form: set by the problem itself (a :class:`~optsolve.solve_api.scipy_forms.ListForm`
        where x0 was a list of numbers): the form ``sol.x`` is given back in.

    Example:
      >>> import jax.numpy as jnp
      >>> prob = OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(3), p=2.0)
    """

    f: Callable[[PyTree, PyTree], jax.Array] = static_field()
    x0: PyTree = None
    p: PyTree = None
    bounds: tuple[PyTree, PyTree] | None = None
    constraints: tuple[Constraint, ...] | None = None
    grad: Callable[[PyTree, PyTree], PyTree] | None = static_field(default=None)
    hvp: Callable[[PyTree, PyTree, PyTree], PyTree] | None = static_field(default=None)
    sense: str = static_field(default="min")
    has_aux: bool = static_field(default=False)
    trainable: Any = static_field(default=None)
    x0_form: scipy_forms.ListForm | None = static_field(default=None)

    def __init__(
        self,
        f,
        x0,
        p=None,
        *,
        bounds=None,
        constraints=None,
        grad=None,
        hvp=None,
        sense="min",
        has_aux=False,
        trainable=None,
        x0_form=None,
    ):
        if sense not in ("min", "max"):
            raise ValueError(f"OptimizationProblem: `sense` must be 'min' or 'max', got {sense!r}.")
        if not isinstance(has_aux, bool):
            raise TypeError(
                f"OptimizationProblem: `has_aux` must be True or False, got {has_aux!r}."
            )
        if not callable(f):
            raise TypeError(
                f"OptimizationProblem: `f` must be a callable f(x, p) -> scalar, got {f!r}."
            )
        _check_takes_x_and_p(f, "f", "f(x, p) -> scalar")
        _check_takes_x_and_p(
            getattr(f, "residual", None), "residual", "residual(x, p) -> array"
        )  # a least-squares problem's
        if grad is not None and not callable(grad):
            raise TypeError(
                f"OptimizationProblem: `grad` must be None or a callable grad(x, p) -> pytree "
                f"like x, got {grad!r}."
            )
        if hvp is not None and not callable(hvp):
            raise TypeError(
                f"OptimizationProblem: `hvp` must be None or a callable hvp(x, v, p) -> pytree "
                f"like x, got {hvp!r}."
            )
        x0, form = scipy_forms.start_point(x0)
        if (
            form is None
            and isinstance(x0_form, scipy_forms.ListForm)
            and getattr(x0, "shape", None) == x0_form.shape
        ):
            form = x0_form  # a copy of a problem given a list (prob.replace(p=...))
        bounded = x0  # what bounds are shaped like: x0, or a model's trained leaves
        if trainable is None:
            _check_x0(x0)
        else:
            for name, value in (("constraints", constraints), ("grad", grad), ("hvp", hvp)):
                if value is not None:
                    raise ValueError(
                        f"OptimizationProblem: `{name}` cannot be combined with `trainable` (a "
                        "model as x0); declare the problem over the trained leaves themselves "
                        "to use it."
                    )
            trainable = freeze(trainable)
            # its errors, at construction
            bounded = trainable_leaves.cached_split(x0, trainable).trained(x0)
        if bounds is not None:
            bounds = scipy_forms.box(bounds, bounded)
            if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
                raise ValueError(
                    "OptimizationProblem: `bounds` must be a pair (lower, upper), each None, a "
                    f"scalar or a pytree like x0; got {bounds!r}."
                )
            lower = _normalize_bound(bounds[0], bounded, -jnp.inf, "lower")
            upper = _normalize_bound(bounds[1], bounded, jnp.inf, "upper")
            for lo, up in zip(jax.tree_util.tree_leaves(lower), jax.tree_util.tree_leaves(upper)):
                if (
                    _is_concrete(lo)
                    and _is_concrete(up)
                    and np.any(np.asarray(lo) > np.asarray(up))
                ):
                    raise ValueError(
                        "OptimizationProblem: `bounds` must have lower <= upper elementwise; "
                        f"got lower={np.asarray(lo)!r} > upper={np.asarray(up)!r} somewhere."
                    )
            bounds = (lower, upper)
        if constraints is not None:
            if isinstance(
                constraints,
                (
                    Constraint,
                    dict,
                    *scipy_forms.scipy_types("LinearConstraint", "NonlinearConstraint"),
                ),
            ):
                constraints = (constraints,)
            constraints = tuple(
                scipy_forms.constraint(c, i, Constraint) for i, c in enumerate(constraints)
            )
            for i, c in enumerate(constraints):
                if not isinstance(c, Constraint):
                    raise TypeError(
                        f"OptimizationProblem: `constraints[{i}]` must be an optsolve.Constraint "
                        "(or scipy's LinearConstraint, NonlinearConstraint or constraint dict), "
                        f"got {type(c).__name__}."
                    )
            if not constraints:
                constraints = None
        object.__setattr__(self, "f", f)
        object.__setattr__(self, "x0", x0)
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "constraints", constraints)
        object.__setattr__(self, "grad", grad)
        object.__setattr__(self, "hvp", hvp)
        object.__setattr__(self, "sense", sense)
        object.__setattr__(self, "has_aux", has_aux)
        object.__setattr__(self, "trainable", trainable)
        object.__setattr__(self, "x0_form", form)

    def replace(self, **changes: Any) -> OptimizationProblem:
        """A new problem with some of ``f``, ``x0``, ``p``, ``bounds``, ``constraints``, ``grad``,
        ``hvp``, ``sense``, ``has_aux``, ``trainable`` changed."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(
                f"OptimizationProblem.replace: unknown field(s) {sorted(unknown)}; valid fields "
                "are f, x0, p, bounds, constraints, grad, hvp, sense, has_aux, trainable."
            )
        if "x0" in changes and "x0_form" not in changes:
            # a new x0 has its own form; lists in this problem's form (an earlier sol.x,
            # for a warm start) are this problem's array again
            form = self.x0_form
            if form is not None and form.holds(changes["x0"]):
                changes["x0"] = form.to_array(changes["x0"])
            else:
                changes["x0_form"] = None
        return replace(self, **changes)

    def derived(self, **changes: Any) -> OptimizationProblem:
        """A problem ``solve`` derives from this validated one (the trained leaves of a
        model, ...), its fields set as given: validating them again costs more than a small
        model's whole step."""
        derived = object.__new__(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(
                derived, field.name, changes.get(field.name, getattr(self, field.name))
            )
        return derived

    @property
    def has_bounds(self) -> bool:
        """True when some bound is finite (concrete bounds) or bounds were given (traced)."""
        if self.bounds is None:
            return False
        for leaf in jax.tree_util.tree_leaves(self.bounds):
            if not _is_concrete(leaf) or np.any(np.isfinite(np.asarray(leaf))):
                return True
        return False
