"""The recompilation warning: it fires where an object rebuilt per call compiles again (a
raw optax transformation, an optax schedule, f), naming the pytree forms, and not where
only numbers change (pytree algorithms and schedules, p)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_contract

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, RecompilationWarning, solve


def _quadratic(x, p):
    return jnp.sum((x - p) ** 2) + 0.01 * jnp.sum(x**4)


def _no_warning(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return not [w for w in caught if issubclass(w.category, RecompilationWarning)]


def test_a_raw_optax_transformation_rebuilt_per_call_warns_and_names_the_class():
    prob = OptimizationProblem(_quadratic, jnp.zeros(5), 1.0)
    solve(prob, optax.lbfgs(), maxiters=3)
    with (
        count_compilations() as counter,
        pytest.warns(
            RecompilationWarning, match=r"compiles again because .*optsolve\.OptaxLBFGS\(\)"
        ),
    ):
        solve(prob, optax.lbfgs(), maxiters=3)
    assert counter.count >= 1  # it did compile again
    # once per structure
    assert _no_warning(lambda: solve(prob, optax.lbfgs(), maxiters=3))
    # the pytree class: new numbers, no compilation, no warning
    solve(prob, optsolve.OptaxLBFGS(learning_rate=0.5), maxiters=3)
    with count_compilations() as counter:
        assert _no_warning(
            lambda: [
                solve(prob, optsolve.OptaxLBFGS(learning_rate=r), maxiters=3) for r in (0.6, 0.7)
            ]
        )
    assert counter.count == 0


def test_different_optax_transformations_built_by_the_same_function_do_not_warn():
    # both are optax.chain's closures: they print alike but close over other functions
    prob = OptimizationProblem(_quadratic, jnp.zeros(4), 1.0)
    zoom_chain = optax.chain(
        optax.sgd(1.0), optax.scale_by_zoom_linesearch(max_linesearch_steps=20)
    )
    solve(prob, zoom_chain, maxiters=3)
    with count_compilations() as counter:
        assert _no_warning(lambda: solve(prob, optax.lbfgs(), maxiters=3))
    assert counter.count >= 1
    # the same chain rebuilt with another number is still the user's recompilation to avoid
    with pytest.warns(RecompilationWarning, match="chain"):
        solve(
            prob,
            optax.chain(optax.sgd(0.5), optax.scale_by_zoom_linesearch(max_linesearch_steps=20)),
            maxiters=3,
        )


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
    with pytest.warns(
        RecompilationWarning, match=r"<function .*make\.<locals>\.<lambda>> is a new object"
    ):
        solve(OptimizationProblem(make(2.0), x0, 1.0), optsolve.LBFGS())
    assert _no_warning(lambda: solve(OptimizationProblem(_quadratic, x0, 2.0), optsolve.LBFGS()))
    assert _no_warning(lambda: solve(OptimizationProblem(_quadratic, x0, 3.0), optsolve.LBFGS()))


# ---------------------------------------------- closures the fingerprint cannot describe
# The check only warns: nothing a closure holds may stop a solve (issue 40). Each value
# below once broke, or could break, the fingerprint: the jax.numpy module has `shape` and
# `dtype` attributes (functions), so it looked like an array.


class _Opaque:
    """An arbitrary object with nothing to describe."""


class _Hostile:
    """An object whose comparison, iteration, length and printing all raise."""

    __hash__ = object.__hash__

    def __eq__(self, other):
        raise RuntimeError("no comparison")

    def __iter__(self):
        raise RuntimeError("no iteration")

    def __len__(self):
        raise RuntimeError("no length")

    def __repr__(self):
        raise RuntimeError("no printing")


class _NoAttributes(_Hostile):
    """Also every missing attribute raises something other than AttributeError (so that
    hasattr raises too)."""

    def __getattr__(self, name):
        raise RuntimeError(f"no attribute {name}")


class _BadList(list):
    """A list whose iteration raises."""

    def __iter__(self):
        raise RuntimeError("no iteration")


class _BadDict(dict):
    """A dict whose items raise."""

    def items(self):
        raise RuntimeError("no items")


class _ShapeRaises:
    """An object whose `shape` and `dtype` are properties that raise."""

    @property
    def shape(self):
        raise RuntimeError("no shape")

    @property
    def dtype(self):
        raise RuntimeError("no dtype")


def _closure_over_unprintable_values(scale):
    """f and residuals (the registry's problems) closing over a module, a class and
    objects the fingerprint cannot describe, as `import jax.numpy as jnp` inside a
    function that then defines f does."""
    import math as math_module

    import jax.numpy as jnp_module

    held = (
        jnp_module,
        math_module,
        _Opaque,
        _Opaque(),
        _Hostile(),
        _BadList([1, 2]),
        _BadDict(a=1),
        _ShapeRaises(),
        type,
        object(),
    )
    _objective, _residuals = test_contract._objective, test_contract._residuals

    def f(x, p):
        assert held  # closes over all of them
        return scale * jnp_module.asarray(_objective(x, p))

    def residuals(x, p):
        assert held
        return jnp_module.sqrt(scale) * _residuals(x, p)

    return f, residuals


@test_contract.pytestmark  # the registry's own deprecation warnings
@pytest.mark.parametrize("cls", test_contract.CLASSES, ids=test_contract._id)
def test_a_closure_over_modules_classes_and_hostile_objects_never_stops_a_solve(cls):
    """Over the whole registry (the contract matrix's cases): every backend reaches the
    check, eager and compiled paths alike."""
    case = test_contract.CASES[cls]
    f, residuals = _closure_over_unprintable_values(1.0)
    prob = test_contract.problem_for(
        cls, f, residuals, test_contract._start(cls), 10.0, test_contract.BOX if case.box else None
    )
    sol = solve(prob, case.make(), maxiters=2)
    np.testing.assert_allclose(
        sol.objective, test_contract._rosenbrock(sol.x, 10.0), rtol=1e-12, atol=1e-14
    )


def test_a_rebuilt_closure_over_a_module_still_warns():
    f1, _ = _closure_over_unprintable_values(1.0)
    f2, _ = _closure_over_unprintable_values(2.0)
    x0 = jnp.array([-1.2, 1.0, 1.0])  # a structure no other test here solves
    solve(OptimizationProblem(f1, x0, 10.0), optsolve.GradientDescent(), maxiters=2)
    with pytest.warns(
        RecompilationWarning, match=r"closure_over_unprintable_values.*is a new object"
    ):
        solve(OptimizationProblem(f2, x0, 10.0), optsolve.GradientDescent(), maxiters=2)


def test_hooks_that_cannot_be_printed_never_stop_a_solve():
    class Callback:  # a callback Python's inspect can read, but not printable
        def __call__(self, i, x, f):
            return None

        def __repr__(self):
            raise RuntimeError("no printing")

    x0 = jnp.array([-1.2, 1.0])
    prob = OptimizationProblem(_quadratic, x0, 1.0)
    first = solve(prob, optsolve.GradientDescent(), maxiters=2, callback=Callback())
    again = solve(prob, optsolve.GradientDescent(), maxiters=2, callback=Callback())
    np.testing.assert_array_equal(first.x, again.x)


def test_the_check_itself_takes_any_value_without_raising():
    # the fingerprint directly, on values beyond what a solve reaches: hasattr raising
    from optsolve.solve_api import recompilation

    hostile = _NoAttributes()

    def f(x, p):
        return hostile

    leaves, treedef = jax.tree_util.tree_flatten(OptimizationProblem(f, jnp.zeros(2), 1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recompilation.note(leaves, treedef, (hostile, None, None))
        recompilation.note(leaves + [hostile], treedef, (hostile, None, None))
    assert "_NoAttributes" in recompilation._built(f, 0)
    assert recompilation._built(jnp, 0) == "module(jax.numpy)"
