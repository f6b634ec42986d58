"""An eager gradient-step run keeps no previous iterate in its compiled loop: where it fails,
the host runs the failed chunk again up to the last good iterate. Its Solution must be the
one a jitted run returns (which keeps the previous iterate at every step), bit for bit,
wherever the failure falls among the chunks.

The problem has a closed form: plain gradient descent with step 1 on
``f(x) = -x_0 + 0 log(10.5 - x_0) + |x_1:|^2`` moves x_0 by +1 per step from 0 and leaves
the rest up to sign (gradient 2 x_1:, so each step flips them), so x_0 = 11 is the first
iterate whose value is NaN (the log of a negative number): the run fails there and returns
x = (10, x0_1:) (ten flips) with f = -10 + |x0_1:|^2 after 10 iterations and 12 evaluations
(x_0 to x_11)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve.backends.native import chunked
from optsolve.backends.native.driver import replays_failures
from optsolve.backends.optax.backend import _make_solver
from optsolve.solve_api.options import SolveOptions

SGD = optax.sgd(1.0)  # one object: each new optax closure is a new structure


def _f(x, p):
    return -x[0] + 0.0 * jnp.log(p - x[0]) + jnp.sum(x[1:] ** 2)


def _same(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


# first-chunk budgets: the failure (at iteration 11) in the first chunk, at the first step of
# the second one (its last good iterate in the first), and inside the second one
@pytest.mark.parametrize("first_budget", [256, 11, 5, 1])
@pytest.mark.parametrize("algorithm", ["sgd", "adam"])
def test_a_failed_eager_run_returns_what_a_jitted_run_returns(monkeypatch, first_budget, algorithm):
    monkeypatch.setattr(chunked, "_FIRST_BUDGET_SMALL", first_budget)
    # a structure of its own per budget (x0's length), so that no plan recorded under
    # another budget stands for this one
    x0 = jnp.concatenate([jnp.zeros(1), jnp.arange(1.0, 2.0 + [256, 11, 5, 1].index(first_budget))])
    alg = SGD if algorithm == "sgd" else optsolve.Adam(0.5)
    prob = optsolve.OptimizationProblem(_f, x0, 10.5)
    jitted = jax.jit(lambda pr: optsolve.solve(pr, alg, maxiters=100))(prob)
    for _ in range(3):  # the layers' path, then the run a plan holds
        eager = optsolve.solve(prob, alg, maxiters=100)
        assert eager.retcode == optsolve.ReturnCode.FAILURE
        assert "finite" in eager.message
        _same((eager.x, eager.objective, eager.state), (jitted.x, jitted.objective, jitted.state))
        assert (eager.stats.iterations, eager.stats.f_evals, eager.stats.grad_evals) == tuple(
            int(v) for v in (jitted.stats.iterations, jitted.stats.f_evals, jitted.stats.grad_evals)
        )
        assert eager.reason == int(jitted.reason)
    if algorithm == "sgd":  # the closed form
        np.testing.assert_array_equal(
            np.asarray(eager.x), np.concatenate([[10.0], np.asarray(x0)[1:]])
        )
        assert eager.objective == -10.0 + float(jnp.sum(x0[1:] ** 2))
        assert (eager.stats.iterations, eager.stats.f_evals) == (10, 12)


def test_the_eager_loop_keeps_no_previous_iterate_only_where_the_host_can_replay():
    prob = optsolve.OptimizationProblem(_f, jnp.array([0.0, 1.0]), 10.5)
    solver = _make_solver(optsolve.Adam(0.5), prob)
    assert replays_failures(solver, SolveOptions(maxiters=10))
    # what a replay would run again unseen (the callback, the bar, the history, the clock, the
    # best iterate), or what reads the previous iterate (ftol, xtol)
    for changed in (
        dict(callback=lambda *a: None),
        dict(history=5),
        dict(progress=True),
        dict(maxtime=10.0),
        dict(keep="best"),
        dict(ftol=1e-3),
        dict(xtol=1e-3),
    ):
        assert not replays_failures(solver, SolveOptions(maxiters=10, **changed)), changed
    # a line-search method's step returns its new point's value: no replay there
    assert not replays_failures(optsolve.LBFGS().make_solver(prob), SolveOptions(maxiters=10))
