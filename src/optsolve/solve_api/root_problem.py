"""Root problems: find ``x`` with ``F(x, p) = 0``, for an ``F`` that returns an array shaped
like ``x`` (a square system).

:class:`RootProblem` is what users declare; :class:`RootSystem` is how the JAX-native root
solvers see one inside the shared compiled driver (see :mod:`optsolve.solve_api.roots`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from optsolve.solve_api import scipy_forms
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.problem import _check_takes_x_and_p, _check_x0
from optsolve.solve_api.pytree import pytree_dataclass, static_field, tree_spec
from optsolve.solve_api.registry import algorithm_classes

PyTree = Any


def _as_root_problem_error(err: Exception) -> Exception:
    """An error of the shared validation helpers (worded for OptimizationProblem) in
    RootProblem's words."""
    message = str(err).replace("OptimizationProblem:", "RootProblem:")
    return type(err)(message)


@pytree_dataclass
class RootProblem:
    """Find ``x`` with ``F(x, p) = 0``, starting from ``x0``.

    An immutable pytree: ``x0`` and ``p`` are leaves, ``F`` is static, so
    ``prob.replace(p=new_p)`` reuses compiled code. ``solve`` returns a
    :class:`~optsolve.Solution` whose ``x`` is the root found; it is SUCCESS when
    ``max|F(x, p)| <= ftol`` (``solve``'s ``ftol``, an absolute tolerance on the residual's
    infinity norm, as scipy's ``nonlin`` ``f_tol``; default 1e-8 in float64, 1e-5 in
    float32), and ``sol.objective`` is the merit ``0.5 |F(x, p)|^2``. ``x*(p)`` is
    differentiable with respect to ``p`` by the implicit function theorem,
    ``dx/dp = -(dF/dx)^-1 dF/dp`` (the minimum-norm least-squares solution where ``dF/dx``
    is singular).

    Args:
      F: ``F(x, p) -> array shaped like x`` (for a pytree ``x``, a pytree of x's structure
        and shapes), real floating point.
      x0: the starting point; any pytree of real floating-point arrays (a list of numbers,
        scipy's form, is one array, and ``sol.x`` is that array).
      p: parameters, any pytree (or None); differentiable through ``solve``.

    Example:
      >>> import jax.numpy as jnp
      >>> prob = RootProblem(lambda x, p: x ** 3 - p, jnp.array([1.0, 2.0]), p=8.0)
    """

    F: Callable[[PyTree, PyTree], PyTree] = static_field()
    x0: PyTree = None
    p: PyTree = None

    def __init__(self, F, x0, p=None):
        if not callable(F):
            raise TypeError(f"RootProblem: `F` must be a callable F(x, p) -> array shaped like "
                            f"x, got {F!r}.")
        try:
            _check_takes_x_and_p(F, "F", "F(x, p) -> array shaped like x")
            x0, _ = scipy_forms.start_point(x0)
            _check_x0(x0)
        except (TypeError, ValueError) as err:
            raise _as_root_problem_error(err) from None
        object.__setattr__(self, "F", F)
        object.__setattr__(self, "x0", x0)
        object.__setattr__(self, "p", p)

    def replace(self, **changes: Any) -> "RootProblem":
        """A new problem with some of ``F``, ``x0``, ``p`` changed."""
        unknown = set(changes) - {"F", "x0", "p"}
        if unknown:
            raise TypeError(f"RootProblem.replace: unknown field(s) {sorted(unknown)}; valid "
                            "fields are F, x0, p.")
        fields = {"F": self.F, "x0": self.x0, "p": self.p, **changes}
        return RootProblem(fields["F"], fields["x0"], fields["p"])


_CHECKED = BoundedCache(1024)


def check_root_function(problem: RootProblem) -> None:
    """Raise a clear error unless ``F(x0, p)`` is real floating point with x0's structure
    and shapes (traced once per F and shapes; cached)."""
    key = (problem.F, tree_spec(problem.x0), tree_spec(problem.p), jax.config.jax_enable_x64)
    _CHECKED.get_or_make(key, lambda: _check_uncached(problem) or True)


def _check_uncached(problem: RootProblem) -> None:
    out = jax.eval_shape(problem.F, problem.x0, problem.p)
    x_def = jax.tree_util.tree_structure(problem.x0)
    out_def = jax.tree_util.tree_structure(out)
    x_leaves = jax.tree_util.tree_leaves(problem.x0)
    if out_def != x_def:
        if len(x_leaves) == 1:
            shape = jnp.shape(x_leaves[0])
            got = (f"shape {out.shape}" if hasattr(out, "shape") and hasattr(out, "dtype")
                   else f"{out_def}")
            raise TypeError(
                f"RootProblem: `F(x, p)` must return an array shaped like x (x0 has shape "
                f"{shape}); got {got}. A root problem is square: one equation per unknown "
                "(for more equations than unknowns use optsolve.LeastSquaresProblem).")
        raise TypeError(
            f"RootProblem: `F(x, p)` must return a pytree with x's structure ({x_def}), one "
            f"equation per unknown; got {out_def}.")
    for path, leaf, xl in zip(jax.tree_util.tree_flatten_with_path(out)[0],
                              jax.tree_util.tree_leaves(out), x_leaves):
        where = jax.tree_util.keystr(path[0])
        if not hasattr(leaf, "dtype") or not jnp.issubdtype(leaf.dtype, jnp.floating):
            kind = getattr(leaf, "dtype", type(leaf).__name__)
            raise TypeError(
                f"RootProblem: `F(x, p)` must return real floating-point values, got {kind}"
                f"{' at ' + where if where else ''}. Split a complex system into its real and "
                "imaginary parts.")
        if leaf.shape != jnp.shape(xl):
            raise TypeError(
                f"RootProblem: `F(x, p)` must return an array shaped like x"
                f"{' at ' + where if where else ''}: x0 has shape {jnp.shape(xl)}, F returned "
                f"shape {leaf.shape}. A root problem is square: one equation per unknown (for "
                "more equations than unknowns use optsolve.LeastSquaresProblem).")


class RootField:
    """``F(x, p)`` with each leaf in the dtype of x's (a float32 x with float64 parameters:
    the iterates keep x's dtype). Equal to another one of the same F, so that problems built
    from one F share compiled code (it is static aux data)."""

    def __init__(self, F: Callable[[PyTree, PyTree], PyTree]):
        self.F = F

    def __call__(self, x: PyTree, p: PyTree) -> PyTree:
        return jax.tree_util.tree_map(lambda fx, xl: jnp.asarray(fx).astype(jnp.result_type(xl)),
                                      self.F(x, p), x)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, RootField) and other.F == self.F

    def __hash__(self) -> int:
        return hash((RootField, self.F))

    def __repr__(self) -> str:
        return f"RootField({self.F!r})"


@pytree_dataclass
class RootSystem(LeastSquaresProblem):
    """A :class:`RootProblem` as the JAX-native root solvers see it in the shared driver:
    the least-squares problem of its residuals ``F`` (``f = 0.5 |F|^2``, the merit their
    line searches decrease) whose *gradient field*, the ``grad`` the driver evaluates and
    tests, is ``F`` itself. The driver's gradient test ``max|grad| <= gtol`` is then the
    root test ``max|F| <= ftol``, and its history's ``grad_norm`` records ``max|F|``.

    Built by :func:`root_system` only; not a problem users declare."""


def root_system(problem: RootProblem) -> RootSystem:
    """The :class:`RootSystem` of a (validated) root problem."""
    field = RootField(problem.F)
    system = object.__new__(RootSystem)
    base = LeastSquaresProblem(field, problem.x0, problem.p)
    for f in dataclasses.fields(LeastSquaresProblem):
        object.__setattr__(system, f.name, getattr(base, f.name))
    object.__setattr__(system, "grad", field)
    return system


def residual_problem(problem: RootProblem) -> LeastSquaresProblem:
    """The least-squares problem of a root problem's residuals ``F`` (for the least-squares
    methods, which take it as it is)."""
    return LeastSquaresProblem(RootField(problem.F), problem.x0, problem.p)


def derived(problem: RootProblem, **changes: Any) -> RootProblem:
    """The problem with fields set as given, without validating them again (``solve``'s
    own derived problems: closures hoisted into p)."""
    out = object.__new__(RootProblem)
    for field in dataclasses.fields(RootProblem):
        object.__setattr__(out, field.name, changes.get(field.name,
                                                        getattr(problem, field.name)))
    return out


# The root traits of the capability table (capabilities.py checks them)

def root_form(algorithm: Any) -> str | None:
    """How an algorithm (or class) solves a :class:`~optsolve.RootProblem`, its
    ``solves_roots`` trait: "field" (a JAX-native root finder, handed the problem's
    :class:`~optsolve.solve_api.root_problem.RootSystem`), "residuals" (a least-squares
    method, handed the least-squares problem of F), "scipy" (scipy's ``root``, handed the
    RootSystem); None where it solves none."""
    # Algorithm declares no default for these root traits yet: a class without them
    # solves no root problem
    cls = algorithm if isinstance(algorithm, type) else type(algorithm)
    return getattr(cls, "solves_roots", None)


def roots_only(algorithm: Any) -> bool:
    """Whether an algorithm (or class) solves root problems only (its ``roots_only``
    trait): NewtonRaphson, Broyden, ScipyRoot."""
    cls = algorithm if isinstance(algorithm, type) else type(algorithm)
    return bool(getattr(cls, "roots_only", False))


def root_solver_names() -> str:
    """The registered classes that solve root problems, by name."""
    names = [c.__name__ for c in algorithm_classes() if root_form(c) is not None]
    return ", ".join(names) if names else "(none installed)"
