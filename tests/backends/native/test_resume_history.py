"""Resuming a run from a Solution, and the per-iterate history recorded in the loop."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

_rng = np.random.default_rng(0)
_A = jnp.asarray(_rng.normal(size=(40, 5)))
_Y = jnp.asarray((_rng.uniform(size=40) < 0.5).astype(float))


def loss(x, p):  # L2-regularised logistic regression
    z = _A @ x["w"] + x["b"]
    return jnp.mean(jnp.logaddexp(0.0, z) - _Y * z) + p * jnp.sum(x["w"] ** 2)


PROBLEM = OptimizationProblem(loss, {"w": jnp.ones(5), "b": jnp.zeros(())}, jnp.asarray(0.1))


@pytest.mark.parametrize(
    "algorithm",
    [
        optsolve.Adam(optax.cosine_decay_schedule(0.1, 100)),  # the schedule's step count carries
        optsolve.SGD(0.1, momentum=0.9),
        optax.lbfgs(),
    ],
    ids=["Adam+schedule", "SGD+momentum", "optax.lbfgs"],
)
def test_n_then_m_steps_equal_n_plus_m_bit_for_bit(algorithm):
    whole = solve(PROBLEM, algorithm, maxiters=25)
    first = solve(PROBLEM, algorithm, maxiters=10)
    second = solve(PROBLEM, algorithm, maxiters=15, resume=first)
    for a, b in zip(jax.tree_util.tree_leaves(whole.x), jax.tree_util.tree_leaves(second.x)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.objective, second.objective)
    assert int(second.stats.iterations) == 25
    # the resumed run evaluates its starting point once more
    assert int(second.stats.f_evals) == int(whole.stats.f_evals) + 1


def test_resume_errors():
    sol = solve(PROBLEM, optsolve.Adam(0.1), maxiters=3)
    with pytest.raises(TypeError, match="`resume` must be a Solution"):
        solve(PROBLEM, optsolve.Adam(0.1), maxiters=3, resume=sol.x)
    other = OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.ones(3))
    with pytest.raises(ValueError, match="`resume` holds x with structure"):
        solve(other, optsolve.Adam(0.1), maxiters=3, resume=sol)
    with pytest.raises(ValueError, match="`resume` holds the optimizer state of"):
        solve(PROBLEM, optsolve.SGD(0.1, momentum=0.9), maxiters=3, resume=sol)


def test_history_equals_objectives_recomputed_from_iterates():
    n = 12
    sol = solve(PROBLEM, optsolve.Adam(0.05), maxiters=n, history=True)
    assert sol.history.objective.shape == (n + 1,)
    # recompute: iterate k of the run is the result of a k-step run
    for k in (0, 1, 5, n):
        x_k = solve(PROBLEM, optsolve.Adam(0.05), maxiters=k).x
        np.testing.assert_allclose(sol.history.objective[k], loss(x_k, PROBLEM.p), rtol=1e-14)
        g = jax.grad(loss)(x_k, PROBLEM.p)
        gnorm = max(float(jnp.max(jnp.abs(leaf))) for leaf in jax.tree_util.tree_leaves(g))
        np.testing.assert_allclose(sol.history.grad_norm[k], gnorm, rtol=1e-14)
    np.testing.assert_allclose(sol.history.objective[-1], sol.objective, rtol=1e-15)


def test_history_of_an_early_stop_is_nan_padded_and_works_under_jit():
    sol = jax.jit(lambda prob: solve(prob, optax.lbfgs(), maxiters=50, gtol=1e-8, history=True))(
        PROBLEM
    )
    k = int(sol.stats.iterations)
    assert int(sol.retcode) == ReturnCode.SUCCESS and k < 50
    assert np.all(np.isfinite(sol.history.objective[: k + 1]))
    assert np.all(np.isnan(sol.history.objective[k + 1 :]))
    np.testing.assert_allclose(sol.history.objective[k], sol.objective, rtol=1e-15)
    assert sol.history.grad_norm[k] <= 1e-8
    # objectives never increase along an L-BFGS (Wolfe line search) run
    assert np.all(np.diff(np.asarray(sol.history.objective[: k + 1])) <= 1e-15)


def test_history_needs_maxiters_and_plots(tmp_path):
    with pytest.raises(ValueError, match="`history=True` needs `maxiters`"):
        solve(PROBLEM, optsolve.Adam(0.1), gtol=1e-3, history=True)
    import matplotlib

    matplotlib.use("Agg")
    sol = solve(PROBLEM, optsolve.Adam(0.05), maxiters=30, history=True)
    ax = sol.history.plot()
    ax.figure.savefig(tmp_path / "history.png")
    assert (tmp_path / "history.png").stat().st_size > 5_000


def test_saved_solution_round_trips_and_resumes_bit_for_bit(tmp_path):
    algorithm = optsolve.Adam(optax.cosine_decay_schedule(0.1, 100))
    first = solve(PROBLEM, algorithm, maxiters=10)
    path = tmp_path / "checkpoint.npz"
    optsolve.save(path, first)
    template = solve(PROBLEM, algorithm, maxiters=0)
    loaded = optsolve.load(path, like=template)
    assert loaded.retcode == first.retcode and int(loaded.stats.iterations) == 10
    for a, b in zip(jax.tree_util.tree_leaves(loaded), jax.tree_util.tree_leaves(first)):
        np.testing.assert_array_equal(a, b)
    resumed = solve(PROBLEM, algorithm, maxiters=15, resume=loaded)
    whole = solve(PROBLEM, algorithm, maxiters=25)
    np.testing.assert_array_equal(resumed.x["w"], whole.x["w"])


def test_loading_runs_no_code_and_checks_the_structure(tmp_path):
    sol = solve(PROBLEM, optsolve.Adam(0.1), maxiters=3)
    path = tmp_path / "sol.npz"
    optsolve.save(path, sol)
    with pytest.raises(ValueError, match="has no leaf|another structure"):
        optsolve.load(path, like=solve(PROBLEM, optsolve.SGD(0.1, momentum=0.9), maxiters=0))
    # an archive holding a pickled object is refused by numpy, never unpickled
    evil = tmp_path / "evil.npz"
    np.savez(
        evil,
        __meta__=np.frombuffer(
            b'{"format": "optsolve-solution-v1", "leaves": [{"key": ".x", "name": "obj"}]}',
            dtype=np.uint8,
        ),
        obj=np.array([object()], dtype=object),
    )
    with pytest.raises(ValueError, match="allow_pickle"):
        optsolve.load(evil, like=sol)
