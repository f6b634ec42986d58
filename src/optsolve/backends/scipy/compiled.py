"""The problem as scipy sees it: callables of one float64 vector, backed by compiled JAX.

``x0`` (any pytree) is flattened with ``jax.flatten_util.ravel_pytree``; scipy works on the
flat float64 vector and every evaluation unravels it to x0's structure and dtypes. Each derivative
scipy asks for is one compiled executable (a
:class:`~optsolve.backends.scipy.host_executable.HostExecutable`: run inline in the calling thread
on a CPU), built once per (f, shapes, dtypes) and cached, and called with numpy inputs and ``p``
bound as an argument: no tracing, no dispatch through ``jax.jit``'s cache and no recompilation when
``p`` changes. Objective and gradient come from one evaluation (``value_and_grad``), packed in one
vector so one device-to-host copy serves both.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from optsolve.backends.scipy.host_executable import HostCall, HostExecutable
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import raise_if_interrupted
from optsolve.solve_api.kkt import constraint_values
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import tree_spec

if TYPE_CHECKING:
    from scipy.sparse.linalg import LinearOperator

PyTree = Any

_CACHE = BoundedCache(256)

# Constraints (and bounds) count as violated beyond this (:meth:`HostProblem.violation`,
# relative to max(1, |bound|)): at the end of a run (INFEASIBLE) and where optsolve's ftol
# test would end a constrained run. Looser than the methods' own tolerances (COBYLA's
# catol = sqrt(eps), trust-constr's 1e-8), so a converged run is never reported INFEASIBLE
# by accident (COBYLA's own flag, by that catol, is not the verdict: see run._outcome).
FEASIBILITY_TOL = 1e-6


def eval_dtype(x0: PyTree) -> np.dtype:
    """The dtype f is evaluated in: float64 when JAX's x64 mode is on (scipy works in
    float64: its line searches and trust-region ratios need the resolution), else x0's."""
    if jax.config.jax_enable_x64:
        return np.dtype(np.float64)
    with jax.numpy_dtype_promotion("standard"):
        return np.dtype(jnp.result_type(*jax.tree_util.tree_leaves(x0)))


_WARNED: list[bool] = []  # the low-precision warning is given once per process


def _warn_low_precision(dtype: np.dtype) -> None:
    if _WARNED:
        return
    _WARNED.append(True)
    warnings.warn(
        f"optsolve: scipy's methods work in float64, but f is evaluated in {dtype} (JAX's x64 "
        "mode is off): line searches, trust regions and constraint tolerances may stop "
        "early or report INFEASIBLE. Enable float64 at start-up with "
        "jax.config.update('jax_enable_x64', True). (Shown once.)",
        RuntimeWarning,
        stacklevel=2,
    )


def _promote(tree: PyTree, dtype: np.dtype) -> PyTree:
    """Floating leaves of ``tree`` as ``dtype``; Python scalars and weakly typed leaves (which
    adapt to what they meet) and leaves already of ``dtype`` are kept as they are."""

    def cast(leaf):
        if isinstance(leaf, (bool, int, float, complex)) or getattr(leaf, "weak_type", False):
            return leaf
        leaf_dtype = getattr(leaf, "dtype", None)
        leaf_dtype = jnp.result_type(leaf) if leaf_dtype is None else leaf_dtype
        if leaf_dtype != dtype and jnp.issubdtype(leaf_dtype, jnp.floating):
            return jnp.asarray(leaf, dtype)
        return leaf

    return jax.tree_util.tree_map(cast, tree)


def host_p(p: PyTree, weak: tuple[bool, ...] | None = None) -> PyTree:
    """``p`` with JAX arrays kept, other array-likes as numpy arrays (placed on a device once
    per solve by :meth:`HostExecutable.bind`) and Python scalars (weakly typed) kept.

    ``weak`` marks leaves that were weakly typed before a host round trip turned them
    into numpy arrays; scalars among them become Python scalars again, so that the
    user's ``f`` sees the same dtypes under JAX's strict promotion as when traced.
    (Scalars stay on the host: this runs inside a JVP rule while JAX traces, where a
    conversion with jnp would be staged out instead of computed.)
    """
    leaves, treedef = jax.tree_util.tree_flatten(p)
    out = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (bool, int, float, complex)):
            out.append(leaf)
        elif weak is not None and weak[i] and np.ndim(leaf) == 0:
            out.append(np.asarray(leaf).item())
        elif isinstance(leaf, jax.Array):
            out.append(leaf)
        else:
            out.append(np.asarray(leaf))
    return jax.tree_util.tree_unflatten(treedef, out)


def flatten_x(tree: PyTree) -> tuple[jax.Array, Callable[[jax.Array], PyTree]]:
    """``ravel_pytree`` that also accepts leaves of mixed float dtypes under strict promotion."""
    with jax.numpy_dtype_promotion("standard"):
        return ravel_pytree(tree)


def _constraint_values(constraints, x, p, dtype) -> jax.Array:
    return constraint_values(constraints, x, p, dtype)  # the adjoint's: both see one c


def _build(kind: str, f, constraints, unravel, dtype) -> Callable:
    """The function of kind ``kind`` of the flat vector and p (to be compiled)."""

    def unr(xf):
        with jax.numpy_dtype_promotion("standard"):
            return unravel(xf)

    def obj(xf, p):
        return f(unr(xf), p).astype(dtype)

    def cons(xf, p):
        return _constraint_values(constraints, unr(xf), p, dtype)

    if kind == "f":
        return obj
    if kind == "f_batch":
        # a population of points (S, n) -> (S,) in one call (differential_evolution's
        # ``vectorized``)
        return jax.vmap(obj, in_axes=(0, None))
    if kind == "c_batch":  # (S, n) -> (S, m)
        return jax.vmap(cons, in_axes=(0, None))
    if kind == "fg":

        def fg(xf, p):
            # [f, g...]: one transfer. Nothing else is computed here: a reduction over g
            # (a finiteness check) splits XLA's fusions into more kernels, and changes how
            # it rounds g, unless a barrier stops it, which costs more kernels still.
            value, grad = jax.value_and_grad(obj)(xf, p)
            return jnp.concatenate([value[None], grad])

        return fg
    if kind == "hessp":
        return lambda xf, v, p: jax.jvp(lambda y: jax.grad(obj)(y, p), (xf,), (v,))[1]
    if kind == "hess":
        return lambda xf, p: jax.hessian(obj)(xf, p)
    if kind == "c":
        return cons
    if kind == "cj":

        def cj(xf, p):
            return cons(xf, p), jax.jacrev(cons)(xf, p)

        return cj
    if kind == "chvp":
        # Hessian of the Lagrangian's constraint part, sum_i v_i c_i(x), times u.
        def chvp(xf, v, u, p):
            grad = jax.grad(lambda y: jnp.dot(v, cons(y, p)))
            return jax.jvp(grad, (xf,), (u,))[1]

        return chvp
    raise ValueError(kind)


def compiled(
    kind: str, problem: OptimizationProblem, p: PyTree, n_cons: int, batch: int | None = None
) -> HostExecutable:
    """The compiled executable of ``kind`` for this problem's shapes (cached); ``batch``:
    the number of points of a ``"f_batch"`` call."""
    g_fns = tuple(c.g for c in problem.constraints or ())
    dtype = eval_dtype(problem.x0)
    key = (kind, problem.f, g_fns, tree_spec(problem.x0), tree_spec(p), str(dtype), batch)

    def build() -> HostExecutable:
        # Only on a cache miss: it dispatches JAX operations.
        flat0, unravel = flatten_x(_promote(problem.x0, dtype))
        n = flat0.shape[0]
        vec = jax.ShapeDtypeStruct((n,), flat0.dtype)
        fn = _build(kind, problem.f, problem.constraints or (), unravel, flat0.dtype)
        args = {
            "hessp": (vec, vec),
            "chvp": (vec, jax.ShapeDtypeStruct((n_cons,), flat0.dtype), vec),
            "f_batch": (jax.ShapeDtypeStruct((batch or 0, n), flat0.dtype),),
            "c_batch": (jax.ShapeDtypeStruct((batch or 0, n), flat0.dtype),),
        }
        return HostExecutable(fn, args.get(kind, (vec,)), p)

    return _CACHE.get_or_make(key, build)


class HostProblem:
    """``problem`` as float64 numpy callables for scipy, with evaluation bookkeeping.

    Args:
      problem: the problem (concrete leaves).
      p_weak: which leaves of ``p`` were weakly typed (after a host round trip), or None.

    Attributes:
      x0: the flat float64 starting point.
      n_f, n_g, n_h: objective, gradient and Hessian (or Hessian-product) evaluations
        actually computed (one compiled call of value-and-gradient counts one of each).
      bad: how many evaluations of "f", "the gradient" and "the Hessian" were not finite.
      nonfinite: True once any evaluation returned a NaN or infinite value.
      reject: ``solve(nonfinite="reject")``: such an evaluation (f, or the gradient
        computed with it) is handed to scipy as f = +inf, a point no better than any
        finite one, which a method that compares values passes over (NaN would not
        compare: differential_evolution's population then keeps a NaN best).
      last_finite: (x, f) of the last evaluation with a finite value (and gradient), or None.
      watch_first: how many first evaluations of :meth:`fun` ``best_of_first`` watches.
      best_of_first: (x, f) of the lowest finite value among them (the first on ties, as
        Nelder-Mead's sort of its initial simplex), or None.
    """

    def __init__(self, problem: OptimizationProblem, p_weak: tuple[bool, ...] | None = None):
        self.problem = problem
        # Flattened in numpy, as ravel_pytree does (leaf order, promoted dtype), without
        # dispatching JAX operations on every solve.
        leaves = jax.tree_util.tree_leaves(problem.x0)
        self.dtype = eval_dtype(problem.x0)
        if self.dtype != np.float64:
            _warn_low_precision(self.dtype)
        self.x0 = np.concatenate([np.ravel(np.asarray(leaf, dtype=np.float64)) for leaf in leaves])
        self.n = self.x0.shape[0]
        self.p = host_p(_promote(problem.p, self.dtype), p_weak)
        self._exe: dict[str, HostCall] = {}
        self.constraints = problem.constraints or ()
        self.n_cons = 0
        if self.constraints:
            x_spec = jax.tree_util.tree_map(
                lambda leaf: jax.ShapeDtypeStruct(np.shape(leaf), self.dtype), problem.x0
            )
            sizes = [
                int(np.prod(jax.eval_shape(c.g, x_spec, self.p).shape)) for c in self.constraints
            ]
            self.n_cons = sum(sizes)
            self.c_lower = np.concatenate(
                [
                    np.broadcast_to(np.asarray(c.lower, np.float64), (m,))
                    for c, m in zip(self.constraints, sizes)
                ]
            )
            self.c_upper = np.concatenate(
                [
                    np.broadcast_to(np.asarray(c.upper, np.float64), (m,))
                    for c, m in zip(self.constraints, sizes)
                ]
            )
        self._f64 = self.dtype == np.float64
        self._fg: HostCall | None = None
        self.n_f = 0
        self.n_g = 0
        self.n_h = 0
        self.bad = {"f": 0, "the gradient": 0, "the Hessian": 0}
        self.nonfinite = False
        self.reject = False
        self.last_finite: tuple[np.ndarray, float] | None = None
        self.watch_first = 0
        self.best_of_first: tuple[np.ndarray, float] | None = None
        self._memo_x: np.ndarray | None = None
        self._memo_fg: tuple[float, np.ndarray] | None = None
        self._memo_cx: np.ndarray | None = None
        self._memo_cj: tuple[np.ndarray, np.ndarray] | None = None
        # fun_batch's and cons_batch's executables, by (kind, batch size)
        self._batched: dict[tuple[str, int], HostCall] = {}

    def prepare(self, kinds: tuple[str, ...]) -> None:
        """Compile the executables of ``kinds`` now (before scipy starts its clock)."""
        for kind in kinds:
            if kind not in self._exe:
                self._exe[kind] = compiled(kind, self.problem, self.p, self.n_cons).bind(self.p)
        self._fg = self._exe.get("fg")

    def _x(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=self.dtype)

    def _seen(self, x: np.ndarray, f: float, finite: bool) -> None:
        if finite:
            self.last_finite = (np.array(x, dtype=np.float64), f)
        else:
            self._bad("f")

    def _bad(self, what: str) -> None:
        self.bad[what] += 1
        self.nonfinite = True

    def nonfinite_note(self) -> str:
        """E.g. "f was not finite at 3 of 57 evaluations" ("" when every value was finite)."""
        totals = {"f": self.n_f, "the gradient": self.n_g, "the Hessian": self.n_h}
        note = "; ".join(
            f"{what} was not finite at {n} of {totals[what]} evaluations"
            for what, n in self.bad.items()
            if n
        )
        if note and self.reject:
            note += " (rejected: passed to the method as f = +inf, nonfinite='reject')"
        return note

    # ------------------------------------------------------------------ objective
    def fun(self, x: np.ndarray) -> float:
        """f(x), for the methods that use no derivatives."""
        raise_if_interrupted()
        self.prepare(("f",))
        f = float(self._exe["f"](self._x(x))[0])
        self.n_f += 1
        finite = math.isfinite(f)
        self._seen(x, f, finite)
        if (
            self.n_f <= self.watch_first
            and finite
            and (self.best_of_first is None or f < self.best_of_first[1])
        ):
            self.best_of_first = (np.array(x, dtype=np.float64), f)
        return f if finite or not self.reject else math.inf

    @property
    def batched(self) -> bool:
        """Whether :meth:`fun_batch` evaluated f (its points are counted in ``n_f``)."""
        return any(kind == "f_batch" for kind, _ in self._batched)

    def _batch_call(self, kind: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(points (S, n), the values of ``kind`` at them (S, ...)) for scipy's (n, S) or (n,).

        Each population size is compiled once; a smaller population (the end of a
        ``maxfun`` budget, the feasible part of one) is padded to a size already compiled
        (the first call, the whole initial population, is the largest) and the padding's
        values dropped."""
        raise_if_interrupted()
        points = np.ascontiguousarray(np.asarray(x, dtype=np.float64).reshape(self.n, -1).T)
        s = points.shape[0]
        size = min((b for k, b in self._batched if k == kind and b >= s), default=None)
        if size is None:
            size = s
            self._batched[kind, s] = compiled(
                kind, self.problem, self.p, self.n_cons, batch=s
            ).bind(self.p)
        padded = (
            points
            if size == s
            else np.concatenate([points, np.broadcast_to(points[-1:], (size - s, self.n))])
        )
        values = np.asarray(self._batched[kind, size](self._x(padded))[0], dtype=np.float64)
        return points, values[:s]

    def fun_batch(self, x: np.ndarray) -> np.ndarray:
        """f at each column of ``x`` (shape (n, S)), in one compiled vmapped call: scipy's
        ``vectorized=True`` protocol (differential_evolution). Every point counts one
        evaluation in ``n_f``; non-finite values are counted and, under ``reject``,
        handed back as +inf, as in :meth:`fun`."""
        if np.size(x) == 0:
            return np.empty(0)
        points, f = self._batch_call("f_batch", x)
        s = points.shape[0]
        self.n_f += s
        finite = np.isfinite(f)
        if finite.any():
            last = int(np.flatnonzero(finite)[-1])
            self.last_finite = (points[last].copy(), float(f[last]))
        bad = s - int(finite.sum())
        if bad:
            self.bad["f"] += bad
            self.nonfinite = True
            if self.reject:
                f = np.where(finite, f, np.inf)
        return f

    def cons_batch(self, x: np.ndarray) -> np.ndarray:
        """All constraint values at each column of ``x`` (n, S), shape (m, S), in one
        compiled call (differential_evolution's vectorized constraints)."""
        if np.size(x) == 0:
            return np.empty((self.n_cons, 0))
        return self._batch_call("c_batch", x)[1].T

    def fun_and_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """(f(x), grad f(x)) from one compiled evaluation (scipy's ``jac=True`` protocol).

        The hot path of every gradient method: one copy of x (scipy may reuse its buffer; the
        copy serves the memo and the last-finite record), one compiled call, one transfer.
        """
        raise_if_interrupted()
        if self._fg is None:
            self.prepare(("fg",))
        xc = np.array(x, dtype=np.float64)
        out = self._fg(xc if self._f64 else xc.astype(self.dtype))[0]
        f = float(out[0])
        g = out[1:] if self._f64 else out[1:].astype(np.float64)
        self.n_f += 1
        self.n_g += 1
        # g.g is one BLAS call, the cheapest finiteness test of g on the host; it also
        # overflows for |g| > 1e154, which the entrywise test then tells apart.
        if not math.isfinite(f):
            self._bad("f")
            f = math.inf if self.reject else f
        elif not math.isfinite(g.dot(g)) and not np.all(np.isfinite(g)):
            self._bad("the gradient")
            f = math.inf if self.reject else f
        else:
            self.last_finite = (xc, f)
        self._memo_x = xc
        self._memo_fg = (f, g)
        return f, g

    def _memo(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if self._memo_x is None or not np.array_equal(self._memo_x, x):
            self.fun_and_grad(x)
        return self._memo_fg

    def value(self, x: np.ndarray) -> float:
        """f(x) through the value-and-gradient memo (one evaluation serves fun and jac)."""
        return self._memo(x)[0]

    def grad(self, x: np.ndarray) -> np.ndarray:
        """grad f(x) through the value-and-gradient memo."""
        return self._memo(x)[1]

    def value_at(self, x: np.ndarray, use_gradient: bool) -> float:
        """f at an iterate a callback saw: the memo when it holds x, else one evaluation."""
        if self._memo_x is not None and np.array_equal(self._memo_x, x):
            return self._memo_fg[0]
        if self.last_finite is not None and np.array_equal(self.last_finite[0], x):
            return self.last_finite[1]
        return self.fun_and_grad(x)[0] if use_gradient else self.fun(x)

    def peek(self, x: np.ndarray, gradient: bool = True) -> tuple[float, np.ndarray | None]:
        """(f(x), grad f(x)) for optsolve's own records (history, the gtol check), counted
        nowhere: the memo when it holds x, else one evaluation. Without ``gradient`` (the
        derivative-free methods) the gradient is None and only f is evaluated."""
        x = np.asarray(x, dtype=np.float64)
        if gradient and self._memo_x is not None and np.array_equal(self._memo_x, x):
            return self._memo_fg
        if gradient:
            self.prepare(("fg",))
            out = self._fg(x if self._f64 else x.astype(self.dtype))[0]
            return float(out[0]), np.asarray(out[1:], dtype=np.float64)
        self.prepare(("f",))
        return float(self._exe["f"](self._x(x))[0]), None

    def hessp(self, x: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Hessian-vector product (forward over reverse)."""
        raise_if_interrupted()
        self.prepare(("hessp",))
        return self._checked_hessian(self._exe["hessp"](self._x(x), self._x(v))[0])

    def hess(self, x: np.ndarray) -> np.ndarray:
        """The dense Hessian."""
        raise_if_interrupted()
        self.prepare(("hess",))
        return self._checked_hessian(self._exe["hess"](self._x(x))[0])

    def _checked_hessian(self, out: np.ndarray) -> np.ndarray:
        self.n_h += 1
        out = np.asarray(out, dtype=np.float64)
        flat = out.ravel()
        # as for g in fun_and_grad: one BLAS call, the entrywise test only where it overflows
        if not math.isfinite(flat.dot(flat)) and not np.all(np.isfinite(flat)):
            self._bad("the Hessian")
        return out

    # ---------------------------------------------------------------- constraints
    def cons(self, x: np.ndarray) -> np.ndarray:
        """All constraint values, concatenated (derivative-free methods)."""
        raise_if_interrupted()
        self.prepare(("c",))
        return np.asarray(self._exe["c"](self._x(x))[0], dtype=np.float64)

    def _cons_memo(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._memo_cx is None or not np.array_equal(self._memo_cx, x):
            raise_if_interrupted()
            self.prepare(("cj",))
            c, jac = self._exe["cj"](self._x(x))
            self._memo_cx = np.array(x, dtype=np.float64)
            self._memo_cj = (np.asarray(c, np.float64), np.asarray(jac, np.float64))
        return self._memo_cj

    def cons_value(self, x: np.ndarray) -> np.ndarray:
        """Constraint values through the value-and-Jacobian memo."""
        return self._cons_memo(x)[0]

    def cons_jac(self, x: np.ndarray) -> np.ndarray:
        """The constraints' Jacobian (m, n), from the same evaluation as their values."""
        return self._cons_memo(x)[1]

    def cons_hess(self, x: np.ndarray, v: np.ndarray) -> LinearOperator:
        """sum_i v_i Hess c_i(x) as a LinearOperator (trust-constr's Lagrangian Hessian)."""
        from scipy.sparse.linalg import LinearOperator  # here: optsolve's import skips scipy

        self.prepare(("chvp",))
        xx, vv = self._x(x), self._x(v)
        exe = self._exe["chvp"]

        def matvec(u):
            return np.asarray(exe(xx, vv, self._x(np.ravel(u)))[0], dtype=np.float64)

        return LinearOperator((self.n, self.n), matvec=matvec, dtype=np.float64)

    def violation(self, x: np.ndarray, bounds: tuple[np.ndarray, np.ndarray] | None) -> float:
        """The largest violation of the bounds and constraints at x, relative to max(1, |bound|)."""
        worst = 0.0
        pairs = []
        if bounds is not None:
            pairs.append((x, bounds[0], bounds[1]))
        if self.constraints:
            values = self.cons_value(x) if "cj" in self._exe else self.cons(x)
            pairs.append((values, self.c_lower, self.c_upper))
        for value, lo, up in pairs:
            with np.errstate(invalid="ignore"):
                below = np.where(np.isfinite(lo), (lo - value) / np.maximum(1.0, np.abs(lo)), 0.0)
                above = np.where(np.isfinite(up), (value - up) / np.maximum(1.0, np.abs(up)), 0.0)
            worst = max(worst, float(np.max(below, initial=0.0)), float(np.max(above, initial=0.0)))
            if not np.all(np.isfinite(value)):
                worst = np.inf
        return worst

    # --------------------------------------------------------------------- output
    def unravel(self, x: np.ndarray) -> PyTree:
        """The flat float64 vector as a pytree like x0 (JAX arrays, x0's dtypes)."""
        return jax.device_put(self.unravel_numpy(x))

    def unravel_numpy(self, x: np.ndarray) -> PyTree:
        """The flat vector as a pytree like x0 of numpy arrays (for the user's callback)."""
        leaves, treedef = jax.tree_util.tree_flatten(self.problem.x0)
        out, start = [], 0
        for leaf in leaves:
            size = int(np.prod(np.shape(leaf)))
            out.append(
                np.asarray(x[start : start + size], dtype=jnp.result_type(leaf)).reshape(
                    np.shape(leaf)
                )
            )
            start += size
        return jax.tree_util.tree_unflatten(treedef, out)
