"""Implicit derivatives whatever the dependence structure: leaves of x that do not depend on
p (weight decay on kernels but not biases), leaves of p that x* ignores, integer and bool
leaves in p, values closed over instead of passed as p, traced bounds; and what happens
where no implicit derivative exists. References are closed forms worked by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import OptimizationProblem, solve

pytestmark = pytest.mark.filterwarnings(
    "ignore:optsolve. differentiating a solution whose retcode:RuntimeWarning"
)

ALGORITHMS = [optsolve.LBFGS(), optsolve.Newton(), optsolve.ScipyMinimize("BFGS")]


def _decay(x, lam, decayed):
    """sum (a - 1)^2 + lam a^2 over the decayed leaves, sum (b + 2)^2 over the others, so
    a* = 1 / (1 + lam) and b* = -2 (independent of lam)."""
    leaves = jax.tree_util.tree_leaves(x)
    flags = jax.tree_util.tree_leaves(decayed)
    total = 0.0
    for leaf, is_decayed in zip(leaves, flags):
        total = total + (
            jnp.sum((leaf - 1) ** 2 + lam * leaf**2) if is_decayed else jnp.sum((leaf + 2) ** 2)
        )
    return total


SHAPES = {
    "dict": ({"a": jnp.zeros(3), "b": jnp.zeros(2)}, {"a": True, "b": False}),
    "kernel and bias": (
        {"kernel": jnp.zeros((2, 3)), "bias": jnp.zeros(())},
        {"kernel": True, "bias": False},
    ),
    "nested list": ([jnp.zeros(2), (jnp.zeros(1), jnp.zeros(2))], [False, (True, False)]),
}


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_leaves_of_x_that_do_not_depend_on_p(algorithm, shape):
    x0, decayed = SHAPES[shape]
    n_decayed = sum(
        int(np.size(leaf))
        for leaf, d in zip(jax.tree_util.tree_leaves(x0), jax.tree_util.tree_leaves(decayed))
        if d
    )
    prob = OptimizationProblem(lambda x, lam: _decay(x, lam, decayed), x0, 0.5)

    def decayed_sum(lam):
        x = solve(prob.replace(p=lam), algorithm, gtol=1e-10).x
        return sum(
            jnp.sum(leaf)
            for leaf, d in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(decayed))
            if d
        )

    expected = -n_decayed / 1.5**2
    np.testing.assert_allclose(jax.grad(decayed_sum)(0.5), expected, rtol=1e-7)
    np.testing.assert_allclose(jax.jvp(decayed_sum, (0.5,), (1.0,))[1], expected, rtol=1e-7)
    # the envelope theorem: df*/dlam = sum a*^2
    objective = jax.grad(lambda lam: solve(prob.replace(p=lam), algorithm, gtol=1e-10).objective)
    np.testing.assert_allclose(objective(0.5), n_decayed / 1.5**2, rtol=1e-7)


def _shifted(x, p):
    scale = jnp.where(p["flag"], 1.0, 2.0) * p["k"]
    return scale * jnp.sum((x - p["c"]) ** 2)


def test_unused_integer_and_bool_leaves_of_p():
    """x* = c: dx*/dc = I, nothing for the unused float leaf; integer and bool leaves take
    part in f and get float0 cotangents under jax.grad(allow_int=True)."""
    p = {"c": jnp.array([1.0, 2.0]), "unused": 0.3, "k": 3, "flag": True}
    prob = OptimizationProblem(_shifted, jnp.zeros(2), p)

    def first(p):
        return solve(prob.replace(p=p), optsolve.LBFGS(), gtol=1e-10).x[0]

    grads = jax.grad(first, allow_int=True)(p)
    np.testing.assert_allclose(grads["c"], [1.0, 0.0], atol=1e-10)
    assert grads["unused"] == 0.0
    assert grads["k"].dtype == jax.dtypes.float0 and grads["flag"].dtype == jax.dtypes.float0
    jacobian = jax.jacfwd(
        lambda c: solve(prob.replace(p={**p, "c": c}), optsolve.LBFGS(), gtol=1e-10).x
    )(p["c"])
    np.testing.assert_allclose(jacobian, np.eye(2), atol=1e-10)


@pytest.mark.parametrize(
    "algorithm",
    ALGORITHMS + [optsolve.ScipyMinimize("Nelder-Mead")],
    ids=lambda a: type(a).__name__ + getattr(a, "method", ""),
)
def test_a_value_closed_over_instead_of_passed_as_p(algorithm):
    """p=None, f closes over c: min sum (x - c)^2 + c x_0 gives x_0* = c / 2, x_1* = c,
    f* = c^2 - c^2 / 4 (so df*/dc = 3c/2), jit-traced or differentiated alike."""

    def solution(c):
        prob = OptimizationProblem(lambda x, p: jnp.sum((x - c) ** 2) + c * x[0], jnp.zeros(2))
        options = {} if getattr(algorithm, "method", "") == "Nelder-Mead" else {"gtol": 1e-10}
        sol = solve(prob, algorithm, **options)
        return sol.x, sol.objective

    tol = 1e-4 if getattr(algorithm, "method", "") == "Nelder-Mead" else 1e-8
    (dx, df) = jax.jacrev(solution)(1.0)
    np.testing.assert_allclose(dx, [0.5, 1.0], atol=tol)
    np.testing.assert_allclose(df, 1.5, atol=tol)
    np.testing.assert_allclose(jax.jacfwd(solution)(1.0)[0], [0.5, 1.0], atol=tol)
    np.testing.assert_allclose(jax.jit(solution)(2.0)[0], [1.0, 2.0], atol=10 * tol)


def test_differentiating_the_algorithm_names_the_unrolled_adjoint():
    prob = OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.ones(2))
    with pytest.raises(
        ValueError,
        match=r"algorithm's own hyperparameters \(Adam\).*"
        r"UnrolledAdjoint",
    ):
        jax.grad(lambda lr: solve(prob, optsolve.Adam(lr), maxiters=10).objective)(0.1)
    unrolled = jax.grad(
        lambda lr: (
            solve(prob, optsolve.SGD(lr), maxiters=3, adjoint=optsolve.UnrolledAdjoint()).objective
        )
    )(0.1)
    # f after 3 SGD steps on |x|^2 from ones(2): 2 (1 - 2 lr)^6, derivative -24 (1 - 2 lr)^5
    np.testing.assert_allclose(unrolled, -24 * 0.8**5, rtol=1e-6)


@pytest.mark.parametrize("where", ["p", "closure", "x pytree"])
def test_a_lower_bound_in_p_closed_over_or_on_a_pytree(where):
    """min (x + 3)^2 over x >= l at l = -1: x* = l, dx*/dl = 1, df*/dl = 2 (l + 3) = 4;
    the free coordinate (y, target 1/2) has no sensitivity."""

    def solution(lo):
        def f(x, p):
            return (x["x"] + 3.0) ** 2 + (x["y"] - 0.5) ** 2

        x0 = {"x": jnp.zeros(()), "y": jnp.zeros(())}
        if where == "p":
            prob = OptimizationProblem(f, x0, {"lo": lo}, bounds=({"x": lo, "y": None}, None))
        elif where == "closure":
            prob = OptimizationProblem(
                lambda x, p: f(x, p) + 0.0 * lo, x0, bounds=({"x": lo, "y": -5.0}, None)
            )
        else:
            prob = OptimizationProblem(f, x0, bounds=({"x": lo, "y": -5.0}, 10.0))
        sol = solve(prob, optsolve.LBFGS(), gtol=1e-10)
        return sol.x, sol.objective

    dx, df = jax.jacrev(solution)(-1.0)
    np.testing.assert_allclose([dx["x"], dx["y"]], [1.0, 0.0], atol=1e-10)
    np.testing.assert_allclose(df, 4.0, rtol=1e-8)
    dx_fwd, df_fwd = jax.jacfwd(solution)(-1.0)
    np.testing.assert_allclose([dx_fwd["x"], dx_fwd["y"], df_fwd], [1.0, 0.0, 4.0], atol=1e-8)


def test_vmap_over_a_bound_equals_a_loop_and_jvp_agrees_with_vjp():
    """Upper bounds u in [0.5, 1, 4] on min (x - 3)^2: active for u < 3 (dx*/du = 1), free
    at u = 4 (dx*/du = 0)."""

    def x_star(u):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum((x - 3.0) ** 2), jnp.zeros(1), bounds=(None, u)
        )
        return solve(prob, optsolve.LBFGS(), gtol=1e-10).x[0]

    us = jnp.array([0.5, 1.0, 4.0])
    batched = jax.vmap(jax.grad(x_star))(us)
    np.testing.assert_allclose(batched, [1.0, 1.0, 0.0], atol=1e-10)
    grad, jvp = jax.jit(jax.grad(x_star)), jax.jit(lambda u: jax.jvp(x_star, (u,), (1.0,))[1])
    np.testing.assert_allclose(batched, [grad(u) for u in us], atol=1e-12)
    np.testing.assert_allclose([jvp(u) for u in us], batched, atol=1e-12)


def _cosh(scale):
    """s sum(cosh(x - p) - 1) over x >= 0: x* = max(p, 0). At any x, H = diag(s cosh(x - p))
    and d/dp grad = -H, so on the free coordinates dx/dp = 1 and dx/d(lower) = 0; on the
    held ones dx/dp = 0 and dx/d(lower) = 1, for every s."""
    return lambda x, p: scale * jnp.sum(jnp.cosh(x - p) - 1)


@pytest.mark.parametrize("scale", [1e3, 1e5])
def test_a_free_coordinate_near_its_bound_stays_free_whatever_the_scale_of_f(scale):
    """trust-constr stops a barrier step inside x* = p (p > 0 small, all free), where the
    gradient pushes towards the bound x >= 0 and grows with s; the Newton step to x*,
    |g_i| / H_ii, does not, and stays below the gap: dx*/dp = I (see _cosh)."""
    p = jnp.array([2e-3, 5e-3, 1e-2])

    def x_star(p):
        prob = OptimizationProblem(_cosh(scale), jnp.ones(3), p, bounds=(0.0, None))
        return solve(prob, optsolve.ScipyMinimize("trust-constr")).x

    assert bool(jnp.all(x_star(p) > p))  # short of x*: the gradient pushes towards 0
    np.testing.assert_allclose(jax.jacrev(x_star)(p), np.eye(3), atol=1e-9)


@pytest.mark.parametrize("n", [4, 400], ids=["exact diagonal", "Rayleigh quotient"])
@pytest.mark.parametrize("scale", [1e3, 1e6])
def test_the_active_set_at_an_unconverged_point_does_not_depend_on_the_scale_of_f(n, scale):
    """At a hand-made point of _cosh's problem: even coordinates free (p = 2e-3, x a step
    3e-6 short of x* = p), odd ones held (p = -0.5, x* = 0; x = 0, or 1e-6 inside as a
    barrier method leaves it). For n > 256 the curvature is one Rayleigh quotient, not the
    Hessian's diagonal. dx/dp and dx/d(lower) are the closed forms of _cosh."""
    free = np.arange(n) % 2 == 0
    p = jnp.asarray(np.where(free, 2e-3, -0.5))
    x = jnp.asarray(np.where(free, 2e-3 + 3e-6, np.where(np.arange(n) % 4 == 1, 0.0, 1e-6)))
    prob = OptimizationProblem(_cosh(scale), jnp.ones(n), p, bounds=(0.0, None))
    adjoint = optsolve.ImplicitAdjoint()
    ones, zeros = jnp.ones(n), jnp.zeros(n)
    np.testing.assert_allclose(adjoint.solution_tangent(prob, x, ones), free, atol=1e-9)
    np.testing.assert_allclose(
        adjoint.solution_tangent(prob, x, None, (ones, zeros)), ~free, atol=1e-9
    )
