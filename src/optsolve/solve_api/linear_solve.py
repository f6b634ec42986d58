"""The one conjugate-gradient loop: the implicit adjoint's linear solve, Newton-CG's inner
solve and the Steihaug-CG trust-region subproblem are all :func:`cg` with different stops.

CG runs matrix-free on products ``v -> H v`` (Hessian-vector products in optsolve), from
``x = 0``, on pytrees (a flat vector is a one-leaf pytree), as a single ``lax.while_loop``:
it compiles once, runs under ``jit`` and ``vmap``, and is forward-differentiable. It counts
the products it makes, because on data-bound objectives each costs about a gradient.

It lives in ``solve_api`` so that the adjoint (which must not import a backend) and the
backends share it.
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from optsolve.solve_api.loops import inner_while_loop

PyTree = Any
Array = jax.Array

_NEGATIVE_CURVATURE = ("ignore", "last", "steepest", "boundary")


class CGStatus(enum.IntEnum):
    """Why :func:`cg` stopped (``CGResult.status`` holds the value as an int32 array)."""

    CONVERGED = 0           # |H x - b| <= the tolerance
    MAX_ITERATIONS = 1      # maxiter products made without meeting the tolerance
    NEGATIVE_CURVATURE = 2  # d.Hd <= 0 along the current direction
    BOUNDARY = 3            # the next iterate would leave the trust region |x| <= radius


class CGResult(NamedTuple):
    """What :func:`cg` returns.

    Attributes:
      x: the solution (a pytree like ``b``).
      matvecs: products with H made (int32). Every loop iteration makes exactly one; the
        zero start costs none (the initial residual is ``-b``).
      iterations: iterations that moved x (int32): ``matvecs``, less the one rejected at
        negative curvature under ``negative_curvature="last"`` or ``"steepest"``.
      status: a :class:`CGStatus` value (int32).
      model: ``q(x) = x.Hx/2 - b.x``, tracked from the CG recurrences without another
        product (<= 0 unless "ignore" met negative curvature); with ``b = -g`` it is the change ``m(x) - m(0)`` of the quadratic
        model of f.
    """

    x: PyTree
    matvecs: Array
    iterations: Array
    status: Array
    model: Array


class _Carry(NamedTuple):
    k: Array           # products made
    steps: Array       # iterations that moved x
    x: PyTree
    r: PyTree          # residual H x - b, the gradient of q at x
    d: PyTree          # search direction
    rr: Array          # r.z, z = M r the preconditioned residual (r.r without M)
    model: Array       # q(x)
    status: Array      # MAX_ITERATIONS while running


def tree_dot(u: PyTree, w: PyTree, dtype: Any) -> Array:
    """The real inner product of two pytrees of the same structure, in ``dtype``."""
    leaves = [jnp.vdot(a, c).real.astype(dtype)
              for a, c in zip(jax.tree_util.tree_leaves(u), jax.tree_util.tree_leaves(w))]
    return functools.reduce(operator.add, leaves)


def _axpy(alpha: Array, u: PyTree, w: PyTree) -> PyTree:
    """``w + alpha u`` leafwise, alpha cast to each leaf's dtype."""
    return jax.tree_util.tree_map(lambda a, c: a + alpha.astype(a.dtype) * c, w, u)


def _where(pred: Array, a: PyTree, b: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda u, w: jnp.where(pred, u, w), a, b)


def _to_boundary(x: PyTree, d: PyTree, radius: Array, dtype: Any) -> Array:
    """The tau >= 0 with ``|x + tau d| = radius`` (the positive root of a quadratic)."""
    xd, dd, xx = tree_dot(x, d, dtype), tree_dot(d, d, dtype), tree_dot(x, x, dtype)
    return (-xd + jnp.sqrt(jnp.maximum(xd * xd + dd * (radius * radius - xx), 0.0))) / dd


def cg(matvec: Callable[[PyTree], PyTree], b: PyTree, *, maxiter: Any,
       rtol: Any = None, atol: Any = None, negative_curvature: str = "ignore",
       radius: Any = None, test_start: bool = True,
       preconditioner: Callable[[PyTree], PyTree] | None = None) -> CGResult:
    """Conjugate gradients for ``H x = b`` from ``x = 0``, i.e. minimising
    ``q(x) = x.Hx/2 - b.x`` (Hestenes & Stiefel 1952; Nocedal & Wright, *Numerical
    Optimization*, 2006, Algorithm 5.2), with the truncations of Newton-CG (Algorithm 7.1)
    and of Steihaug's trust-region CG (Steihaug 1983, SIAM J. Numer. Anal. 20; Algorithm 7.2).

    Each iteration makes one product ``H d``; with ``r = H x - b``:
    ``alpha = r.r / d.Hd``, ``x += alpha d``, ``r += alpha H d``,
    ``d = -r + (r.r new / r.r old) d``. CG stops once ``|r| <= max(rtol |b|, atol)``,
    after ``maxiter`` products, or as ``negative_curvature`` and ``radius`` say.

    Args:
      matvec: ``v -> H v`` on pytrees shaped like ``b``; H symmetric.
      b: the right-hand side (a pytree of float arrays).
      maxiter: the most products (a Python int or an int array).
      rtol: tolerance on ``|r|`` relative to ``|b|``.
      atol: absolute tolerance on ``|r|``. At least one of rtol and atol must be given;
        with both, the larger bound applies.
      negative_curvature: what a direction with ``d.Hd <= 0`` does.
        "ignore": nothing (H is assumed positive definite);
        "last": stop and return the last iterate (0 if met at the first iteration);
        "steepest": as "last", but return ``b`` (steepest descent on q) if met at the first
        iteration (Newton-CG);
        "boundary": stop on the trust-region boundary along d (Steihaug; needs ``radius``).
      radius: the trust radius: an iterate that would reach ``|x| >= radius`` is replaced by
        the point on the boundary along d and CG stops. Needs ``negative_curvature="boundary"``.
      test_start: test the tolerance on ``b`` before the first product (a ``b`` that meets
        it costs nothing and gives x = 0). False takes at least one iteration, as Newton-CG
        and optsolve's Steihaug-CG do, so a descent direction is never zero even when
        ``rtol >= 1``.
      preconditioner: ``r -> M r`` with M symmetric positive definite, an approximation of
        H^-1 (preconditioned CG, Nocedal & Wright Algorithm 5.3: ``z = M r``,
        ``alpha = r.z / d.Hd``, ``d = -z + (r.z new / r.z old) d``); the stopping test stays
        on ``|r|``. Only with ``negative_curvature="ignore"``.

    Returns:
      A :class:`CGResult`: the solution, products made, iterations, why it stopped, q(x).

    Example:
      >>> h = jnp.array([[4.0, 1.0], [1.0, 3.0]])
      >>> res = cg(lambda v: h @ v, jnp.array([1.0, 2.0]), rtol=1e-6, maxiter=10)
      >>> int(res.matvecs), int(res.status) == CGStatus.CONVERGED
      (2, True)
    """
    if negative_curvature not in _NEGATIVE_CURVATURE:
        raise ValueError(f"cg: `negative_curvature` must be one of "
                         f"{', '.join(_NEGATIVE_CURVATURE)}, got {negative_curvature!r}.")
    if (radius is None) != (negative_curvature != "boundary"):
        raise ValueError("cg: a trust `radius` goes with negative_curvature='boundary' and "
                         f"only with it; got radius={radius!r}, "
                         f"negative_curvature={negative_curvature!r}.")
    if rtol is None and atol is None:
        raise ValueError("cg: give `rtol`, `atol` or both (the residual tolerance).")
    if preconditioner is not None and negative_curvature != "ignore":
        raise ValueError("cg: a `preconditioner` goes with negative_curvature='ignore' only; "
                         f"got negative_curvature={negative_curvature!r}.")
    precondition = preconditioner if preconditioner is not None else (lambda r: r)

    with jax.numpy_dtype_promotion("standard"):
        dtype = jnp.result_type(*jax.tree_util.tree_leaves(b))
    r0 = jax.tree_util.tree_map(jnp.negative, b)
    rr0 = tree_dot(r0, r0, dtype)
    # Only the given terms: rtol * |b| alone is exact, and 0 * inf cannot make it NaN.
    bounds = [] if rtol is None else [jnp.asarray(rtol, dtype) * jnp.sqrt(rr0)]
    bounds += [] if atol is None else [jnp.asarray(atol, dtype)]
    tol = functools.reduce(jnp.maximum, bounds)
    if radius is not None:
        radius = jnp.asarray(radius, dtype)

    def status_of(converged):
        return jnp.where(converged, CGStatus.CONVERGED, CGStatus.MAX_ITERATIONS).astype(jnp.int32)

    def cond(c: _Carry):
        return (c.status == CGStatus.MAX_ITERATIONS) & (c.k < maxiter)

    def body(c: _Carry) -> _Carry:
        hd = matvec(c.d)
        dhd = tree_dot(c.d, hd, dtype)
        alpha = c.rr / dhd
        x = _axpy(alpha, c.d, c.x)
        r = _axpy(alpha, hd, c.r)
        z = precondition(r)
        rr = tree_dot(r, z, dtype)
        d = jax.tree_util.tree_map(lambda zi, di: -zi + (rr / c.rr).astype(di.dtype) * di,
                                   z, c.d)
        model = c.model - 0.5 * alpha * c.rr
        residual = rr if preconditioner is None else tree_dot(r, r, dtype)
        status = status_of(jnp.sqrt(residual) <= tol)
        moved = jnp.ones((), bool)
        # A stop leaves r, d and r.r as computed: the loop ends, and they are not returned.
        if negative_curvature != "ignore":
            bad = ~(dhd > 0)  # also catches a NaN curvature
            if radius is None:
                x, model, moved = _where(bad, c.x, x), jnp.where(bad, c.model, model), ~bad
            else:
                crossing = tree_dot(x, x, dtype) >= radius * radius
                outside = bad | crossing
                tau = _to_boundary(c.x, c.d, radius, dtype)
                x = _where(outside, _axpy(tau, c.d, c.x), x)
                model = jnp.where(outside, c.model + tau * tree_dot(c.r, c.d, dtype)
                                  + 0.5 * tau * tau * dhd, model)
                status = jnp.where(crossing, CGStatus.BOUNDARY, status)
            status = jnp.where(bad, CGStatus.NEGATIVE_CURVATURE, status).astype(jnp.int32)
        return _Carry(c.k + 1, c.steps + moved.astype(jnp.int32), x, r, d, rr, model, status)

    start = (status_of(jnp.sqrt(rr0) <= tol) if test_start
             else jnp.asarray(CGStatus.MAX_ITERATIONS, jnp.int32))
    zero_int = jnp.zeros((), jnp.int32)
    if preconditioner is None:
        d0, rz0 = b, rr0
    else:
        d0 = preconditioner(b)  # -M r0
        rz0 = tree_dot(b, d0, dtype)
    c = inner_while_loop(cond, body, _Carry(
        zero_int, zero_int, jax.tree_util.tree_map(jnp.zeros_like, b), r0, d0, rz0,
        jnp.zeros((), dtype), start), maxiter)
    x = c.x
    if negative_curvature == "steepest":
        x = _where((c.status == CGStatus.NEGATIVE_CURVATURE) & (c.steps == 0), b, x)
    return CGResult(x, c.k, c.steps, c.status, c.model)
