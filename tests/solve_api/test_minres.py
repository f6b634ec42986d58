"""MINRES (optsolve.solve_api.linear_solve.minres) against references that do not come from
it: numpy's dense solve and least-squares solve, the true residual ``|b - A x|`` computed
from the iterate, and scipy.sparse.linalg.minres (Paige & Saunders' own recurrences, whose
k-th iterate is the same Krylov-space minimiser as ours).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse.linalg as spla

from optsolve.solve_api.linear_solve import minres
from optsolve.solve_api.loops import CheckpointedScan

jax.config.update("jax_enable_x64", True)


def indefinite(n, seed=0):
    """A = Q diag(eig) Q^T with eigenvalues of both signs, |eig| in [1, 4] (cond <= 4)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    eig = rng.uniform(1.0, 4.0, n) * np.where(np.arange(n) % 2, 1.0, -1.0)
    return q @ np.diag(eig) @ q.T, rng.normal(size=n)


def kkt(seed=0):
    """[[H, J^T], [J, -D]]: H SPD (30x30), J (10x30) full rank, D small positive diagonal."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(30, 30))
    h = g @ g.T / 30 + np.eye(30)
    j = rng.normal(size=(10, 30))
    d = np.diag(rng.uniform(1e-4, 1e-2, 10))
    return np.block([[h, j.T], [j, -d]]), rng.normal(size=40)


def badly_scaled(n=30, seed=0):
    """S A0 S with A0 indefinite and diagonally dominant-ish (diagonal +-[1, 3], a symmetric
    perturbation of 2-norm 0.5, so eigenvalues are bounded away from 0) and S spanning
    1e-2..1e2: the diagonal spans about 1e-4..1e4 and cond(A) is about 1e8."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(n, n))
    e = (e + e.T) / 2
    e *= 0.5 / np.linalg.norm(e, 2)
    a0 = np.diag(rng.uniform(1.0, 3.0, n) * np.where(np.arange(n) % 2, 1.0, -1.0)) + e
    s = np.logspace(-2, 2, n)
    rng.shuffle(s)
    return s[:, None] * a0 * s[None, :], rng.normal(size=n)


def matvec_of(a, dtype=jnp.float64):
    a = jnp.asarray(a, dtype)
    return lambda v: a @ v


def relative_error(x, expected):
    return np.linalg.norm(np.asarray(x) - expected) / np.linalg.norm(expected)


def scipy_iterates(a, b, *, rtol, maxiter, m=None):
    """scipy's MINRES iterates x_1, x_2, ... (one per product) and its own final answer."""
    iterates = []
    x, info = spla.minres(
        a, b, rtol=rtol, maxiter=maxiter, M=m, callback=lambda xk: iterates.append(np.array(xk))
    )
    return iterates, x, info


@pytest.mark.parametrize("n", [5, 40])
def test_indefinite_system_matches_numpy_float64(n):
    a, b = indefinite(n, seed=n)
    assert np.linalg.eigvalsh(a).min() < 0 < np.linalg.eigvalsh(a).max()
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=10 * n)
    assert res.x.dtype == jnp.float64
    assert bool(res.converged)
    assert relative_error(res.x, np.linalg.solve(a, b)) <= 1e-10
    # the estimate is the true relative residual
    true = np.linalg.norm(b - a @ np.asarray(res.x)) / np.linalg.norm(b)
    assert float(res.residual) <= 1e-12 and true <= 1e-11
    assert 0 < int(res.matvecs) <= 10 * n


@pytest.mark.parametrize("n", [5, 40])
def test_indefinite_system_matches_numpy_float32(n):
    a, b = indefinite(n, seed=n)
    res = minres(matvec_of(a, jnp.float32), jnp.asarray(b, jnp.float32), rtol=1e-5, maxiter=10 * n)
    assert res.x.dtype == jnp.float32 and res.residual.dtype == jnp.float32
    assert bool(res.converged) and float(res.residual) <= 1e-5
    # cond(A) <= 4: error <= 4 * 1e-5, plus float32 rounding
    assert relative_error(res.x, np.linalg.solve(a, b)) <= 1e-4


def test_kkt_system_matches_numpy():
    k, b = kkt()
    assert np.linalg.eigvalsh(k).min() < 0  # indefinite: CG's d.Hd > 0 would not hold
    res = minres(matvec_of(k), jnp.asarray(b), rtol=1e-12, maxiter=400)
    assert bool(res.converged)
    assert relative_error(res.x, np.linalg.solve(k, b)) <= 1e-10


def test_diagonal_preconditioner_on_badly_scaled_system():
    a, b = badly_scaled()
    diag = np.abs(np.diag(a))
    assert diag.min() < 1e-3 and diag.max() > 1e3
    inverse_diag = jnp.asarray(1.0 / diag)
    maxiter = 300
    plain = minres(matvec_of(a), jnp.asarray(b), rtol=1e-10, maxiter=maxiter)
    pre = minres(
        matvec_of(a),
        jnp.asarray(b),
        rtol=1e-10,
        maxiter=maxiter,
        preconditioner=lambda v: inverse_diag * v,
    )
    assert bool(pre.converged)
    assert int(pre.matvecs) < int(plain.matvecs)
    assert int(pre.matvecs) <= 40
    expected = np.linalg.solve(a, b)
    assert relative_error(pre.x, expected) <= 1e-8
    # residual is in the preconditioner's norm: |r|_M / |b|_M with M = diag(1/|a_ii|)
    r = b - a @ np.asarray(pre.x)
    m_norm = lambda v: np.sqrt(v @ (np.asarray(inverse_diag) * v))
    np.testing.assert_allclose(float(pre.residual), m_norm(r) / m_norm(b), rtol=1e-3)


@pytest.mark.parametrize("case", ["indefinite40", "kkt", "preconditioned"])
def test_iterates_and_product_count_agree_with_scipy(case):
    """Our iterate after k products is scipy's k-th iterate, and we stop where scipy's
    iterates first meet our test. scipy's own stopping test is ``phibar <= rtol |A| |x|``
    (|A| a Frobenius estimate of T_k), not ``phibar <= rtol |b|``, so scipy run at the same
    rtol stops earlier (0-4 iterations on random well-conditioned systems, 8 on the
    preconditioned one); the count is compared at the same residual instead, read from
    scipy's iterates, and, without a preconditioner, with scipy's own stop at the same rtol
    too."""
    m = None
    preconditioner = None
    if case == "indefinite40":
        a, b = indefinite(40, seed=3)
    elif case == "kkt":
        a, b = kkt(seed=1)
    else:
        a, b = badly_scaled(seed=2)
        inverse_diag = 1.0 / np.abs(np.diag(a))
        m = spla.LinearOperator(a.shape, matvec=lambda v: inverse_diag * v, dtype=np.float64)
        preconditioner = lambda v: jnp.asarray(inverse_diag) * v
    norm = np.linalg.norm if m is None else (lambda v: np.sqrt(v @ (inverse_diag * v)))
    rtol, maxiter = 1e-8, 400
    res = minres(
        matvec_of(a), jnp.asarray(b), rtol=rtol, maxiter=maxiter, preconditioner=preconditioner
    )
    assert bool(res.converged)

    # scipy to a much tighter tolerance: its iterates past where we stop
    iterates, _, _ = scipy_iterates(a, b, rtol=1e-15, maxiter=maxiter, m=m)
    for k in (1, 2, 5, int(res.matvecs) // 2):
        ours = minres(
            matvec_of(a), jnp.asarray(b), rtol=rtol, maxiter=k, preconditioner=preconditioner
        )
        assert int(ours.matvecs) == k
        assert relative_error(ours.x, iterates[k - 1]) <= 1e-9
        np.testing.assert_allclose(
            float(ours.residual), norm(b - a @ iterates[k - 1]) / norm(b), rtol=1e-6
        )
    first = next(k for k, x in enumerate(iterates, 1) if norm(b - a @ x) <= rtol * norm(b))
    assert abs(int(res.matvecs) - first) <= 2

    if m is not None:
        # scipy's |x| in its test is the 2-norm of the unscaled x (1e4 here), so at the same
        # rtol it stops 8 iterations early on this system: no like-for-like count there
        return
    # scipy at the same rtol: its earlier stop (3 iterations earlier on the KKT system);
    # the same answer
    same_rtol, x_scipy, info = scipy_iterates(a, b, rtol=rtol, maxiter=maxiter, m=m)
    assert info == 0
    assert 0 <= int(res.matvecs) - len(same_rtol) <= 4
    expected = np.linalg.solve(a, b)
    assert relative_error(x_scipy, expected) <= 1e-6
    assert relative_error(res.x, x_scipy) <= 1e-6


def test_jit_and_vmap_over_right_hand_sides():
    a, _ = indefinite(12, seed=7)
    rhs = np.random.default_rng(8).normal(size=(4, 12))
    rhs[2] = 0.0  # a zero row: stops at once while the others run on
    solve = jax.jit(lambda bb, tol: minres(matvec_of(a), bb, rtol=tol, maxiter=50))
    batched = jax.vmap(solve, in_axes=(0, None))(jnp.asarray(rhs), 1e-10)
    for i, bi in enumerate(rhs):
        single = solve(jnp.asarray(bi), 1e-10)
        np.testing.assert_allclose(
            np.asarray(batched.x[i]), np.asarray(single.x), rtol=1e-12, atol=1e-14
        )
        assert int(batched.matvecs[i]) == int(single.matvecs)
        assert bool(batched.converged[i]) == bool(single.converged)
        # the batched product rounds differently: residuals agree to rounding of |b|
        np.testing.assert_allclose(
            float(batched.residual[i]), float(single.residual), rtol=1e-6, atol=1e-15
        )
        if i != 2:
            np.testing.assert_allclose(np.asarray(single.x), np.linalg.solve(a, bi), rtol=1e-8)
    assert int(batched.matvecs[2]) == 0 and not np.any(np.asarray(batched.x[2]))
    assert np.all(np.isfinite(np.asarray(batched.x)))


def test_vmap_over_matrices_and_right_hand_sides():
    mats, rhs = zip(*(indefinite(8, seed=s) for s in range(3)))
    mats, rhs = np.stack(mats), np.stack(rhs)

    def solve(a, bb):
        return minres(lambda v: a @ v, bb, rtol=1e-11, maxiter=40)

    batched = jax.jit(jax.vmap(solve))(jnp.asarray(mats), jnp.asarray(rhs))
    assert np.all(np.asarray(batched.converged))
    for i in range(3):
        single = solve(jnp.asarray(mats[i]), jnp.asarray(rhs[i]))
        np.testing.assert_allclose(
            np.asarray(batched.x[i]), np.asarray(single.x), rtol=1e-12, atol=1e-14
        )
        assert int(batched.matvecs[i]) == int(single.matvecs)
        np.testing.assert_allclose(
            np.asarray(batched.x[i]), np.linalg.solve(mats[i], rhs[i]), rtol=1e-9
        )


def test_inside_checkpointed_scan():
    """Under CheckpointedScan the loop is a bounded scan (inner_while_loop): same answer."""
    a, b = indefinite(10, seed=4)

    def solve(bb):
        return minres(matvec_of(a), bb, rtol=1e-10, maxiter=30)

    direct = solve(jnp.asarray(b))
    scanned = CheckpointedScan(1)(
        lambda c: c[1] == 0, lambda c: (solve(c[0]).x, c[1] + 1), (jnp.asarray(b), 0)
    )[0]
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(direct.x), rtol=1e-12)


@pytest.mark.parametrize("preconditioned", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_zero_right_hand_side(preconditioned, dtype):
    a, _ = indefinite(6)
    res = minres(
        matvec_of(a, dtype),
        jnp.zeros(6, dtype),
        rtol=1e-8,
        maxiter=20,
        preconditioner=(lambda v: 2.0 * v) if preconditioned else None,
    )
    assert not np.any(np.asarray(res.x)) and res.x.dtype == dtype
    assert int(res.matvecs) == 0 and bool(res.converged) and float(res.residual) == 0.0


def test_maxiter_reached():
    a, b = indefinite(40, seed=5)
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=5)
    assert not bool(res.converged)
    assert int(res.matvecs) == 5
    true = np.linalg.norm(b - a @ np.asarray(res.x)) / np.linalg.norm(b)
    np.testing.assert_allclose(float(res.residual), true, rtol=1e-8)
    assert float(res.residual) > 1e-12


def test_rtol_one_costs_nothing():
    a, b = indefinite(5)
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1.0, maxiter=10)
    assert int(res.matvecs) == 0 and bool(res.converged) and not np.any(np.asarray(res.x))


def test_singular_consistent_system_gives_minimum_norm_solution():
    """A zero row/column pair with b zero there (a variable the system ignores), and a
    singular A with a rotated null space and b in its range: the Krylov space stays in the
    range, so MINRES from 0 converges to the minimum-norm solution, numpy's lstsq."""
    a, b = indefinite(9, seed=6)
    a[4, :] = 0.0
    a[:, 4] = 0.0
    b[4] = 0.0
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=60)
    x = np.asarray(res.x)
    assert np.all(np.isfinite(x)) and bool(res.converged)
    expected = np.linalg.lstsq(a, b, rcond=None)[0]
    assert relative_error(x, expected) <= 1e-10
    assert x[4] == 0.0

    rng = np.random.default_rng(9)
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    eig = np.array([-3.0, -2.0, -1.5, -1.0, 0.0, 0.0, 1.0, 2.0, 2.5, 4.0])
    a = q @ np.diag(eig) @ q.T
    b = a @ rng.normal(size=10)  # in the range
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1e-12, maxiter=60)
    assert np.all(np.isfinite(np.asarray(res.x))) and bool(res.converged)
    assert relative_error(res.x, np.linalg.pinv(a) @ b) <= 1e-9


def test_breakdown_on_exhausted_krylov_space():
    """b an eigenvector: the first Lanczos step gives beta = 0 exactly, which ends the loop
    after one product with the exact answer; no division by the zero beta leaks a NaN."""
    a = np.diag([2.0, -1.0, 3.0, 5.0, -4.0])
    b = np.array([0.0, 4.0, 0.0, 0.0, 0.0])  # a power of 2: alpha / beta is exact
    res = minres(matvec_of(a), jnp.asarray(b), rtol=0.0, maxiter=20)
    assert int(res.matvecs) == 1
    assert bool(res.converged) and float(res.residual) == 0.0
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.solve(a, b), rtol=1e-15)

    # b in a 3-dimensional invariant subspace: beta is rounding after 3 products, not 0
    b = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1e-14, maxiter=20)
    assert int(res.matvecs) <= 4 and bool(res.converged)
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.solve(a, b), rtol=1e-13, atol=1e-15)


def test_breakdown_on_inconsistent_singular_system():
    """b in A's null space: A v_1 = 0, so alpha = beta = 0 and the rotation's gamma is 0
    (T_1 = [0] singular). The minimum residual over the Krylov space is |b|, at x = 0
    (numpy's lstsq); MINRES stops there, not converged, with no NaN."""
    a = np.diag([0.0, 1.0, -2.0])
    b = np.array([2.0, 0.0, 0.0])
    res = minres(matvec_of(a), jnp.asarray(b), rtol=1e-10, maxiter=20)
    assert int(res.matvecs) == 1 and not bool(res.converged)
    np.testing.assert_allclose(np.asarray(res.x), np.linalg.lstsq(a, b, rcond=None)[0])
    assert float(res.residual) == 1.0
