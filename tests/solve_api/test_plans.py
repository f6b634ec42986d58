"""Plans (solve_api/plans.py): a plain call's stages run once per structure; a later call
of that structure skips them, and solves its own values, never the recorded call's."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import OptimizationProblem, solve
from optsolve.solve_api import plans

solve_module = importlib.import_module("optsolve.solve_api.solve")


def _quadratic(x, p):
    return jnp.sum((x - p) ** 2) + 0.1 * jnp.sum(x**4)


@pytest.fixture
def entered(monkeypatch):
    """The number of calls that went through solve's stages, from here on."""
    plans._PLANS.clear()
    count = [0]
    enter = solve_module.enter_stages

    def counting(stages, call):
        count[0] += 1
        return enter(stages, call)

    monkeypatch.setattr(solve_module, "enter_stages", counting)
    yield count
    plans._PLANS.clear()


def _adam_by_hand(x, p, learning_rate, steps):
    """optax's own Adam loop: the reference a planned call must reproduce."""
    tx = optax.adam(learning_rate)
    state = tx.init(x)
    for _ in range(steps):
        g = jax.grad(_quadratic)(x, p)
        updates, state = tx.update(g, state, x)
        x = optax.apply_updates(x, updates)
    return x


def test_a_planned_call_skips_the_stages_and_solves_its_own_values(entered):
    first = OptimizationProblem(_quadratic, jnp.zeros(3, jnp.float32), jnp.float32(1.0))
    solve(first, optsolve.Adam(0.1), maxiters=20)
    assert entered[0] == 1
    # the same structure, every number new: x0, p and the learning rate
    second = OptimizationProblem(
        _quadratic, jnp.array([0.5, -1.0, 2.0], jnp.float32), jnp.float32(-0.5)
    )
    sol = solve(second, optsolve.Adam(0.05), maxiters=20)
    assert entered[0] == 1  # the plan stood for the stages
    expected = _adam_by_hand(second.x0, second.p, 0.05, 20)
    np.testing.assert_allclose(sol.x, expected, rtol=1e-6, atol=1e-6)
    assert sol.stats.iterations == 20 and sol.retcode == optsolve.ReturnCode.MAXITERS
    assert sol.problem is second
    # and bit for bit the call the stages make
    plans._PLANS.clear()
    staged = solve(second, optsolve.Adam(0.05), maxiters=20)
    assert entered[0] == 2
    np.testing.assert_array_equal(sol.x, staged.x)
    assert float(sol.objective) == float(staged.objective)
    assert (sol.stats.f_evals, sol.stats.grad_evals) == (
        staged.stats.f_evals,
        staged.stats.grad_evals,
    )


def test_new_keywords_shapes_or_functions_take_the_stages_again(entered):
    prob = OptimizationProblem(_quadratic, jnp.zeros(3), 1.0)
    solve(prob, optsolve.LBFGS(), maxiters=5)
    solve(prob, optsolve.LBFGS(), maxiters=5)
    assert entered[0] == 1
    solve(prob, optsolve.LBFGS(), maxiters=6)  # another keyword value
    solve(prob.replace(x0=jnp.zeros(4)), optsolve.LBFGS(), maxiters=5)  # another shape
    solve(prob, optsolve.BFGS(), maxiters=5)  # another algorithm
    assert entered[0] == 4
    # equal values of another type are another call: bool is refused where int is taken
    with pytest.raises(TypeError, match="`maxiters` must be an integer"):
        solve(prob, optsolve.LBFGS(), maxiters=True)
    with pytest.raises(TypeError, match="`maxiters` must be an integer"):
        solve(prob, optsolve.LBFGS(), maxiters=5.0)
    # a new f of the same shapes is checked anew
    vector = OptimizationProblem(lambda x, p: (x - p) ** 2, jnp.zeros(3), 1.0)
    with pytest.raises(ValueError, match="must return a scalar"):
        solve(vector, optsolve.LBFGS(), maxiters=5)


def test_calls_whose_stages_read_values_or_change_the_call_are_never_planned(entered):
    # bounds: x0 against the box is a check of values, made at every call
    boxed = OptimizationProblem(_quadratic, jnp.zeros(3), 1.0, bounds=(0.5, 2.0))
    for _ in range(2):
        with pytest.warns(UserWarning, match="x0 lies outside the bounds"):
            sol = solve(boxed, optsolve.LBFGS(), maxiters=50)
        assert float(jnp.min(sol.x)) >= 0.5
    assert entered[0] == 2
    # maximisation, aux and hooks: the stages change the call
    peak = OptimizationProblem(lambda x, p: -_quadratic(x, p), jnp.zeros(3), 1.0, sense="max")
    seen = []
    for _ in range(2):
        solve(peak, optsolve.LBFGS(), maxiters=5)
        solve(
            OptimizationProblem(_quadratic, jnp.zeros(3), 1.0),
            optsolve.LBFGS(),
            maxiters=5,
            callback=lambda i, x, f: seen.append(i),
        )
    assert entered[0] == 6 and len(seen) == 10


def test_a_call_under_a_trace_is_never_planned(entered):
    prob = OptimizationProblem(_quadratic, jnp.zeros(3), 1.0)

    @jax.jit
    def run(p):
        return solve(prob.replace(p=p), optsolve.LBFGS(), maxiters=30).x

    np.testing.assert_allclose(run(1.0), solve(prob, optsolve.LBFGS(), maxiters=30).x, rtol=1e-6)
    run(2.0)  # compiled once: the second call does not trace solve again
    assert entered[0] == 2
    assert len(plans._PLANS) == 1  # the eager call's only


@pytest.fixture
def layered(monkeypatch):
    """The number of calls that went through the layers below the stages (solve's _run)."""
    count = [0]
    run = solve_module._run

    def counting(*args, **kwargs):
        count[0] += 1
        return run(*args, **kwargs)

    monkeypatch.setattr(solve_module, "_run", counting)
    return count


def test_a_later_call_takes_the_run_its_plan_holds_and_solves_its_own_values(entered, layered):
    first = OptimizationProblem(_quadratic, jnp.zeros(3, jnp.float32), jnp.float32(1.0))
    solve(first, optsolve.Adam(0.1), maxiters=20)  # through the stages: records the plan
    solve(first, optsolve.Adam(0.1), maxiters=20)  # planned: the backend offers its run
    (plan,) = plans._PLANS._entries.values()
    assert plan.run is not None and layered[0] == 2
    second = OptimizationProblem(
        _quadratic, jnp.array([0.5, -1.0, 2.0], jnp.float32), jnp.float32(-0.5)
    )
    sol = solve(second, optsolve.Adam(0.05), maxiters=20)
    assert (entered[0], layered[0]) == (1, 2)  # neither the stages nor the layers ran
    np.testing.assert_allclose(
        sol.x, _adam_by_hand(second.x0, second.p, 0.05, 20), rtol=1e-6, atol=1e-6
    )
    assert sol.retcode == optsolve.ReturnCode.MAXITERS and sol.reason is not None
    assert type(sol.stats.iterations) is int and sol.stats.iterations == 20
    assert sol.stats.time > 0 and sol.problem is second
    # and bit for bit the call the stages and the layers make
    plans._PLANS.clear()
    staged = solve(second, optsolve.Adam(0.05), maxiters=20)
    assert (entered[0], layered[0]) == (2, 3)
    np.testing.assert_array_equal(sol.x, staged.x)
    assert float(sol.objective) == float(staged.objective)
    assert (sol.retcode, sol.reason) == (staged.retcode, staged.reason)
    assert (sol.stats.iterations, sol.stats.f_evals, sol.stats.grad_evals) == (
        staged.stats.iterations,
        staged.stats.f_evals,
        staged.stats.grad_evals,
    )
    np.testing.assert_array_equal(sol.state[0].mu, staged.state[0].mu)


def test_a_plan_holds_no_run_where_the_layers_do_more_than_run_it(entered, layered):
    prob = OptimizationProblem(_quadratic, jnp.zeros(3), 1.0)
    for _ in range(3):  # the progress bar: the layers' own
        solve(prob, optsolve.LBFGS(), maxiters=5, progress=True)
    (plan,) = plans._PLANS._entries.values()
    assert plan.run is None and layered[0] == 3
    plans._PLANS.clear()
    for _ in range(3):  # scipy's backend offers none: the layers run every call
        solve(prob, optsolve.ScipyMinimize("BFGS"), maxiters=5)
    (plan,) = plans._PLANS._entries.values()
    assert plan.run is None and layered[0] == 6


def test_a_ctrl_c_stops_a_run_a_plan_holds_at_its_last_completed_chunk(entered):
    import os
    import signal
    import threading
    import time

    from optsolve.solve_api import host

    prob = OptimizationProblem(_quadratic, jnp.zeros(3, jnp.float32), jnp.float32(1.0))
    for _ in range(2):  # the plan, then its run (each to gtol, within a few hundred steps)
        assert solve(prob, optsolve.Adam(0.1), maxiters=10**8, gtol=1e-3).success
    (plan,) = plans._PLANS._entries.values()
    assert plan.run is not None
    done, sent = threading.Event(), []

    def interrupt():  # once the run has gone on for 0.3 s (a Ctrl-C inside the solve)
        while not done.wait(0.01):
            if host._CATCHING[0] and time.perf_counter() - started >= 0.3:
                sent.append(time.perf_counter())
                os.kill(os.getpid(), signal.SIGINT)
                return

    far = OptimizationProblem(_quadratic, jnp.full(3, 1e4, jnp.float32), jnp.float32(1.0))
    sender = threading.Thread(target=interrupt, daemon=True)
    started = time.perf_counter()
    sender.start()
    try:
        sol = solve(far, optsolve.Adam(1e-4), maxiters=10**8, gtol=1e-3)
    finally:
        done.set()
        sender.join()
    assert sent and time.perf_counter() - sent[0] < 5.0
    assert sol.retcode == optsolve.ReturnCode.INTERRUPTED and entered[0] == 1
    assert 0 < sol.stats.iterations < 10**8
    # the iterate, its value and the count belong together: Adam's steps from the start
    assert np.all(np.isfinite(np.asarray(sol.x)))
    np.testing.assert_allclose(sol.objective, _quadratic(sol.x, far.p), rtol=1e-6)
    assert int(sol.state[0].count) == sol.stats.iterations
