"""Maximisation (``sense="max"``) and auxiliary outputs (``has_aux=True``) beyond the
contract rule that runs them on every algorithm (tests/contract/test_contract.py): derivatives,
multipliers, a user gradient, training on data and bad input. References are closed forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve


def _concave(x, p):
    return 3.0 - jnp.sum((x - p) ** 2)


def test_the_optimal_value_and_its_derivative_are_the_maximums():
    # max 3 - |x - p|^2: x* = p, f* = 3, df*/dp = 0 and dx*/dp = 1
    prob = OptimizationProblem(_concave, jnp.zeros(2), 1.5, sense="max")
    run = lambda p: solve(prob.replace(p=p), optsolve.LBFGS())
    sol = run(1.5)
    assert sol.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(sol.x, [1.5, 1.5], rtol=1e-10)
    np.testing.assert_allclose(sol.objective, 3.0, rtol=1e-14)
    np.testing.assert_allclose(jax.grad(lambda p: run(p).objective)(1.5), 0.0, atol=1e-10)
    np.testing.assert_allclose(jax.jacfwd(lambda p: run(p).x)(1.5), [1.0, 1.0], rtol=1e-10)


def test_a_user_gradient_is_the_gradient_of_the_maximised_objective():
    grad = lambda x, p: -2 * (x - p)
    prob = OptimizationProblem(_concave, jnp.zeros(2), 1.5, sense="max", grad=grad)
    for alg in (optsolve.LBFGS(), optsolve.ScipyMinimize("BFGS")):
        sol = solve(prob, alg)
        np.testing.assert_allclose(sol.x, [1.5, 1.5], rtol=1e-8)


def test_multipliers_of_a_maximisation_keep_their_meaning():
    """max -(x0^2 + x1^2) s.t. x0 + x1 >= c: f* = -c^2/2, so df*/dc = -c and, with
    -multipliers[j] the derivative of the optimal value, the multiplier is c."""

    def solution(c):
        prob = OptimizationProblem(
            lambda x, p: -jnp.sum(x**2),
            jnp.array([1.0, 0.5]),
            constraints=[Constraint(lambda x, p: jnp.sum(x), lower=c)],
            sense="max",
        )
        return solve(prob, optsolve.ScipyMinimize("SLSQP"))

    sol = solution(1.0)
    np.testing.assert_allclose(sol.objective, -0.5, rtol=1e-8)
    np.testing.assert_allclose(sol.multipliers[0], 1.0, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda c: solution(c).objective)(1.0), -1.0, rtol=1e-6)


def test_aux_crosses_jit_and_vmap():
    with_aux = lambda x, p: (jnp.sum((x - p) ** 2), {"residual": x - p})
    prob = OptimizationProblem(with_aux, jnp.zeros(2), 2.0, has_aux=True)
    run = jax.jit(jax.vmap(lambda p: solve(prob.replace(p=p), optsolve.LBFGS()).aux))
    np.testing.assert_allclose(run(jnp.array([1.0, 2.0]))["residual"], 0.0, atol=1e-8)


def test_training_on_data_maximises_and_records_aux():
    # the mean log-likelihood of a unit-variance normal, maximised by SGD over batches
    data = jnp.linspace(0.0, 2.0, 64)
    loglik = lambda m, p, batch: -0.5 * jnp.mean((batch - m) ** 2)
    prob = OptimizationProblem(loglik, jnp.array(0.0), sense="max")
    sol = solve(prob, optsolve.SGD(0.5), data=data, batch_size=64, epochs=200)
    np.testing.assert_allclose(sol.x, 1.0, rtol=1e-6)
    np.testing.assert_allclose(sol.objective, loglik(sol.x, None, data), rtol=1e-6)
    aux = OptimizationProblem(
        lambda m, p, b: (loglik(m, p, b), m), jnp.array(0.0), sense="max", has_aux=True
    )
    # aux belongs to each step's batch: recorded in the history, none on the Solution
    sol = solve(aux, optsolve.SGD(0.5), data=data, batch_size=8, history=True)
    assert sol.aux is None
    m, expected = 0.0, []
    for batch in data.reshape(8, 8):  # SGD by hand: the iterate each step's aux saw
        expected.append(m)
        m -= 0.5 * float(jnp.mean(m - batch))
    np.testing.assert_allclose(sol.history.metrics, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sol.x, m, rtol=1e-6)


def test_bad_sense_and_aux_get_clear_errors():
    with pytest.raises(ValueError, match="`sense` must be 'min' or 'max', got 'maximize'"):
        OptimizationProblem(_concave, jnp.zeros(2), sense="maximize")
    with pytest.raises(TypeError, match="`has_aux` must be True or False"):
        OptimizationProblem(_concave, jnp.zeros(2), has_aux=1)
    no_pair = OptimizationProblem(_concave, jnp.zeros(2), 1.0, has_aux=True)
    with pytest.raises(TypeError, match=r"has_aux=True.*must return a pair \(value, aux\)"):
        solve(no_pair, optsolve.LBFGS())
