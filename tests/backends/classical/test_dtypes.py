"""16-bit floats, mixed precision and JAX's strict configurations, on the JAX-native methods.

The contract matrix (tests/contract/test_contract.py) runs the shared rules on every class; these
are the defects found there one by one: a bfloat16 x0 whose objective is float32 (mixed
precision: the line searches' loops mixed the two), a gradient descent that wandered at
rounding level until maxiters, float16 Hessian products that overflowed in CG, L-BFGS's
compact memory under ``jax_numpy_rank_promotion='raise'`` and optax under strict promotion.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

LINE_SEARCH_METHODS = [
    optsolve.GradientDescent,
    optsolve.NonlinearCG,
    optsolve.LBFGS,
    optsolve.BFGS,
    optsolve.Newton,
]


def _bowl32(x, p):
    """A convex bowl in float32 of a bfloat16 x: the mixed-precision idiom (16-bit
    parameters, a float32 loss), written for strict promotion (every cast explicit)."""
    z = x.astype(jnp.float32) - 1.0
    return jnp.sum(p * z**2 + z**4)


@pytest.mark.parametrize(
    "cls", LINE_SEARCH_METHODS + [optsolve.TrustRegion], ids=lambda c: c.__name__
)
def test_a_bfloat16_x_with_a_float32_objective(cls):
    x0 = jnp.array([-1.2, 3.0], jnp.bfloat16)
    prob = OptimizationProblem(_bowl32, x0, jnp.array([1.0, 4.0], jnp.float32))
    with jax.numpy_dtype_promotion("strict"):
        sol = solve(prob, cls(), maxiters=60)
    assert sol.x.dtype == jnp.bfloat16 and sol.objective.dtype == jnp.float32
    assert sol.retcode in (ReturnCode.SUCCESS, ReturnCode.STALLED), sol.message
    # bfloat16 has 8 bits of mantissa: the minimiser (1, 1) to a few of its units
    np.testing.assert_allclose(np.asarray(sol.x, np.float32), [1.0, 1.0], atol=0.1)
    # XLA keeps x + a d in float32 where its bfloat16 rounding feeds straight into a float32
    # f (its default xla_allow_excess_precision): f recomputed at the rounded x differs by
    # about |g| times half a unit of x
    np.testing.assert_allclose(sol.objective, _bowl32(sol.x, prob.p), rtol=0.02, atol=1e-3)


def test_gradient_descent_in_bfloat16_stalls_instead_of_wandering_until_maxiters():
    # Near the minimiser (0, 0) f is 2 within bfloat16's rounding: the steps move x about
    # the minimiser without any decrease of f or of the gradient
    f = lambda x, p: jnp.sum(jnp.exp(x) - x)
    prob = OptimizationProblem(f, jnp.array([3.0, -2.0], jnp.bfloat16))
    sol = solve(prob, optsolve.GradientDescent(), maxiters=50)
    assert sol.retcode == ReturnCode.STALLED, sol.message
    assert sol.stats.iterations < 30
    np.testing.assert_allclose(np.asarray(sol.x, np.float32), [0.0, 0.0], atol=0.1)


@pytest.mark.parametrize("cls", LINE_SEARCH_METHODS, ids=lambda c: c.__name__)
def test_the_stall_rule_leaves_float64_runs_to_converge(cls):
    """The stall rule is the same in every dtype: it never cuts a float64 run short (it
    needs iterations without progress), which still reaches the minimiser."""
    scales = jnp.logspace(0.0, 2.0, 4)
    f = lambda x, p: 1.0 + jnp.sum(scales * (x - 1.0) ** 2 + (x - 1.0) ** 4)
    sol = solve(OptimizationProblem(f, jnp.zeros(4)), cls(), maxiters=5000)
    assert sol.retcode in (ReturnCode.SUCCESS, ReturnCode.STALLED), sol.message
    np.testing.assert_allclose(sol.x, np.ones(4), atol=1e-6)


def test_the_trust_region_in_float16_does_not_overflow():
    # g.g is 5.4e4 and g.Hg 7e7 at x0, beyond float16's 65504: Steihaug-CG on the unscaled
    # system gave NaN, and the trust region sat at x0 until maxiters
    f = lambda x, p: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
    prob = OptimizationProblem(f, jnp.array([-1.2, 1.0], jnp.float16))
    sol = solve(prob, optsolve.TrustRegion(), maxiters=100)
    assert sol.retcode in (ReturnCode.SUCCESS, ReturnCode.STALLED), sol.message
    assert sol.x.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(sol.x, np.float32), [1.0, 1.0], atol=0.05)


def test_newton_in_float16_takes_newton_steps():
    # g.g = 1.5e6 overflows float16: CG gave a NaN direction, and the steepest descent it
    # fell back on a first step 1/|g|_2 = 0; on this quadratic the Newton step is exact
    f = lambda x, p: jnp.sum(jnp.array([100.0, 50.0], jnp.float16) * (x - 1.0) ** 2)
    prob = OptimizationProblem(f, jnp.array([6.0, -6.0], jnp.float16))
    sol = solve(prob, optsolve.Newton(), maxiters=100)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert sol.stats.iterations <= 2
    np.testing.assert_allclose(np.asarray(sol.x, np.float32), [1.0, 1.0], atol=1e-2)


def test_lbfgs_compact_memory_under_rank_promotion_raise():
    # n = 20: the compact (2, m, n) memory times an n-vector broadcast implicitly
    f = lambda x, p: jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
    prob = OptimizationProblem(f, jnp.zeros(20), 10.0)
    run = lambda p: solve(prob.replace(p=p), optsolve.LBFGS(), maxiters=5).x
    plain = jax.vmap(run)(jnp.array([10.0, 20.0]))
    with jax.numpy_rank_promotion("raise"):
        strict = jax.vmap(run)(jnp.array([10.0, 20.0]))
    np.testing.assert_allclose(strict, plain, rtol=1e-12)


@pytest.mark.parametrize(
    "make",
    [lambda: optsolve.Adam(0.1), lambda: optsolve.Adafactor(0.1), lambda: optsolve.OptaxLBFGS()],
    ids=["Adam", "Adafactor", "OptaxLBFGS"],
)
def test_optax_runs_under_strict_dtype_promotion(make):
    """optax computes ``b1 ** count`` with an int32 count (and float32 constants) that strict
    promotion refuses with optsolve's traced hyperparameters: optsolve runs optax's own
    arithmetic under standard promotion, the user's f under the user's setting."""
    f = lambda x, p: jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
    prob = OptimizationProblem(f, jnp.array([-1.2, 1.0]), 10.0)
    plain = solve(prob, make(), maxiters=5)
    with jax.numpy_dtype_promotion("strict"):
        strict = solve(prob, make(), maxiters=5)
    np.testing.assert_allclose(strict.x, plain.x, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dense_least_squares_refuse_16_bit_floats_before_running(dtype):
    r = lambda x, p: jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])
    prob = optsolve.LeastSquaresProblem(r, jnp.array([-1.2, 1.0], dtype))
    for alg in (optsolve.GaussNewton(), optsolve.LevenbergMarquardt()):
        with pytest.raises(
            TypeError,
            match=f"{type(alg).__name__} cannot compute in {dtype}.*takes float32, float64.*LBFGS",
        ):
            solve(prob, alg, maxiters=5)
