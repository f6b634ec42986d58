"""The interior-point method's Newton system, matrix-free: MINRES on products with the
Hessian of the Lagrangian and with c's Jacobian, and an inertia-free curvature test in
place of the factorisation's inertia.

The system is the condensed one of :mod:`~optsolve.backends.constrained.newton_system`,

    [ W + Sigma_x + delta_w I     J^T ] [dx]   [ r_x ]
    [ J                           -D  ] [dy] = [ r_y ],

symmetric and indefinite, never formed: each MINRES iteration (Paige & Saunders 1975;
:func:`~optsolve.solve_api.linear_solve.minres`) makes one product with W (the Lagrangian's
gradient linearised once per step), one with J and one with J^T. Without a factorisation
there is no inertia to read, so the regularisation delta_w is chosen by the curvature test
of Chiang & Zavala, "An inertia-free filter line-search algorithm for large-scale nonlinear
programming", Comput. Optim. Appl. 64 (2016), 327-354: the step d = (dx, ds) is kept when

    dx.(W + Sigma_x + delta_w I) dx + ds.(Sigma_s + delta_w) ds >= kappa |d|^2,

else delta_w grows as in IPOPT's Algorithm IC (from 1e-4, or a third of the last one, by
100x the first time and 8x after) and the system is solved again; delta_c is added where
MINRES cannot reduce the residual (a singular, inconsistent system). The test holds for
every d when the inertia is right, and where it holds the step is a descent direction of
the barrier function on a feasible point, which is what the filter line search needs.

MINRES is preconditioned by a positive diagonal: on the x block ``Sigma_x + delta_w`` plus
an estimate of W's row norms, on the rows ``D`` plus an estimate of the Schur complement's
diagonal ``J P_x^-1 J^T``; the estimates are from products with two fixed sign vectors
(Hutchinson's probing: each gives the squared row norms in expectation), so that the
preconditioner costs four products, not a matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from optsolve.backends.constrained.newton_system import schedule
from optsolve.backends.constrained.nlp import NLP, Jacobian
from optsolve.solve_api.linear_solve import minres

Array = jax.Array

_KAPPA_CURVATURE = 1e-8
# MINRES's relative residual above which a solve is not trusted as a Newton step
_LOOSEST = 1e-2


class KrylovSystem:
    """The Newton system at one iterate, as products (not a pytree: built and used inside
    one traced step)."""

    def __init__(
        self,
        nlp: NLP,
        hvp: Callable[[Array], Array],
        jacobian: Jacobian,
        sigma: Array,
        maxiter: int,
    ):
        self.nlp, self.hvp, self.jacobian, self.sigma = nlp, hvp, jacobian, sigma
        self.maxiter = maxiter
        n, dtype = nlp.n, sigma.dtype
        signs = jnp.where(jnp.arange(n) % 2 == 0, 1.0, -1.0).astype(dtype)
        self.probes = (jnp.ones(n, dtype), signs)
        # W's squared row norms, probed once per step (the probes do not depend on delta_w)
        self.w_rows = 0.5 * sum(hvp(r) ** 2 for r in self.probes)

    def _blocks(self, delta_w: Array, delta_c: Array) -> tuple[Array, Array]:
        """``Sigma_x + delta_w`` and ``D`` (1 on rows that constrain nothing)."""
        nlp, n = self.nlp, self.nlp.n
        sigma_s = jnp.where(nlp.ineq, self.sigma[n:] + delta_w, 1.0)
        d = jnp.where(nlp.ineq, delta_c + 1.0 / sigma_s, jnp.where(nlp.eq, delta_c, 1.0))
        return jnp.where(nlp.free_x, self.sigma[:n] + delta_w, 1.0), d

    def sigma_s(self, delta_w: Array) -> Array:
        return jnp.where(self.nlp.ineq, self.sigma[self.nlp.n :] + delta_w, 1.0)

    def operator(self, delta_w: Array, delta_c: Array) -> Callable[[Array], Array]:
        nlp, n, free = self.nlp, self.nlp.n, self.nlp.free_x
        diag_x, d = self._blocks(delta_w, delta_c)

        def product(u: Array) -> Array:
            # a fixed variable's row and column: the identity (its step is 0)
            ux, uy = jnp.where(free, u[:n], 0.0), jnp.where(nlp.rows, u[n:], 0.0)
            top = jnp.where(free, self.hvp(ux) + diag_x * ux + self.jacobian.rmv(uy), u[:n])
            bottom = jnp.where(nlp.rows, self.jacobian.mv(ux), 0.0) - d * u[n:]
            return jnp.concatenate([top, bottom])

        return product

    def preconditioner(self, delta_w: Array, delta_c: Array) -> Callable[[Array], Array]:
        nlp = self.nlp
        diag_x, d = self._blocks(delta_w, delta_c)
        p_x = diag_x + jnp.where(nlp.free_x, jnp.sqrt(self.w_rows), 0.0)
        p_x = jnp.maximum(
            p_x, jnp.finfo(p_x.dtype).eps * jnp.maximum(jnp.max(p_x, initial=0.0), 1.0)
        )
        schur = 0.5 * sum(
            jnp.where(
                nlp.rows, self.jacobian.mv(jnp.where(nlp.free_x, r / jnp.sqrt(p_x), 0.0)), 0.0
            )
            ** 2
            for r in self.probes
        )
        p_y = d + schur
        p_y = jnp.maximum(
            p_y, jnp.finfo(p_y.dtype).eps * jnp.maximum(jnp.max(p_y, initial=0.0), 1.0)
        )
        inverse = 1.0 / jnp.concatenate([p_x, p_y])
        return lambda u: inverse * u

    def solve(self, rhs: Array, delta_w: Array, delta_c: Array, rtol: Array):
        return minres(
            self.operator(delta_w, delta_c),
            rhs,
            maxiter=self.maxiter,
            rtol=rtol,
            preconditioner=self.preconditioner(delta_w, delta_c),
        )


class Corrected(NamedTuple):
    """The regularisation the curvature test accepted, with the step it gave."""

    delta_w: Array
    delta_c: Array
    sigma_s: Array
    ok: Array  # a step passed the test within delta_w's range


def _rhs(
    nlp: NLP, jacobian: Jacobian, sigma_s: Array, grad_phi: Array, y: Array, residual: Array
) -> Array:
    n = nlp.n
    g_x, g_s = grad_phi[:n], grad_phi[n:]
    slack_term = jnp.where(nlp.ineq, (y - g_s) / sigma_s, 0.0)
    return jnp.concatenate(
        [
            jnp.where(nlp.free_x, -(g_x + jacobian.rmv(jnp.where(nlp.rows, y, 0.0))), 0.0),
            jnp.where(nlp.rows, -residual + slack_term, 0.0),
        ]
    )


def _split(nlp: NLP, step: Array, sigma_s: Array, grad_phi: Array, y: Array):
    n = nlp.n
    dx, dy = step[:n], jnp.where(nlp.rows, step[n:], 0.0)
    ds = jnp.where(nlp.ineq, (dy + y - grad_phi[n:]) / sigma_s, 0.0)
    return dx, ds, dy


def corrected_direction(
    system: KrylovSystem,
    grad_phi: Array,
    y: Array,
    residual: Array,
    mu: Array,
    delta_w_last: Array,
    rtol: Array,
):
    """The Newton step (dx, ds, dy) with the least regularisation that passes the
    curvature test (the module docstring), and that regularisation as :class:`Corrected`."""
    nlp, dtype = system.nlp, grad_phi.dtype
    zero = jnp.zeros((), dtype)

    def attempt(delta_w, delta_c):
        sigma_s = system.sigma_s(delta_w)
        rhs = _rhs(nlp, system.jacobian, sigma_s, grad_phi, y, residual)
        result = system.solve(rhs, delta_w, delta_c, rtol)
        dx, ds, dy = _split(nlp, result.x, sigma_s, grad_phi, y)
        curvature = jnp.vdot(
            dx, system.hvp(dx) + (system.sigma[: nlp.n] + delta_w) * dx
        ) + jnp.vdot(ds, jnp.where(nlp.ineq, sigma_s, 0.0) * ds)
        size = jnp.vdot(dx, dx) + jnp.vdot(ds, ds)
        finite = jnp.all(jnp.isfinite(result.x))
        solved = finite & (result.residual <= _LOOSEST)
        convex = curvature >= _KAPPA_CURVATURE * size
        return (dx, ds, dy), sigma_s, solved, solved & convex

    class Carry(NamedTuple):
        delta_w: Array
        delta_c: Array
        step: tuple
        sigma_s: Array
        ok: Array

    step, sigma_s, solved, ok = attempt(zero, zero)
    # a system MINRES cannot solve is treated as singular (delta_c), as the dense one is
    plan = schedule(delta_w_last, mu, ~solved, dtype)

    def cond(c: Carry) -> Array:
        return ~c.ok & (c.delta_w <= plan.most)

    def body(c: Carry) -> Carry:
        step, sigma_s, _, ok = attempt(c.delta_w, plan.delta_c)
        delta_w = jnp.where(ok, c.delta_w, plan.grow * c.delta_w).astype(dtype)
        return Carry(delta_w, plan.delta_c, step, sigma_s, ok)

    start = Carry(plan.first, plan.delta_c, step, sigma_s, jnp.zeros((), bool))
    done = lax.cond(
        ok, lambda: Carry(zero, zero, step, sigma_s, ok), lambda: lax.while_loop(cond, body, start)
    )
    return Corrected(done.delta_w, done.delta_c, done.sigma_s, done.ok), done.step


def direction(
    system: KrylovSystem,
    corrected: Corrected,
    grad_phi: Array,
    y: Array,
    residual: Array,
    rtol: Array,
):
    """(dx, ds, dy) for another right-hand side (a second-order correction's residual) with
    the regularisation already chosen."""
    rhs = _rhs(system.nlp, system.jacobian, corrected.sigma_s, grad_phi, y, residual)
    result = system.solve(rhs, corrected.delta_w, corrected.delta_c, rtol)
    return _split(system.nlp, result.x, corrected.sigma_s, grad_phi, y)
