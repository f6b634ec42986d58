"""Values that a problem's functions hold rather than take in p: closures in a constraint,
bound methods and callable objects. The implicit rule differentiates with respect to them
as if they were in p. Closed forms worked by hand in each test."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import Constraint, OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)


def test_a_constraint_that_closes_over_the_differentiated_value():
    # min |x|^2 s.t. a.x = 1: x* = a / |a|^2, so dx*/da = I/|a|^2 - 2 a a^T / |a|^4.
    def x_star(a):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum(x**2),
            jnp.ones(3),
            constraints=[Constraint(lambda x, p: jnp.dot(a, x), lower=1.0, upper=1.0)],
        )
        return solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-14).x

    a = jnp.array([1.0, 2.0, -0.5])
    s2 = float(a @ a)
    expected = np.eye(3) / s2 - 2 * np.outer(a, a) / s2**2
    np.testing.assert_allclose(jax.jacrev(x_star)(a), expected, atol=1e-7)
    np.testing.assert_allclose(jax.jit(x_star)(a), a / s2, atol=1e-7)


def test_an_objective_closure_beside_a_constraint():
    # min |x - c 1|^2 s.t. sum(x) <= 1 at c = 0.1: sum(c 1) = 0.3 < 1, the constraint is
    # inactive, so x* = c 1 and dx*/dc = 1 for every coordinate.
    def x_star(c):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum((x - c) ** 2),
            jnp.zeros(3),
            constraints=[Constraint(lambda x, p: jnp.sum(x), upper=1.0)],
        )
        return solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-14).x

    np.testing.assert_allclose(jax.jacrev(x_star)(0.1), np.ones(3), atol=1e-7)


class _Shifted:
    """An objective as a model object: |x - c|^2, minimised at x = c."""

    def __init__(self, c):
        self.c = c

    def loss(self, x, p):
        return jnp.sum((x - self.c) ** 2)

    def __call__(self, x, p):
        return self.loss(x, p)


@pytest.mark.parametrize(
    "algorithm",
    [optsolve.LBFGS(), optsolve.ScipyMinimize("BFGS")],
    ids=["LBFGS", "ScipyMinimize-BFGS"],
)
@pytest.mark.parametrize("form", ["bound method", "callable object"])
def test_bound_methods_and_callable_objects(algorithm, form):
    # x* = c, so d x*_0 / dc = 1 in both modes.
    def x0_star(c):
        model = _Shifted(c)
        f = model.loss if form == "bound method" else model
        return solve(OptimizationProblem(f, jnp.zeros(2)), algorithm, gtol=1e-10).x[0]

    assert jax.grad(x0_star)(1.0) == pytest.approx(1.0, abs=1e-8)
    assert jax.jacfwd(x0_star)(1.0) == pytest.approx(1.0, abs=1e-8)
