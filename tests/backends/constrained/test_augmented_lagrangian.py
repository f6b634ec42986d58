"""optsolve.AugmentedLagrangian against published minima, closed forms and InteriorPoint.

References: Hock & Schittkowski, *Test Examples for Nonlinear Programming Codes* (1981)
(problems 35 and 71 with their published f* and x*); closed forms worked by hand: the
projection of a onto an affine set {x : A x = b} is ``a - A^T (A A^T)^{-1} (A a - b)``,
with f* = |A^T w|^2 / 2 for ``w = (A A^T)^{-1} (A a - b)`` and multipliers ``y = w``
(optsolve's sign: the Lagrangian ``f + y.(A x - b)``), so df*/db = -y; the least violation
of ``x_0 + x_1 >= 3`` over the unit box is at (1, 1).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from constrained_problems import HS071_X, hs035_objective, hs071
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve

jax.config.update("jax_enable_x64", True)

AL = optsolve.AugmentedLagrangian()


# HS035: a convex quadratic, one linear inequality, x >= 0 (f* = 1/9 at (4/3, 7/9, 4/9)).
HS035 = OptimizationProblem(
    hs035_objective,
    jnp.full(3, 0.5),
    bounds=(0.0, None),
    constraints=[Constraint(lambda x, p: x[0] + x[1] + 2 * x[2], upper=3.0)],
)


def test_hs071_published_minimum_and_interior_points_multipliers():
    sol = solve(hs071(), AL)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, 17.0140173, rtol=1e-8)
    np.testing.assert_allclose(sol.x, HS071_X, atol=1e-6)
    ip = solve(hs071(), optsolve.InteriorPoint())
    for mine, theirs in zip(sol.multipliers, ip.multipliers):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    # the product bound is active at its lower side: a multiplier <= 0 (optsolve's sign)
    assert float(sol.multipliers[0]) < 0
    assert "|V| <= feasibility_tol" in sol.detail


def test_hs035_published_minimum_with_bounds_and_an_inequality():
    sol = solve(HS035, AL)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, 1 / 9, rtol=1e-7)
    np.testing.assert_allclose(sol.x, [4 / 3, 7 / 9, 4 / 9], atol=1e-6)


def _affine(a, matrix, b):
    """min |x - a|^2 / 2 s.t. matrix x = b (b a leaf of the constraint)."""
    return OptimizationProblem(
        lambda x, p: 0.5 * jnp.sum((x - p) ** 2),
        jnp.zeros_like(a),
        a,
        constraints=[Constraint(lambda x, p: matrix @ x, lower=b, upper=b)],
    )


def _projection(a, matrix, b):
    w = np.linalg.solve(matrix @ matrix.T, matrix @ a - b)
    return a - matrix.T @ w, w


def test_equality_projection_closed_form_multipliers_and_derivative():
    rng = np.random.default_rng(0)
    n, m = 12, 3
    a, matrix, b = rng.normal(size=n), rng.normal(size=(m, n)), rng.normal(size=m)
    x_star, w = _projection(a, matrix, b)
    sol = solve(_affine(jnp.asarray(a), jnp.asarray(matrix), jnp.asarray(b)), AL)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, x_star, atol=1e-7)
    np.testing.assert_allclose(sol.multipliers[0], w, rtol=1e-6, atol=1e-8)

    def f_star(b_):
        return solve(_affine(jnp.asarray(a), jnp.asarray(matrix), b_), AL).objective

    np.testing.assert_allclose(jax.grad(f_star)(jnp.asarray(b)), -w, rtol=1e-6, atol=1e-8)
    # and x* w.r.t. p = a: the projector onto the null space of the matrix
    projector = np.eye(n) - matrix.T @ np.linalg.solve(matrix @ matrix.T, matrix)

    def x_star_of(a_):
        prob = _affine(jnp.asarray(a), jnp.asarray(matrix), jnp.asarray(b)).replace(p=a_)
        return solve(prob, AL).x

    np.testing.assert_allclose(jax.jacrev(x_star_of)(jnp.asarray(a)), projector, atol=1e-6)


def test_infeasible_problem_is_infeasible_at_the_least_violation():
    prob = OptimizationProblem(
        lambda x, p: jnp.sum(x**2),
        jnp.array([0.2, 0.3]),
        bounds=(0.0, 1.0),
        constraints=[Constraint(lambda x, p: x[0] + x[1], lower=3.0)],
    )
    sol = solve(prob, AL)
    assert sol.retcode == ReturnCode.INFEASIBLE, sol.message
    np.testing.assert_allclose(sol.x, [1.0, 1.0], atol=1e-6)
    assert "locally infeasible" in sol.detail
    assert "largest violation is 3.333333e-01" in sol.detail  # (3 - 2) / 3, relative


def test_jit_and_vmap_agree_with_eager():
    products = jnp.array([24.0, 25.0, 26.0])

    def f_star(product):
        return solve(hs071(product), AL).objective

    eager = np.array([f_star(v) for v in products])
    np.testing.assert_allclose(eager[1], 17.0140173, rtol=1e-8)
    np.testing.assert_allclose(jax.jit(jax.vmap(f_star))(products), eager, rtol=1e-9)


def test_float32():
    sol = solve(hs071(dtype=jnp.float32), AL)
    assert sol.x.dtype == jnp.float32
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, 17.0140173, rtol=1e-4)


def test_resume_continues_with_the_multipliers():
    whole = solve(hs071(), AL, maxiters=4)
    first = solve(hs071(), AL, maxiters=2)
    second = solve(hs071(), AL, maxiters=2, resume=first)
    np.testing.assert_allclose(second.x, whole.x, rtol=1e-12)
    np.testing.assert_allclose(second.state.y, whole.state.y, rtol=1e-12)
    np.testing.assert_allclose(second.state.rho, whole.state.rho)


def test_gradient_descent_inner_method():
    sol = solve(
        HS035, optsolve.AugmentedLagrangian(optsolve.GradientDescent(), inner_maxiters=20_000)
    )
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, 1 / 9, rtol=1e-6)


def test_large_matrix_free_problem():
    """n = 20000 variables, 20 equalities: nothing n x n is formed (the dense Newton
    system alone would take 3.2 GB)."""
    rng = np.random.default_rng(1)
    n, m = 20_000, 20
    a, matrix, b = rng.normal(size=n), rng.normal(size=(m, n)) / np.sqrt(n), rng.normal(size=m)
    x_star, w = _projection(a, matrix, b)
    sol = solve(_affine(jnp.asarray(a), jnp.asarray(matrix), jnp.asarray(b)), AL)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, x_star, atol=1e-6)
    np.testing.assert_allclose(sol.multipliers[0], w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"inner": optsolve.BFGS()}, "`inner` must be a JAX-native algorithm that takes bounds"),
        ({"inner": optsolve.ScipyMinimize("L-BFGS-B")}, "got ScipyMinimize"),
        ({"penalty_increase": 1.0}, "`penalty_increase` must be > 1"),
        ({"infeasibility_decrease": 1.5}, r"`infeasibility_decrease` must be in \(0, 1\)"),
        ({"feasibility_tol": -1.0}, "`feasibility_tol` must be > 0"),
    ],
)
def test_bad_hyperparameters_are_named(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        optsolve.AugmentedLagrangian(**kwargs)


def test_history_records_the_violation():
    sol = solve(hs071(), AL, history=True, maxiters=50)
    violation = np.asarray(sol.history.violation)
    steps = int(sol.stats.iterations)
    # x0 = (1, 5, 5, 1): the sum of squares is 52, not 40 (relative to 40); the product
    # 25 holds
    np.testing.assert_allclose(violation[0], 12 / 40, rtol=1e-12)
    assert violation[steps] <= 1e-8
    assert np.all(np.isnan(violation[steps + 1 :]))
