"""The one conjugate-gradient loop: the implicit adjoint's linear solve, Newton-CG's inner
solve and the Steihaug-CG trust-region subproblem are all :func:`cg` with different stops.

CG runs matrix-free on products ``v -> H v`` (Hessian-vector products in optsolve), from
``x = 0``, on pytrees (a flat vector is a one-leaf pytree), as a single ``lax.while_loop``:
it compiles once, runs under ``jit`` and ``vmap``, and is forward-differentiable. It counts
the products it makes, because on data-bound objectives each costs about a gradient.

It lives in ``solve_api`` so that the adjoint (which must not import a backend) and the
backends share it. :func:`cgls` beside it gives the minimum-norm least-squares solution of a
singular system, where CG breaks down (the implicit adjoint's fallback), and :func:`minres`
solves symmetric indefinite systems (an interior-point method's KKT system), where CG's
``d.Hd`` may vanish.
"""

from __future__ import annotations

import enum
import functools
import operator
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from optsolve.solve_api.loops import inner_while_loop

PyTree = Any
Array = jax.Array

_NEGATIVE_CURVATURE = ("ignore", "last", "steepest", "boundary", "singular")


class CGStatus(enum.IntEnum):
    """Why :func:`cg` stopped (``CGResult.status`` holds the value as an int32 array)."""

    CONVERGED = 0  # |H x - b| <= the tolerance
    MAX_ITERATIONS = 1  # maxiter products made without meeting the tolerance
    NEGATIVE_CURVATURE = 2  # d.Hd <= 0 along the current direction
    BOUNDARY = 3  # the next iterate would leave the trust region |x| <= radius
    SINGULAR = 4  # d.Hd <= eps (largest d.Hd / d.d seen) d.d: H singular along d


class CGResult(NamedTuple):
    """What :func:`cg` returns.

    Attributes:
      x: the solution (a pytree like ``b``).
      matvecs: products with H made (int32). Every loop iteration makes exactly one; the
        zero start costs none (the initial residual is ``-b``).
      iterations: iterations that moved x (int32): ``matvecs``, less the one rejected at
        negative curvature under ``negative_curvature="last"``, ``"steepest"`` or
        ``"singular"``.
      status: a :class:`CGStatus` value (int32).
      model: ``q(x) = x.Hx/2 - b.x``, tracked from the CG recurrences without another
        product (<= 0 unless "ignore" met negative curvature); with ``b = -g`` it is the change
        ``m(x) - m(0)`` of the quadratic model of f.
    """

    x: PyTree
    matvecs: Array
    iterations: Array
    status: Array
    model: Array


class _Carry(NamedTuple):
    k: Array  # products made
    steps: Array  # iterations that moved x
    x: PyTree
    r: PyTree  # residual H x - b, the gradient of q at x
    d: PyTree  # search direction
    rr: Array  # r.z, z = M r the preconditioned residual (r.r without M)
    model: Array  # q(x)
    status: Array  # MAX_ITERATIONS while running
    curvature: Array  # the largest d.Hd / d.d seen ("singular" only; else 0)


def tree_dot(u: PyTree, w: PyTree, dtype: Any) -> Array:
    """The real inner product of two pytrees of the same structure, in ``dtype``."""
    leaves = [
        jnp.vdot(a, c).real.astype(dtype)
        for a, c in zip(jax.tree_util.tree_leaves(u), jax.tree_util.tree_leaves(w))
    ]
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


def cg(
    matvec: Callable[[PyTree], PyTree],
    b: PyTree,
    *,
    maxiter: Any,
    rtol: Any = None,
    atol: Any = None,
    negative_curvature: str = "ignore",
    radius: Any = None,
    test_start: bool = True,
    preconditioner: Callable[[PyTree], PyTree] | None = None,
) -> CGResult:
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
        "boundary": stop on the trust-region boundary along d (Steihaug; needs ``radius``);
        "singular": H is taken as positive semidefinite, possibly singular: a direction
        along which it is numerically singular, ``d.Hd <= eps c d.d`` with c the largest
        ``d.Hd / d.d`` seen (zero, negative and NaN curvature included), stops CG with
        status SINGULAR and the last iterate. Below eps c, a curvature is within the
        rounding of the products themselves. On a consistent system (b in the range of H)
        CG from 0 converges before that; otherwise its iterates grow without bound first,
        and the last iterate is not a solution (see :func:`cgls`).
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
        raise ValueError(
            f"cg: `negative_curvature` must be one of "
            f"{', '.join(_NEGATIVE_CURVATURE)}, got {negative_curvature!r}."
        )
    if (radius is None) != (negative_curvature != "boundary"):
        raise ValueError(
            "cg: a trust `radius` goes with negative_curvature='boundary' and "
            f"only with it; got radius={radius!r}, "
            f"negative_curvature={negative_curvature!r}."
        )
    if rtol is None and atol is None:
        raise ValueError("cg: give `rtol`, `atol` or both (the residual tolerance).")
    if preconditioner is not None and negative_curvature not in ("ignore", "singular"):
        raise ValueError(
            "cg: a `preconditioner` goes with negative_curvature='ignore' or "
            f"'singular' only; got negative_curvature={negative_curvature!r}."
        )
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
        d = jax.tree_util.tree_map(lambda zi, di: -zi + (rr / c.rr).astype(di.dtype) * di, z, c.d)
        model = c.model - 0.5 * alpha * c.rr
        residual = rr if preconditioner is None else tree_dot(r, r, dtype)
        status = status_of(jnp.sqrt(residual) <= tol)
        moved = jnp.ones((), bool)
        curvature = c.curvature
        # A stop leaves r, d and r.r as computed: the loop ends, and they are not returned.
        if negative_curvature == "singular":
            dd = tree_dot(c.d, c.d, dtype)
            curvature = jnp.maximum(curvature, dhd / jnp.where(dd > 0, dd, 1.0))
            bad = ~(dhd > jnp.finfo(dtype).eps * curvature * dd)  # also a NaN curvature
            x, model, moved = _where(bad, c.x, x), jnp.where(bad, c.model, model), ~bad
            status = jnp.where(bad, CGStatus.SINGULAR, status).astype(jnp.int32)
        elif negative_curvature != "ignore":
            bad = ~(dhd > 0)  # also catches a NaN curvature
            if radius is None:
                x, model, moved = _where(bad, c.x, x), jnp.where(bad, c.model, model), ~bad
            else:
                crossing = tree_dot(x, x, dtype) >= radius * radius
                outside = bad | crossing
                tau = _to_boundary(c.x, c.d, radius, dtype)
                x = _where(outside, _axpy(tau, c.d, c.x), x)
                model = jnp.where(
                    outside,
                    c.model + tau * tree_dot(c.r, c.d, dtype) + 0.5 * tau * tau * dhd,
                    model,
                )
                status = jnp.where(crossing, CGStatus.BOUNDARY, status)
            status = jnp.where(bad, CGStatus.NEGATIVE_CURVATURE, status).astype(jnp.int32)
        return _Carry(
            c.k + 1, c.steps + moved.astype(jnp.int32), x, r, d, rr, model, status, curvature
        )

    start = (
        status_of(jnp.sqrt(rr0) <= tol)
        if test_start
        else jnp.asarray(CGStatus.MAX_ITERATIONS, jnp.int32)
    )
    zero_int = jnp.zeros((), jnp.int32)
    if preconditioner is None:
        d0, rz0 = b, rr0
    else:
        d0 = preconditioner(b)  # -M r0
        rz0 = tree_dot(b, d0, dtype)
    c = inner_while_loop(
        cond,
        body,
        _Carry(
            zero_int,
            zero_int,
            jax.tree_util.tree_map(jnp.zeros_like, b),
            r0,
            d0,
            rz0,
            jnp.zeros((), dtype),
            start,
            jnp.zeros((), dtype),
        ),
        maxiter,
    )
    x = c.x
    if negative_curvature == "steepest":
        x = _where((c.status == CGStatus.NEGATIVE_CURVATURE) & (c.steps == 0), b, x)
    return CGResult(x, c.k, c.steps, c.status, c.model)


class CGLSResult(NamedTuple):
    """What :func:`cgls` returns.

    Attributes:
      x: the solution (a pytree like ``b``).
      matvecs: products with H made (int32): two per iteration.
      converged: whether ``|H (H x - b)| <= rtol |H b|`` was met (bool).
    """

    x: PyTree
    matvecs: Array
    converged: Array


class _CGLSCarry(NamedTuple):
    k: Array  # iterations made
    x: PyTree
    r: PyTree  # b - H x
    p: PyTree  # search direction
    ss: Array  # s.s of the last s = H r (the normal equations' residual)
    tol: Array  # rtol |H b|, set at the first iteration
    done: Array


def cgls(matvec: Callable[[PyTree], PyTree], b: PyTree, *, rtol: Any, maxiter: Any) -> CGLSResult:
    """The minimum-norm least-squares solution ``H^+ b`` of ``H x = b`` for a symmetric,
    possibly singular H: conjugate gradients on the normal equations ``H^2 x = H b`` from
    x = 0, in the form that never multiplies H by itself (CGLS: Hestenes & Stiefel 1952;
    Paige & Saunders, ACM TOMS 8, 1982, section 7.1; Bjorck, *Numerical Methods for Least
    Squares Problems*, 1996, section 7.4.1).

    Every iterate lies in the Krylov space of ``H^2`` on ``H b``, inside the range of H, so
    the limit is the least-squares solution with no component in the null space: where b
    has one (a right-hand side CG breaks down on), it is ignored rather than amplified.
    Each iteration ``s = H r``, ``p = s + (s.s / s.s old) p``, ``q = H p``,
    ``x += (s.s / q.q) p``, ``r -= (s.s / q.q) q`` makes two products; all are inside the
    loop, so a zero ``b`` costs none (also under ``vmap``, where only the rows with a
    nonzero ``b`` keep the loop going). Slower than CG on a regular system (the normal
    equations square H's condition number): meant as the fallback for singular ones.

    Args:
      matvec: ``v -> H v`` on pytrees shaped like ``b``; H symmetric.
      b: the right-hand side (a pytree of float arrays).
      rtol: the tolerance on the normal equations' residual ``|H (b - H x)|``, relative to
        ``|H b|``.
      maxiter: the most iterations (a Python int or an int array).

    Returns:
      A :class:`CGLSResult`.

    Example:
      >>> h = jnp.diag(jnp.array([2.0, 0.0]))
      >>> cgls(lambda v: h @ v, jnp.array([1.0, 1.0]), rtol=1e-6, maxiter=10).x
      Array([0.5, 0. ], dtype=float32)
    """
    with jax.numpy_dtype_promotion("standard"):
        dtype = jnp.result_type(*jax.tree_util.tree_leaves(b))

    def cond(c: _CGLSCarry):
        return ~c.done & (c.k < maxiter)

    def body(c: _CGLSCarry) -> _CGLSCarry:
        s = matvec(c.r)
        ss = tree_dot(s, s, dtype)
        first = c.k == 0
        tol = jnp.where(first, jnp.asarray(rtol, dtype) * jnp.sqrt(ss), c.tol)
        converged = jnp.sqrt(ss) <= tol  # at the first iteration, only where H b = 0
        beta = jnp.where(first, 0.0, ss / jnp.where(c.ss > 0, c.ss, 1.0))
        p = _axpy(beta, c.p, s)
        q = matvec(p)
        qq = tree_dot(q, q, dtype)
        # q = 0 needs p in the null space; p lies in the range and p.s = s.s > 0, so only
        # rounding can make it 0
        stop = converged | ~(qq > 0)
        alpha = jnp.where(stop, 0.0, ss / jnp.where(qq > 0, qq, 1.0))
        x = _axpy(alpha, p, c.x)
        r = _axpy(-alpha, q, c.r)
        return _CGLSCarry(c.k + 1, x, r, p, ss, tol, stop)

    zero = jax.tree_util.tree_map(jnp.zeros_like, b)
    empty = tree_dot(b, b, dtype) == 0
    c = inner_while_loop(
        cond,
        body,
        _CGLSCarry(
            jnp.zeros((), jnp.int32),
            zero,
            b,
            zero,
            jnp.zeros((), dtype),
            jnp.zeros((), dtype),
            empty,
        ),
        maxiter,
    )
    return CGLSResult(c.x, 2 * c.k, c.done)


class MINRESResult(NamedTuple):
    """What :func:`minres` returns.

    Attributes:
      x: the solution (an array like ``b``).
      matvecs: products with A made (int32). Every loop iteration makes exactly one; the
        zero start costs none (a zero ``b`` costs none at all).
      residual: the final residual-norm estimate relative to ``|b|``, both in the norm of the
        preconditioner (``|r|_M = sqrt(r.M r)`` with M the preconditioner's operator, the
        2-norm without one): Paige and Saunders' ``phibar / beta_1``, which equals the true
        relative residual up to rounding; 0 for a zero ``b`` (NaN for a NaN one).
      converged: whether ``residual <= rtol`` was met (bool).
    """

    x: Array
    matvecs: Array
    residual: Array
    converged: Array


class _MINRESCarry(NamedTuple):
    k: Array  # products made
    x: Array
    r1: Array  # the Lanczos vector before r2, unscaled, in b's space
    r2: Array  # the newest Lanczos vector, unscaled: M r2 = beta v_{k+1}
    y: Array  # M r2, so that beta^2 = r2.y
    w: Array  # the last two columns of V R^-1, the directions x moves along
    w2: Array
    beta: Array  # beta_{k+1}, the Lanczos off-diagonal
    oldb: Array  # beta_k
    dbar: Array  # the rotated tridiagonal entries carried to the next column
    epsln: Array
    cs: Array  # the last Givens rotation
    sn: Array
    phibar: Array  # the residual-norm estimate |r_k|_M
    done: Array


def minres(
    matvec: Callable[[Array], Array],
    b: Array,
    *,
    maxiter: int,
    rtol: Any,
    preconditioner: Callable[[Array], Array] | None = None,
) -> MINRESResult:
    """MINRES for ``A x = b`` with A symmetric, possibly indefinite or singular, from x = 0:
    the iterate minimising ``|b - A x|`` over the Krylov space (Paige & Saunders, "Solution
    of sparse indefinite systems of linear equations", SIAM J. Numer. Anal. 12, 1975; the
    preconditioned form of Choi, Paige & Saunders, SIAM J. Sci. Comput. 33, 2011, Table 3.1,
    which ``scipy.sparse.linalg.minres`` also follows).

    Each iteration makes one product: a Lanczos step on A (in the preconditioner's inner
    product) extends the tridiagonal T_k, a Givens rotation updates its QR factorisation, and
    x moves along the new column of ``V_k R_k^-1``. The rotations give the residual norm
    ``phibar`` without forming the residual. MINRES stops once
    ``phibar <= rtol |b|`` (both in the preconditioner's norm), after ``maxiter`` products, or
    when Lanczos breaks down (``beta = 0``: the Krylov space is invariant under A, so the
    current x is the minimum-residual solution over all of it; converged if ``phibar`` meets
    the tolerance, as it does for a consistent system). Unlike CG it needs no positive
    curvature: a KKT matrix ``[[H, J^T], [J, -D]]`` is fine. On a consistent singular
    system the iterates stay in A's range and tend to the minimum-norm solution; on an
    inconsistent one rounding rarely makes beta exactly 0, and the iterates can grow without
    bound while ``phibar`` stalls above the tolerance (MINRES-QLP, Choi, Paige & Saunders
    2011, is the remedy; :func:`cgls` gives the minimum-norm least-squares solution).

    Args:
      matvec: ``v -> A v`` on 1-D arrays shaped like ``b``; A symmetric.
      b: the right-hand side, a 1-D float array; its dtype is the computation's.
      maxiter: the most products (a static Python int, so that the loop also runs as a
        bounded scan under :class:`~optsolve.solve_api.loops.CheckpointedScan`).
      rtol: the tolerance on the residual norm relative to ``|b|`` (may be traced).
      preconditioner: ``r -> M r`` with M symmetric positive definite, an approximation of
        |A|^-1 (a diagonal scaling, say). A must still be symmetric: MINRES then works in the
        M^-1 inner product, and the norms of ``residual`` and the stopping test are
        ``|r|_M = sqrt(r.M r)``.

    Returns:
      A :class:`MINRESResult`: the solution, products made, the relative residual estimate,
      whether it converged.

    Example:
      >>> a = jnp.array([[1.0, 2.0], [2.0, -1.0]])
      >>> res = minres(lambda v: a @ v, jnp.array([3.0, 1.0]), rtol=1e-6, maxiter=10)
      >>> int(res.matvecs), bool(res.converged)
      (2, True)
    """
    precondition = preconditioner if preconditioner is not None else (lambda r: r)
    dtype = b.dtype
    zero = jnp.zeros_like(b)
    scalar_zero = jnp.zeros((), dtype)

    y = precondition(b)
    # M is positive definite: a negative b.M b is rounding, and 0 means b = 0
    beta1 = jnp.sqrt(jnp.maximum(jnp.vdot(b, y).real.astype(dtype), 0.0))
    tol = jnp.asarray(rtol, dtype) * beta1

    def safe(d):
        # Divisors that are 0 only where the loop has stopped (or never starts: b = 0), and
        # where a vmapped row still runs the body for the others; 1 keeps those rows finite.
        return jnp.where(d > 0, d, jnp.ones_like(d))

    def cond(c: _MINRESCarry):
        return ~c.done & (c.k < maxiter)

    def body(c: _MINRESCarry) -> _MINRESCarry:
        # Lanczos: beta_{k+1} v_{k+1} = A v_k - alpha_k v_k - beta_k v_{k-1}, in the M^-1
        # inner product (v = M r / beta lives in x's space, r in b's).
        v = c.y / safe(c.beta)
        y = matvec(v) - (c.oldb > 0).astype(dtype) * (c.beta / safe(c.oldb)) * c.r1
        alfa = jnp.vdot(v, y).real.astype(dtype)
        y = y - (alfa / safe(c.beta)) * c.r2
        r1, r2 = c.r2, y
        y = precondition(r2)
        beta = jnp.sqrt(jnp.maximum(jnp.vdot(r2, y).real.astype(dtype), 0.0))

        # The previous rotation on the new column (0 above beta_k, alpha_k, beta_{k+1}).
        delta = c.cs * c.dbar + c.sn * alfa
        gbar = c.sn * c.dbar - c.cs * alfa
        epsln = c.sn * beta
        dbar = -c.cs * beta

        # The new rotation zeroes beta_{k+1}. gamma = 0 needs beta_{k+1} = 0 and T_k
        # singular (b not in A's range): the minimum residual is then the last one, so x
        # stays (cs = 0) and phibar keeps its value (sn = 1); the breakdown stops the loop.
        gamma = jnp.hypot(gbar, beta)
        singular = ~(gamma > 0)
        cs = jnp.where(singular, 0.0, gbar / safe(gamma)).astype(dtype)
        sn = jnp.where(singular, 1.0, beta / safe(gamma)).astype(dtype)
        phi = cs * c.phibar
        phibar = sn * c.phibar

        w = (v - c.epsln * c.w2 - delta * c.w) / safe(gamma)
        x = c.x + phi * w
        # ~(phibar > tol) also stops on a NaN estimate; ~(beta > 0) is the breakdown
        done = ~(phibar > tol) | ~(beta > 0)
        return _MINRESCarry(
            c.k + 1, x, r1, r2, y, w, c.w, beta, c.beta, dbar, epsln, cs, sn, phibar, done
        )

    # cs = -1 makes the first column's "previous rotation" give gbar = alpha_1, delta = 0.
    c = inner_while_loop(
        cond,
        body,
        _MINRESCarry(
            jnp.zeros((), jnp.int32),
            zero,
            b,
            b,
            y,
            zero,
            zero,
            beta1,
            scalar_zero,
            scalar_zero,
            scalar_zero,
            -jnp.ones((), dtype),
            scalar_zero,
            beta1,
            ~(beta1 > tol),
        ),
        maxiter,
    )
    empty = beta1 == 0
    residual = jnp.where(empty, scalar_zero, c.phibar / jnp.where(empty, 1.0, beta1))
    return MINRESResult(c.x, c.k, residual, c.phibar <= tol)


SINGULAR_MESSAGE = (
    "optsolve: the implicit derivative's linear system is singular (the Hessian at x* has "
    "a null space: a leaf of x that f ignores, a flat direction of f); its minimum-norm "
    "least-squares solution was used, which gives the null directions no derivative. "
    "ImplicitAdjoint(ridge=...) regularises them instead."
)


def _warn_singular(flag: Any) -> None:
    if bool(flag):
        warnings.warn(SINGULAR_MESSAGE, RuntimeWarning, stacklevel=2)


@custom_vmap
def warn_singular(flag: Array) -> Array:
    """Warn (:data:`SINGULAR_MESSAGE`, a RuntimeWarning) when ``flag`` is true, at run
    time (under ``jit`` too). Under ``vmap`` (``jax.jacrev`` batches one cotangent per
    output) the batch warns once, if any of its rows is singular.

    Returns:
      ``flag``, to be ignored (the callback is kept for its effect).
    """
    jax.debug.callback(_warn_singular, flag)
    return flag


@warn_singular.def_vmap
def _warn_singular_batched(axis_size, in_batched, flag):
    del axis_size, in_batched
    return warn_singular(jnp.any(flag)), False
