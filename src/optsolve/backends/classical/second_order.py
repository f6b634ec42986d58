"""Second-order methods on Hessian-vector products: Newton-CG, the Steihaug-CG trust
region, and AdaHessian (an ML optimizer on Hutchinson estimates of the Hessian diagonal).

The products come from ``solve`` through :meth:`Objective.hvp` (forward-over-reverse
differentiation, or the problem's own ``hvp``); no dense Hessian is ever formed.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optsolve.backends.classical.descent import (
    ClassicalAlgorithm,
    DescentSolver,
    Flat,
    _default_linesearch,
    check_positive,
    default_gtol,
    register,
    tiny_step,
)
from optsolve.backends.classical.linesearch import Backtracking
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.linear_solve import CGStatus, cg
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.pytree import pytree_dataclass, static_field

Array = jax.Array


def _forcing(g: Array, eta_max: Any, scale: Any = 1.0) -> Array:
    """CG residual tolerance ``min(eta_max, sqrt|g|) |g|`` (superlinear; N&W eq. 7.3), for
    the system scaled by ``scale`` (see :func:`_pow2_scale`): divided by it."""
    gn_scaled = jnp.linalg.norm(g / scale)
    gn = gn_scaled * scale
    return jnp.minimum(eta_max, jnp.sqrt(gn)).astype(g.dtype) * gn_scaled


def _pow2_scale(g: Array) -> Array:
    """A power of two near ``|g|_inf`` (1 where g is 0 or not finite). CG runs on
    ``H p = -g / s`` and its solution is multiplied by s: in float16 ``g.g`` and ``g.Hg``
    overflow 65504 at gradients of a few hundred (NaN steps, a trust region stuck at x0),
    and a power of two divides exactly, so other dtypes take the same steps as unscaled."""
    m = jnp.max(jnp.abs(g))
    ok = jnp.isfinite(m) & (m > 0)
    _, exponent = jnp.frexp(jnp.where(ok, m, jnp.ones((), g.dtype)))
    return jnp.where(ok, jnp.ldexp(jnp.ones((), g.dtype), exponent), jnp.ones((), g.dtype))


def _cg_maxiter(alg: Any, n: int) -> int:
    return alg.cg_maxiter if alg.cg_maxiter is not None else 2 * n


# ----------------------------------------------------------------------------- Newton-CG


class _NewtonSolver(DescentSolver):
    def direction(self, model, x, g, state, flat):
        # Truncated CG on H p = -g, at least one iteration so p is never 0; negative
        # curvature at the first one gives -g (N&W Algorithm 7.1).
        scale = _pow2_scale(g)
        res = cg(
            flat.hvp_at(x),
            -g / scale,
            atol=_forcing(g, self.alg.cg_rtol, scale),
            maxiter=_cg_maxiter(self.alg, self.n),
            negative_curvature="steepest",
            test_start=False,
        )
        steepest = (res.status == CGStatus.NEGATIVE_CURVATURE) & (res.iterations == 0)
        return res.x * scale, steepest

    def initial_step(self, state, f, g, d, steepest):
        return jnp.where(steepest, 1.0 / jnp.maximum(jnp.linalg.norm(d), 1e-30), 1.0)


@register
@pytree_dataclass
class Newton(ClassicalAlgorithm):
    """Line-search Newton-CG: matrix-free, truncated, safeguarded against indefiniteness.

    Each iteration solves ``H_k p = -g_k`` by conjugate gradients on Hessian-vector
    products, stopped at the residual ``min(cg_rtol, sqrt|g_k|) |g_k|`` or at negative
    curvature (then the last CG iterate, or ``-g_k`` if met at once), followed by a
    backtracking line search from the unit step (Nocedal & Wright, *Numerical
    Optimization*, 2006, Algorithm 7.1).

    Args:
      cg_rtol: the largest relative CG residual, eta_max in the forcing sequence
        ``min(eta_max, sqrt|g|)`` (default 0.1; N&W use 0.5, which on badly scaled problems
        stops CG at tiny Cauchy-like steps).
      cg_maxiter: the most CG iterations per step (static; default 2n).
      linesearch: :class:`Backtracking` (default) or :class:`Zoom`.
    """

    needs_hessian: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 1000

    cg_rtol: Any = 0.1
    cg_maxiter: int | None = static_field(default=None)
    linesearch: Any = None

    def __post_init__(self):
        _check_cg_maxiter("Newton", self.cg_maxiter)
        _default_linesearch(self, Backtracking())

    def make_solver(self, problem: OptimizationProblem) -> DescentSolver:
        return _NewtonSolver(self, problem)


def _check_cg_maxiter(owner: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{owner}: `cg_maxiter` must be None or an integer >= 1, got {value!r}.")


# ------------------------------------------------------------------------- trust region


def steihaug_cg(
    hvp, g: Array, radius: Array, tol: Array, maxiter: int
) -> tuple[Array, Array, Array]:
    """Approximately minimise ``g.p + p.Hp/2`` subject to ``|p| <= radius`` by CG, stopping
    at the boundary or at negative curvature (Steihaug 1983; Nocedal & Wright Algorithm 7.2):
    :func:`cg` on ``H p = -g`` with a trust radius, at least one iteration.

    Returns:
      (p, predicted change of the model m(p) - m(0) (<= 0), whether p is on the boundary).
    """
    res = cg(
        hvp,
        -g,
        atol=tol,
        maxiter=maxiter,
        radius=radius,
        negative_curvature="boundary",
        test_start=False,
    )
    boundary = (res.status == CGStatus.BOUNDARY) | (res.status == CGStatus.NEGATIVE_CURVATURE)
    return res.x, res.model, boundary


class _TRState(NamedTuple):
    radius: Array


class _TrustRegionSolver(SteppingSolver):
    def __init__(self, alg: TrustRegion, problem: OptimizationProblem):
        self.alg = alg
        self.problem = problem
        x0 = Flat.ravel(problem.x0)
        self.n = x0.size
        self.dtype = x0.dtype
        self.default_gtol = default_gtol(self.dtype)
        self.default_maxiters = type(alg).default_maxiters

    def init(self, objective: Objective, x, f, g) -> _TRState:
        return _TRState(jnp.asarray(self.alg.initial_radius, self.dtype))

    def step(self, objective: Objective, x, f, g, state: _TRState) -> Step:
        flat = Flat(objective, self.problem)
        xf, gf = Flat.ravel(x), Flat.ravel(g)
        radius = state.radius
        scale = _pow2_scale(gf)
        p, predicted, boundary = steihaug_cg(
            flat.hvp_at(xf),
            gf / scale,
            radius / scale,
            _forcing(gf, self.alg.cg_rtol, scale),
            _cg_maxiter(self.alg, self.n),
        )
        p = p * scale
        x_new = xf + p
        f_new, g_new = flat.value_and_grad(x_new)
        finite = jnp.isfinite(f_new) & jnp.all(jnp.isfinite(g_new))
        # the model's change of the scaled system is 1/scale^2 of the true one; the ratio in
        # the wider of x's and f's dtypes (a float32 f of a bfloat16 x keeps its precision)
        with jax.numpy_dtype_promotion("standard"):
            st = jnp.promote_types(self.dtype, jnp.result_type(f))
        actual = (f_new.astype(st) - f.astype(st)) / scale.astype(st)
        predicted = predicted.astype(st) * scale.astype(st)
        rho = jnp.where(finite & (predicted < 0), actual / predicted, -jnp.inf)
        pn = jnp.linalg.norm(p)
        # Radius update of Nocedal & Wright Algorithm 4.1.
        radius = jnp.where(
            rho < 0.25,
            0.25 * pn,
            jnp.where(
                (rho > 0.75) & boundary, jnp.minimum(2.0 * radius, self.alg.max_radius), radius
            ),
        )
        accept = rho > self.alg.eta
        eps = float(jnp.finfo(self.dtype).eps)
        # The region has shrunk below rounding of x: no step can change f any more.
        stalled = (~accept & (radius <= 10 * eps * jnp.maximum(jnp.linalg.norm(xf), 1.0))) | (
            accept & tiny_step(p, xf)
        )
        xo = jnp.where(accept, x_new, xf)
        fo = jnp.where(accept, f_new, f)
        go = jnp.where(accept, g_new, gf)
        one = jnp.ones((), jnp.int32)
        return Step(
            flat.unravel(xo),
            fo,
            flat.unravel(go),
            _TRState(radius),
            one,
            one,
            jnp.zeros((), bool),
            stalled,
            ~finite,
        )


@register
@pytree_dataclass
class TrustRegion(ClassicalAlgorithm):
    """Newton trust-region method with the Steihaug-CG subproblem solver.

    Each iteration minimises the quadratic model ``g.p + p.H p/2`` within ``|p| <= radius``
    by truncated CG on Hessian-vector products (Steihaug 1983, SIAM J. Numer. Anal. 20;
    Nocedal & Wright, *Numerical Optimization*, 2006, Algorithm 7.2) and adapts the radius
    from the ratio of actual to predicted reduction (Algorithm 4.1). A rejected step leaves
    x unchanged and counts as an iteration.

    Args:
      initial_radius: the first trust radius (default 1).
      max_radius: the largest radius (default 1e10).
      eta: accept a step when actual/predicted reduction exceeds it, in [0, 1/4)
        (default 0.15).
      cg_rtol: the largest relative CG residual (see :class:`Newton`; default 0.1).
      cg_maxiter: the most CG iterations per step (static; default 2n).
    """

    needs_hessian: ClassVar[bool] = True
    default_maxiters: ClassVar[int] = 1000

    initial_radius: Any = 1.0
    max_radius: Any = 1e10
    eta: Any = 0.15
    cg_rtol: Any = 0.1
    cg_maxiter: int | None = static_field(default=None)

    def __post_init__(self):
        check_positive("TrustRegion", "initial_radius", self.initial_radius)
        check_positive("TrustRegion", "max_radius", self.max_radius)
        eta = self.eta
        if not isinstance(eta, jax.core.Tracer) and not 0.0 <= float(eta) < 0.25:
            raise ValueError(f"TrustRegion: `eta` must be in [0, 0.25), got {eta!r}.")
        _check_cg_maxiter("TrustRegion", self.cg_maxiter)

    def make_solver(self, problem: OptimizationProblem) -> _TrustRegionSolver:
        return _TrustRegionSolver(self, problem)


# --------------------------------------------------------------------------- AdaHessian


class _AdaHessianState(NamedTuple):
    m: Any
    v: Any
    count: Array
    key: Array


class _AdaHessianSolver(SteppingSolver):
    def __init__(self, alg: AdaHessian, problem: OptimizationProblem):
        self.alg = alg

    def init(self, objective, x, f, g) -> _AdaHessianState:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, x)
        return _AdaHessianState(
            zeros, zeros, jnp.zeros((), jnp.int32), jax.random.PRNGKey(self.alg.seed)
        )

    def step(self, objective: Objective, x, f, g, state: _AdaHessianState) -> Step:
        a = self.alg
        key, sub = jax.random.split(state.key)
        leaves, treedef = jax.tree_util.tree_flatten(x)
        keys = jax.random.split(sub, len(leaves))
        z = jax.tree_util.tree_unflatten(
            treedef,
            [
                jax.random.rademacher(k, jnp.shape(leaf), dtype=jnp.result_type(leaf))
                for k, leaf in zip(keys, leaves)
            ],
        )
        # Hutchinson: E[z * Hz] = diag(H) for Rademacher z (Yao et al. 2021, eq. 5).
        diag = jax.tree_util.tree_map(jnp.multiply, z, objective.hvp(x, z))
        count = state.count + 1
        t = count.astype(jnp.result_type(f))
        m = jax.tree_util.tree_map(lambda m_, g_: a.b1 * m_ + (1 - a.b1) * g_, state.m, g)
        v = jax.tree_util.tree_map(lambda v_, d_: a.b2 * v_ + (1 - a.b2) * d_ * d_, state.v, diag)
        bc1, bc2 = 1 - a.b1**t, 1 - a.b2**t

        def update(x_, m_, v_):
            denom = jnp.sqrt(v_ / bc2) ** a.hessian_power + a.eps
            return x_ - a.learning_rate * (m_ / bc1 / denom + a.weight_decay * x_)

        x_new = jax.tree_util.tree_map(update, x, m, v)
        f_new, g_new = objective.value_and_grad(x_new)
        one = jnp.ones((), jnp.int32)
        return Step(
            x_new, f_new, g_new, _AdaHessianState(m, v, count, key), one, one, jnp.zeros((), bool)
        )


@register
@pytree_dataclass
class AdaHessian(ClassicalAlgorithm):
    """AdaHessian: Adam with the squared gradient replaced by a Hutchinson estimate of the
    squared Hessian diagonal (Yao et al., "ADAHESSIAN: An Adaptive Second Order Optimizer
    for Machine Learning", AAAI 2021, Algorithm 1; no spatial averaging).

    ``D = z * (H z)`` with Rademacher ``z`` (one Hessian-vector product per step, from
    ``solve``), ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) D^2``,
    ``x -= lr (m/(1-b1^t)) / ((sqrt(v/(1-b2^t)))^k + eps) + lr wd x``.

    An ML optimizer: it has no convergence test of its own, so ``solve`` needs ``maxiters``
    (or gtol/ftol/maxtime).

    Args:
      learning_rate: step size (default 0.15, the paper's).
      b1, b2: moment decay rates (default 0.9, 0.999).
      eps: denominator offset (default 1e-4, the paper's).
      weight_decay: decoupled weight decay (default 0).
      hessian_power: the exponent k of the curvature denominator, in [0, 1] (default 1).
      seed: seed of the Rademacher draws (static; default 0).
    """

    needs_hessian: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = False
    extra_options: ClassVar[tuple[str, ...]] = ()

    learning_rate: Any = 0.15
    b1: Any = 0.9
    b2: Any = 0.999
    eps: Any = 1e-4
    weight_decay: Any = 0.0
    hessian_power: Any = 1.0
    seed: int = static_field(default=0)

    def __post_init__(self):
        check_positive("AdaHessian", "learning_rate", self.learning_rate)
        for name in ("b1", "b2"):
            value = getattr(self, name)
            if not isinstance(value, jax.core.Tracer) and not 0.0 <= float(value) < 1.0:
                raise ValueError(f"AdaHessian: `{name}` must be in [0, 1), got {value!r}.")
        hp = self.hessian_power
        if not isinstance(hp, jax.core.Tracer) and not 0.0 <= float(hp) <= 1.0:
            raise ValueError(f"AdaHessian: `hessian_power` must be in [0, 1], got {hp!r}.")

    def make_solver(self, problem: OptimizationProblem) -> _AdaHessianSolver:
        return _AdaHessianSolver(self, problem)
