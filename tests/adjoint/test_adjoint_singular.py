"""Implicit derivatives where the Hessian at x* is singular (issue 36, item 3): a leaf of x
that f ignores, and the flat intercept direction of a multiclass softmax regression.

The derivative is the minimum-norm one: forward mode solves H dx = -B dp with B dp in the
range of H, reverse mode solves H u = cotangent, whose component in the null space of H is
ignored (the least-squares, minimum-norm solution), so that both agree with each other, with
values worked by hand, and with central finite differences. Every adjoint path is covered:
CG (preconditioned by the L-BFGS memory, or not), GMRES, BiCGStab and the dense solve,
scipy's algorithms (the same ImplicitAdjoint), box bounds (the reduced system) and general
constraints (the KKT system).
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import Constraint, ImplicitAdjoint, OptimizationProblem, solve

SINGULAR = "singular"
SOLVERS = ["cg", "gmres", "bicgstab", "dense"]
# LBFGS preconditions CG with its memory; BFGS does not; scipy goes through the same adjoint
ALGORITHMS = [optsolve.LBFGS(), optsolve.BFGS(), optsolve.ScipyMinimize("BFGS")]
LAM = 0.5


def _warns_singular(expected: bool = True):
    """The singular warning is expected; where not, conftest makes any warning an error."""
    return pytest.warns(RuntimeWarning, match=SINGULAR) if expected else contextlib.nullcontext()


def _forward_warns(solver: str) -> bool:
    """Whether forward mode warns: the dense solve sees H's rank whatever the right-hand
    side; the iterative ones only a right-hand side with a component along a null direction,
    which the forward one (B dp, in the range of H) has not."""
    return solver == "dense"


def _ignoring(x, lam):
    """f reads x["w"] only: w* = 1 / (1 + lam) in each of its 3 entries, x["unused"] stays
    at x0. H = 2 (1 + lam) on w and 0 on unused."""
    return jnp.sum((x["w"] - 1.0) ** 2) + lam * jnp.sum(x["w"] ** 2)


X0 = {"w": jnp.zeros(3), "unused": jnp.ones(2)}


def _dw_dlam(lam):
    """dw*/dlam = -w* / (1 + lam) = -1 / (1 + lam)^2, in each entry of w."""
    return -1.0 / (1.0 + lam) ** 2


def _solution(lam, algorithm, adjoint=ImplicitAdjoint(), bounds=None):
    prob = OptimizationProblem(_ignoring, X0, lam, bounds=bounds)
    return solve(prob, algorithm, gtol=1e-10, adjoint=adjoint).x


def _loss(x):
    """Reads both leaves: d/dlam = 3 dw/dlam + 0."""
    return jnp.sum(x["w"]) + jnp.sum(x["unused"])


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: type(a).__name__)
def test_a_leaf_that_f_ignores_gets_zero_and_forward_equals_reverse(algorithm, solver):
    adjoint = ImplicitAdjoint(linear_solver=solver)
    outer = lambda lam: _loss(_solution(lam, algorithm, adjoint))
    expected = 3 * _dw_dlam(LAM)  # -4/3
    with _warns_singular():
        reverse = jax.grad(outer)(LAM)
    np.testing.assert_allclose(reverse, expected, rtol=1e-8)
    with _warns_singular(_forward_warns(solver)):
        forward = jax.jacfwd(outer)(LAM)
    np.testing.assert_allclose(forward, expected, rtol=1e-8)
    # a loss that reads only the ignored leaf: its cotangent lies in H's null space
    with _warns_singular():
        only_unused = jax.grad(lambda lam: jnp.sum(_solution(lam, algorithm, adjoint)["unused"]))(
            LAM
        )
    assert only_unused == 0.0


@pytest.mark.parametrize("solver", SOLVERS)
def test_jacobians_of_every_leaf_forward_and_reverse(solver):
    """jacrev batches one cotangent per entry of x: the regular ones (w) and the singular
    ones (unused) in one vmapped solve."""
    adjoint = ImplicitAdjoint(linear_solver=solver)
    run = lambda lam: _solution(lam, optsolve.LBFGS(), adjoint)
    expected = {"w": np.full(3, _dw_dlam(LAM)), "unused": np.zeros(2)}
    with _warns_singular():
        reverse = jax.jacrev(run)(LAM)
    with _warns_singular(_forward_warns(solver)):
        forward = jax.jacfwd(run)(LAM)
    for got in (reverse, forward):
        for leaf in expected:
            np.testing.assert_allclose(got[leaf], expected[leaf], rtol=1e-8, atol=1e-12)


def test_box_bounds_reduce_to_a_singular_free_block():
    """Under loose bounds no coordinate is held: the reduced system is H itself."""
    bounds = (-5.0, 5.0)
    outer = lambda lam: _loss(_solution(lam, optsolve.LBFGS(), bounds=bounds))
    with _warns_singular():
        reverse = jax.grad(outer)(LAM)
    np.testing.assert_allclose(reverse, 3 * _dw_dlam(LAM), rtol=1e-8)
    np.testing.assert_allclose(jax.jacfwd(outer)(LAM), 3 * _dw_dlam(LAM), rtol=1e-8)


def test_constrained_singular_hessian_kkt():
    """With w[0] <= 0.2 (active: the unconstrained w* = 2/3): w* = (0.2, 1/(1+lam),
    1/(1+lam)), so d(sum w + sum unused)/dlam = 2 dw/dlam; the reduced Hessian is singular
    along unused."""
    con = Constraint(lambda x, p: x["w"][0], upper=0.2)

    def outer(lam):
        prob = OptimizationProblem(_ignoring, X0, lam, constraints=[con])
        return _loss(solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-12).x)

    expected = 2 * _dw_dlam(LAM)
    with _warns_singular():
        reverse = jax.grad(outer)(LAM)
    np.testing.assert_allclose(reverse, expected, rtol=1e-7)
    with _warns_singular():
        forward = jax.jacfwd(outer)(LAM)
    np.testing.assert_allclose(forward, expected, rtol=1e-7)


# --- multiclass softmax regression with an unregularised intercept ------------------------

_rng = np.random.default_rng(0)
N, D, K = 40, 3, 4
FEATURES = jnp.asarray(_rng.normal(size=(N, D)))
LABELS = jax.nn.one_hot(jnp.asarray(_rng.integers(0, K, N)), K)


def _softmax_regression(x, lam):
    """Mean cross-entropy + lam/2 |W|^2; b is not regularised. Adding a constant to every
    entry of b changes no probability: H has the null vector (0, 1_K), and x* is unique only
    up to it. From b = 0 every gradient, and so every iterate, keeps sum(b) = 0: the
    minimum-norm minimiser, whose derivative is the minimum-norm one."""
    logits = FEATURES @ x["W"] + x["b"]
    return -jnp.mean(jnp.sum(LABELS * jax.nn.log_softmax(logits), axis=1)) + 0.5 * lam * jnp.sum(
        x["W"] ** 2
    )


SOFTMAX_X0 = {"W": jnp.zeros((D, K)), "b": jnp.zeros(K)}


def _fit(lam, algorithm, adjoint=ImplicitAdjoint(), gtol=1e-11):
    prob = OptimizationProblem(_softmax_regression, SOFTMAX_X0, lam)
    return solve(prob, algorithm, gtol=gtol, adjoint=adjoint).x


def _central_differences(lam, h=1e-5):
    """dx*/dlam by central differences of two tight L-BFGS fits (float64)."""
    plus, minus = _fit(lam + h, optsolve.LBFGS()), _fit(lam - h, optsolve.LBFGS())
    return jax.tree_util.tree_map(lambda a, b: (a - b) / (2 * h), plus, minus)


# scipy's BFGS loses precision below gtol 1e-9 here (FAILURE)
SOFTMAX_CASES = [(optsolve.LBFGS(), 1e-11), (optsolve.ScipyMinimize("BFGS"), 1e-9)]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    "algorithm, gtol",
    SOFTMAX_CASES,
    ids=lambda a: type(a).__name__ if not isinstance(a, float) else "",
)
def test_softmax_intercept_against_central_differences(algorithm, gtol, solver):
    lam = 0.3
    central = _central_differences(lam)
    np.testing.assert_allclose(np.sum(central["b"]), 0.0, atol=1e-9)  # the min-norm one
    adjoint = ImplicitAdjoint(linear_solver=solver)
    with _warns_singular():
        reverse = jax.jacrev(_fit)(lam, algorithm, adjoint, gtol)
    with _warns_singular(_forward_warns(solver)):
        forward = jax.jacfwd(_fit)(lam, algorithm, adjoint, gtol)
    # Forward mode's CG preconditioned by the L-BFGS memory: the memory's last pairs (s, y
    # of size 1e-11 here) carry rounding along the null direction (1e-6 of their size),
    # which the preconditioner passes into dx, where the residual cannot see it. Only the
    # intercept's entries, along (1, ..., 1), are affected.
    mixing = 1e-6 if (solver, type(algorithm)) == ("cg", optsolve.LBFGS) else 1e-7
    for mode, got in (("reverse", reverse), ("forward", forward)):
        np.testing.assert_allclose(got["W"], central["W"], rtol=1e-5, atol=1e-7, err_msg=mode)
        np.testing.assert_allclose(
            got["b"],
            central["b"],
            rtol=1e-5,
            atol=mixing if mode == "forward" else 1e-7,
            err_msg=mode,
        )


def test_cg_falls_back_to_the_pseudo_inverse_and_costs_a_regular_batch_nothing():
    """The adjoint's CG on H = diag(3, 3, 1, 0): a right-hand side with a null component
    gets H^+ b (warning once for the batch); a batch of regular right-hand sides makes
    exactly the products of plain CG (two distinct eigenvalues on the range: 2 each)."""
    from optsolve.solve_api.adjoint import _cg

    h = jnp.diag(jnp.array([3.0, 3.0, 1.0, 0.0]))
    solve_all = jax.jit(jax.vmap(lambda b: _cg(lambda v: h @ v, b, 1e-12, 40)))
    mixed = jnp.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 0.0]])
    with _warns_singular():
        v, _ = solve_all(mixed)
    np.testing.assert_allclose(v, mixed @ np.linalg.pinv(np.diag([3.0, 3.0, 1.0, 0.0])), rtol=1e-12)
    regular = jnp.array([[1.0, 2.0, 3.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    _, products = solve_all(regular)
    assert products.tolist() == [2, 2]
