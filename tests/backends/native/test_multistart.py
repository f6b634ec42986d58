"""Multistart: starts sampled in the box, one vmapped solve, the best run, its derivative."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import qmc

import optsolve
from optsolve import Multistart, OptimizationProblem, ReturnCode, solve


def rastrigin(x, p):
    """Rastrigin shifted to p (its global minimum, 0, at x = p)."""
    z = x - p
    return 10.0 * z.size + jnp.sum(z**2 - 10.0 * jnp.cos(2.0 * jnp.pi * z))


# (dimension, box half-width, starts): the 5-D box holds 3^5 local minima
CASES = [(2, 5.12, 256), (5, 1.5, 2048)]


@pytest.mark.parametrize("n, half, n_starts", CASES)
def test_finds_rastrigins_global_minimum_where_one_start_does_not(n, half, n_starts):
    shift = jnp.full(n, 0.7)
    prob = OptimizationProblem(rastrigin, jnp.zeros(n), shift, bounds=(-half, half))
    single = solve(prob, optsolve.LBFGS())  # from the box's centre
    assert single.objective > 0.5
    sol = solve(prob, Multistart(optsolve.LBFGS(), n_starts, jax.random.key(0)))
    assert sol.retcode == ReturnCode.SUCCESS
    assert sol.objective < 1e-10
    np.testing.assert_allclose(sol.x, shift, atol=1e-6)


def test_the_best_run_is_the_lowest_objective_among_the_runs():
    prob = OptimizationProblem(
        rastrigin, jnp.zeros(2), jnp.array([0.7, -1.1]), bounds=(-5.12, 5.12)
    )
    sol = solve(prob, Multistart(optsolve.LBFGS(), 64, jax.random.key(3)))
    runs = sol.original
    objective, codes = np.asarray(runs.objective), np.asarray(runs.retcode)
    assert objective.shape == codes.shape == (64,)
    assert np.asarray(runs.x).shape == np.asarray(runs.starts).shape == (64, 2)
    success = codes == int(ReturnCode.SUCCESS)
    assert success.any()
    best = int(runs.best)
    assert objective[best] == objective[success].min()
    np.testing.assert_array_equal(sol.x, np.asarray(runs.x)[best])
    assert sol.objective == objective[best]
    assert sol.retcode == ReturnCode(int(codes[best]))
    assert sol.stats.iterations == int(runs.iterations[best])
    # the runs' evaluations together
    assert sol.stats.f_evals > 64 * int(np.min(runs.iterations))


def test_a_failed_run_is_never_preferred_to_a_successful_one():
    from optsolve.backends.native.multistart import _best

    objective = jnp.array([1.0, -5.0, jnp.nan, 2.0])
    codes = jnp.array(
        [
            int(ReturnCode.SUCCESS),
            int(ReturnCode.FAILURE),
            int(ReturnCode.FAILURE),
            int(ReturnCode.SUCCESS),
        ],
        jnp.int32,
    )
    assert int(_best(objective, codes)) == 0
    none_ok = jnp.full(4, int(ReturnCode.MAXITERS), jnp.int32)
    assert int(_best(objective, none_ok)) == 1


def _unit(sampler, key, n_starts, n):
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel())
    if sampler == "sobol":
        return qmc.Sobol(n, scramble=True, rng=rng).random_base2(int(np.log2(n_starts)))
    return qmc.LatinHypercube(n, rng=rng).random(n_starts)


@pytest.mark.parametrize("sampler", ["sobol", "latin", "uniform"])
def test_the_starts_are_the_samplers_points_scaled_to_the_box(sampler):
    key = jax.random.key(7)
    lower, upper = jnp.array([-1.0, 0.0, 2.0]), jnp.array([1.0, 4.0, 2.5])
    prob = OptimizationProblem(rastrigin, (lower + upper) / 2, 0.0, bounds=(lower, upper))
    sol = solve(prob, Multistart(optsolve.LBFGS(), 16, key, sampler=sampler), maxiters=1)
    if sampler == "uniform":
        unit = jax.random.uniform(key, (16, 3), dtype=jnp.float64)
    else:
        unit = _unit(sampler, key, 16, 3)
    np.testing.assert_allclose(
        sol.original.starts, lower + unit * (upper - lower), rtol=1e-15, atol=1e-15
    )


def test_starts_keep_x0s_structure():
    def f(x, p):
        return rastrigin(jnp.concatenate([x["a"], x["b"]]), p)

    x0 = {"a": jnp.zeros(1), "b": jnp.zeros(1)}
    prob = OptimizationProblem(f, x0, 0.7, bounds=(-2.0, 2.0))
    sol = solve(prob, Multistart(optsolve.LBFGS(), 32, jax.random.key(1)))
    assert set(sol.x) == {"a", "b"} and sol.original.starts["a"].shape == (32, 1)
    np.testing.assert_allclose(sol.objective, 0.0, atol=1e-10)


def test_jit_of_the_whole_solve_and_vmap_over_p():
    prob = OptimizationProblem(
        rastrigin, jnp.zeros(2), jnp.array([0.7, -1.1]), bounds=(-5.12, 5.12)
    )
    alg = Multistart(optsolve.LBFGS(), 64, jax.random.key(0))
    eager = solve(prob, alg)

    @jax.jit
    def run(p, key):
        sol = solve(prob.replace(p=p), alg.replace(key=key))
        return sol.x, sol.objective, sol.original.objective

    x, _f, fs = run(prob.p, jax.random.key(0))
    np.testing.assert_allclose(x, eager.x, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fs, eager.original.objective, rtol=1e-12, atol=1e-14)
    xs = jax.vmap(lambda p: solve(prob.replace(p=p), alg).x)(jnp.stack([prob.p, prob.p]))
    np.testing.assert_allclose(xs, np.stack([eager.x] * 2), rtol=1e-12, atol=1e-14)


def shifted_bowl(x, p):
    """Rastrigin around p[:2], with a bowl of weight p[2]: x* and f* both move with p."""
    return rastrigin(x, p[:2]) + p[2] * jnp.sum(x**2)


def test_gradient_with_respect_to_p_is_finite_differences_at_the_best_run():
    p0 = jnp.array([0.7, -1.1, 0.3])
    prob = OptimizationProblem(shifted_bowl, jnp.zeros(2), p0, bounds=(-5.12, 5.12))
    alg = Multistart(optsolve.LBFGS(), 128, jax.random.key(0))

    def objective(p):
        return solve(prob.replace(p=p), alg, gtol=1e-12).objective

    def first(p):
        return solve(prob.replace(p=p), alg, gtol=1e-12).x[0]

    sol = solve(prob, alg, gtol=1e-12)
    grad = jax.grad(objective)(p0)
    # the gradient at the best run's solution (envelope theorem: x* does not move f*)
    np.testing.assert_allclose(grad, jax.grad(shifted_bowl, argnums=1)(sol.x, p0), rtol=1e-8)
    eps = 1e-5
    for fn, g in ((objective, grad), (first, jax.grad(first)(p0))):
        fd = [(fn(p0 + eps * e) - fn(p0 - eps * e)) / (2 * eps) for e in np.eye(3)]
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


def test_inner_algorithms_without_bounds_and_from_optax():
    prob = OptimizationProblem(rastrigin, jnp.zeros(2), 0.7, bounds=(-3.0, 3.0))
    key = jax.random.key(0)
    newton = solve(prob, Multistart(optsolve.Newton(), 64, key))
    np.testing.assert_allclose(newton.objective, 0.0, atol=1e-10)
    adam = solve(prob, Multistart(optsolve.Adam(0.01), 64, key), maxiters=2000, gtol=1e-6)
    np.testing.assert_allclose(adam.objective, 0.0, atol=1e-8)


@pytest.mark.parametrize(
    "make, error, pattern",
    [
        (
            lambda: Multistart(optsolve.ScipyMinimize("BFGS"), 8, jax.random.key(0)),
            TypeError,
            r"Multistart: `algorithm` must be a JAX-native algorithm .* got .*BFGS.* "
            r"Use one of: .*LBFGS",
        ),
        (
            lambda: Multistart(optsolve.Brent(), 8, jax.random.key(0)),
            TypeError,
            r"`algorithm` must be a JAX-native algorithm that iterates from a start .* got Brent",
        ),
        (
            lambda: Multistart(
                Multistart(optsolve.LBFGS(), 2, jax.random.key(0)), 8, jax.random.key(0)
            ),
            TypeError,
            r"got Multistart",
        ),
        (
            lambda: Multistart(optsolve.LBFGS(), 0, jax.random.key(0)),
            ValueError,
            r"`n_starts` must be an integer >= 1, got 0",
        ),
        (lambda: Multistart(optsolve.LBFGS(), 8, 0), TypeError, r"`key` must be a jax.random key"),
        (
            lambda: Multistart(optsolve.LBFGS(), 8, jax.random.key(0), sampler="halton"),
            ValueError,
            r"`sampler` must be one of 'sobol', 'uniform', 'latin', got 'halton'",
        ),
    ],
)
def test_construction_errors(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


@pytest.mark.parametrize("bounds", [None, (-jnp.inf, 1.0)])
def test_a_box_is_required(bounds):
    prob = OptimizationProblem(rastrigin, jnp.zeros(2), 0.0, bounds=bounds)
    with pytest.raises(ValueError, match="Multistart samples its starts in the problem's box"):
        solve(prob, Multistart(optsolve.LBFGS(), 8, jax.random.key(0)))
