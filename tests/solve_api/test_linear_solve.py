"""The shared CG loop (optsolve.solve_api.linear_solve.cg) against references that do not
come from CG itself: numpy's dense solve, Krylov-subspace minimisers (Nocedal & Wright,
Theorem 5.2), finite termination (Theorem 5.4), and hand-worked Steihaug steps.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optsolve.solve_api.linear_solve import CGStatus, cg, cgls


def spd(n, eigenvalues, seed=0):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    return q @ np.diag(eigenvalues) @ q.T


def matvec_of(a, dtype=jnp.float64):
    a = jnp.asarray(a, dtype)
    return lambda v: a @ v


def krylov_minimiser(a, b, k):
    """argmin of q(x) = x.Ax/2 - b.x over span{b, Ab, ..., A^(k-1) b}: CG's k-th iterate."""
    basis = np.stack([np.linalg.matrix_power(a, j) @ b for j in range(k)], axis=1)
    return basis @ np.linalg.solve(basis.T @ a @ basis, basis.T @ b)


def quadratic(h, b, x):
    return 0.5 * x @ h @ x - b @ x


def test_solves_spd_system_like_numpy_and_counts_products():
    n = 8
    a = spd(n, np.linspace(1.0, 4.0, n))
    b = np.random.default_rng(1).normal(size=n)
    res = cg(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=10 * n)
    expected = np.linalg.solve(a, b)
    np.testing.assert_allclose(np.asarray(res.x), expected, rtol=1e-10, atol=1e-12)
    assert int(res.status) == CGStatus.CONVERGED
    # From x = 0 the initial residual is -b: no product. One product per iteration.
    assert int(res.matvecs) == int(res.iterations) <= n
    np.testing.assert_allclose(float(res.model), -0.5 * b @ expected, rtol=1e-12)


def test_terminates_after_as_many_products_as_distinct_eigenvalues():
    a = spd(10, [1.0] * 4 + [3.0] * 3 + [10.0] * 3)
    b = np.random.default_rng(0).normal(size=10)
    res = cg(matvec_of(a), jnp.asarray(b), rtol=1e-10, maxiter=100)
    assert int(res.matvecs) == 3 and int(res.status) == CGStatus.CONVERGED
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.solve(a, b), rtol=1e-10)


def test_max_iterations_returns_the_krylov_minimiser():
    n = 8
    a = spd(n, np.arange(1.0, n + 1))
    b = np.random.default_rng(2).normal(size=n)
    res = cg(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=3)
    assert int(res.status) == CGStatus.MAX_ITERATIONS
    assert int(res.matvecs) == int(res.iterations) == 3
    x3 = krylov_minimiser(a, b, 3)
    np.testing.assert_allclose(np.asarray(res.x), x3, rtol=1e-10)
    np.testing.assert_allclose(float(res.model), quadratic(a, b, x3), rtol=1e-10)


def test_zero_right_hand_side_costs_no_product():
    res = cg(matvec_of(np.eye(4)), jnp.zeros(4), rtol=1e-10, maxiter=10)
    assert int(res.matvecs) == 0 and int(res.status) == CGStatus.CONVERGED
    assert not np.any(np.asarray(res.x))


def test_atol_and_rtol_the_larger_bound_applies():
    n = 8
    a = spd(n, np.arange(1.0, n + 1))
    b = np.random.default_rng(3).normal(size=n)
    bn = np.linalg.norm(b)
    loose = cg(matvec_of(a), jnp.asarray(b), rtol=1e-2, atol=1e-12, maxiter=50)
    same = cg(matvec_of(a), jnp.asarray(b), atol=1e-2 * bn, maxiter=50)
    assert int(loose.matvecs) == int(same.matvecs)
    assert np.linalg.norm(a @ np.asarray(loose.x) - b) <= 1e-2 * bn


def test_pytree_operands_match_the_flat_solve():
    a = spd(5, [1.0, 2.0, 3.0, 5.0, 8.0])
    b = np.random.default_rng(4).normal(size=5)

    def matvec(t):
        y = jnp.asarray(a) @ jnp.concatenate([t["u"], t["w"].ravel()])
        return {"u": y[:2], "w": y[2:].reshape(3, 1)}

    tree_b = {"u": jnp.asarray(b[:2]), "w": jnp.asarray(b[2:]).reshape(3, 1)}
    res = cg(matvec, tree_b, rtol=1e-12, maxiter=20)
    x = np.concatenate([np.asarray(res.x["u"]), np.asarray(res.x["w"]).ravel()])
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-10)
    assert res.x["w"].shape == (3, 1)


# --------------------------------------------------------------- negative curvature

H_FIRST = np.diag([1.0, -3.0])  # b.Hb = -2 < 0 at once for b = (1, 1)
H_SECOND = np.diag([2.0, 1.0, -1.0])  # b.Hb = 2 > 0, then d1.H d1 < 0 for b = (1, 1, 1)


def test_negative_curvature_at_the_first_step():
    b = jnp.ones(2)
    last = cg(matvec_of(H_FIRST), b, atol=1e-12, maxiter=10, negative_curvature="last")
    steepest = cg(matvec_of(H_FIRST), b, atol=1e-12, maxiter=10, negative_curvature="steepest")
    for res in (last, steepest):
        assert int(res.status) == CGStatus.NEGATIVE_CURVATURE
        assert (int(res.matvecs), int(res.iterations)) == (1, 0)
        assert float(res.model) == 0.0
    np.testing.assert_array_equal(np.asarray(last.x), np.zeros(2))
    np.testing.assert_array_equal(np.asarray(steepest.x), np.ones(2))  # b = -grad q(0)


def test_negative_curvature_at_the_second_step_keeps_the_cauchy_point():
    b = np.ones(3)
    # The textbook second direction, and the precondition that it has negative curvature.
    x1 = (b @ b) / (b @ H_SECOND @ b) * b  # minimiser of q along b
    r1 = H_SECOND @ x1 - b
    d1 = -r1 + (r1 @ r1) / (b @ b) * b
    assert d1 @ H_SECOND @ d1 < 0
    res = cg(
        matvec_of(H_SECOND), jnp.asarray(b), atol=1e-12, maxiter=10, negative_curvature="steepest"
    )
    assert int(res.status) == CGStatus.NEGATIVE_CURVATURE
    assert (int(res.matvecs), int(res.iterations)) == (2, 1)
    np.testing.assert_allclose(np.asarray(res.x), x1, rtol=1e-14)
    np.testing.assert_allclose(float(res.model), quadratic(H_SECOND, b, x1), rtol=1e-14)


# --------------------------------------------------------------------------- Steihaug


def steihaug(h, g, radius, dtype=jnp.float64, maxiter=20):
    return cg(
        matvec_of(h, dtype),
        -jnp.asarray(g, dtype),
        atol=jnp.asarray(0.0, dtype),
        maxiter=maxiter,
        radius=radius,
        negative_curvature="boundary",
        test_start=False,
    )


def test_steihaug_identity_hessian_inside_and_on_the_boundary():
    g = np.array([3.0, -4.0])  # |g| = 5; the Newton step is -g
    inside = steihaug(np.eye(2), g, 6.0)
    np.testing.assert_allclose(np.asarray(inside.x), -g, rtol=1e-15)
    assert int(inside.status) == CGStatus.CONVERGED and int(inside.matvecs) == 1
    np.testing.assert_allclose(float(inside.model), -0.5 * 25.0, rtol=1e-15)

    radius = 2.0
    edge = steihaug(np.eye(2), g, radius)
    np.testing.assert_allclose(np.asarray(edge.x), -radius * g / 5.0, rtol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(edge.x)), radius, rtol=1e-15)
    assert int(edge.status) == CGStatus.BOUNDARY and int(edge.matvecs) == 1
    # m(p) - m(0) = g.p + |p|^2/2 = -radius |g| + radius^2/2
    np.testing.assert_allclose(float(edge.model), -radius * 5.0 + radius**2 / 2, rtol=1e-15)


def test_steihaug_negative_curvature_goes_to_the_boundary_along_the_direction():
    g = -np.ones(3)  # b = -g = (1, 1, 1): the second-step case above
    b = -g
    x1 = (b @ b) / (b @ H_SECOND @ b) * b
    r1 = H_SECOND @ x1 - b
    d1 = -r1 + (r1 @ r1) / (b @ b) * b
    radius = 10.0
    tau = max(np.roots([d1 @ d1, 2 * x1 @ d1, x1 @ x1 - radius**2]).real)
    p = x1 + tau * d1
    res = steihaug(H_SECOND, g, radius)
    assert int(res.status) == CGStatus.NEGATIVE_CURVATURE
    assert (int(res.matvecs), int(res.iterations)) == (2, 2)
    np.testing.assert_allclose(np.asarray(res.x), p, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(res.x)), radius, rtol=1e-12)
    np.testing.assert_allclose(float(res.model), g @ p + 0.5 * p @ H_SECOND @ p, rtol=1e-12)


def test_steihaug_first_step_negative_curvature_is_scaled_steepest_descent():
    g = np.array([-1.0, -1.0])
    res = steihaug(H_FIRST, g, 0.5)
    np.testing.assert_allclose(np.asarray(res.x), -0.5 * g / np.linalg.norm(g), rtol=1e-15)
    assert int(res.status) == CGStatus.NEGATIVE_CURVATURE


# ------------------------------------------------------------ dtypes and transformations


def test_float32():
    n = 6
    a = spd(n, np.linspace(1.0, 3.0, n))
    b = np.random.default_rng(5).normal(size=n)
    res = cg(matvec_of(a, jnp.float32), jnp.asarray(b, jnp.float32), rtol=1e-5, maxiter=30)
    assert res.x.dtype == jnp.float32 and res.model.dtype == jnp.float32
    assert res.matvecs.dtype == jnp.int32 and res.status.dtype == jnp.int32
    assert int(res.status) == CGStatus.CONVERGED
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    edge = steihaug(np.eye(2), np.array([3.0, -4.0]), 2.0, dtype=jnp.float32)
    assert edge.x.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(edge.x), [-1.2, 1.6], rtol=1e-6)


def test_jit_and_vmap_match_the_eager_solves():
    n = 6
    a = spd(n, np.linspace(1.0, 5.0, n))
    bs = np.random.default_rng(6).normal(size=(4, n))
    radii = np.array([0.1, 0.5, 2.0, 50.0])

    def one(b, radius):
        res = cg(
            matvec_of(a),
            b,
            atol=1e-10,
            maxiter=20,
            radius=radius,
            negative_curvature="boundary",
            test_start=False,
        )
        return res.x, res.matvecs, res.status

    batched = jax.jit(jax.vmap(one))(jnp.asarray(bs), jnp.asarray(radii))
    for i in range(4):
        eager = one(jnp.asarray(bs[i]), radii[i])
        np.testing.assert_allclose(np.asarray(batched[0][i]), np.asarray(eager[0]), rtol=1e-13)
        assert int(batched[1][i]) == int(eager[1]) and int(batched[2][i]) == int(eager[2])
    # The small radii stop on the boundary, the largest converges inside.
    assert int(batched[2][0]) == CGStatus.BOUNDARY and int(batched[2][-1]) == CGStatus.CONVERGED
    np.testing.assert_allclose(np.linalg.norm(np.asarray(batched[0][0])), 0.1, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(batched[0][-1]), np.linalg.solve(a, bs[-1]), rtol=1e-8)


def test_forward_mode_derivative_is_the_inverse_applied():
    """With three distinct eigenvalues CG's iterate is exactly A^-1 b for every b, so its
    derivative in b is A^-1 (jvp through the while loop)."""
    a = spd(10, [1.0] * 4 + [3.0] * 3 + [10.0] * 3)
    rng = np.random.default_rng(7)
    b, b_dot = rng.normal(size=10), rng.normal(size=10)
    _, x_dot = jax.jvp(
        lambda rhs: cg(matvec_of(a), rhs, rtol=1e-12, maxiter=20).x,
        (jnp.asarray(b),),
        (jnp.asarray(b_dot),),
    )
    np.testing.assert_allclose(np.asarray(x_dot), np.linalg.solve(a, b_dot), rtol=1e-8)


def test_invalid_arguments_are_named():
    mv, b = matvec_of(np.eye(2)), jnp.ones(2)
    with pytest.raises(ValueError, match="`negative_curvature` must be one of ignore"):
        cg(mv, b, rtol=1e-6, maxiter=5, negative_curvature="flip")
    with pytest.raises(ValueError, match="a trust `radius` goes with"):
        cg(mv, b, rtol=1e-6, maxiter=5, radius=1.0)
    with pytest.raises(ValueError, match="a trust `radius` goes with"):
        cg(mv, b, rtol=1e-6, maxiter=5, negative_curvature="boundary")
    with pytest.raises(ValueError, match="give `rtol`, `atol` or both"):
        cg(mv, b, maxiter=5)


def test_preconditioned_cg_counts_the_distinct_eigenvalues_of_m_h():
    # H = A D A^T-like with a spread spectrum; with M = H^-1 exactly, M H = I has one
    # eigenvalue: one product. With M = (H - E)^-1 for a rank-2 E, M H = I + rank 2 has at
    # most 3 distinct eigenvalues: at most 3 products (Nocedal & Wright, Theorem 5.4 applied
    # to the preconditioned system). The solution is numpy's in both cases.
    n = 12
    a = spd(n, np.geomspace(1.0, 1e4, n))
    b = np.random.default_rng(2).normal(size=n)
    expected = np.linalg.solve(a, b)
    exact = jnp.asarray(np.linalg.inv(a))
    res = cg(
        matvec_of(a), jnp.asarray(b), rtol=1e-10, maxiter=100, preconditioner=lambda r: exact @ r
    )
    assert int(res.matvecs) == 1 and int(res.status) == CGStatus.CONVERGED
    np.testing.assert_allclose(np.asarray(res.x), expected, rtol=1e-8)
    u = np.random.default_rng(3).normal(size=(n, 2))
    approx = jnp.asarray(np.linalg.inv(a + u @ u.T))
    res = cg(
        matvec_of(a), jnp.asarray(b), rtol=1e-10, maxiter=100, preconditioner=lambda r: approx @ r
    )
    plain = cg(matvec_of(a), jnp.asarray(b), rtol=1e-10, maxiter=100)
    assert int(res.matvecs) <= 3 < int(plain.matvecs)
    np.testing.assert_allclose(np.asarray(res.x), expected, rtol=1e-8)
    np.testing.assert_allclose(float(res.model), -0.5 * b @ expected, rtol=1e-10)


def test_a_preconditioner_goes_with_positive_definite_cg_only():
    with pytest.raises(ValueError, match="preconditioner"):
        cg(
            lambda v: v,
            jnp.ones(2),
            rtol=1e-6,
            maxiter=5,
            negative_curvature="last",
            preconditioner=lambda r: r,
        )


# ------------------------------------------------------------ singular systems

# H = diag(3, 3, 1, 0): singular along e_3. b_RANGE lies in the range, b_MIXED does not.
H_SINGULAR = np.diag([3.0, 3.0, 1.0, 0.0])
B_RANGE = np.array([1.0, 2.0, 3.0, 0.0])
B_MIXED = np.array([1.0, 2.0, 3.0, 4.0])


def test_singular_mode_converges_on_a_consistent_system_to_the_minimum_norm_solution():
    """From 0 on b in range(H), CG stays in the range: two distinct nonzero eigenvalues, two
    products, and the null component stays 0 (the minimum-norm solution)."""
    res = cg(
        matvec_of(H_SINGULAR),
        jnp.asarray(B_RANGE),
        rtol=1e-12,
        maxiter=40,
        negative_curvature="singular",
    )
    assert int(res.status) == CGStatus.CONVERGED and int(res.matvecs) == 2
    np.testing.assert_allclose(np.asarray(res.x), [1 / 3, 2 / 3, 3.0, 0.0], rtol=1e-12)


def test_singular_mode_stops_where_the_curvature_vanishes():
    """b along the null vector alone: d.Hd = 0 at the first product. Plain CG divides by it
    (NaN); "singular" stops there with the last iterate, x = 0."""
    b = jnp.asarray([0.0, 0.0, 0.0, 1.0])
    plain = cg(matvec_of(H_SINGULAR), b, rtol=1e-10, maxiter=40)
    assert np.isnan(np.asarray(plain.x)).all()
    res = cg(matvec_of(H_SINGULAR), b, rtol=1e-10, maxiter=40, negative_curvature="singular")
    assert int(res.status) == CGStatus.SINGULAR and int(res.matvecs) == 1
    assert int(res.iterations) == 0 and not np.any(np.asarray(res.x))
    # with a range component too, CG grows along the null vector until the curvature of
    # its direction is below eps times the largest seen
    mixed = cg(
        matvec_of(H_SINGULAR),
        jnp.asarray(B_MIXED),
        rtol=1e-10,
        maxiter=40,
        negative_curvature="singular",
    )
    assert int(mixed.status) == CGStatus.SINGULAR and int(mixed.matvecs) < 40


def test_cgls_is_the_pseudo_inverse_applied():
    """H^+ b for an inconsistent b (the null component is ignored), for a consistent one,
    and on a spread spectrum with a two-dimensional null space, against numpy's pinv."""
    for b in (B_MIXED, B_RANGE):
        res = cgls(matvec_of(H_SINGULAR), jnp.asarray(b), rtol=1e-12, maxiter=40)
        assert bool(res.converged)
        np.testing.assert_allclose(
            np.asarray(res.x), np.linalg.pinv(H_SINGULAR) @ b, rtol=1e-12, atol=1e-14
        )
    a = spd(8, [0.0, 0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0], seed=3)
    b = np.random.default_rng(8).normal(size=8)
    res = cgls(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=80)
    assert bool(res.converged) and int(res.matvecs) % 2 == 0
    np.testing.assert_allclose(
        np.asarray(res.x), np.linalg.pinv(a, rcond=1e-10) @ b, rtol=1e-9, atol=1e-12
    )


def test_cgls_zero_right_hand_side_costs_no_product_also_under_vmap():
    """The implicit adjoint calls it with b = 0 on the regular path: no product there, and
    under vmap a batch of zeros runs no iteration."""
    res = cgls(matvec_of(H_SINGULAR), jnp.zeros(4), rtol=1e-10, maxiter=40)
    assert int(res.matvecs) == 0 and not np.any(np.asarray(res.x))
    batched = jax.vmap(lambda b: cgls(matvec_of(H_SINGULAR), b, rtol=1e-10, maxiter=40))(
        jnp.zeros((3, 4))
    )
    assert not np.any(np.asarray(batched.matvecs))


def test_singular_mode_takes_a_preconditioner_and_names_the_modes():
    res = cg(
        matvec_of(H_SINGULAR),
        jnp.asarray(B_RANGE),
        rtol=1e-12,
        maxiter=40,
        negative_curvature="singular",
        preconditioner=lambda r: r / 2.0,
    )
    assert int(res.status) == CGStatus.CONVERGED
    np.testing.assert_allclose(np.asarray(res.x), [1 / 3, 2 / 3, 3.0, 0.0], rtol=1e-12)
    with pytest.raises(ValueError, match="goes with negative_curvature='ignore' or 'singular'"):
        cg(
            lambda v: v,
            jnp.ones(2),
            rtol=1e-6,
            maxiter=5,
            negative_curvature="boundary",
            radius=1.0,
            preconditioner=lambda r: r,
        )
