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
import numpy as np

from optsolve.solve_api import scipy_forms
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.problem import _check_takes_x_and_p, _check_x0
from optsolve.solve_api.pytree import is_traced, pytree_dataclass, static_field, tree_spec
from optsolve.solve_api.registry import algorithm_classes

PyTree = Any

# Above this many unknowns, Jacobians are products, never matrices: NewtonRaphson's
# linear_solver="auto" and the implicit derivative of a root solve run a Krylov method on
# J v products (a dense J would take n forward passes and n^2 memory).
MATRIX_FREE_ABOVE = 256


def krylov_solve(
    method: str,
    matvec: Callable[[jax.Array], jax.Array],
    b: jax.Array,
    rtol: Any,
    maxiter: int,
    restart: int = 50,
) -> jax.Array:
    """An approximate solution of the nonsymmetric system ``A v = b`` from products
    ``matvec(v) = A v``, from v = 0, to ``|A v - b| <= rtol |b|`` or ``maxiter`` products
    (about; BiCGStab makes two an iteration).

    ``method``: "gmres" (restarted GMRES(restart): Saad & Schultz, SIAM J. Sci. Stat.
    Comput. 7, 1986), whose residual never grows but which stagnates on ill-conditioned
    systems once restarted; "bicgstab" or "auto" (van der Vorst, SIAM J. Sci. Stat. Comput.
    13, 1992), with short recurrences: no restart, so no stagnation from one, and memory of
    a few vectors, but it can break down (a non-finite or useless iterate the caller must
    check). "auto" is BiCGStab because on discretised PDEs (the typical large root
    problem) GMRES(50) stagnates where it converges.
    """
    if method == "gmres":
        restart = min(b.size, restart)
        return jax.scipy.sparse.linalg.gmres(
            matvec, b, tol=rtol, restart=restart, maxiter=max(1, -(-maxiter // restart))
        )[0]
    return jax.scipy.sparse.linalg.bicgstab(matvec, b, tol=rtol, maxiter=max(1, maxiter // 2))[0]


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
      bracket: ``(a, b)``, an interval ``a < b`` of finite numbers in which F changes sign,
        for a scalar x (x0 a 0-d array), as scipy's ``root_scalar(f, bracket=[a, b])``: the
        bracketing methods (:class:`~optsolve.Bisection`, :class:`~optsolve.Brentq`) search
        it and need it; the others start from x0 and do not use it. Leaves (in x0's
        dtype), so a new bracket reuses compiled code and ``jax.vmap`` may map over it.

    Example:
      >>> import jax.numpy as jnp
      >>> prob = RootProblem(lambda x, p: x ** 3 - p, jnp.array([1.0, 2.0]), p=8.0)
      >>> scalar = RootProblem(lambda x, p: x ** 3 - p, jnp.array(1.0), 8.0,
      ...                      bracket=(0.0, 4.0))
    """

    F: Callable[[PyTree, PyTree], PyTree] = static_field()
    x0: PyTree = None
    p: PyTree = None
    bracket: PyTree = None

    def __init__(self, F, x0, p=None, *, bracket=None):
        if not callable(F):
            raise TypeError(
                f"RootProblem: `F` must be a callable F(x, p) -> array shaped like x, got {F!r}."
            )
        try:
            _check_takes_x_and_p(F, "F", "F(x, p) -> array shaped like x")
            x0, _ = scipy_forms.start_point(x0)
            _check_x0(x0)
        except (TypeError, ValueError) as err:
            raise _as_root_problem_error(err) from None
        if bracket is not None:
            bracket = _checked_bracket(bracket, x0)
        object.__setattr__(self, "F", F)
        object.__setattr__(self, "x0", x0)
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "bracket", bracket)

    def replace(self, **changes: Any) -> RootProblem:
        """A new problem with some of ``F``, ``x0``, ``p``, ``bracket`` changed."""
        unknown = set(changes) - {"F", "x0", "p", "bracket"}
        if unknown:
            raise TypeError(
                f"RootProblem.replace: unknown field(s) {sorted(unknown)}; valid "
                "fields are F, x0, p, bracket."
            )
        fields = {"F": self.F, "x0": self.x0, "p": self.p, "bracket": self.bracket, **changes}
        return RootProblem(fields["F"], fields["x0"], fields["p"], bracket=fields["bracket"])


_BRACKET_EXAMPLE = "RootProblem(F, jnp.array(1.0), p, bracket=(0.0, 2.0))"


def _scalar_x0_error(x0: PyTree, what: str) -> str | None:
    """The complaint about an x0 that is not one 0-d array (None where it is one)."""
    leaves = jax.tree_util.tree_leaves(x0)
    if len(leaves) == 1 and jnp.ndim(leaves[0]) == 0:
        return None
    given = (
        f"an array of shape {jnp.shape(leaves[0])}"
        if len(leaves) == 1
        else f"a pytree of {len(leaves)} arrays"
    )
    return (
        f"{what} one scalar unknown, so `x0` must be a 0-d float array (e.g. "
        f"jnp.array(1.0)); got {given}. E.g. {_BRACKET_EXAMPLE}."
    )


def _checked_bracket(bracket: Any, x0: PyTree) -> tuple[jax.Array, jax.Array]:
    """``bracket`` as a pair of 0-d arrays in x0's dtype, checked: a pair ``(a, b)`` of
    real numbers for a scalar x0, finite with ``a < b`` where they are concrete."""
    complaint = _scalar_x0_error(x0, "RootProblem: `bracket` brackets")
    if complaint is not None:
        raise ValueError(complaint)
    if hasattr(bracket, "shape") and not isinstance(bracket, (tuple, list)):
        ends = [bracket[0], bracket[1]] if jnp.shape(bracket) == (2,) else None
    else:
        ends = list(bracket) if isinstance(bracket, (tuple, list)) and len(bracket) == 2 else None
    if ends is None or any(jnp.ndim(e) != 0 or not _real(e) for e in ends):
        raise ValueError(
            f"RootProblem: `bracket` must be a pair (a, b) of real numbers, the "
            f"ends of an interval where F changes sign; got {bracket!r}. E.g. "
            f"{_BRACKET_EXAMPLE}."
        )
    dtype = jnp.result_type(jax.tree_util.tree_leaves(x0)[0])
    a, b = (jnp.asarray(e).astype(dtype) for e in ends)
    if not is_traced((a, b)):
        if not (np.isfinite(float(a)) and np.isfinite(float(b))):
            raise ValueError(
                f"RootProblem: `bracket` must have finite ends; got ({float(a)}, {float(b)})."
            )
        if not float(a) < float(b):
            raise ValueError(
                f"RootProblem: `bracket` must be (a, b) with a < b; got ({float(a)}, {float(b)})."
            )
    return a, b


def _real(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and (
        jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    )


def check_bracketed(problem: RootProblem, name: str) -> None:
    """Raise a clear error unless ``problem`` suits a bracketing method (``name``): a
    bracket, on a scalar x."""
    complaint = _scalar_x0_error(problem.x0, f"solve: {name} searches a bracket around")
    if complaint is not None:
        raise ValueError(complaint)
    if problem.bracket is None:
        raise ValueError(
            f"solve: {name} searches the interval given by the problem's `bracket`, an "
            f"interval where F changes sign; got bracket=None. E.g. {_BRACKET_EXAMPLE}."
        )


_CHECKED = BoundedCache(1024)


def check_root_function(problem: RootProblem) -> None:
    """Raise a clear error unless ``F(x0, p)`` is real floating point with x0's structure
    and shapes (traced once per F and shapes; cached)."""
    # jax's Config declares its flags at run time, not as attributes
    x64 = jax.config.jax_enable_x64  # type: ignore[attr-defined]
    key = (problem.F, tree_spec(problem.x0), tree_spec(problem.p), x64)
    _CHECKED.check_once(key, lambda: _check_uncached(problem))


def _check_uncached(problem: RootProblem) -> None:
    out = jax.eval_shape(problem.F, problem.x0, problem.p)
    x_def = jax.tree_util.tree_structure(problem.x0)
    out_def = jax.tree_util.tree_structure(out)
    x_leaves = jax.tree_util.tree_leaves(problem.x0)
    if out_def != x_def:
        if len(x_leaves) == 1:
            shape = jnp.shape(x_leaves[0])
            got = (
                f"shape {out.shape}"
                if hasattr(out, "shape") and hasattr(out, "dtype")
                else f"{out_def}"
            )
            raise TypeError(
                f"RootProblem: `F(x, p)` must return an array shaped like x (x0 has shape "
                f"{shape}); got {got}. A root problem is square: one equation per unknown "
                "(for more equations than unknowns use optsolve.LeastSquaresProblem)."
            )
        raise TypeError(
            f"RootProblem: `F(x, p)` must return a pytree with x's structure ({x_def}), one "
            f"equation per unknown; got {out_def}."
        )
    for path, leaf, xl in zip(
        jax.tree_util.tree_flatten_with_path(out)[0], jax.tree_util.tree_leaves(out), x_leaves
    ):
        where = jax.tree_util.keystr(path[0])
        if not hasattr(leaf, "dtype") or not jnp.issubdtype(leaf.dtype, jnp.floating):
            kind = getattr(leaf, "dtype", type(leaf).__name__)
            raise TypeError(
                f"RootProblem: `F(x, p)` must return real floating-point values, got {kind}"
                f"{' at ' + where if where else ''}. Split a complex system into its real and "
                "imaginary parts."
            )
        if leaf.shape != jnp.shape(xl):
            raise TypeError(
                f"RootProblem: `F(x, p)` must return an array shaped like x"
                f"{' at ' + where if where else ''}: x0 has shape {jnp.shape(xl)}, F returned "
                f"shape {leaf.shape}. A root problem is square: one equation per unknown (for "
                "more equations than unknowns use optsolve.LeastSquaresProblem)."
            )


class RootField:
    """``F(x, p)`` with each leaf in the dtype of x's (a float32 x with float64 parameters:
    the iterates keep x's dtype). Equal to another one of the same F, so that problems built
    from one F share compiled code (it is static aux data)."""

    def __init__(self, F: Callable[[PyTree, PyTree], PyTree]):
        self.F = F

    def __call__(self, x: PyTree, p: PyTree) -> PyTree:
        return jax.tree_util.tree_map(
            lambda fx, xl: jnp.asarray(fx).astype(jnp.result_type(xl)), self.F(x, p), x
        )

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

    ``bracket`` is the root problem's (None where it has none): the bracketing methods
    search it.

    Built by :func:`root_system` only; not a problem users declare."""

    bracket: PyTree = None


def root_system(problem: RootProblem) -> RootSystem:
    """The :class:`RootSystem` of a (validated) root problem."""
    field = RootField(problem.F)
    system = object.__new__(RootSystem)
    base = LeastSquaresProblem(field, problem.x0, problem.p)
    for f in dataclasses.fields(LeastSquaresProblem):
        object.__setattr__(system, f.name, getattr(base, f.name))
    object.__setattr__(system, "grad", field)
    object.__setattr__(system, "bracket", problem.bracket)
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
        object.__setattr__(out, field.name, changes.get(field.name, getattr(problem, field.name)))
    return out


# The root traits of the capability table (Algorithm.traits; capabilities.py checks them)


def _caps(algorithm: Algorithm | type[Algorithm]) -> dict[str, Any]:
    return algorithm.traits() if isinstance(algorithm, type) else algorithm.capabilities()


def root_form(algorithm: Any) -> str | None:
    """How an algorithm (or class) solves a :class:`~optsolve.RootProblem`, its
    ``solves_roots`` trait: "field" (a JAX-native root finder, handed the problem's
    :class:`~optsolve.solve_api.root_problem.RootSystem`), "residuals" (a least-squares
    method, handed the least-squares problem of F), "scipy" (scipy's ``root``, handed the
    RootSystem), "bracket" (a JAX-native bracketing method on a scalar x, handed the
    RootSystem with the problem's bracket, SUCCESS by its own bracket test); None where it
    solves none."""
    return _caps(algorithm)["solves_roots"]


def roots_only(algorithm: Any) -> bool:
    """Whether an algorithm (or class) solves root problems only (its ``roots_only``
    trait): NewtonRaphson, Broyden, ScipyRoot."""
    return bool(_caps(algorithm)["roots_only"])


def root_solver_names() -> str:
    """The registered classes that solve root problems, by name."""
    names = [c.__name__ for c in algorithm_classes() if root_form(c) is not None]
    return ", ".join(names) if names else "(none installed)"
