"""Errors people can act on: each names the argument, what was expected, what was given and
the nearest valid choice, in under ~300 characters; and scipy's habits (``callback(xk)``,
``metrics`` without ``history``) accepted where they are unambiguous."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve
from optsolve.solve_api.registry import algorithm_classes

LIMIT = 300
BOWL = lambda x, p: jnp.sum((x - 3.0) ** 2)
PROB = OptimizationProblem(BOWL, jnp.zeros(3))


def _raised(exc_type, fn, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert len(message) < LIMIT, f"{len(message)} characters: {message}"
    return message


# ------------------------------------------------------------------ misspelled keywords


def test_a_misspelled_solve_keyword_gets_did_you_mean_and_every_option():
    with pytest.raises(TypeError) as info:
        solve(PROB, optsolve.Adam(0.1), maxiter=10)
    message = str(info.value)
    # every keyword of solve's signature is listed (about 20 of them: a little over LIMIT)
    assert len(message) < LIMIT + 30, f"{len(message)} characters: {message}"
    assert "'maxiter'" in message and "did you mean 'maxiters'" in message, message
    params = inspect.signature(solve).parameters
    for name, param in params.items():
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            assert name in message, (name, message)
    assert "callback_every" in message
    with pytest.raises(TypeError, match="xtol; did you mean 'xtol'") as info:
        solve(PROB, optsolve.LBFGS(), xtoll=1e-8)
    assert len(str(info.value)) < LIMIT + 30


def test_a_misspelled_algorithm_keyword_is_short_and_suggests():
    message = _raised(TypeError, optsolve.Adam, learning_rte=0.1)
    assert "'learning_rte'" in message and "did you mean 'learning_rate'" in message, message
    message = _raised(TypeError, optsolve.LBFGS, memroy_size=3)
    assert "did you mean 'memory_size'" in message and "linesearch" in message, message
    message = _raised(TypeError, optsolve.Adam)
    assert "learning_rate" in message, message


def test_every_registered_class_names_its_arguments_for_an_unknown_one():
    for cls in algorithm_classes():
        params = inspect.signature(cls).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            continue  # scipy's classes take the method's options, checked by their table
        with pytest.raises(TypeError) as info:
            cls(not_an_argument=1.0)
        message = str(info.value)
        assert len(message) < LIMIT and "not_an_argument" in message, (cls, message)
        assert cls.__name__ in message, (cls, message)


def test_key_must_be_a_prng_key():
    batches = jnp.ones((8, 3))
    prob = OptimizationProblem(lambda x, p, b: jnp.sum((b @ x) ** 2), jnp.zeros(3))
    message = _raised(TypeError, solve, prob, optsolve.Adam(0.1), data=batches, batch_size=2, key=0)
    assert "`key`" in message and "jax.random.key(0)" in message and "got 0" in message
    for key in (jax.random.key(1), jax.random.PRNGKey(1)):  # typed and raw keys work
        sol = solve(prob, optsolve.Adam(0.1), data=batches, batch_size=2, key=key)
        assert sol.stats.iterations == 4


# ------------------------------------------------------------------ f and callback


def test_a_one_argument_objective_is_told_it_takes_x_and_p():
    message = _raised(TypeError, OptimizationProblem, lambda x: jnp.sum(x**2), jnp.zeros(3))
    assert "f(x, p)" in message and "lambda x, p:" in message, message
    # a (x, p, batch) objective for training on data is still accepted
    OptimizationProblem(lambda x, p, batch: jnp.sum(x**2), jnp.zeros(3))


def test_a_scipy_style_callback_is_accepted():
    seen = []
    sol = solve(PROB, optsolve.LBFGS(), maxiters=3, callback=lambda xk: seen.append(xk))
    assert len(seen) == sol.stats.iterations and jnp.shape(seen[0]) == (3,)
    results = []

    def intermediate(intermediate_result):  # scipy's other form, by the parameter's name
        results.append(intermediate_result)
        if intermediate_result.nit >= 2:
            raise StopIteration

    rosenbrock = OptimizationProblem(
        lambda x, p: (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2, jnp.array([-1.2, 1.0])
    )
    sol = solve(rosenbrock, optsolve.BFGS(), callback=intermediate)
    assert sol.retcode == ReturnCode.TERMINATED and sol.stats.iterations == 2
    assert isinstance(results[-1], so.OptimizeResult)
    np.testing.assert_allclose(results[-1].fun, so.rosen(np.asarray(results[-1].x)), rtol=1e-12)


def test_a_callback_of_another_signature_is_told_the_signatures():
    message = _raised(
        TypeError, solve, PROB, optsolve.LBFGS(), maxiters=3, callback=lambda a, b: None
    )
    assert "callback(iteration, x, objective)" in message and "callback(xk)" in message
    assert "(a, b)" in message, message


# ------------------------------------------------------------------ metrics and history


def test_metrics_imply_history():
    sol = solve(PROB, optsolve.LBFGS(), maxiters=3, metrics=lambda x, p: {"x0": x[0]})
    k = sol.stats.iterations
    assert sol.history is not None
    np.testing.assert_allclose(sol.history.metrics["x0"][k], sol.x[0])
    # where a history needs maxiters (its length), that rule's error stays
    with pytest.raises(ValueError, match="needs `maxiters`"):
        solve(PROB, optsolve.LBFGS(), metrics=lambda x, p: x[0])


# ------------------------------------------------------------------ dense methods

BIG = 10**6  # one dense n x n float64 matrix: 7.3 TiB, more than any machine's memory


@pytest.mark.parametrize(
    "make, problem_kind",
    [
        (lambda: optsolve.BFGS(), "scalar"),
        (lambda: optsolve.GaussNewton(linear_solver="dense"), "residuals"),
        (lambda: optsolve.LevenbergMarquardt(linear_solver="dense"), "residuals"),
    ],
)
def test_a_dense_method_too_large_for_memory_is_refused_before_it_runs(make, problem_kind):
    x0 = jnp.zeros(BIG)
    if problem_kind == "scalar":
        prob = OptimizationProblem(BOWL, x0)
    else:
        prob = optsolve.LeastSquaresProblem(lambda x, p: x - 3.0, x0)
    alg = make()
    message = _raised(MemoryError, solve, prob, alg, maxiters=1)
    assert type(alg).__name__ in message and f"n = {BIG}" in message and "GiB" in message
    assert "LBFGS" in message, message


def test_a_dense_constrained_method_too_large_names_the_matrix_free_one():
    prob = OptimizationProblem(
        BOWL,
        jnp.zeros(BIG),
        constraints=[optsolve.Constraint(lambda x, p: jnp.sum(x), lower=1.0, upper=1.0)],
    )
    message = _raised(
        MemoryError, solve, prob, optsolve.InteriorPoint(linear_solver="dense"), maxiters=1
    )
    assert "InteriorPoint" in message and f"n = {BIG}" in message
    assert "linear_solver='minres'" in message and "AugmentedLagrangian" in message, message


def test_a_dense_adjoint_too_large_for_memory_is_refused_before_it_runs():
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(BIG), 1.0)
    dense = optsolve.ImplicitAdjoint(linear_solver="dense")

    def loss(p):
        return jnp.sum(solve(prob.replace(p=p), optsolve.LBFGS(), maxiters=1, adjoint=dense).x)

    with pytest.raises(MemoryError) as info:
        jax.grad(loss)(1.0)
    message = str(info.value)
    assert len(message) < LIMIT and "linear_solver='dense'" in message and "cg" in message


def test_resume_with_another_algorithm_names_both_states_briefly():
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - 1.0) ** 2), jnp.zeros(3))
    adam = solve(prob, optsolve.Adam(0.1), maxiters=3)
    for other in (optsolve.SGD(0.1, momentum=0.9), optsolve.LBFGS()):
        with pytest.raises(ValueError) as caught:
            solve(prob, other, maxiters=3, resume=adam)
        message = str(caught.value)
        assert "ScaleByAdamState" in message and "PyTreeDef" not in message
        assert "resume=None" in message and len(message) < 300
