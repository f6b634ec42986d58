"""The XLA options of an eager run's compiled chunk (backends/native/compile_options.py):
XLA's classic emitters where every array of the program is small, XLA's defaults
elsewhere, and a fallback where an XLA refuses the option."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import OptimizationProblem, solve
from optsolve.backends.native import chunked, compile_options


def _rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


@pytest.fixture
def chosen(monkeypatch):
    """The compiler options chosen for each eager chunk compiled from here on."""
    seen = []

    def spy(small):
        seen.append(compile_options.chunk_options(small))
        return seen[-1]

    monkeypatch.setattr(chunked, "chunk_options", spy)
    chunked._TEMPLATES.clear()
    yield seen
    chunked._TEMPLATES.clear()


def test_largest_array_counts_constants_and_nested_programs():
    data = jnp.arange(300.0)  # a constant of the program: 300 elements

    @jax.jit
    def inner(v):  # a nested program: the outer product, 40 x 40 = 1600 elements
        return jnp.sum(jnp.outer(v, v))

    def f(x):
        y = lax_loop(x)
        return inner(y[:40]) + jnp.sum(data)

    def lax_loop(x):  # a loop body's 2 x 100 = 200-element stack
        return jax.lax.fori_loop(0, 3, lambda i, v: jnp.stack([v, v])[0] * 0.5, x)

    program = jax.make_jaxpr(f)(jnp.ones(100))
    assert compile_options.largest_array(program) == 1600
    assert compile_options.largest_array(jax.make_jaxpr(lambda x: x + data)(1.0)) == 300


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the option is the CPU backend's")
def test_a_small_problem_compiles_with_classic_emitters_a_large_one_with_defaults(chosen):
    small = solve(OptimizationProblem(_rosenbrock, jnp.array([-1.2, 1.0] * 5)), optsolve.LBFGS())
    # data of 300 x 100 = 30000 elements, closed over: a constant of the program
    data = jnp.asarray(np.random.default_rng(0).normal(size=(300, 100)))

    def least_squares(x, p):
        return jnp.mean((data @ x - 1.0) ** 2)

    large = solve(OptimizationProblem(least_squares, jnp.zeros(100)), optsolve.LBFGS())
    assert chosen == [compile_options.CLASSIC_EMITTERS, None]
    assert small.retcode == optsolve.ReturnCode.SUCCESS
    np.testing.assert_allclose(small.x, np.ones(10), rtol=1e-7)
    # the large problem's minimum, from numpy's least squares
    expected = np.linalg.lstsq(np.asarray(data), np.ones(300), rcond=None)[0]
    np.testing.assert_allclose(large.x, expected, atol=1e-5)


def test_the_eager_solve_equals_the_jitted_one_at_rounding_level():
    problem = OptimizationProblem(_rosenbrock, jnp.array([-1.2, 1.0] * 5))
    eager = solve(problem, optsolve.BFGS())
    jitted = jax.jit(lambda x0: solve(OptimizationProblem(_rosenbrock, x0), optsolve.BFGS()))(
        problem.x0
    )
    assert eager.retcode == jitted.retcode == optsolve.ReturnCode.SUCCESS
    np.testing.assert_allclose(eager.x, jitted.x, rtol=1e-9)
    np.testing.assert_allclose(eager.x, np.ones(10), rtol=1e-8)


def test_an_xla_that_refuses_the_option_compiles_with_its_defaults(chosen, monkeypatch):
    monkeypatch.setattr(compile_options, "CLASSIC_EMITTERS", {"xla_no_such_option": False})
    monkeypatch.setattr(compile_options, "_unsupported", set())

    def shifted(x, p):  # a function of its own: no compiled chunk to reuse
        return jnp.sum((x - 3.0) ** 2)

    first = solve(OptimizationProblem(shifted, jnp.zeros(4)), optsolve.LBFGS())
    second = solve(OptimizationProblem(shifted, jnp.ones(4)), optsolve.LBFGS())
    np.testing.assert_allclose(first.x, 3.0)
    np.testing.assert_allclose(second.x, 3.0)
    # refused once, then not asked for again in this process
    assert compile_options._unsupported == {"xla_no_such_option"}
    assert chosen == [{"xla_no_such_option": False}, None]
    assert compile_options.chunk_options(True) is None
