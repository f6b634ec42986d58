"""``sol.x`` has the structure of ``x0``: a list of numbers (scipy's form, one array inside
``f``) comes back as a list, and an integer NumPy array is taken like a list of integers.
The rule over every registered algorithm is in test_contract.py
(``test_x0s_structure_is_kept``). References: closed forms (the box's corner, the
quadratic's minimiser) and the treedef of x0 itself."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import OptimizationProblem, solve

INF = float("inf")
BOWL = lambda x, p: jnp.sum((x - 3.0) ** 2)  # x: one array, scipy's form


def _same_structure(a, b) -> bool:
    return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)


def test_a_bounded_list_comes_back_a_list():
    # the case: optimistix's bounded tests start from lists, compare leaf by leaf
    x0 = [-1.0, -1.0]
    sol = solve(OptimizationProblem(BOWL, x0, bounds=([-INF, -INF], [0.0, 0.0])), optsolve.LBFGS())
    assert isinstance(sol.x, list) and _same_structure(sol.x, x0), sol.x
    for leaf in sol.x:
        np.testing.assert_allclose(leaf, 0.0, atol=1e-10)


def test_nested_lists_come_back_nested():
    x0 = [[0.0, 1.0], [2.0, 4.0]]
    sol = solve(OptimizationProblem(BOWL, x0), optsolve.LBFGS(), gtol=1e-10)
    assert _same_structure(sol.x, x0), sol.x
    np.testing.assert_allclose(np.array(sol.x), np.full((2, 2), 3.0), atol=1e-8)


def test_a_list_of_numbers_is_one_array_inside_f_and_the_hooks():
    seen = []
    sol = solve(
        OptimizationProblem(lambda x, p: x @ x, [1.0, 2.0]),
        optsolve.LBFGS(),
        callback=lambda i, x, f: seen.append(jnp.shape(x)),
        maxiters=3,
    )
    assert seen and set(seen) == {(2,)}
    assert isinstance(sol.x, list) and len(sol.x) == 2


def test_integer_numpy_array_and_integer_list_get_the_same_treatment():
    by_list = solve(OptimizationProblem(BOWL, [3, 4]), optsolve.LBFGS(), gtol=1e-10)
    by_array = solve(OptimizationProblem(BOWL, np.array([3, 4])), optsolve.LBFGS(), gtol=1e-10)
    np.testing.assert_allclose(np.array(by_list.x), [3.0, 3.0], atol=1e-8)
    np.testing.assert_allclose(by_array.x, [3.0, 3.0], atol=1e-8)
    # each in the structure it was given: a list, an array
    assert isinstance(by_list.x, list)
    assert isinstance(by_array.x, jax.Array) and by_array.x.dtype == jnp.float64
    # a JAX integer array is not scipy's form: still refused, with how to convert it
    with pytest.raises(TypeError, match="int32"):
        OptimizationProblem(BOWL, jnp.array([3, 4], jnp.int32))


def test_structure_kept_through_replace_jit_vmap_and_grad():
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), [0.0, 0.0], p=1.0)
    alg = optsolve.LBFGS()
    jitted = jax.jit(lambda p: solve(prob.replace(p=p), alg).x)(2.0)
    assert isinstance(jitted, list) and len(jitted) == 2
    np.testing.assert_allclose(jitted, [2.0, 2.0], atol=1e-8)
    batch = jax.vmap(lambda p: solve(prob.replace(p=p), alg).x)(jnp.array([1.0, 2.0]))
    assert isinstance(batch, list) and len(batch) == 2
    np.testing.assert_allclose(batch[1], [1.0, 2.0], atol=1e-8)
    dx = jax.grad(lambda p: solve(prob.replace(p=p), alg).x[1])(1.0)
    np.testing.assert_allclose(dx, 1.0, rtol=1e-6)


def test_a_list_solution_warm_starts_and_resumes():
    rosenbrock = lambda x, p: (1 - x[0]) ** 2 + 10 * (x[1] - x[0] ** 2) ** 2
    prob = OptimizationProblem(rosenbrock, [-1.2, 1.0])
    first = solve(prob, optsolve.LBFGS(), maxiters=2)
    resumed = solve(prob, optsolve.LBFGS(), maxiters=3, resume=first)
    whole = solve(prob, optsolve.LBFGS(), maxiters=5)
    assert isinstance(resumed.x, list) and resumed.stats.iterations == 5
    np.testing.assert_allclose(np.array(resumed.x), np.array(whole.x), rtol=1e-12)
    # prob.replace(x0=sol.x): the same form again (f still receives one array)
    again = solve(prob.replace(x0=first.x), optsolve.LBFGS(), gtol=1e-10)
    assert isinstance(again.x, list)
    np.testing.assert_allclose(np.array(again.x), [1.0, 1.0], atol=1e-7)


def test_scipy_backend_keeps_the_structure_too():
    sol = solve(
        OptimizationProblem(BOWL, [0.0, 1.0], bounds=[(0, 1), (0, 2)]),
        optsolve.ScipyMinimize("L-BFGS-B"),
    )
    assert isinstance(sol.x, list)
    np.testing.assert_allclose(np.array(sol.x), [1.0, 2.0], atol=1e-8)


def test_a_checkpoint_of_a_list_run_resumes(tmp_path):
    rosenbrock = lambda x, p: (1 - x[0]) ** 2 + 10 * (x[1] - x[0] ** 2) ** 2
    prob = OptimizationProblem(rosenbrock, [-1.2, 1.0])
    path = tmp_path / "run.npz"
    solve(prob, optsolve.LBFGS(), maxiters=3, checkpoint=path, checkpoint_every=2)
    resumed = solve(prob, optsolve.LBFGS(), maxiters=3, resume=optsolve.load(path))
    whole = solve(prob, optsolve.LBFGS(), maxiters=5)
    assert isinstance(resumed.x, list) and resumed.stats.iterations == 5
    np.testing.assert_allclose(np.array(resumed.x), np.array(whole.x), rtol=1e-12)


def test_covariance_of_a_solution_started_from_a_list():
    # f takes one array although x0 was a list; the inverse Hessian of
    # (x0 - 1)^2 + 4 (x1 - 1)^2 is diag(1/2, 1/8)
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - 1.0) ** 2 * jnp.array([1.0, 4.0])), [0.0, 0.0]
    )
    sol = solve(prob, optsolve.LBFGS())
    assert isinstance(sol.x, list)
    np.testing.assert_allclose(optsolve.covariance(sol), np.diag([0.5, 0.125]), rtol=1e-8)
