"""UnrolledAdjoint on the classical methods (line searches and CG run as bounded scans, so
reverse mode sees the accepted steps) and on Adam, against central finite differences of
the same runs (the same number of iterations, no stopping test), forward mode against
reverse mode."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import OptimizationProblem, solve


def _rosenbrock(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


X0 = jnp.array([-1.2, 1.0, 0.5])
UNROLLED = optsolve.UnrolledAdjoint()

CLASSICAL = {
    "GradientDescent": optsolve.GradientDescent(),
    "NonlinearCG": optsolve.NonlinearCG(),
    "LBFGS": optsolve.LBFGS(),
    "LBFGS backtracking": optsolve.LBFGS(linesearch=optsolve.Backtracking()),
    "BFGS": optsolve.BFGS(),
    "Newton": optsolve.Newton(),
    "TrustRegion": optsolve.TrustRegion(),
    "AdaHessian": optsolve.AdaHessian(0.01),
}


def _central(fn, value, h=1e-6):
    return (fn(value + h) - fn(value - h)) / (2 * h)


@pytest.mark.parametrize("name", list(CLASSICAL))
def test_unrolled_derivative_of_five_iterations_matches_finite_differences(name):
    alg = CLASSICAL[name]

    def x_after(p, adjoint=None):
        extra = {} if adjoint is None else {"adjoint": adjoint}
        return solve(OptimizationProblem(_rosenbrock, X0, p), alg, maxiters=5, gtol=0.0, **extra).x

    reverse = jax.jacrev(lambda p: x_after(p, UNROLLED))(10.0)
    np.testing.assert_allclose(reverse, _central(x_after, 10.0), atol=1e-7)
    if name in ("LBFGS", "Newton"):  # forward mode once per loop kind (line search, CG)
        np.testing.assert_allclose(
            jax.jacfwd(lambda p: x_after(p, UNROLLED))(10.0), reverse, atol=1e-12
        )


def test_unrolled_projected_lbfgs_with_a_traced_bound():
    """Projected L-BFGS on min sum (x - 3)^2 over x <= u: five steps reach the bound, so
    the unrolled dx/du is 1 on the bounded coordinate (and matches finite differences)."""

    def x_after(u, adjoint=None):
        extra = {} if adjoint is None else {"adjoint": adjoint}
        prob = OptimizationProblem(
            lambda x, p: jnp.sum((x - jnp.array([3.0, 0.5])) ** 2),
            jnp.zeros(2),
            bounds=(None, jnp.stack([u, 2.0])),
        )
        return solve(prob, optsolve.LBFGS(), maxiters=5, gtol=0.0, **extra).x

    reverse = jax.jacrev(lambda u: x_after(u, UNROLLED))(1.0)
    np.testing.assert_allclose(reverse, [1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(reverse, _central(x_after, 1.0), atol=1e-7)


def test_unrolled_gradient_wrt_the_learning_rates_of_gradient_descent_and_adam():
    prob = OptimizationProblem(_rosenbrock, X0, 10.0)

    def descent(lr, adjoint=None):
        extra = {} if adjoint is None else {"adjoint": adjoint}
        return solve(
            prob,
            optsolve.GradientDescent(learning_rate=lr, linesearch=optsolve.Backtracking()),
            maxiters=5,
            gtol=0.0,
            **extra,
        ).objective

    def adam(lr, adjoint=None):
        extra = {} if adjoint is None else {"adjoint": adjoint}
        return solve(prob, optsolve.Adam(lr, eps_root=1e-8), maxiters=20, **extra).objective

    for fn, lr in ((descent, 1e-3), (adam, 1e-2)):
        np.testing.assert_allclose(
            jax.grad(lambda a: fn(a, UNROLLED))(lr),  # noqa: B023  (called in this iteration)
            _central(fn, lr, 1e-7),
            rtol=1e-5,
        )


def test_adam_with_eps_root_zero_warns_and_names_the_fix():
    """x0[0] starts at its minimiser: that gradient entry is exactly 0, and the derivative of
    sqrt(nu) at nu = 0 makes the unrolled derivative NaN; eps_root > 0 makes it finite."""
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(2), jnp.array([0.0, 1.0])
    )

    def x_after(p, alg):
        return solve(prob.replace(p=p), alg, maxiters=5, adjoint=UNROLLED).x

    p = jnp.array([0.0, 1.0])
    with pytest.warns(RuntimeWarning, match=r"eps_root=0 .* pass eps_root > 0"):
        assert np.isnan(jax.jacrev(x_after)(p, optsolve.Adam(0.1))).any()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert np.isfinite(jax.jacrev(x_after)(p, optsolve.Adam(0.1, eps_root=1e-8))).all()


def _hand_optax_run(tx, p, steps):
    """A hand-written optax loop: the reference whose forward-mode derivative the unrolled
    solve must give in both modes."""
    x, state = X0, tx.init(X0)
    value_fn = lambda y: _rosenbrock(y, p)
    for _ in range(steps):
        value, grad = jax.value_and_grad(value_fn)(x)
        updates, state = tx.update(grad, state, x, value=value, grad=grad, value_fn=value_fn)
        x = optax.apply_updates(x, updates)
    return x


@pytest.mark.parametrize("name", ["OptaxLBFGS", "OptaxTransform(sgd + backtracking)"])
def test_optax_line_searches_unroll_by_forward_passes(name):
    # optax's line searches loop with lax.while_loop (no transpose), and optax.lbfgs's first
    # update has a 0/0 inside a where (a NaN cotangent): derivatives come from forward
    # passes, so reverse mode equals forward mode through a hand-written optax loop.
    tx = {
        "OptaxLBFGS": optax.lbfgs(),
        "OptaxTransform(sgd + backtracking)": optax.chain(
            optax.sgd(1e-2), optax.scale_by_backtracking_linesearch(max_backtracking_steps=15)
        ),
    }[name]
    algorithm = optsolve.OptaxLBFGS() if name == "OptaxLBFGS" else optsolve.OptaxTransform(tx)
    assert algorithm.unrolls_by_forward_passes()

    def x_final(p):
        return solve(
            OptimizationProblem(_rosenbrock, X0, p),
            algorithm,
            maxiters=3,
            gtol=0.0,
            adjoint=UNROLLED,
        ).x

    p = jnp.asarray(10.0)
    hand = jax.jit(lambda q: _hand_optax_run(tx, q, 3))
    np.testing.assert_allclose(x_final(p), hand(p), rtol=1e-13)
    expected = jax.jit(jax.jacfwd(hand))(p)
    # reverse mode (under jit) through the forward passes; the rule itself is forward mode
    np.testing.assert_allclose(jax.jit(jax.jacrev(x_final))(p), expected, rtol=1e-10, atol=1e-12)


def test_unrolled_gradient_wrt_the_learning_rate_of_optax_lbfgs():
    def f_final(lr):
        return solve(
            OptimizationProblem(_rosenbrock, X0, 10.0),
            optsolve.OptaxLBFGS(learning_rate=lr),
            maxiters=5,
            gtol=0.0,
            adjoint=UNROLLED,
        ).objective

    plain = lambda lr: float(
        solve(
            OptimizationProblem(_rosenbrock, X0, 10.0),
            optsolve.OptaxLBFGS(learning_rate=lr),
            maxiters=5,
            gtol=0.0,
        ).objective
    )
    assert float(jax.grad(f_final)(0.7)) == pytest.approx(_central(plain, 0.7), rel=1e-6)
