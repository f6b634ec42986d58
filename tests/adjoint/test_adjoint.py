"""Differentiating solutions with respect to p: implicit differentiation on every backend,
against closed forms and finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import ImplicitAdjoint, OptimizationProblem, ReturnCode, solve

_rng = np.random.default_rng(0)
A = jnp.asarray(_rng.normal(size=(30, 5)))
B = jnp.asarray(_rng.normal(size=30))
A_VAL = jnp.asarray(_rng.normal(size=(20, 5)))
B_VAL = jnp.asarray(_rng.normal(size=20))


def ridge(x, lam):
    return 0.5 * jnp.sum((A @ x - B) ** 2) + 0.5 * lam * jnp.sum(x**2)


def ridge_closed_form(lam):
    """x*(lam) = (A^T A + lam I)^-1 A^T b."""
    return jnp.linalg.solve(A.T @ A + lam * jnp.eye(5), A.T @ B)


def validation_loss(x):
    return 0.5 * jnp.sum((A_VAL @ x - B_VAL) ** 2)


def analytic_hypergradient(lam):
    # d/dlam L(x*(lam)) = -(dL/dx)^T (A^T A + lam I)^-1 x*(lam)
    x = ridge_closed_form(lam)
    h = A.T @ A + lam * jnp.eye(5)
    return -(A_VAL.T @ (A_VAL @ x - B_VAL)) @ jnp.linalg.solve(h, x)


RIDGE_PROBLEM = OptimizationProblem(ridge, jnp.zeros(5), jnp.asarray(0.7))


@pytest.mark.parametrize(
    "algorithm, options",
    [
        (optsolve.LBFGS(), {"gtol": 1e-9}),
        (optsolve.BFGS(), {"gtol": 1e-9}),
        (optsolve.Newton(), {"gtol": 1e-9}),
        (optsolve.ScipyMinimize("BFGS"), {"gtol": 1e-9}),
        (optsolve.ScipyMinimize("L-BFGS-B"), {"gtol": 1e-9, "ftol": 0.0}),
        (optsolve.ScipyMinimize("trust-ncg"), {"gtol": 1e-8}),  # scipy stalls below ~1e-8 here
        (optax.lbfgs(), {"gtol": 1e-9, "maxiters": 200}),
    ],
    ids=[
        "LBFGS",
        "BFGS",
        "Newton",
        "scipy-BFGS",
        "scipy-L-BFGS-B",
        "scipy-trust-ncg",
        "optax.lbfgs",
    ],
)
def test_ridge_hypergradient_matches_closed_form(algorithm, options):
    def outer(lam):
        return validation_loss(solve(RIDGE_PROBLEM.replace(p=lam), algorithm, **options).x)

    lam = jnp.asarray(0.7)
    np.testing.assert_allclose(jax.grad(outer)(lam), analytic_hypergradient(lam), rtol=1e-6)


def test_converged_adam_hypergradient_within_1e_3():
    def outer(lam):
        sol = solve(RIDGE_PROBLEM.replace(p=lam), optsolve.Adam(0.05), maxiters=20000, gtol=1e-7)
        return validation_loss(sol.x)

    lam = jnp.asarray(0.7)
    np.testing.assert_allclose(jax.grad(outer)(lam), analytic_hypergradient(lam), rtol=1e-3)


def test_jacobian_wrt_vector_p_and_dict_p():
    # per-coordinate regularisation: f = 0.5||Ax-b||^2 + 0.5 sum(lam_i x_i^2)
    f = lambda x, lam: 0.5 * jnp.sum((A @ x - B) ** 2) + 0.5 * jnp.sum(lam * x**2)
    closed = lambda lam: jnp.linalg.solve(A.T @ A + jnp.diag(lam), A.T @ B)
    lam = jnp.linspace(0.2, 1.0, 5)
    prob = OptimizationProblem(f, jnp.zeros(5), lam)
    solve_x = lambda lam: solve(prob.replace(p=lam), optsolve.ScipyMinimize("BFGS"), gtol=1e-9).x
    np.testing.assert_allclose(jax.jacobian(solve_x)(lam), jax.jacobian(closed)(lam), atol=1e-9)

    g = lambda x, p: 0.5 * jnp.sum((A @ x - p["target"]) ** 2) + 0.5 * p["lam"] * jnp.sum(x**2)
    p = {"lam": jnp.asarray(0.5), "target": B}
    prob = OptimizationProblem(g, jnp.zeros(5), p)
    grads = jax.grad(
        lambda p: validation_loss(solve(prob.replace(p=p), optsolve.LBFGS(), gtol=1e-9).x)
    )(p)
    reference = jax.grad(
        lambda p: validation_loss(
            jnp.linalg.solve(A.T @ A + p["lam"] * jnp.eye(5), A.T @ p["target"])
        )
    )(p)
    np.testing.assert_allclose(grads["lam"], reference["lam"], rtol=1e-6)
    np.testing.assert_allclose(grads["target"], reference["target"], rtol=1e-6, atol=1e-12)


def test_forward_and_reverse_mode_agree():
    solve_x = lambda lam: solve(RIDGE_PROBLEM.replace(p=lam), optsolve.LBFGS(), gtol=1e-9).x
    lam = jnp.asarray(1.3)
    forward = jax.jacfwd(solve_x)(lam)
    reverse = jax.jacrev(solve_x)(lam)
    np.testing.assert_allclose(forward, reverse, rtol=1e-10)
    np.testing.assert_allclose(forward, jax.jacfwd(ridge_closed_form)(lam), rtol=1e-6)
    _, tangent = jax.jvp(solve_x, (lam,), (jnp.asarray(1.0),))
    np.testing.assert_allclose(tangent, forward, rtol=1e-12)


def test_objective_derivative_is_the_envelope_theorem():
    # d/dlam f(x*(lam), lam) = 0.5 ||x*||^2 (the partial in lam; the x-part vanishes)
    value = lambda lam: solve(RIDGE_PROBLEM.replace(p=lam), optsolve.LBFGS(), gtol=1e-9).objective
    lam = jnp.asarray(0.9)
    np.testing.assert_allclose(
        jax.grad(value)(lam), 0.5 * jnp.sum(ridge_closed_form(lam) ** 2), rtol=1e-8
    )


def _logistic_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 4))
    y = (x @ np.array([1.0, -1.0, 0.5, 2.0]) + 0.5 * rng.normal(size=60) > 0).astype(float)
    return jnp.asarray(x), jnp.asarray(y)


def test_logistic_regression_hypergradient_against_finite_differences():
    features, labels = _logistic_data()

    def loss(w, p):  # regularisation strengths per feature live in p
        z = features @ w
        return jnp.mean(jnp.logaddexp(0.0, z) - labels * z) + jnp.sum(jnp.exp(p) * w**2)

    outer = lambda w: jnp.sum(w**2) + jnp.sum(w)
    prob = OptimizationProblem(loss, jnp.zeros(4), jnp.log(jnp.array([0.01, 0.02, 0.05, 0.1])))
    tight = optsolve.ScipyMinimize("trust-exact")

    def value(p):
        return outer(solve(prob.replace(p=p), tight, gtol=1e-12).x)

    grad = jax.grad(value)(prob.p)
    h = 1e-5
    fd = np.array(
        [(value(prob.p.at[i].add(h)) - value(prob.p.at[i].add(-h))) / (2 * h) for i in range(4)]
    )
    np.testing.assert_allclose(grad, fd, rtol=1e-6)
    # the same gradient from a JAX-native solve
    native = jax.grad(lambda p: outer(solve(prob.replace(p=p), optsolve.Newton(), gtol=1e-12).x))
    np.testing.assert_allclose(native(prob.p), fd, rtol=1e-6)


def test_active_bounds_carry_no_sensitivity():
    # x* = clip(p, 0, 1): dx/dp = 1 on free coordinates, 0 where a bound is active
    f = lambda x, p: 0.5 * jnp.sum((x - p) ** 2) + 0.1 * jnp.sum(x) ** 2
    p = jnp.array([-0.5, 0.3, 0.6, 1.7])
    prob = OptimizationProblem(f, jnp.full(4, 0.5), p, bounds=(0.0, 1.0))
    # f is quadratic, so the implicit derivative is exact at any point of the right active
    # set: a gtol every BLAS kernel and compiler option reaches by the gradient test itself
    # (at 1e-9 scipy's L-BFGS-B may stop by its ftol first, STALLED, on some of them)
    for algorithm in (optsolve.ScipyMinimize("L-BFGS-B"), optsolve.LBFGS()):
        jac = jax.jacobian(lambda p: solve(prob.replace(p=p), algorithm, gtol=1e-7).x)(p)  # noqa: B023  (called in this iteration)
        # free block {1, 2}: x_F = (I + 0.2 * 11^T)^-1 p_F (x_0 = x_3 - 1 shifts only a constant)
        h_free = np.eye(2) + 0.2 * np.ones((2, 2))
        expected = np.zeros((4, 4))
        expected[np.ix_([1, 2], [1, 2])] = np.linalg.inv(h_free)
        np.testing.assert_allclose(jac, expected, atol=1e-7)


def test_vmap_over_p_equals_python_loop():
    lams = jnp.array([0.1, 0.5, 2.0, 8.0])
    hyper = jax.grad(
        lambda lam: validation_loss(
            solve(RIDGE_PROBLEM.replace(p=lam), optsolve.LBFGS(), gtol=1e-9).x
        )
    )
    batched = jax.vmap(hyper)(lams)
    looped = np.array([hyper(lam) for lam in lams])
    np.testing.assert_allclose(batched, looped, rtol=1e-10)
    np.testing.assert_allclose(batched, [analytic_hypergradient(lam) for lam in lams], rtol=1e-6)
    scipy_batched = jax.vmap(
        lambda lam: solve(RIDGE_PROBLEM.replace(p=lam), optsolve.ScipyMinimize("BFGS"), gtol=1e-9).x
    )(lams)
    np.testing.assert_allclose(scipy_batched, jax.vmap(ridge_closed_form)(lams), rtol=1e-8)


def test_gradient_with_respect_to_x0_is_zero():
    grad_x0 = jax.grad(
        lambda x0: validation_loss(
            solve(RIDGE_PROBLEM.replace(x0=x0), optsolve.LBFGS(), gtol=1e-9).x
        )
    )(jnp.ones(5))
    np.testing.assert_array_equal(grad_x0, np.zeros(5))


def test_not_converged_solution_warns():
    outer = lambda lam: validation_loss(
        solve(RIDGE_PROBLEM.replace(p=lam), optsolve.Adam(0.01), maxiters=5).x
    )
    with pytest.warns(RuntimeWarning, match="retcode is MAXITERS; the implicit gradient assumes"):
        jax.grad(outer)(jnp.asarray(0.7))


def test_linear_solvers_agree_and_ridge_fallback_for_singular_hessian():
    outer = lambda lam, adjoint: validation_loss(
        solve(RIDGE_PROBLEM.replace(p=lam), optsolve.LBFGS(), gtol=1e-9, adjoint=adjoint).x
    )
    lam = jnp.asarray(0.7)
    for name in ("cg", "gmres", "bicgstab", "dense"):
        np.testing.assert_allclose(
            jax.grad(outer)(lam, ImplicitAdjoint(linear_solver=name)),
            analytic_hypergradient(lam),
            rtol=1e-6,
        )
    # f has a flat direction (x[1] does not appear): H is singular; the ridge regularises it
    f = lambda x, p: (x[0] - p) ** 2
    prob = OptimizationProblem(f, jnp.zeros(2), jnp.asarray(1.0))
    jac = jax.jacobian(
        lambda p: (
            solve(
                prob.replace(p=p),
                optsolve.LBFGS(),
                gtol=1e-12,
                adjoint=ImplicitAdjoint(ridge=1e-12),
            ).x
        )
    )(prob.p)
    np.testing.assert_allclose(jac, [1.0, 0.0], atol=1e-9)
    with pytest.raises(ValueError, match="`linear_solver` must be one of cg, gmres"):
        ImplicitAdjoint(linear_solver="lu")


def test_constrained_ridge_hypergradient_matches_closed_form():
    """Ridge regression with its weights summing to 1 (an active equality). Closed form: the
    KKT system K [x; mu] = [A^T b; 1], K = [[A^T A + lam I, 1], [1^T, 0]], is linear, so
    d[x; mu]/dlam = -K^-1 [x; 0]."""
    con = optsolve.Constraint(lambda x, p: jnp.sum(x), lower=1.0, upper=1.0)
    prob = OptimizationProblem(ridge, jnp.zeros(5), jnp.asarray(0.7), constraints=[con])
    a, b = np.asarray(A), np.asarray(B)
    lam = 0.7
    kkt = np.block([[a.T @ a + lam * np.eye(5), np.ones((5, 1))], [np.ones((1, 5)), 0.0]])
    x = np.linalg.solve(kkt, np.concatenate([a.T @ b, [1.0]]))[:5]
    dx = -np.linalg.solve(kkt, np.concatenate([x, [0.0]]))[:5]
    expected = (np.asarray(A_VAL).T @ (np.asarray(A_VAL) @ x - np.asarray(B_VAL))) @ dx

    def outer(lam):
        return validation_loss(
            solve(prob.replace(p=lam), optsolve.ScipyMinimize("SLSQP"), ftol=1e-15).x
        )

    # solve's ftol reaches SLSQP's own test (its default 1e-6 stopped it 8e-5 away from x*)
    sol = solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-15)
    np.testing.assert_allclose(sol.x, x, atol=1e-9)
    np.testing.assert_allclose(jax.grad(outer)(jnp.asarray(lam)), expected, rtol=1e-7)


def _hand_sgd_momentum(lr, p, steps):
    f = lambda x: jnp.sum((x - p) ** 2 * jnp.arange(1.0, 4.0))
    tx = optax.sgd(lr, momentum=0.5)
    x = jnp.zeros(3)
    state = tx.init(x)
    for _ in range(steps):
        updates, state = tx.update(jax.grad(f)(x), state, x)
        x = optax.apply_updates(x, updates)
    return jnp.sum(x**2)


def test_unrolled_gradient_wrt_learning_rate_matches_finite_differences():
    f = lambda x, p: jnp.sum((x - p) ** 2 * jnp.arange(1.0, 4.0))
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.asarray(2.0))

    def meta_loss(lr):
        sol = solve(
            prob, optsolve.SGD(lr, momentum=0.5), maxiters=15, adjoint=optsolve.UnrolledAdjoint()
        )
        return jnp.sum(sol.x**2)

    lr = jnp.asarray(0.05)
    grad = jax.grad(meta_loss)(lr)
    h = 1e-5
    fd = (meta_loss(lr + h) - meta_loss(lr - h)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-7)
    # and exactly the derivative of the hand-written optax loop
    np.testing.assert_allclose(grad, jax.grad(_hand_sgd_momentum)(lr, 2.0, 15), rtol=1e-12)
    # forward mode through the unrolled loop agrees
    np.testing.assert_allclose(jax.jacfwd(meta_loss)(lr), grad, rtol=1e-10)


def test_unrolled_gradient_wrt_p_matches_hand_loop_and_stops_like_the_while_loop():
    f = lambda x, p: jnp.sum((x - p) ** 2 * jnp.arange(1.0, 4.0))
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.asarray(2.0))
    unrolled = lambda p: solve(
        prob.replace(p=p),
        optsolve.SGD(0.05, momentum=0.5),
        maxiters=40,
        adjoint=optsolve.UnrolledAdjoint(),
    )
    hand = lambda p: _hand_sgd_momentum(0.05, p, 40)
    np.testing.assert_allclose(
        jax.grad(lambda p: jnp.sum(unrolled(p).x ** 2))(2.0), jax.grad(hand)(2.0), rtol=1e-12
    )
    # a run that converges early: the unrolled scan returns what the while loop returns
    early = solve(
        prob, optsolve.SGD(0.1), maxiters=500, gtol=1e-6, adjoint=optsolve.UnrolledAdjoint()
    )
    plain = solve(prob, optsolve.SGD(0.1), maxiters=500, gtol=1e-6)
    assert early.retcode == plain.retcode == ReturnCode.SUCCESS
    assert int(early.stats.iterations) == int(plain.stats.iterations) < 500
    np.testing.assert_allclose(early.x, plain.x, rtol=1e-15)


def test_unrolled_adjoint_errors():
    prob = RIDGE_PROBLEM
    with pytest.raises(ValueError, match="ScipyMinimize.* cannot be differentiated by unrolling"):
        solve(prob, optsolve.ScipyMinimize("BFGS"), adjoint=optsolve.UnrolledAdjoint())
    with pytest.raises(ValueError, match="`maxiters` must be given as a Python int"):
        solve(prob, optsolve.Adam(0.1), gtol=1e-3, adjoint=optsolve.UnrolledAdjoint())
    with pytest.raises(TypeError, match="`adjoint` must be an adjoint"):
        solve(prob, optsolve.Adam(0.1), maxiters=3, adjoint="implicit")


def test_hypergradient_under_jit():
    hyper = jax.jit(
        jax.grad(
            lambda lam: validation_loss(
                solve(RIDGE_PROBLEM.replace(p=lam), optax.lbfgs(), maxiters=100, gtol=1e-9).x
            )
        )
    )
    np.testing.assert_allclose(hyper(jnp.asarray(0.7)), analytic_hypergradient(0.7), rtol=1e-6)
    np.testing.assert_allclose(hyper(jnp.asarray(2.0)), analytic_hypergradient(2.0), rtol=1e-6)


def test_cg_solves_and_counts_its_products():
    """CG on an SPD matrix with three distinct eigenvalues terminates after three products
    (Nocedal & Wright, Theorem 5.4), from the zero start with no product spent on it."""
    from optsolve.solve_api.adjoint import _cg

    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    a = q @ np.diag([1.0] * 4 + [3.0] * 3 + [10.0] * 3) @ q.T
    b = rng.normal(size=10)
    v, products = jax.jit(lambda rhs: _cg(lambda u: jnp.asarray(a) @ u, rhs, 1e-10, 100))(
        jnp.asarray(b)
    )
    assert int(products) == 3
    np.testing.assert_allclose(np.asarray(v), np.linalg.solve(a, b), rtol=1e-10)
    zero, none = _cg(lambda u: jnp.asarray(a) @ u, jnp.zeros(10), 1e-10, 100)
    assert int(none) == 0 and not np.any(np.asarray(zero))
