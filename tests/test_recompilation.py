"""The recompilation warning: it fires where an object rebuilt per call compiles again (a
raw optax transformation, an optax schedule, f), naming the pytree forms, and not where
only numbers change (pytree algorithms and schedules, p)."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import optax
import pytest

import optsolve
from optsolve import OptimizationProblem, RecompilationWarning, solve
from compile_count import count_compilations


def _quadratic(x, p):
    return jnp.sum((x - p) ** 2) + 0.01 * jnp.sum(x ** 4)


def _no_warning(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return not [w for w in caught if issubclass(w.category, RecompilationWarning)]


def test_a_raw_optax_transformation_rebuilt_per_call_warns_and_names_the_class():
    prob = OptimizationProblem(_quadratic, jnp.zeros(5), 1.0)
    solve(prob, optax.lbfgs(), maxiters=3)
    with count_compilations() as counter, pytest.warns(
            RecompilationWarning, match=r"compiles again because .*optsolve\.OptaxLBFGS\(\)"):
        solve(prob, optax.lbfgs(), maxiters=3)
    assert counter.count >= 1  # it did compile again
    # once per structure
    assert _no_warning(lambda: solve(prob, optax.lbfgs(), maxiters=3))
    # the pytree class: new numbers, no compilation, no warning
    solve(prob, optsolve.OptaxLBFGS(learning_rate=0.5), maxiters=3)
    with count_compilations() as counter:
        assert _no_warning(lambda: [solve(prob, optsolve.OptaxLBFGS(learning_rate=r), maxiters=3)
                                    for r in (0.6, 0.7)])
    assert counter.count == 0


def test_different_optax_transformations_built_by_the_same_function_do_not_warn():
    # both are optax.chain's closures: they print alike but close over other functions
    prob = OptimizationProblem(_quadratic, jnp.zeros(4), 1.0)
    zoom_chain = optax.chain(optax.sgd(1.0), optax.scale_by_zoom_linesearch(max_linesearch_steps=20))
    solve(prob, zoom_chain, maxiters=3)
    with count_compilations() as counter:
        assert _no_warning(lambda: solve(prob, optax.lbfgs(), maxiters=3))
    assert counter.count >= 1
    # the same chain rebuilt with another number is still the user's recompilation to avoid
    with pytest.warns(RecompilationWarning, match="chain"):
        solve(prob, optax.chain(optax.sgd(0.5), optax.scale_by_zoom_linesearch(
            max_linesearch_steps=20)), maxiters=3)


def test_an_optax_schedule_rebuilt_per_call_warns_and_optsolves_does_not():
    prob = OptimizationProblem(_quadratic, jnp.zeros(6), 1.0)
    run = lambda schedule: solve(prob, optsolve.Adam(schedule), maxiters=5)
    run(optax.cosine_decay_schedule(0.1, 10))
    with pytest.warns(RecompilationWarning, match="optsolve.schedules"):
        run(optax.cosine_decay_schedule(0.2, 10))
    run(optsolve.schedules.cosine_decay_schedule(0.1, 10))
    assert _no_warning(lambda: run(optsolve.schedules.cosine_decay_schedule(0.3, 10)))


def test_f_rebuilt_per_call_warns_and_p_does_not():
    def make(scale):
        return lambda x, p: scale * jnp.sum((x - p) ** 2)

    x0 = jnp.zeros(7)
    solve(OptimizationProblem(make(1.0), x0, 1.0), optsolve.LBFGS())
    with pytest.warns(RecompilationWarning, match=r"<function .*make\.<locals>\.<lambda>> is a new object"):
        solve(OptimizationProblem(make(2.0), x0, 1.0), optsolve.LBFGS())
    assert _no_warning(lambda: solve(OptimizationProblem(_quadratic, x0, 2.0), optsolve.LBFGS()))
    assert _no_warning(lambda: solve(OptimizationProblem(_quadratic, x0, 3.0), optsolve.LBFGS()))
