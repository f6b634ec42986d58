"""A primal-dual interior-point method in the design of IPOPT, on the shared compiled driver.

Wächter & Biegler, "On the implementation of an interior-point filter line-search algorithm
for large-scale nonlinear programming", Math. Programming 106 (2006), 25-57. What is built
here, by section of the paper:

- §2.1 the barrier problem of :mod:`~optsolve.backends.constrained.nlp` (slacks for
  inequalities, bound multipliers z_L, z_U), its optimality error E_mu (eq. (5)) and the
  monotone Fiacco-McCormick update of mu (eq. (7)): mu shrinks, as many times as its test
  allows, once E_mu <= kappa_eps mu, and the filter is reset;
- §2.2-2.3 the primal-dual Newton step with exact Hessians of the Lagrangian (JAX, dense),
  the fraction-to-the-boundary rule (eq. (15)) and the safeguard on z (eq. (16));
- §2.3-2.4 the filter line search (Algorithm A, steps A-5.1 to A-5.10) with the switching
  condition, Armijo on the barrier function for f-type steps, one second-order correction
  (static ``second_order_correction``) and the minimum step alpha_min (eq. (23));
- §3.1 the inertia correction (delta_w, delta_c) of the Newton system
  (:mod:`~optsolve.backends.constrained.newton_system`); above ``DENSE_KKT_SIZE`` variables
  and rows (``linear_solver="auto"``) the system is matrix-free instead
  (:mod:`~optsolve.backends.constrained.newton_krylov`: MINRES, and Chiang & Zavala's
  curvature test for delta_w), the state holds no Jacobian, and the restoration's
  Levenberg-Marquardt step is MINRES on Hessian products too;
- §3.5 the relaxation of bounds, of the inequality rows' only (``bound_relax_factor``):
  x's own bounds stay as the user gave them, so f and c are never evaluated outside them;
- §3.8 the gradient-based scaling of f and of each row of c, fixed at x0 and held in the
  state; E_0 and ``tol`` are those of the scaled problem, and the run converges only where
  the user's problem is feasible to 1e-6. The driver gets f, the Lagrangian's gradient and
  (through ``IPState.multipliers``) y unscaled;
- §3.6 the start: x0 pushed inside its bounds (bound_push, bound_frac), slacks likewise,
  z = 1, y from the least-squares estimate (0 where it exceeds 1e3);
- §3.3 feasibility restoration, simplified: not IPOPT's own interior-point problem in
  (p, n) but a Levenberg-Marquardt method on 1/2 |c(x) - s|^2 over (x, s), in the scaled
  norm ``min(1, gap to the bound)`` and with the fraction-to-the-boundary rule, so that the
  iterates stay inside the bounds. It returns to the barrier problem once the violation is
  below 0.9 of where it began and the point is acceptable to the filter; it declares the
  problem locally infeasible where the scaled gradient of the violation's norm |c(x) - s|
  vanishes (or its damping runs past 1e12) at a violation above ``tol``: the run then
  ends INFEASIBLE at that point, the
  least violation the restoration found, never SUCCESS.

The driver's protocol (:class:`~optsolve.backends.native.protocol.SteppingSolver`):

- the state holds the whole primal-dual iterate (x, s, y, z_L, z_U), mu, the filter and the
  restoration's own numbers, so that ``resume=`` continues the run exactly. Its x is x0
  pushed inside the bounds from ``init`` on, while the driver's x0 stays the user's (so
  ``maxiters=0`` returns it unchanged);
- the history's ``violation`` column: :meth:`InteriorPointSolver.violation` at the driver's
  x0, then ``Step.violation`` from the c the state holds at each new x;
- ``Step.g`` is the Lagrangian's gradient ``grad f + J^T y`` (the box's multipliers left to
  the driver's projection, as for every bounded method): the history's gradient norm, and
  what ``solve``'s ``gtol`` (if given) tests;
- the method's own test, E_0 <= ``tol`` (IPOPT's, with its "acceptable" variant: E_0 <=
  ``acceptable_tol`` at 15 iterates in a row), comes back through
  ``Step.reduction_converged`` (``tests_tolerances``); ``ftol`` is tested by the method
  too, and only at a point feasible to 1e-6 (``Step.radius_converged``). The backend turns
  those reasons into this method's words on the way out.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from optsolve.backends.constrained import newton_krylov, newton_system
from optsolve.backends.constrained.nlp import NLP, feasibility_tol, flat_problem_size
from optsolve.backends.native import batch_cond
from optsolve.backends.native.chunked import run_iterative
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import Step, SteppingSolver
from optsolve.solve_api.linear_solve import minres
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem

Array = jax.Array
PyTree = Any

# IPOPT's constants (Wächter & Biegler 2006, Table 1 and §3), not hyperparameters.
_KAPPA_EPS = 10.0  # mu shrinks once E_mu <= kappa_eps mu
_KAPPA_SIGMA = 1e10  # z safeguard (eq. (16))
_GAMMA_THETA, _GAMMA_PHI = 1e-5, 1e-8
_DELTA, _S_THETA, _S_PHI, _ETA_PHI = 1.0, 1.1, 2.3, 1e-4
_GAMMA_ALPHA = 0.05
_KAPPA_RESTO = 0.9
_ACCEPTABLE_ITERATIONS = 15
_FILTER_SIZE = 32  # filter entries kept (the oldest is overwritten when full)
_MAX_TRIALS = 60  # backtracking trials of one line search
_LM_MAX = 1e12  # restoration's damping beyond which it gives up
# Steps in a row cut below 1e-3 of alpha_max by non-finite values at the trial points
# after which the run fails: it is pinned against a region where f or c is not finite,
# creeping towards it by ever shorter steps.
_BLOCKED_STEPS = 5

# Default KKT tolerance by itemsize: IPOPT's 1e-8 in float64; float32 resolves the scaled
# errors to about 100 eps.
DEFAULT_TOL = {8: 1e-8, 4: 1e-5}

# ``linear_solver="auto"``: the Newton system dense up to this size (n + m); above it, the
# column-by-column factorisation's (n + m)^3 work outgrows MINRES's products.
DENSE_KKT_SIZE = 256
# MINRES's most products per solve in the matrix-free form (static: the loop's bound)
_KRYLOV_MAXITER = 1000


class IPState(NamedTuple):
    """The interior-point method's state: the primal-dual iterate and what the next step
    needs (see the module docstring)."""

    x: Array  # flat x, strictly inside its bounds
    s: Array  # slacks (inequality rows; other entries unused)
    y: Array  # constraint multipliers (optsolve's sign)
    z_l: Array  # bound multipliers of v = (x, s)
    z_u: Array
    f: Array  # f, its gradient, c and its Jacobian at x
    grad: Array
    c: Array
    jac: Array
    mu: Array
    delta_w: Array  # the last inertia correction
    filter_theta: Array
    filter_phi: Array
    filter_next: Array
    theta_max: Array
    theta_min: Array
    resto: Array  # in the feasibility restoration phase
    resto_theta: Array  # the violation where it began
    lm: Array  # its Levenberg-Marquardt damping
    acceptable: Array  # iterates in a row with E_0 <= acceptable_tol
    error: Array  # E_0 at x
    infeasible: Array  # the restoration found x locally infeasible
    blocked: Array  # steps in a row cut short by non-finite values at the trial points
    f_scale: Array  # the scaling of f and of c's rows, fixed at the start (nlp.NLP)
    c_scale: Array

    def multipliers(self) -> Array:
        """y in the user's problem's terms (``Solution.multipliers``)."""
        return self.y * self.c_scale / self.f_scale[..., None]


class _Outcome(NamedTuple):
    state: IPState
    f_evals: Array
    failed: Array
    stalled: Array
    nonfinite: Array
    converged: Array
    ftol_met: Array


class _Search(NamedTuple):
    """The backtracking line search's carry: the next alpha, the accepted trial."""

    alpha: Array
    accepted: Array
    h_type: Array  # the accepted step augments the filter
    nonfinite: Array  # a trial point met non-finite values
    trials: Array
    v: Array
    f: Array
    c: Array
    alpha_acc: Array


def _alpha_min(slope: Array, theta: Array, theta_min: Array) -> Array:
    """The shortest trial step before the restoration phase (eq. (23))."""
    neg = jnp.where(slope < 0, -slope, 1.0)
    by_filter = jnp.minimum(_GAMMA_THETA, _GAMMA_PHI * theta / neg)
    switching = jnp.minimum(by_filter, _DELTA * theta**_S_THETA / neg**_S_PHI)
    return jnp.where(
        slope < 0,
        _GAMMA_ALPHA * jnp.where(theta <= theta_min, switching, by_filter),
        _GAMMA_ALPHA * _GAMMA_THETA,
    )


def _fraction_to_boundary(nlp: NLP, v: Array, dv: Array, tau: Array) -> Array:
    """The largest alpha in (0, 1] with ``v + alpha dv`` at least ``(1 - tau)`` of its gaps
    inside the bounds (eq. (15))."""
    gl, gu = nlp.gaps(v)
    big = jnp.ones_like(v)
    lower = jnp.where(nlp.has_lower & (dv < 0), tau * gl / jnp.where(dv < 0, -dv, 1.0), big)
    upper = jnp.where(nlp.has_upper & (dv > 0), tau * gu / jnp.where(dv > 0, dv, 1.0), big)
    return jnp.minimum(1.0, jnp.minimum(jnp.min(lower, initial=1.0), jnp.min(upper, initial=1.0)))


def _z_fraction(z: Array, dz: Array, mask: Array, tau: Array) -> Array:
    alpha = jnp.where(mask & (dz < 0), tau * z / jnp.where(dz < 0, -dz, 1.0), 1.0)
    return jnp.minimum(1.0, jnp.min(alpha, initial=1.0))


def _safeguard_z(nlp: NLP, v: Array, z_l: Array, z_u: Array, mu: Array):
    """z kept within ``[mu / (kappa_sigma gap), kappa_sigma mu / gap]`` (eq. (16))."""
    gl, gu = nlp.gaps(v)
    z_l = jnp.where(
        nlp.has_lower, jnp.clip(z_l, mu / (_KAPPA_SIGMA * gl), _KAPPA_SIGMA * mu / gl), 0.0
    )
    z_u = jnp.where(
        nlp.has_upper, jnp.clip(z_u, mu / (_KAPPA_SIGMA * gu), _KAPPA_SIGMA * mu / gu), 0.0
    )
    return z_l, z_u


def _filter_reset(theta_max: Array, dtype: Any) -> tuple[Array, Array, Array]:
    """An empty filter holding (theta_max, -inf) only: entries of +inf reject nothing."""
    theta = jnp.full(_FILTER_SIZE, jnp.inf, dtype).at[0].set(theta_max)
    phi = jnp.full(_FILTER_SIZE, jnp.inf, dtype).at[0].set(-jnp.inf)
    return theta, phi, jnp.ones((), jnp.int32)


def _filter_accepts(st: IPState, theta: Array, phi: Array) -> Array:
    return ~jnp.any((theta >= st.filter_theta) & (phi >= st.filter_phi))


def _filter_add(st: IPState, theta: Array, phi: Array) -> IPState:
    # slot 0 holds theta_max: the others rotate
    at = 1 + (st.filter_next - 1) % (_FILTER_SIZE - 1)
    return st._replace(
        filter_theta=st.filter_theta.at[at].set(theta),
        filter_phi=st.filter_phi.at[at].set(phi),
        filter_next=(st.filter_next + 1).astype(jnp.int32),
    )


class InteriorPointSolver(SteppingSolver):
    """The steps of :class:`~optsolve.InteriorPoint` (see the module docstring)."""

    tests_tolerances: ClassVar[bool] = True

    def __init__(self, algorithm: Any, problem: OptimizationProblem):
        self.alg, self.problem = algorithm, problem
        x0 = ravel_pytree(problem.x0)[0]
        self.dtype = x0.dtype
        self.default_maxiters = type(algorithm).default_maxiters
        self.default_gtol = None  # the method's own KKT test decides (module docstring)
        self.ftol = None
        self.history = False
        n, m = flat_problem_size(problem)
        kind = getattr(algorithm, "linear_solver", "dense")
        self.condensed = kind == "condensed"
        self.equalities = getattr(algorithm, "_equality_rows", None)
        self.dense = kind in ("dense", "condensed") or (kind == "auto" and n + m <= DENSE_KKT_SIZE)
        self.krylov_maxiter = min(2 * (n + m) + 10, _KRYLOV_MAXITER)

    def _nlp(self, objective: Objective, state: IPState | None = None) -> NLP:
        """The problem as the method sees it: scaled by the state's factors (unscaled
        without a state), its bounds relaxed by ``bound_relax_factor``."""
        scale = None if state is None else (state.f_scale, state.c_scale)
        return NLP(
            objective,
            self.problem,
            self.dense,
            scale,
            self._relax(),
            self.condensed,
            self.equalities,
        )

    def _relax(self) -> Array:
        """bound_relax_factor, by default IPOPT's 1e-8 but never above ``tol`` (a tighter
        tolerance asks for the problem as stated)."""
        if self.alg.bound_relax_factor is None:
            return jnp.minimum(1e-8, self.tol()).astype(self.dtype)
        return self._h("bound_relax_factor")

    def _scaling(self, nlp: NLP, grad: Array, jac: Array) -> tuple[Array, Array]:
        """IPOPT's gradient-based scaling from the unscaled gradient and Jacobian at x0:
        ``min(1, g_max / |row|_inf)`` (at least 1e-8) for f and for each row of c, so that
        no gradient starts larger than ``g_max = nlp_scaling_max_gradient``. The
        matrix-free form scales f only (its rows' norms would take m products)."""
        g_max = self._h("nlp_scaling_max_gradient")

        def factor(norm):
            k = jnp.clip(g_max / norm, 1e-8, 1.0)
            return jnp.where(jnp.isfinite(k), k, 1.0).astype(self.dtype)

        f_scale = factor(jnp.max(jnp.abs(jnp.where(nlp.free_x, grad, 0.0)), initial=0.0))
        c_scale = jnp.ones(nlp.m, self.dtype)
        if nlp.m and nlp.dense:
            rows = jnp.max(jnp.abs(jnp.where(nlp.free_x[None, :], jac, 0.0)), axis=1, initial=0.0)
            c_scale = jnp.where(nlp.rows, factor(rows), 1.0)
        return f_scale, c_scale

    def _krylov_rtol(self, error: Array) -> Array:
        """MINRES's tolerance: tighter as the KKT error falls (an inexact Newton step whose
        error stays below the method's own)."""
        eps = jnp.finfo(self.dtype).eps
        return jnp.clip(1e-2 * error, 10 * eps, 1e-2).astype(self.dtype)

    def bind_options(self, options: SolveOptions) -> None:
        self.ftol = options.ftol
        self.history = bool(options.history)  # Step.violation is recorded only then

    def _h(self, name: str) -> Array:
        return jnp.asarray(getattr(self.alg, name), self.dtype)

    def tol(self) -> Array:
        if self.alg.tol is None:
            return jnp.asarray(DEFAULT_TOL[jnp.dtype(self.dtype).itemsize], self.dtype)
        return self._h("tol")

    # ------------------------------------------------------------------- the start
    def init(self, objective: Objective, x: PyTree, f: Array, g: PyTree) -> IPState:
        unscaled = self._nlp(objective)
        n, m, dtype = unscaled.n, unscaled.m, self.dtype
        push, frac = self._h("bound_push"), self._h("bound_frac")
        x0 = unscaled.push(jnp.concatenate([ravel_pytree(x)[0], jnp.zeros(m, dtype)]), push, frac)[
            :n
        ]
        # scaled by the gradients at the user's x0, as IPOPT (not the point pushed inside)
        x_user = ravel_pytree(x)[0].astype(dtype)
        f_scale, c_scale = self._scaling(unscaled, unscaled.grad(x_user), unscaled.jac(x_user))
        nlp = NLP(
            objective,
            self.problem,
            self.dense,
            (f_scale, c_scale),
            self._relax(),
            self.condensed,
            self.equalities,
        )
        grad0, jac0 = nlp.grad(x0), nlp.jac(x0)
        c0 = nlp.cons(x0)
        s0 = nlp.push(jnp.concatenate([x0, c0]), push, frac)[n:]
        s0 = jnp.where(nlp.ineq, s0, 0.0)
        v0 = jnp.concatenate([x0, s0])
        f0 = nlp.value(x0)
        z_l = jnp.where(nlp.has_lower, 1.0, 0.0).astype(dtype)
        z_u = jnp.where(nlp.has_upper, 1.0, 0.0).astype(dtype)
        jacobian0 = nlp.jacobian(x0, jac0)
        y0 = nlp.least_squares_y(grad0, jacobian0, z_l, z_u)
        y0 = jnp.where(jnp.max(jnp.abs(y0), initial=0.0) > 1e3, 0.0, y0)
        y0 = jnp.where(jnp.isfinite(y0), y0, 0.0)
        theta0 = nlp.theta(c0, s0)
        theta_max = 1e4 * jnp.maximum(1.0, theta0)
        filter_theta, filter_phi, filter_next = _filter_reset(theta_max, dtype)
        mu = self._h("mu_init")
        false, zero = jnp.zeros((), bool), jnp.zeros((), dtype)
        error = nlp.errors(grad0, c0, jacobian0.rmv(y0), v0, y0, z_l, z_u, zero)[0]
        return IPState(
            x0,
            s0,
            y0,
            z_l,
            z_u,
            f0,
            grad0,
            c0,
            jac0,
            mu,
            zero,
            filter_theta,
            filter_phi,
            filter_next,
            theta_max,
            1e-4 * jnp.maximum(1.0, theta0),
            false,
            zero,
            jnp.asarray(1e-3, dtype),
            jnp.zeros((), jnp.int32),
            error,
            false,
            jnp.zeros((), jnp.int32),
            f_scale,
            c_scale,
        )

    # ------------------------------------------------------------------ one step
    def step(self, objective: Objective, x: PyTree, f: Array, g: PyTree, state: IPState) -> Step:
        nlp = self._nlp(objective, state)
        if nlp.m:
            # batch_cond: under vmap the restoration runs only while some member restores
            out = batch_cond.cond(
                state.resto,
                lambda st: self._restoration(nlp, st),
                lambda st: self._barrier_step(nlp, st),
                state,
            )
        else:
            # Without constraints nothing is ever infeasible (a failed search fails the
            # run): no restoration to compile. (Its zero-size arrays also make XLA on the
            # CPU lose the FFI version of a host callback elsewhere in the program.)
            out = self._barrier_step(nlp, state)
        st = out.state
        # the driver sees the user's problem: f and the Lagrangian's gradient unscaled
        g_l = (st.grad + nlp.jacobian(st.x, st.jac).rmv(st.y)) / st.f_scale
        one = jnp.ones((), jnp.int32)
        return Step(
            nlp.unravel(st.x),
            st.f / st.f_scale,
            nlp.unravel(g_l),
            st,
            out.f_evals,
            one,
            out.failed,
            out.stalled,
            out.nonfinite,
            out.converged,
            out.ftol_met,
            violation=nlp.violation_of(st.x, st.c) if self.history else None,
        )

    def violation(self, objective: Objective, x: PyTree, state: IPState) -> Array:
        """The violation at the driver's first iterate ``x`` (the user's x0, not the
        state's x pushed inside the bounds): one evaluation of c, outside the loop. Later
        iterates' come with each step, from the c the state holds."""
        return self._nlp(objective).violation(ravel_pytree(x)[0].astype(self.dtype))

    def _converged(self, nlp: NLP, st: IPState, f_old: Array, moved: Array):
        """E_0 <= tol (or acceptable_tol at 15 iterates in a row), measured on the scaled
        problem as IPOPT's; ftol where given. Either only at a point of the user's problem
        that the outcome calls feasible (1e-6; 1e-4 in float32): scaling may hide a
        violation."""
        zero = jnp.zeros((), self.dtype)
        jty = nlp.jacobian(st.x, st.jac).rmv(st.y)
        error = nlp.errors(
            st.grad, st.c, jty, jnp.concatenate([st.x, st.s]), st.y, st.z_l, st.z_u, zero
        )[0]
        acceptable = jnp.where(error <= self._h("acceptable_tol"), st.acceptable + 1, 0).astype(
            jnp.int32
        )
        feasible = nlp.violation_of(st.x, st.c) <= feasibility_tol(self.dtype)
        converged = feasible & ((error <= self.tol()) | (acceptable >= _ACCEPTABLE_ITERATIONS))
        ftol_met = jnp.zeros((), bool)
        if self.ftol is not None:
            f_new, f_old = st.f / st.f_scale, f_old / st.f_scale
            scale = jnp.maximum(jnp.maximum(jnp.abs(f_old), jnp.abs(f_new)), 1.0)
            ftol_met = moved & feasible & (jnp.abs(f_old - f_new) <= self.ftol * scale)
        return st._replace(error=error, acceptable=acceptable), converged, ftol_met

    def _new_mu(self, nlp: NLP, st: IPState) -> IPState:
        """Fiacco-McCormick: mu <- max(tol/11, min(kappa_mu mu, mu^theta_mu)) while E_mu <=
        kappa_eps mu (eq. (7)); the filter is reset when mu changes."""
        v = jnp.concatenate([st.x, st.s])
        mu_min = self.tol() / 11.0
        kappa, power = self._h("mu_linear_decrease"), self._h("mu_superlinear_power")
        jty = nlp.jacobian(st.x, st.jac).rmv(st.y)

        def error(mu):
            return nlp.errors(st.grad, st.c, jty, v, st.y, st.z_l, st.z_u, mu)[0]

        def cond(mu):
            return (error(mu) <= _KAPPA_EPS * mu) & (mu > mu_min)

        def body(mu):
            return jnp.maximum(mu_min, jnp.minimum(kappa * mu, mu**power))

        mu = lax.while_loop(cond, body, st.mu)
        changed = mu != st.mu
        theta, phi, nxt = _filter_reset(st.theta_max, self.dtype)
        return st._replace(
            mu=mu,
            filter_theta=jnp.where(changed, theta, st.filter_theta),
            filter_phi=jnp.where(changed, phi, st.filter_phi),
            filter_next=jnp.where(changed, nxt, st.filter_next),
        )

    def _barrier_step(self, nlp: NLP, st: IPState) -> _Outcome:
        n, dtype = nlp.n, self.dtype
        st = self._new_mu(nlp, st)
        mu = st.mu
        tau = jnp.maximum(self._h("tau_min"), 1.0 - mu)
        v = jnp.concatenate([st.x, st.s])
        sigma = nlp.sigma(v, st.z_l, st.z_u)
        grad_phi = nlp.barrier_grad(st.grad, v, mu)
        residual = nlp.residual(st.c, st.s)
        if nlp.dense:
            hessian = nlp.lagrangian_hessian(st.x, st.y)
            fact = newton_system.factorise(nlp, hessian, st.jac, sigma, mu, st.delta_w)
            dx, ds, dy = newton_system.direction(nlp, fact, grad_phi, st.jac, st.y, residual)

            def resolve(rhs_residual):
                return newton_system.direction(nlp, fact, grad_phi, st.jac, st.y, rhs_residual)
        else:
            rtol = self._krylov_rtol(st.error)
            jacobian = nlp.jacobian(st.x, st.jac)
            system = newton_krylov.KrylovSystem(
                nlp, nlp.lagrangian_hvp(st.x, st.y), jacobian, sigma, self.krylov_maxiter
            )
            fact, (dx, ds, dy) = newton_krylov.corrected_direction(
                system, grad_phi, st.y, residual, mu, st.delta_w, rtol
            )

            def resolve(rhs_residual):
                return newton_krylov.direction(system, fact, grad_phi, st.y, rhs_residual, rtol)

        dv = jnp.concatenate([dx, ds])
        gl, gu = nlp.gaps(v)
        dz_l = jnp.where(nlp.has_lower, (mu - st.z_l * dv) / gl - st.z_l, 0.0)
        dz_u = jnp.where(nlp.has_upper, (mu + st.z_u * dv) / gu - st.z_u, 0.0)
        alpha_max = _fraction_to_boundary(nlp, v, dv, tau)
        alpha_z = jnp.minimum(
            _z_fraction(st.z_l, dz_l, nlp.has_lower, tau),
            _z_fraction(st.z_u, dz_u, nlp.has_upper, tau),
        )
        theta_k = nlp.theta(st.c, st.s)
        phi_k = nlp.barrier(st.f, v, mu)
        slope = jnp.vdot(grad_phi, dv)
        eps = jnp.finfo(dtype).eps
        tiny = jnp.max(jnp.abs(dv) / (1.0 + jnp.abs(v)), initial=0.0) < 10 * eps

        def switching(alpha):
            return (
                (slope < 0)
                & (alpha * (-slope) ** _S_PHI > _DELTA * theta_k**_S_THETA)
                & (theta_k <= st.theta_min)
            )

        def judge(alpha, v_t, f_t, c_t):
            """(accepted, h-type, finite) for the trial point v_t: f and c finite there
            (a trial that rounding put on a bound, where the barrier is infinite, is
            rejected without counting as a non-finite value of the problem's)."""
            theta_t = nlp.theta(c_t, v_t[n:])
            phi_t = nlp.barrier(f_t, v_t, mu)
            finite = jnp.isfinite(f_t) & jnp.isfinite(theta_t)
            gl, gu = nlp.gaps(v_t)
            inside = jnp.all((gl > 0) & (gu > 0)) & jnp.isfinite(phi_t)
            armijo = phi_t <= phi_k + _ETA_PHI * alpha * slope
            decrease = (theta_t <= (1 - _GAMMA_THETA) * theta_k) | (
                phi_t <= phi_k - _GAMMA_PHI * theta_k
            )
            f_type = switching(alpha)
            ok = (
                finite
                & inside
                & _filter_accepts(st, theta_t, phi_t)
                & jnp.where(f_type, armijo, decrease)
            )
            ok = ok | (tiny & finite & inside)
            return ok, ~(f_type & armijo), finite

        def trial(alpha, dv_):
            v_t = v + alpha * dv_
            x_t = v_t[:n]
            return v_t, nlp.value(x_t), nlp.cons(x_t)

        # the first trial at alpha_max, then (if it raised the violation) one second-order
        # correction (A-5.5 to A-5.10): the same matrix, the constraints' residual at the
        # trial point added to the right-hand side
        v1, f1, c1 = trial(alpha_max, dv)
        ok1, h1, fin1 = judge(alpha_max, v1, f1, c1)
        evals = jnp.ones((), jnp.int32)
        accepted, h_type, nonfinite = ok1, h1, ~fin1
        v_acc, f_acc, c_acc, alpha_acc = v1, f1, c1, alpha_max
        if self.alg.second_order_correction and nlp.m:
            theta1 = nlp.theta(c1, v1[n:])
            try_soc = ~ok1 & fin1 & (theta1 >= theta_k)

            def soc():
                c_soc = alpha_max * residual + nlp.residual(c1, v1[n:])
                sx, ss, _ = resolve(c_soc)
                d_soc = jnp.concatenate([sx, ss])
                a_soc = _fraction_to_boundary(nlp, v, d_soc, tau)
                v_s, f_s, c_s = trial(a_soc, d_soc)
                ok_s, h_s, _ = judge(alpha_max, v_s, f_s, c_s)
                return ok_s, h_s, v_s, f_s, c_s

            def no_soc():
                return ok1, h1, v1, f1, c1

            ok_s, h_s, v_s, f_s, c_s = batch_cond.cond(try_soc, soc, no_soc)
            evals = evals + try_soc.astype(jnp.int32)
            accepted = ok_s
            h_type = jnp.where(ok_s, h_s, h_type)
            v_acc, f_acc, c_acc = v_s, f_s, c_s

        # backtracking from alpha_max / 2, down to alpha_min (eq. (23))
        alpha_min = _alpha_min(slope, theta_k, st.theta_min)

        def cond(s: _Search):
            return ~s.accepted & (s.alpha >= alpha_min) & (s.trials < _MAX_TRIALS)

        def body(s: _Search):
            v_t, f_t, c_t = trial(s.alpha, dv)
            ok, h, fin = judge(s.alpha, v_t, f_t, c_t)
            keep = lambda new, old: jnp.where(ok, new, old)
            return _Search(
                s.alpha / 2,
                ok,
                keep(h, s.h_type),
                s.nonfinite | ~fin,
                s.trials + 1,
                keep(v_t, s.v),
                keep(f_t, s.f),
                keep(c_t, s.c),
                keep(s.alpha, s.alpha_acc),
            )

        found = lax.while_loop(
            cond,
            body,
            _Search(
                alpha_max / 2, accepted, h_type, nonfinite, evals, v_acc, f_acc, c_acc, alpha_acc
            ),
        )
        accepted, evals = found.accepted, found.trials
        alpha = found.alpha_acc
        v_new, f_new, c_new = found.v, found.f, found.c
        x_new = v_new[:n]
        y_new = st.y + alpha * dy
        z_l, z_u = _safeguard_z(nlp, v_new, st.z_l + alpha_z * dz_l, st.z_u + alpha_z * dz_u, mu)
        grad_new, jac_new = nlp.grad(x_new), nlp.jac(x_new)
        cut_short = found.nonfinite & (alpha < 1e-3 * alpha_max)
        blocked = jnp.where(cut_short, st.blocked + 1, 0).astype(jnp.int32)
        moved = st._replace(
            x=x_new,
            s=v_new[n:],
            y=y_new,
            z_l=z_l,
            z_u=z_u,
            f=f_new,
            grad=grad_new,
            c=c_new,
            jac=jac_new,
            delta_w=fact.delta_w,
            blocked=blocked,
        )
        moved = jax.tree_util.tree_map(
            lambda a, b: jnp.where(found.h_type, a, b),
            _filter_add(moved, (1 - _GAMMA_THETA) * theta_k, phi_k - _GAMMA_PHI * theta_k),
            moved,
        )
        moved, converged, ftol_met = self._converged(nlp, moved, st.f, jnp.ones((), bool))
        # A failed search: the restoration phase from here, unless the point is already
        # feasible (then no step can be found: FAILURE). Also right after a restoration:
        # each one must cut theta by 1 - kappa_resto, so going back cannot cycle for ever
        stuck = ~accepted & (theta_k <= self.tol())
        stuck = stuck | (accepted & (blocked >= _BLOCKED_STEPS))
        filter_entry = _filter_add(st, (1 - _GAMMA_THETA) * theta_k, phi_k - _GAMMA_PHI * theta_k)
        to_resto = filter_entry._replace(
            resto=jnp.ones((), bool),
            resto_theta=theta_k,
            lm=jnp.asarray(1e-3, dtype),
            delta_w=fact.delta_w,
        )
        state = jax.tree_util.tree_map(lambda a, b: jnp.where(accepted, a, b), moved, to_resto)
        false = jnp.zeros((), bool)
        return _Outcome(
            state, evals, stuck, false, found.nonfinite, accepted & converged, accepted & ftol_met
        )

    # ------------------------------------------------------------- restoration
    def _restoration(self, nlp: NLP, st: IPState) -> _Outcome:
        """One Levenberg-Marquardt step on 1/2 |c(x) - s|^2 (the module docstring)."""
        n, dtype = nlp.n, self.dtype
        v = jnp.concatenate([st.x, st.s])
        moves = jnp.concatenate([nlp.free_x, nlp.ineq])
        r = nlp.residual(st.c, st.s)
        gl, gu = nlp.gaps(v)
        inf = jnp.asarray(jnp.inf, dtype)
        gap = jnp.minimum(jnp.where(nlp.has_lower, gl, inf), jnp.where(nlp.has_upper, gu, inf))
        scale = jnp.minimum(1.0, gap)  # affine scaling: small near a bound
        gradient = jnp.where(moves, nlp.jac_v_rmv(nlp.jacobian(st.x, st.jac), r), 0.0)

        # the exact Hessian of 1/2 |r|^2 (J^T J and the residuals' curvature): with
        # Gauss-Newton alone the iterates of a problem whose least violation is large
        # circle round its minimiser instead of converging to it
        def half_square(w):
            return 0.5 * jnp.sum(nlp.residual(nlp.cons(w[:n]), w[n:]) ** 2)

        if nlp.dense:
            hessian = jnp.where(moves[:, None] & moves[None, :], jax.hessian(half_square)(v), 0.0)
            size = jnp.maximum(jnp.max(jnp.abs(jnp.diagonal(hessian)), initial=0.0), 1.0)
            damping = jnp.where(moves, st.lm * size / scale**2, 1.0)
            d = jnp.linalg.solve(hessian + jnp.diag(damping), -gradient)

            def model(u):
                return hessian @ u
        else:
            hvp = jax.linearize(jax.grad(half_square), v)[1]

            def model(u):
                return jnp.where(moves, hvp(jnp.where(moves, u, 0.0)), 0.0)

            size = jnp.maximum(jnp.max(jnp.abs(model(jnp.ones_like(v))), initial=0.0), 1.0)
            damping = jnp.where(moves, st.lm * size / scale**2, 1.0)
            d = minres(
                lambda u: model(u) + damping * u,
                -gradient,
                maxiter=self.krylov_maxiter,
                rtol=self._krylov_rtol(st.error),
                preconditioner=lambda u: u / (damping + size),
            ).x
        d = jnp.where(moves, d, 0.0)
        tau = jnp.maximum(self._h("tau_min"), 1.0 - st.mu)
        alpha = _fraction_to_boundary(nlp, v, d, tau)
        v_t = v + alpha * d
        x_t = v_t[:n]
        f_t, c_t = nlp.value(x_t), nlp.cons(x_t)
        r_t = nlp.residual(c_t, v_t[n:])
        finite = jnp.isfinite(f_t) & jnp.all(jnp.isfinite(c_t))
        rr = jnp.vdot(r, r)
        predicted = -2 * (alpha * jnp.vdot(gradient, d) + 0.5 * alpha**2 * jnp.vdot(d, model(d)))
        actual = rr - jnp.vdot(r_t, r_t)
        ok = finite & (predicted > 0) & (actual >= 1e-4 * predicted)
        lm = jnp.where(ok, jnp.maximum(st.lm / 3, 1e-12), st.lm * 10).astype(dtype)
        theta = nlp.theta(st.c, st.s)
        # the gradient of |r|, not of 1/2 |r|^2: near a degenerate root (c = x^2 at x = 0)
        # the latter vanishes as |r|^(3/2) long before the violation does
        stationary = jnp.max(jnp.abs(gradient * scale), initial=0.0) <= self.tol() * jnp.sqrt(rr)
        hopeless = stationary | (lm > _LM_MAX)
        infeasible = (
            hopeless & (theta > self.tol()) & (jnp.max(jnp.abs(r), initial=0.0) > self.tol())
        )
        failed = hopeless & ~infeasible
        grad_t, jac_t = nlp.grad(x_t), nlp.jac(x_t)
        theta_t = nlp.theta(c_t, v_t[n:])
        back = (
            ok
            & (theta_t <= _KAPPA_RESTO * st.resto_theta)
            & _filter_accepts(st, theta_t, nlp.barrier(f_t, v_t, st.mu))
        )
        z_l, z_u = _safeguard_z(nlp, v_t, st.z_l, st.z_u, st.mu)
        y_t = jnp.where(back, nlp.least_squares_y(grad_t, nlp.jacobian(x_t, jac_t), z_l, z_u), st.y)
        y_t = jnp.where(jnp.isfinite(y_t) & (jnp.max(jnp.abs(y_t), initial=0.0) <= 1e3), y_t, 0.0)
        moved = st._replace(
            x=x_t,
            s=v_t[n:],
            y=y_t,
            z_l=z_l,
            z_u=z_u,
            f=f_t,
            grad=grad_t,
            c=c_t,
            jac=jac_t,
            lm=lm,
            resto=~back,
        )
        moved, converged, _ = self._converged(nlp, moved, st.f, jnp.ones((), bool))
        still = st._replace(lm=lm, infeasible=infeasible)
        state = jax.tree_util.tree_map(lambda a, b: jnp.where(ok & ~hopeless, a, b), moved, still)
        return _Outcome(
            state,
            jnp.ones((), jnp.int32),
            failed,
            infeasible,
            ~finite,
            ok & ~hopeless & back & converged,
            jnp.zeros((), bool),
        )


def solve_interior_point(
    problem: OptimizationProblem, algorithm: Any, options: SolveOptions, loop: Any = None
) -> Any:
    """Run :class:`~optsolve.InteriorPoint` on the shared driver, then say the outcome in
    its terms (:mod:`optsolve.backends.constrained.outcome`)."""
    from optsolve.backends.constrained.outcome import finished

    return run_iterative(_make_solver, problem, algorithm, options, loop, after=finished)


def _make_solver(algorithm: Any, problem: OptimizationProblem) -> InteriorPointSolver:
    return InteriorPointSolver(algorithm, problem)
