"""A residual problem as scipy.optimize.least_squares sees it: ``fun`` and ``jac`` of one
float64 vector, backed by compiled JAX.

``x0`` (any pytree) is flattened with ``jax.flatten_util.ravel_pytree``, as for the other
scipy methods (:mod:`optsolve.backends.scipy.compiled`), and so is the residual pytree (its
leaves raveled and concatenated in leaf order). The residuals and their Jacobian are two
compiled executables, built once per (residual, shapes, dtypes) and cached; the Jacobian is
``jax.jacfwd`` when there are at least as many residuals as parameters (n forward passes)
and ``jax.jacrev`` otherwise (m reverse passes).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.backends.scipy.compiled import HostProblem, _promote, eval_dtype, flatten_x
from optsolve.backends.scipy.host_executable import HostCall, HostExecutable
from optsolve.backends.scipy.losses import robust_cost
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import raise_if_interrupted
from optsolve.solve_api.least_squares import LeastSquaresProblem, jacobian_of, residual_size
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import tree_spec

PyTree = Any

_CACHE = BoundedCache(256)
_SIZES = BoundedCache(1024)


@dataclasses.dataclass(frozen=True)
class ResidualExecutables:
    """The compiled residuals (n,) -> (m,) and Jacobian (n,) -> (m, n) of one problem shape."""

    residuals: HostExecutable
    jacobian: HostExecutable
    m: int
    n: int


def flat_residuals(residual, unravel, dtype):
    """``xf, p -> r``: the residual pytree at ``unravel(xf)`` as one vector of ``dtype``."""

    def fn(xf, p):
        with jax.numpy_dtype_promotion("standard"):
            leaves = jax.tree_util.tree_leaves(residual(unravel(xf), p))
        return jnp.concatenate([jnp.ravel(leaf).astype(dtype) for leaf in leaves])

    return fn


def number_of_residuals(problem: LeastSquaresProblem) -> int:
    """m, the residuals' total size (cached per residual and shapes: it traces the residual)."""
    key = (problem.residual, tree_spec(problem.x0), tree_spec(problem.p))
    try:
        return _SIZES.get_or_make(key, lambda: residual_size(problem))
    except TypeError:  # an unhashable residual
        return residual_size(problem)


def residual_executables(problem: LeastSquaresProblem, p: PyTree) -> ResidualExecutables:
    """The compiled residuals and Jacobian for this problem's shapes (cached)."""
    dtype = eval_dtype(problem.x0)
    key = (problem.residual, tree_spec(problem.x0), tree_spec(p), str(dtype))

    def build() -> ResidualExecutables:
        flat0, unravel = flatten_x(_promote(problem.x0, dtype))
        n = flat0.shape[0]
        vec = jax.ShapeDtypeStruct((n,), flat0.dtype)
        fn = flat_residuals(problem.residual, unravel, flat0.dtype)
        m = jax.eval_shape(fn, vec, p).shape[0]
        jac = jacobian_of(fn, m, n)
        return ResidualExecutables(
            HostExecutable(fn, (vec,), p), HostExecutable(jac, (vec,), p), m, n
        )

    return _CACHE.get_or_make(key, build)


class ResidualHost(HostProblem):
    """A residual problem as float64 numpy callables for scipy.optimize.least_squares.

    The inherited side (``peek``, ``grad``: the history's gradient norms) sees
    ``cost_problem``, whose objective is the cost scipy minimises (the robust loss's);
    :meth:`residuals` and :meth:`jacobian` are what scipy calls.

    Args:
      problem: the residual problem (concrete leaves).
      cost_problem: the problem whose f is scipy's cost (``problem`` for the linear loss).
      loss, f_scale: scipy's robust loss (for the cost at the last finite iterate).
      p_weak: which leaves of ``p`` were weakly typed (after a host round trip), or None.

    Attributes:
      m: the number of residuals.
      n_f, n_g: residual and Jacobian evaluations computed.
      bad: how many residual and Jacobian evaluations were not finite.
      last_finite: (x, cost) of the last evaluation with finite residuals, or None.
      rejects_nonfinite_trials: non-finite residuals after the first evaluation are trial
        points the method rejects (MINPACK's lm), counted in ``rejected``, not failures.
    """

    def __init__(
        self,
        problem: LeastSquaresProblem,
        cost_problem: OptimizationProblem,
        loss: str,
        f_scale: float,
        p_weak: tuple[bool, ...] | None = None,
    ):
        super().__init__(cost_problem, p_weak)
        self.loss, self.f_scale = loss, f_scale
        self.bad.update({"the residuals": 0, "the Jacobian": 0})
        exe = residual_executables(problem, self.p)
        self.m = exe.m
        self._r: HostCall = exe.residuals.bind(self.p)
        self._j: HostCall = exe.jacobian.bind(self.p)
        self._memo_rx: np.ndarray | None = None
        self._memo_cost: float | None = None
        self.rejects_nonfinite_trials = False
        self.rejected = 0

    def cost(self, r: np.ndarray) -> float:
        """scipy's cost of the residual vector ``r``."""
        return float(robust_cost(r, self.loss, self.f_scale, np))

    def residuals(self, x: np.ndarray) -> np.ndarray:
        """r(x), a fresh float64 vector (scipy's trf and dogbox scale it in place)."""
        raise_if_interrupted()
        xc = np.array(x, dtype=np.float64)
        r = np.array(self._r(xc if self._f64 else xc.astype(self.dtype))[0], np.float64)
        self.n_f += 1
        # r.r is one BLAS call, the cheapest finiteness test; it also overflows for huge
        # finite residuals, which the entrywise test then tells apart
        if not math.isfinite(r.dot(r)) and not np.all(np.isfinite(r)):
            if self.rejects_nonfinite_trials and self.n_f > 1:
                # MINPACK's ratio test fails on such a trial, which it rejects and retries
                # with a smaller step: not a failure of the run
                self.rejected += 1
            else:
                self._bad("the residuals")
        else:
            self._memo_rx, self._memo_cost = xc, self.cost(r)
            self.last_finite = (xc, self._memo_cost)
        return r

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        """The (m, n) Jacobian of r at x, a fresh float64 array (scipy scales it in place)."""
        raise_if_interrupted()
        xc = np.asarray(x, dtype=np.float64)
        jac = np.array(self._j(xc if self._f64 else xc.astype(self.dtype))[0], np.float64)
        self.n_g += 1
        flat = jac.ravel()
        if not math.isfinite(flat.dot(flat)) and not np.all(np.isfinite(flat)):
            self._bad("the Jacobian")
        return jac

    def cost_at(self, x: np.ndarray) -> float:
        """The cost at x: from the last residual evaluation when it was at x (scipy asks for
        the Jacobian at the point it just evaluated), else one uncounted evaluation."""
        if self._memo_rx is not None and np.array_equal(self._memo_rx, x):
            return self._memo_cost
        r = np.asarray(self._r(np.asarray(x, self.dtype))[0], np.float64)
        return self.cost(r)

    def nonfinite_note(self) -> str:
        """E.g. "the residuals were not finite at 3 of 57 evaluations" ("" when all were)."""
        totals = {"the residuals": self.n_f, "the Jacobian": self.n_g}
        verb = {"the residuals": "were", "the Jacobian": "was"}
        return "; ".join(
            f"{what} {verb[what]} not finite at {n} of {totals[what]} evaluations"
            for what, n in self.bad.items()
            if n and what in totals
        )
