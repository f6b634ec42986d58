"""sol.multipliers come from the solver where it computes them (SLSQP, trust-constr), in
optsolve's sign (grad f + sum_j lambda_j grad g_j = 0), and by least squares elsewhere;
their derivatives are those of the KKT multipliers. Closed forms worked by hand."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import Constraint, OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)

# min |x|^2 s.t. x0 + x1 >= 1, x0 - 2 x1 = 0, -10 <= (x0, -x1) <= (5, -0.5).
# x1 >= 0.5 and x0 = 2 x1 give x* = (1, 0.5), where x0 + x1 = 1.5 > 1 (inactive) and
# x0 = 1 < 5 (inactive). grad f = (2, 1) = -(mu (1, -2) + nu (0, -1)): mu = -2, nu = 5.
MIXED = OptimizationProblem(
    lambda x, p: jnp.sum(x**2),
    jnp.zeros(2),
    constraints=[
        Constraint(lambda x, p: x[0] + x[1], lower=1.0),
        Constraint(lambda x, p: x[0] - 2 * x[1], lower=0.0, upper=0.0),
        Constraint(
            lambda x, p: jnp.stack([x[0], -x[1]]), lower=-10.0, upper=jnp.array([5.0, -0.5])
        ),
    ],
)
EXPECTED = [0.0, -2.0, np.array([0.0, 5.0])]


def _close(got, expected, atol):
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e, atol=atol)


def test_slsqp_multipliers_are_its_own_mapped_to_each_constraint():
    sol = solve(MIXED, optsolve.ScipyMinimize("SLSQP"), ftol=1e-14)
    _close(sol.multipliers, EXPECTED, 1e-8)
    assert [np.shape(m) for m in sol.multipliers] == [(), (), (2,)]
    # scipy's own vector: the equality row, then the rows of finite lower bounds (three),
    # then those of finite upper bounds (two), each nonnegative
    np.testing.assert_allclose(sol.original["multipliers"], [2, 0, 0, 0, 0, 5], atol=1e-8)
    jitted = jax.jit(
        lambda prob: solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-14).multipliers
    )(MIXED)
    _close(jitted, [np.asarray(m) for m in sol.multipliers], 1e-12)


def test_trust_constr_multipliers_are_its_own_v():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = solve(MIXED, optsolve.ScipyMinimize("trust-constr"), gtol=1e-10)
    own = np.concatenate([np.ravel(m) for m in sol.multipliers])
    np.testing.assert_array_equal(own, sol.original["v"][0])
    _close(sol.multipliers, EXPECTED, 1e-3)


def test_methods_without_multipliers_get_the_least_squares_ones():
    sol = solve(MIXED, optsolve.ScipyMinimize("COBYQA"))
    _close(sol.multipliers, EXPECTED, 1e-6)


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr", "COBYQA"])
def test_the_derivative_of_the_solvers_multipliers(method):
    # min |x|^2 s.t. sum(x) >= c, n = 3: x* = c/n 1, lambda = -2c/n, d lambda / dc = -2/n.
    def lam(c):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum(x**2),
            jnp.zeros(3),
            constraints=[Constraint(lambda x, p: jnp.sum(x), lower=c)],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return solve(prob, optsolve.ScipyMinimize(method)).multipliers[0]

    assert float(lam(1.5)) == pytest.approx(-1.0, abs=2e-3)
    assert float(jax.grad(lam)(1.5)) == pytest.approx(-2 / 3, abs=2e-3)
