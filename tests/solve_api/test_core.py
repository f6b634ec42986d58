"""The problem / solve / solution contract: pytrees, return codes and every bad-input error
of DESIGN.md, each with its message."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import Constraint, OptimizationProblem, ReturnCode, Solution, solve

quadratic = lambda x, p: jnp.sum((x - p) ** 2)


def test_problem_is_a_pytree_with_f_static():
    prob = OptimizationProblem(
        quadratic, jnp.zeros(3), p={"a": 1.0, "b": (2.0, 3.0)}, bounds=(-1.0, None)
    )
    leaves, treedef = jax.tree_util.tree_flatten(prob)
    # x0, p's three numbers, the lower and the upper bound
    assert len(leaves) == 6
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.f is quadratic and rebuilt.p["b"] == (2.0, 3.0)
    np.testing.assert_array_equal(rebuilt.bounds[0], [-1.0, -1.0, -1.0])
    np.testing.assert_array_equal(rebuilt.bounds[1], [np.inf] * 3)


def test_replace_gives_a_new_problem_and_validates():
    prob = OptimizationProblem(quadratic, jnp.zeros(2), 1.0)
    other = prob.replace(p=2.0)
    assert other.p == 2.0 and prob.p == 1.0 and other.f is prob.f
    with pytest.raises(TypeError, match=r"unknown field\(s\) \['q'\]"):
        prob.replace(q=1.0)
    with pytest.raises(TypeError, match="x0"):
        prob.replace(x0=jnp.zeros(2, jnp.int32))


def test_replace_inside_jit_and_grad():
    prob = OptimizationProblem(quadratic, jnp.zeros(2), 1.0)
    out = jax.jit(lambda p: prob.replace(p=p).p * 2)(3.0)
    assert out == 6.0


def test_nested_dict_x0_like_flax_params():
    x0 = {"params": {"dense": {"kernel": jnp.zeros((2, 3)), "bias": jnp.zeros(3)}}}
    target = {"params": {"dense": {"kernel": jnp.ones((2, 3)), "bias": -jnp.ones(3)}}}
    f = lambda x, p: sum(
        jnp.sum((a - b) ** 2)
        for a, b in zip(jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(p))
    )
    sol = solve(OptimizationProblem(f, x0, target), optsolve.Adam(0.1), maxiters=300, gtol=1e-6)
    assert sol.success
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), sol.x, target)


def test_scalar_x0():
    sol = solve(
        OptimizationProblem(lambda x, p: (x - 2.0) ** 2, jnp.asarray(0.0)),
        optsolve.SGD(0.25),
        maxiters=3,
    )
    # SGD on (x-2)^2 with lr 0.25 halves the distance each step: 2 - 2 * 0.5**3
    np.testing.assert_allclose(sol.x, 1.75, rtol=1e-15)


def test_return_codes_carry_messages_and_compare_with_arrays():
    for code in ReturnCode:
        assert isinstance(code.message, str) and len(code.message) > 20
    assert jnp.asarray(0, jnp.int32) == ReturnCode.SUCCESS
    assert "maxiters" in ReturnCode.MAXITERS.message


def test_solution_fields_and_repr():
    prob = OptimizationProblem(quadratic, jnp.zeros(2), 1.0)
    sol = solve(prob, optsolve.Adam(0.1), maxiters=5)
    assert isinstance(sol, Solution)
    for field in ("x", "objective", "retcode", "success", "stats", "original", "state", "message"):
        getattr(sol, field)
    assert sol.retcode is ReturnCode.MAXITERS and sol.success == False  # noqa: E712
    assert int(sol.stats.iterations) == 5 and int(sol.stats.f_evals) == 6
    assert int(sol.stats.grad_evals) == 6 and sol.stats.time > 0
    assert "MAXITERS" in repr(sol)
    np.testing.assert_allclose(sol.objective, quadratic(sol.x, 1.0), rtol=1e-15)
    # the optimizer state is there to continue from: adam's step count
    assert int(optax.tree.get(sol.state, "count")) == 5


# ------------------------------------------------------------------------------ bad input


def test_non_scalar_objective():
    prob = OptimizationProblem(lambda x, p: x**2, jnp.zeros(3))
    with pytest.raises(ValueError, match=r"must return a scalar, got an array of shape \(3,\)"):
        solve(prob, optsolve.Adam(0.1), maxiters=3)


def test_complex_objective():
    prob = OptimizationProblem(lambda x, p: jnp.sum(x * 1j), jnp.zeros(3))
    with pytest.raises(TypeError, match="real floating-point scalar, got a complex value"):
        solve(prob, optsolve.Adam(0.1), maxiters=3)


def test_integer_objective_and_non_array_objective():
    with pytest.raises(TypeError, match="got a int32 value"):
        solve(
            OptimizationProblem(lambda x, p: jnp.int32(3), jnp.zeros(3)),
            optsolve.Adam(0.1),
            maxiters=3,
        )
    with pytest.raises(TypeError, match="must return a scalar array"):
        solve(
            OptimizationProblem(lambda x, p: (jnp.sum(x), x), jnp.zeros(3)),
            optsolve.Adam(0.1),
            maxiters=3,
        )


def test_integer_x0():
    with pytest.raises(TypeError, match=r"`x0` must hold real floating-point arrays .* int32"):
        OptimizationProblem(quadratic, jnp.zeros(3, jnp.int32))
    with pytest.raises(TypeError, match=r"leaf x0\['b'\] has dtype int"):
        OptimizationProblem(quadratic, {"a": jnp.zeros(2), "b": np.arange(3)})
    with pytest.raises(TypeError, match="complex"):
        OptimizationProblem(quadratic, jnp.zeros(2, jnp.complex64))


def test_f_not_callable():
    with pytest.raises(TypeError, match="`f` must be a callable"):
        OptimizationProblem(3.0, jnp.zeros(2))


def test_bounds_that_do_not_match_x0():
    with pytest.raises(
        ValueError,
        match=r"`bounds` lower has a leaf of shape \(2,\) where x0 has "
        r"shape \(3,\)",
    ):
        OptimizationProblem(quadratic, jnp.zeros(3), bounds=(jnp.zeros(2), None))
    with pytest.raises(ValueError, match="structure of x0"):
        OptimizationProblem(quadratic, {"a": jnp.zeros(2)}, bounds=({"b": 0.0}, None))
    with pytest.raises(ValueError, match=r"must be a pair \(lower, upper\)"):
        OptimizationProblem(quadratic, jnp.zeros(3), bounds=0.0)


def test_bounds_with_lower_above_upper():
    with pytest.raises(ValueError, match="lower <= upper"):
        OptimizationProblem(quadratic, jnp.zeros(3), bounds=(jnp.array([0.0, 2.0, 0.0]), 1.0))
    with pytest.raises(ValueError, match="`lower` must be <= `upper`"):
        Constraint(lambda x, p: x[0], lower=1.0, upper=0.0)


def test_unknown_option_lists_the_valid_ones():
    prob = OptimizationProblem(quadratic, jnp.zeros(2))
    with pytest.raises(
        TypeError,
        match=r"Adam does not take the option\(s\) 'tol'. Valid options: "
        r"maxiters, maxtime, gtol, ftol, callback, callback_every",
    ):
        solve(prob, optsolve.Adam(0.1), maxiters=3, tol=1e-3)


def test_bad_option_values():
    prob = OptimizationProblem(quadratic, jnp.zeros(2))
    with pytest.raises(TypeError, match="`maxiters` must be an integer, got 2.5"):
        solve(prob, optsolve.Adam(0.1), maxiters=2.5)
    with pytest.raises(ValueError, match="`gtol` must be >= 0"):
        solve(prob, optsolve.Adam(0.1), maxiters=3, gtol=-1.0)
    with pytest.raises(TypeError, match="`callback` must be callable"):
        solve(prob, optsolve.Adam(0.1), maxiters=3, callback=5)
    with pytest.raises(ValueError, match="`callback_every` must be an integer >= 1"):
        solve(prob, optsolve.Adam(0.1), maxiters=3, callback=print, callback_every=0)


def test_bounds_given_to_an_algorithm_that_cannot_honour_them():
    prob = OptimizationProblem(quadratic, jnp.zeros(2), 0.5, bounds=(0.0, 1.0))
    with pytest.raises(
        ValueError,
        match="Adam does not support bounds. Either remove `bounds` "
        "from the problem or use an algorithm that takes them",
    ):
        solve(prob, optsolve.Adam(0.1), maxiters=3)
    # infinite bounds are no bounds
    unbounded = OptimizationProblem(quadratic, jnp.zeros(2), 0.5, bounds=(-jnp.inf, None))
    assert solve(unbounded, optsolve.Adam(0.1), maxiters=3).stats.iterations == 3


def test_constraints_given_to_an_algorithm_that_cannot_honour_them():
    prob = OptimizationProblem(
        quadratic, jnp.zeros(2), constraints=[Constraint(lambda x, p: x[0] + x[1], 1.0, 1.0)]
    )
    with pytest.raises(ValueError, match="OptaxTransform does not support constraints"):
        solve(prob, optax.adam(0.1), maxiters=3)
    with pytest.raises(TypeError, match=r"`constraints\[0\]` must be an optsolve.Constraint"):
        OptimizationProblem(quadratic, jnp.zeros(2), constraints=[lambda x, p: x])


def test_maxiters_missing_where_nothing_else_stops_the_run():
    prob = OptimizationProblem(quadratic, jnp.zeros(2), 1.0)
    with pytest.raises(
        ValueError, match="Adam has no convergence test of its own, so `maxiters` is required"
    ):
        solve(prob, optsolve.Adam(0.1))
    # a tolerance is another way to stop
    assert solve(prob, optsolve.Adam(0.1), gtol=1e-6).success


def test_wrong_algorithm_and_problem_types():
    prob = OptimizationProblem(quadratic, jnp.zeros(2))
    with pytest.raises(TypeError, match="got the class Adam; call it"):
        solve(prob, optsolve.Adam, maxiters=3)
    with pytest.raises(TypeError, match="`algorithm` must be an optsolve algorithm .* got str"):
        solve(prob, "adam", maxiters=3)
    with pytest.raises(TypeError, match="`problem` must be an optsolve.OptimizationProblem"):
        solve(quadratic, optsolve.Adam(0.1), maxiters=3)


def test_bad_hyperparameter_names_the_signature():
    with pytest.raises(
        TypeError,
        match=r"Adam: unknown argument\(s\) 'beta1'\. Adam takes "
        r"learning_rate, b1, b2, eps",
    ):
        optsolve.Adam(
            1e-3, beta1=0.9
        )  # the names, not every annotation (tests/solve_api/test_errors.py)
    with pytest.raises(TypeError, match="missing a required argument: 'learning_rate'"):
        optsolve.Adam()
    with pytest.raises(TypeError, match=r"unknown hyperparameter\(s\) \['beta1'\]"):
        optsolve.Adam(1e-3).replace(beta1=0.9)
