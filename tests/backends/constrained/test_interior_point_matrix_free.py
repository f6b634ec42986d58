"""optsolve.InteriorPoint with its matrix-free Newton system (MINRES on products, the
curvature test in place of the inertia), against closed forms and published minima.

References: the Euclidean projection onto the probability simplex, whose closed form is the
threshold of Held, Wolfe & Crowder (Math. Programming 6, 1974) as written by Duchi et al.
(ICML 2008, Fig. 1); the minimum of a linear function on the unit ball (``-a/|a|``); a
concave quadratic on a box (its best corner, worked by hand). Hock & Schittkowski's
published minima with ``linear_solver="minres"`` are in
tests/backends/constrained/test_interior_point.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve
from optsolve.backends.constrained.interior_point import DENSE_KKT_SIZE, InteriorPointSolver

jax.config.update("jax_enable_x64", True)

# the auto choice: matrix-free on every problem below (n + m > 256)
AUTO = optsolve.InteriorPoint(tol=1e-10)


def simplex_projection(a: np.ndarray) -> np.ndarray:
    """The closed form: x = max(a - tau, 0), tau from the sorted entries."""
    u = np.sort(a)[::-1]
    sums = np.cumsum(u) - 1.0
    rho = np.nonzero(u - sums / np.arange(1, a.size + 1) > 0)[0][-1]
    return np.maximum(a - sums[rho] / (rho + 1), 0.0)


def _squared_distance(x, p):
    return 0.5 * jnp.sum((x - p) ** 2)


def _total(x, p):
    return jnp.sum(x)


def simplex(a, dtype=jnp.float64) -> OptimizationProblem:
    n = a.shape[-1]
    return OptimizationProblem(
        _squared_distance,
        jnp.full(n, 1.0 / n, dtype),
        jnp.asarray(a, dtype),
        bounds=(0.0, None),
        constraints=[Constraint(_total, lower=1.0, upper=1.0)],
    )


def _targets(n: int, seed: int = 0) -> np.ndarray:
    """Half the points well above the threshold, half well below (no entry within
    rounding of it: there IPOPT's tolerance on complementarity, x_i z_i ~ tol, would
    leave x_i off by about tol / x_i)."""
    i = np.arange(n // 2)
    above = 2.0 / n * (1.0 + 0.5 * np.sin(i + seed))
    below = -0.05 * (1.0 + 0.5 * np.cos(np.arange(n - n // 2) + seed))
    return np.random.default_rng(seed).permutation(np.concatenate([above, below]))


def test_auto_is_matrix_free_above_the_threshold():
    small, large = simplex(_targets(10)), simplex(_targets(DENSE_KKT_SIZE))
    assert InteriorPointSolver(AUTO, small).dense
    assert not InteriorPointSolver(AUTO, large).dense  # n + m = 257
    assert InteriorPointSolver(optsolve.InteriorPoint(linear_solver="dense"), large).dense
    assert optsolve.InteriorPoint().capabilities()["dense_matrices"] == 0
    assert optsolve.InteriorPoint(linear_solver="dense").capabilities()["dense_matrices"] == 3


def test_simplex_projection_of_500_points_matches_the_closed_form():
    a = _targets(500)
    sol = solve(simplex(a), AUTO)  # auto: matrix-free here
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    expected = simplex_projection(a)
    assert 0 < np.sum(expected > 0) < a.size  # some bounds active, some not
    np.testing.assert_allclose(sol.x, expected, atol=1e-6)
    np.testing.assert_allclose(sol.objective, 0.5 * np.sum((expected - a) ** 2), rtol=1e-6)
    # the equality's multiplier is the threshold tau: x - a + tau = z_L at the optimum,
    # and -tau = df*/d(the sum's bound) (optsolve's sign)
    tau = np.mean(a[expected > 0] - expected[expected > 0])
    np.testing.assert_allclose(np.asarray(sol.multipliers[0]), tau, atol=1e-8)


def test_a_linear_objective_on_the_unit_ball_of_400_dimensions():
    n = 400
    prob = OptimizationProblem(
        _total, jnp.zeros(n), None, constraints=[Constraint(lambda x, p: jnp.sum(x**2), upper=1.0)]
    )
    sol = solve(prob, AUTO)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, np.full(n, -1.0 / np.sqrt(n)), rtol=1e-6)
    np.testing.assert_allclose(sol.objective, -np.sqrt(n), rtol=1e-8)


def test_negative_curvature_is_corrected_without_an_inertia():
    """-|x|^2 on [-1, 2]^300 from 0.5: W = -2 I everywhere, so every step needs delta_w;
    the best corner is x = 2 (f* = -1200)."""
    n = 300
    prob = OptimizationProblem(
        lambda x, p: -jnp.sum(x**2), jnp.full(n, 0.5), None, bounds=(-1.0, 2.0)
    )
    sol = solve(prob, AUTO)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, np.full(n, 2.0), rtol=1e-7)
    np.testing.assert_allclose(sol.objective, -4.0 * n, rtol=1e-8)


def test_jit_and_vmap_equal_the_closed_forms():
    a = np.stack([_targets(300, seed) for seed in range(3)])

    def projected(target):
        return solve(simplex(target), AUTO).x

    batch = jax.jit(jax.vmap(projected))(jnp.asarray(a))
    for row, target in zip(np.asarray(batch), a):
        np.testing.assert_allclose(row, simplex_projection(target), atol=1e-6)


def test_float32():
    a = _targets(300)
    sol = solve(simplex(a, jnp.float32), optsolve.InteriorPoint())  # tol 1e-5
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert sol.x.dtype == jnp.float32
    # tol = 1e-5 ends with mu ~ 1e-6, so x_i z_i ~ 1e-6 on the positive entries
    # (x_i ~ 5e-3): z_i up to ~3e-4 there, and x_i off by as much
    expected = simplex_projection(a)
    np.testing.assert_allclose(sol.x, expected, atol=5e-4)
    np.testing.assert_allclose(sol.objective, 0.5 * np.sum((expected - a) ** 2), rtol=3e-3)


def test_resume_continues_the_run():
    prob = simplex(_targets(300))
    whole = solve(prob, AUTO)
    first = solve(prob, AUTO, maxiters=4)
    rest = solve(prob, AUTO, resume=first)
    assert rest.retcode == ReturnCode.SUCCESS, rest.message
    assert rest.stats.iterations == whole.stats.iterations  # counted from the start
    np.testing.assert_allclose(rest.x, whole.x, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rest.state.y, whole.state.y, rtol=1e-12, atol=1e-14)


def test_a_bad_linear_solver_is_named():
    with pytest.raises(
        ValueError, match="linear_solver.*'auto', 'dense', 'condensed', 'minres'.*'lu'"
    ):
        optsolve.InteriorPoint(linear_solver="lu")
