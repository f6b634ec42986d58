"""The derivative rules of the contract, over every registered algorithm class (the cases of
test_contract.py): ``jax.grad`` through ``solve`` with the default ImplicitAdjoint.

References are closed forms worked by hand. The objectives are quadratics with a constant
Hessian, for which the implicit derivative dx*/dp = -H^-1 d(grad)/dp does not depend on where
the run stopped: an unconverged run (a few iterations of Adam) has the same derivative as a
converged one, so every algorithm meets the rule within its contract budget.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_contract import BOX, CASES, CLASSES, _caps, _id, problem_for

import optsolve
from optsolve import Constraint, OptimizationProblem, solve

# what solve says to a scalar class (trait scalar_only) given an x0 of more than one number
_SCALAR_ONLY = "minimises over one scalar, so `x0` must be a 0-d float array"


def _tracking(x, lam):
    """A scalar class's form of :func:`_partial`: x = {"a": one scalar} tracks lam."""
    return (x["a"] - lam) ** 2


def _bounded_scalar(x, p):
    """A scalar class's form of :func:`_bounded`: its first coordinate."""
    return (x - 3.0) ** 2


pytestmark = pytest.mark.filterwarnings(
    "ignore:`optimistic_adam` is deprecated:DeprecationWarning",
    "ignore:optsolve. differentiating a solution whose retcode:RuntimeWarning",
)


def _leaves(x, lam):
    """x["a"] tracks lam, x["b"] does not depend on it, and f ignores x["u"] (H is singular
    along it): dx_a/dlam = 1, dx_b/dlam = 0, and dx_u/dlam = 0 (the minimum-norm derivative)."""
    return jnp.sum((x["a"] - lam) ** 2) + jnp.sum((x["b"] + 0.5) ** 2) + 0.5


def _leaves_residuals(x, lam):
    """A pytree of residuals whose half squared norm is :func:`_leaves`; the constant one
    makes as many residuals as parameters, which MINPACK's lm needs."""
    return {
        "a": jnp.sqrt(2.0) * (x["a"] - lam),
        "b": jnp.sqrt(2.0) * (x["b"] + 0.5),
        "c": jnp.ones(1),
    }


X0_LEAVES = {"a": jnp.zeros(2), "b": jnp.zeros(1), "u": jnp.ones(1)}


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_leaves_of_x_that_do_not_depend_on_p_or_that_f_ignores(cls):
    """Two failures, one run in each mode. Reverse mode used to fail with a bare
    AssertionError from custom_linear_solve's transpose whenever a leaf of x does not depend
    on p (x["b"]). Where f ignores a leaf (x["u"]) the Hessian is singular along it, and
    reverse mode's cotangent for that leaf lies in H's null space: it used to give NaN where
    forward mode gave the right answer. Both modes give the minimum-norm derivative, and
    reverse mode warns that the system is singular."""
    alg = CASES[cls].make()
    bounds = BOX if CASES[cls].box else None

    def run(lam):
        prob = problem_for(cls, _leaves, _leaves_residuals, X0_LEAVES, lam, bounds)
        return solve(prob, alg, maxiters=CASES[cls].iterations).x

    if CASES[cls].scalar:
        # refused (x of one scalar has no second leaf); its one scalar tracks lam
        # (x = {"a": x_a}): dx_a/dlam = 1 both ways
        with pytest.raises(ValueError, match=_SCALAR_ONLY):
            run(0.5)

        def scalar(lam):
            prob = OptimizationProblem(_tracking, {"a": jnp.array(0.0)}, lam, bounds=bounds)
            return solve(prob, alg).x["a"]

        for mode in (jax.jacrev, jax.jacfwd):
            np.testing.assert_allclose(mode(scalar)(0.5), 1.0, atol=1e-8)
        return
    expected = {"a": np.ones(2), "b": np.zeros(1), "u": np.zeros(1)}
    with pytest.warns(RuntimeWarning, match="linear system is singular"):
        reverse = jax.jacrev(run)(0.5)
    forward = jax.jacfwd(run)(0.5)
    for mode, got in (("jacrev", reverse), ("jacfwd", forward)):
        for leaf in ("a", "b", "u"):
            np.testing.assert_allclose(got[leaf], expected[leaf], atol=1e-8, err_msg=mode)


def _bounded(x, p):
    return (x[0] - 3.0) ** 2 + (x[1] - 0.5) ** 2


def _bounded_residuals(x, p):
    return jnp.sqrt(2.0) * (x - jnp.array([3.0, 0.5]))


BOUNDED = [cls for cls in CLASSES if _caps(cls)["takes_bounds"]]


@pytest.mark.parametrize("cls", BOUNDED, ids=_id)
def test_derivatives_with_respect_to_a_bound(cls):
    """min (x0 - 3)^2 + (x1 - 1/2)^2 with x <= (u, 2) at u = 1: x0 sits on its bound, so
    dx*/du = (1, 0) and df*/du = 2 (u - 3) = -4; the lower bound (not active) carries none.
    The bounds are traced inputs of the problem, with p=None."""
    alg = CASES[cls].make()

    def run(lower, u):
        prob = problem_for(
            cls,
            _bounded,
            _bounded_residuals,
            jnp.zeros(2),
            None,
            bounds=(lower, jnp.stack([u, 2.0])),
        )
        # a global method ends with a local solve: a few of its iterations suffice
        sol = solve(prob, alg, maxiters=20 if issubclass(cls, optsolve.ScipyGlobal) else 300)
        return sol.x, sol.objective

    if CASES[cls].scalar:
        # refused; its scalar form, min (x - 3)^2 on [lower, u]: x* = u, dx*/du = 1,
        # df*/du = 2 (u - 3) = -4, nothing from the lower bound (not active)
        with pytest.raises(ValueError, match=_SCALAR_ONLY):
            run(-2.0, 1.0)

        def run(lower, u):
            prob = OptimizationProblem(_bounded_scalar, jnp.array(0.0), bounds=(lower, u))
            sol = solve(prob, alg, maxiters=300)
            return jnp.stack([sol.x, jnp.zeros(())]), sol.objective

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for mode in (jax.jacrev, jax.jacfwd):
            (dx_dlower, dx_du), (df_dlower, df_du) = mode(run, argnums=(0, 1))(-2.0, 1.0)
            np.testing.assert_allclose(dx_du, [1.0, 0.0], atol=1e-8, err_msg=mode.__name__)
            np.testing.assert_allclose(dx_dlower, [0.0, 0.0], atol=1e-8)
            # a barrier method (trust-constr) stops a little inside the box
            np.testing.assert_allclose(df_du, -4.0, rtol=2e-3)
            np.testing.assert_allclose(df_dlower, 0.0, atol=1e-8)


CONSTRAINED = [cls for cls in CLASSES if _caps(cls)["takes_constraints"]]


@pytest.mark.parametrize("cls", CONSTRAINED, ids=_id)
def test_derivatives_and_multipliers_of_a_constrained_solution(cls):
    """min |x|^2 over x in R^2 s.t. x0 + x1 >= c at c = 1: x* = (c/2, c/2), df*/dc = c, and
    the multiplier is -c (the KKT system, whichever backend found x*)."""
    alg = CASES[cls].make()
    bounds = BOX if CASES[cls].box else None

    def solution(c):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum(x**2),
            jnp.array([1.0, 0.5]),
            bounds=bounds,
            constraints=[Constraint(lambda x, p: jnp.sum(x), lower=c)],
        )
        # global methods end with a local solve: a few of their iterations suffice
        return solve(prob, alg, maxiters=20 if CASES[cls].box else 300)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sol = solution(1.0)
        np.testing.assert_allclose(sol.multipliers[0], -1.0, rtol=2e-3)
        np.testing.assert_allclose(jax.grad(lambda c: solution(c).objective)(1.0), 1.0, rtol=2e-3)
        np.testing.assert_allclose(jax.jacfwd(lambda c: solution(c).x)(1.0), [0.5, 0.5], atol=1e-6)
