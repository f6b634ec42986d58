"""Derivatives of constrained solutions through their KKT conditions, and the multipliers,
against closed forms worked by hand and against scipy's own multipliers (SLSQP,
trust-constr)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import Constraint, OptimizationProblem, solve
from optsolve.solve_api import kkt

pytestmark = pytest.mark.filterwarnings(
    "ignore:optsolve. differentiating a solution whose retcode:RuntimeWarning"
)

N = 3
LOCAL = ["SLSQP", "trust-constr", "COBYLA", "COBYQA"]
# barrier (trust-constr) and derivative-free (COBYLA) runs stop near, not at, the solution
TOL = {"SLSQP": 1e-8, "trust-constr": 2e-3, "COBYLA": 1e-4, "COBYQA": 1e-6}


def _sum_at_least(c, method):
    """min |x|^2 s.t. sum(x) >= c: x* = c/n, f* = c^2/n, df*/dc = 2c/n, multiplier -2c/n."""
    prob = OptimizationProblem(
        lambda x, p: jnp.sum(x**2),
        jnp.ones(N),
        constraints=[Constraint(lambda x, p: jnp.sum(x), lower=c)],
    )
    return solve(prob, optsolve.ScipyMinimize(method))


@pytest.mark.parametrize("method", LOCAL)
def test_inequality_bound_derivative_is_the_envelope_theorem(method):
    c = 1.5
    np.testing.assert_allclose(
        jax.grad(lambda c: _sum_at_least(c, method).objective)(c), 2 * c / N, rtol=TOL[method]
    )
    np.testing.assert_allclose(
        jax.jacfwd(lambda c: _sum_at_least(c, method).x)(c), np.full(N, 1 / N), atol=TOL[method]
    )
    np.testing.assert_allclose(
        _sum_at_least(c, method).multipliers[0], -2 * c / N, rtol=TOL[method]
    )


@pytest.mark.parametrize("method", LOCAL)
def test_equality_projection_jacobian(method):
    """min |x - p|^2 s.t. sum(x) = 1: x* = p - (sum p - 1)/n, dx*/dp = I - 11^T/n."""

    def x_star(p):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum((x - p) ** 2),
            jnp.zeros(N),
            p,
            constraints=[Constraint(lambda x, p: jnp.sum(x), lower=1.0, upper=1.0)],
        )
        return solve(prob, optsolve.ScipyMinimize(method)).x

    p = jnp.array([0.3, -0.2, 0.5])
    expected = np.eye(N) - 1.0 / N
    np.testing.assert_allclose(jax.jacrev(x_star)(p), expected, atol=TOL[method])
    np.testing.assert_allclose(jax.jacfwd(x_star)(p), expected, atol=TOL[method])


@pytest.mark.parametrize("method", LOCAL)
def test_p_inside_the_constraint_function(method):
    """min |x|^2 s.t. p . x = 1: x* = p / |p|^2, dx*/dp = I/|p|^2 - 2 p p^T / |p|^4."""

    def x_star(p):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum(x**2),
            jnp.ones(N),
            p,
            constraints=[Constraint(lambda x, p: jnp.dot(p, x), lower=1.0, upper=1.0)],
        )
        return solve(prob, optsolve.ScipyMinimize(method)).x

    p = jnp.array([1.0, 2.0, -0.5])
    s2 = float(p @ p)
    expected = np.eye(N) / s2 - 2 * np.outer(p, p) / s2**2
    np.testing.assert_allclose(jax.jacrev(x_star)(p), expected, atol=TOL[method])


def test_an_upper_bound_of_a_nonlinear_constraint_and_a_box_bound_together():
    """max x0 + x1 (min -(x0 + x1)) s.t. x0^2 + x1^2 <= r and x1 <= u: with u = 0.5 and
    r = 2, x1* = u (held by the box), x0* = sqrt(r - u^2). So dx0*/dr = 1 / (2 x0*),
    dx0*/du = -u / x0*, and f* = -(x0* + u): df*/dr = -1/(2 x0*), df*/du = u/x0* - 1."""

    def solution(r, u):
        prob = OptimizationProblem(
            lambda x, p: -(x[0] + x[1]),
            jnp.zeros(2),
            bounds=(None, jnp.stack([10.0, u])),
            constraints=[Constraint(lambda x, p: jnp.sum(x**2), upper=r)],
        )
        sol = solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-14)
        return sol.x, sol.objective

    r, u = 2.0, 0.5
    x0 = np.sqrt(r - u**2)
    (dx_dr, dx_du), (df_dr, df_du) = jax.jacrev(solution, argnums=(0, 1))(r, u)
    np.testing.assert_allclose(dx_dr, [1 / (2 * x0), 0.0], atol=1e-7)
    np.testing.assert_allclose(dx_du, [-u / x0, 1.0], atol=1e-7)
    np.testing.assert_allclose([df_dr, df_du], [-1 / (2 * x0), u / x0 - 1], atol=1e-7)
    fwd = jax.jacfwd(solution, argnums=(0, 1))(r, u)
    np.testing.assert_allclose(fwd[0][0], dx_dr, atol=1e-9)
    np.testing.assert_allclose(fwd[1][1], df_du, atol=1e-9)


def test_multipliers_agree_with_scipys_own():
    """Two inequality constraints, one active: SLSQP's and trust-constr's own multipliers
    (scipy's sign: >= 0 for an active c(x) >= 0) against ours (<= 0 at a lower bound)."""

    def problem(method):
        return OptimizationProblem(
            lambda x, p: jnp.sum((x - jnp.array([2.0, 1.0])) ** 2),
            jnp.zeros(2),
            constraints=[
                Constraint(lambda x, p: x[0] + x[1], upper=1.0),
                Constraint(lambda x, p: x[0] - x[1], lower=-5.0),
            ],
        )

    # x* = (1, 0): the first is active with multiplier 2, the second inactive
    sol = solve(problem("SLSQP"), optsolve.ScipyMinimize("SLSQP"))
    np.testing.assert_allclose(sol.x, [1.0, 0.0], atol=1e-9)
    np.testing.assert_allclose([sol.multipliers[0], sol.multipliers[1]], [2.0, 0.0], atol=1e-8)
    scipy_own = (
        np.concatenate(sol.original["multipliers"])
        if isinstance(sol.original["multipliers"], list)
        else np.asarray(sol.original["multipliers"])
    )
    np.testing.assert_allclose(np.sort(np.abs(scipy_own)), [0.0, 2.0], atol=1e-8)
    tc = solve(problem("trust-constr"), optsolve.ScipyMinimize("trust-constr"))
    np.testing.assert_allclose(float(tc.multipliers[0]), np.abs(tc.original["v"][0][0]), rtol=1e-4)


def test_a_degenerate_active_set_gets_the_minimum_norm_solution():
    """The same constraint twice (LICQ fails): the derivative is still the closed form, the
    KKT multiplier (minimum-norm) is shared between the copies. (An untraced solve may
    report the backend's own multipliers, any split of -2c/n.)"""

    def problem(c):
        g = lambda x, p: jnp.sum(x)
        return OptimizationProblem(
            lambda x, p: jnp.sum(x**2),
            jnp.ones(N),
            constraints=[Constraint(g, lower=c), Constraint(g, lower=c)],
        )

    def solution(c):
        return solve(problem(c), optsolve.ScipyMinimize("SLSQP"))

    c = 1.5
    np.testing.assert_allclose(jax.grad(lambda c: solution(c).objective)(c), 2 * c / N, rtol=1e-8)
    lam = kkt.multipliers(problem(c), solution(c).x)
    np.testing.assert_allclose([lam[0], lam[1]], [-c / N, -c / N], rtol=1e-8)


def test_vmap_over_p_equals_a_loop_and_jvp_agrees_with_vjp():
    def x0_star(p):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum((x - p) ** 2),
            jnp.zeros(N),
            p,
            constraints=[Constraint(lambda x, p: jnp.sum(x), upper=1.0)],
        )
        return solve(prob, optsolve.ScipyMinimize("SLSQP")).x[0]

    ps = jnp.array([[0.3, -0.2, 0.5], [1.0, 1.0, 1.0], [0.0, 0.1, 0.2]])
    batched = jax.vmap(jax.grad(x0_star))(ps)
    grad = jax.jit(jax.grad(x0_star))
    jvp = jax.jit(lambda p, t: jax.jvp(x0_star, (p,), (t,))[1])
    looped = np.stack([grad(p) for p in ps])
    np.testing.assert_allclose(batched, looped, atol=1e-10)
    # active (sum p > 1): I - 11^T/n, first row; inactive: e_0
    np.testing.assert_allclose(looped[1], [1 - 1 / N, -1 / N, -1 / N], atol=1e-8)
    np.testing.assert_allclose(looped[2], [1.0, 0.0, 0.0], atol=1e-8)
    tangent = jnp.array([0.2, -1.0, 0.7])
    for p, row in zip(ps, looped):
        np.testing.assert_allclose(jvp(p, tangent), row @ tangent, atol=1e-10)


def test_a_constraint_near_both_of_its_bounds_is_held_at_the_one_its_multiplier_picks():
    """min (x - p)^2 s.t. 0 <= x <= u with u = 1e-4 < p = 1: x* = u, held at its upper bound
    (within the candidate gap of both), multiplier 2 (p - u) = 1.9998 (>= 0 at an upper
    bound), dx*/dp = 0, dx*/du = 1, df*/du = -2 (p - u)."""

    def problem(p, u):
        return OptimizationProblem(
            lambda x, p: jnp.sum((x - p) ** 2),
            jnp.zeros(1),
            p,
            constraints=[Constraint(lambda x, p: x[0], lower=0.0, upper=u)],
        )

    def solution(p, u):
        sol = solve(problem(p, u), optsolve.ScipyMinimize("SLSQP"), ftol=1e-14)
        return sol.x[0], sol.objective

    p, u = 1.0, 1e-4
    x = solution(p, u)[0]
    np.testing.assert_allclose(
        kkt.multipliers(problem(p, u), jnp.stack([x]))[0], 2 * (p - u), rtol=1e-8
    )
    (dx_dp, dx_du), (_df_dp, df_du) = jax.jacrev(solution, argnums=(0, 1))(p, u)
    np.testing.assert_allclose([dx_dp, dx_du, df_du], [0.0, 1.0, -2 * (p - u)], atol=1e-8)
    np.testing.assert_allclose(jax.jacfwd(solution, argnums=1)(p, u)[0], 1.0, atol=1e-8)


@pytest.mark.parametrize("scale", [1e3, 1e6])
def test_an_inactive_constraint_near_its_bound_stays_inactive_whatever_the_scale_of_f(scale):
    """min s sum(cosh(x - p) - 1) s.t. x0 >= 0, p0 = 5e-4 > 0: the constraint is inactive
    (x* = p). trust-constr stops a barrier step inside, where the least-squares multiplier
    grows with s but the Newton step it implies, |lambda| / (s cosh(x0 - p0)), stays below
    the gap x0 for every s. At any x with the constraint inactive, H = diag(s cosh(x - p))
    and d/dp grad = -H, so dx*/dp = I and the multiplier is 0."""

    def problem(p):
        return OptimizationProblem(
            lambda x, p: scale * jnp.sum(jnp.cosh(x - p) - 1),
            jnp.ones(N),
            p,
            constraints=[Constraint(lambda x, p: x[0], lower=0.0)],
        )

    p = jnp.array([5e-4, 0.3, -0.2])
    x = solve(problem(p), optsolve.ScipyMinimize("trust-constr")).x
    assert x[0] > p[0]  # stopped short of x*: the gradient there pushes towards the bound
    np.testing.assert_array_equal(kkt.multipliers(problem(p), x)[0], 0.0)
    jac = jax.jacrev(lambda p: solve(problem(p), optsolve.ScipyMinimize("trust-constr")).x)(p)
    np.testing.assert_allclose(jac, np.eye(N), atol=1e-10)


@pytest.mark.parametrize("scale", [1e-6, 1e-8])
def test_float32_small_curvature_next_to_the_constraint_gradient(scale):
    """min s |x - p|^2 s.t. sum(x) = 1, in float32: x* = p - (sum p - 1)/n and
    dx*/dp = I - 11^T/n whatever s (the Hessian 2 s I is small against the constraint's
    gradient 1 for small s; a least-squares solve of the whole KKT matrix cut it off)."""

    def problem(p):
        return OptimizationProblem(
            lambda x, p: scale * jnp.sum((x - p) ** 2),
            jnp.zeros(N, jnp.float32),
            p,
            constraints=[Constraint(lambda x, p: jnp.sum(x), lower=1.0, upper=1.0)],
        )

    p = jnp.array([0.3, -0.2, 0.5], jnp.float32)
    x_star = p - (jnp.sum(p) - 1) / N
    expected = np.eye(N) - 1.0 / N
    at_x_star = jax.jacfwd(lambda t: kkt.kkt_tangent(problem(p), x_star, t, None, None))(
        jnp.zeros(N, jnp.float32)
    )
    assert at_x_star.dtype == jnp.float32
    np.testing.assert_allclose(at_x_star, expected, atol=1e-6)
    jac = jax.jacrev(lambda p: solve(problem(p), optsolve.ScipyMinimize("trust-constr")).x)(p)
    assert jac.dtype == jnp.float32
    np.testing.assert_allclose(jac, expected, atol=1e-6)


def test_the_problems_own_gradient_is_used():
    """f evaluated on the host (jax.pure_callback: JAX cannot differentiate it) with its
    gradient given as ``grad``: min |x - p|^2 s.t. sum(x) = 1 has x* = p - (sum p - 1)/n,
    multiplier 2 (sum p - 1)/n (grad f + lambda 1 = 0) and dx*/dp = I - 11^T/n. The scipy
    backend differentiates f itself, so the KKT functions are called at x* directly."""

    def host_f(x, p):
        return jax.pure_callback(
            lambda x, p: np.sum((x - p) ** 2), jax.ShapeDtypeStruct((), x.dtype), x, p
        )

    p = jnp.array([0.3, -0.2, 0.5])
    prob = OptimizationProblem(
        host_f,
        jnp.zeros(N),
        p,
        grad=lambda x, p: 2 * (x - p),
        constraints=[Constraint(lambda x, p: jnp.sum(x), lower=1.0, upper=1.0)],
    )
    x_star = p - (jnp.sum(p) - 1) / N
    np.testing.assert_allclose(
        kkt.multipliers(prob, x_star)[0], 2 * (np.sum(p) - 1) / N, rtol=1e-12
    )
    jac = jax.jacfwd(lambda t: kkt.kkt_tangent(prob, x_star, t, None, None))(jnp.zeros(N))
    np.testing.assert_allclose(jac, np.eye(N) - 1.0 / N, atol=1e-12)
