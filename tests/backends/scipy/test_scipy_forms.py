"""scipy.optimize's input forms are converted, not refused: x0 as a list, bounds as
``Bounds`` or per-variable pairs, constraints as LinearConstraint, NonlinearConstraint and
dicts. References: closed forms (the projection of (3, 3) onto each feasible set) and
scipy's own minimize given the same inputs."""

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import optsolve
from fresh_interpreter import run_without_x64
from optsolve import OptimizationProblem, solve

F = lambda x, p: jnp.sum((x - 3.0) ** 2)
F_NP = lambda x: float(np.sum((x - 3.0) ** 2))


@pytest.mark.parametrize(
    "bounds, expected",
    [
        ([(0, 1), (0, 2)], [1.0, 2.0]),  # one (min, max) pair per entry
        ([(None, 1), (0, None)], [1.0, 3.0]),  # None: no bound on that side
        (so.Bounds([0, 0], [1, 2]), [1.0, 2.0]),
        (so.Bounds(-np.inf, [1, 5]), [1.0, 3.0]),
    ],
)
def test_bounds_in_scipys_forms(bounds, expected):
    for algorithm in (optsolve.LBFGS(), optsolve.ScipyMinimize("L-BFGS-B")):
        sol = solve(OptimizationProblem(F, jnp.zeros(2), bounds=bounds), algorithm, gtol=1e-10)
        np.testing.assert_allclose(sol.x, expected, atol=1e-8)
    by_scipy = so.minimize(F_NP, np.zeros(2), method="L-BFGS-B", bounds=bounds)
    np.testing.assert_allclose(by_scipy.x, expected, atol=1e-6)


def test_a_list_of_pairs_needs_one_pair_per_entry():
    with pytest.raises(ValueError, match=r"one pair per entry of x0 \(3\), got 2 pairs"):
        OptimizationProblem(F, jnp.zeros(3), bounds=[(0, 1), (0, 2)])
    # optsolve's own form is unchanged: (lower, upper), each a scalar or like x0
    prob = OptimizationProblem(F, jnp.zeros(3), bounds=(0.0, jnp.array([1.0, 2.0, 5.0])))
    np.testing.assert_allclose(solve(prob, optsolve.LBFGS(), gtol=1e-10).x, [1, 2, 3], atol=1e-8)


def test_x0_as_a_list_of_numbers_is_one_array_inside_and_a_list_back():
    prob = OptimizationProblem(F, [0.0, 1.0])
    assert isinstance(prob.x0, jnp.ndarray) and prob.x0.shape == (2,)  # what f receives
    sol = solve(prob, optsolve.LBFGS(), gtol=1e-10)
    assert isinstance(sol.x, list) and len(sol.x) == 2  # x0's structure (test_structure.py)
    np.testing.assert_allclose(np.array(sol.x), [3.0, 3.0], atol=1e-8)
    # a list of arrays stays a pytree
    tree = OptimizationProblem(lambda x, p: F(x[0], p) + F(x[1], p), [jnp.zeros(2), jnp.zeros(1)])
    assert isinstance(solve(tree, optsolve.LBFGS()).x, list)


CONSTRAINTS = [
    # (scipy's constraint, the solution of min |x - (3, 3)|^2 under it)
    (so.LinearConstraint([[1.0, 1.0]], -np.inf, 1.0), [0.5, 0.5]),
    (so.NonlinearConstraint(lambda x: x[0] ** 2 + x[1] ** 2, 0.0, 2.0), [1.0, 1.0]),
    ({"type": "ineq", "fun": lambda x: 1.0 - x[0] - x[1]}, [0.5, 0.5]),
    ({"type": "eq", "fun": lambda x, shift: x[0] - x[1] - shift, "args": (1.0,)}, [3.5, 2.5]),
]


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr"])
@pytest.mark.parametrize("case", range(len(CONSTRAINTS)))
def test_constraints_in_scipys_forms(case, method):
    constraint, expected = CONSTRAINTS[case]
    if method == "trust-constr" and isinstance(constraint, dict):
        pytest.skip("scipy's trust-constr takes no constraint dicts itself")
    prob = OptimizationProblem(F, jnp.zeros(2), constraints=[constraint])
    tight = {"SLSQP": {"ftol": 1e-12}, "trust-constr": {"gtol": 1e-10}}[method]
    sol = solve(prob, optsolve.ScipyMinimize(method), **tight)
    if method == "trust-constr":
        # its gtol test held on the barrier subproblem, the barrier parameter above
        # 1e-6 (1 + |f|): short of x* (below), so not SUCCESS
        assert sol.retcode == optsolve.ReturnCode.STALLED, sol.message
        assert "barrier parameter" in sol.message
    else:
        assert sol.retcode == optsolve.ReturnCode.SUCCESS, sol.message
    by_scipy = so.minimize(
        F_NP, np.zeros(2), method=method, constraints=[constraint], options=tight
    )
    np.testing.assert_allclose(sol.x, by_scipy.x, atol=1e-8)
    # scipy's own trust-constr ends 1e-4 short of x* here (its barrier's stopping test)
    np.testing.assert_allclose(sol.x, expected, atol=1e-6 if method == "SLSQP" else 3e-4)


def test_a_single_scipy_constraint_and_a_malformed_dict():
    prob = OptimizationProblem(
        F, jnp.zeros(2), constraints=so.LinearConstraint([[1.0, 1.0]], -np.inf, 1.0)
    )
    assert len(prob.constraints) == 1
    with pytest.raises(TypeError, match=r"constraints\[0\]` is a dict.*type='le'"):
        OptimizationProblem(F, jnp.zeros(2), constraints=[{"type": "le", "fun": lambda x: x[0]}])
    with pytest.raises(
        TypeError, match=r"constraints\[1\]` must be an optsolve.Constraint \(or scipy"
    ):
        OptimizationProblem(F, jnp.zeros(2), constraints=[{"type": "eq", "fun": lambda x: x[0]}, 3])


def test_a_float32_objective_under_scipy_warns_once_naming_x64():
    # JAX's x64 mode is process-wide and on in this suite: a fresh interpreter without it
    script = (
        "import warnings, jax.numpy as jnp, optsolve\n"
        "from optsolve import OptimizationProblem, solve\n"
        "prob = OptimizationProblem(lambda x, p: jnp.sum((x - 3.0) ** 2), jnp.zeros(2))\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for method in ('L-BFGS-B', 'BFGS'):\n"
        "        solve(prob, optsolve.ScipyMinimize(method))\n"
        "    solve(prob, optsolve.LBFGS())\n"
        "print(sum('jax_enable_x64' in str(w.message) for w in caught))\n"
    )
    assert run_without_x64(script).split()[-1] == "1"
