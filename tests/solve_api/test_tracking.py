"""Metrics, held-out evaluations, the best iterate and checkpoints when training models.
References: a hand-written ``nnx.Optimizer`` loop that records the same values, and the
uninterrupted run (a run killed by SIGKILL and resumed from its last checkpoint equals it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from test_models import X_TEST, X_TRAIN, Y_TEST, Y_TRAIN, Net, assert_models_close, loss

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

BATCHES = [(X_TRAIN[i : i + 150], Y_TRAIN[i : i + 150]) for i in range(0, 1200, 150)] * 2


def loss_and_accuracy(model, p, batch):
    x, y = batch
    logits = model(x)
    value = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return value, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}


def held_out_error(model, p):
    """The test error of an eval-mode copy (BatchNorm's running averages, no Dropout)."""
    model = nnx.clone(model)
    model.eval()
    return 1.0 - jnp.mean(jnp.argmax(model(X_TEST), -1) == Y_TEST)


def test_metrics_evaluations_and_the_best_model_equal_a_hand_written_loop():
    prob = OptimizationProblem(
        loss_and_accuracy, Net(nnx.Rngs(0)), trainable=nnx.Param, has_aux=True
    )
    sol = solve(
        prob,
        optsolve.Adam(3e-2),
        data=BATCHES,
        history=True,
        evaluate=held_out_error,
        eval_every=4,
        keep="best",
    )

    # the reference: an nnx.Optimizer loop recording the same values, keeping the best model
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        (value, aux), grads = nnx.value_and_grad(
            lambda m: loss_and_accuracy(m, None, batch), has_aux=True
        )(model)
        optimizer.update(model, grads)
        return value, aux["accuracy"]

    losses, accuracies, errors = [], [], {}
    best, best_error = None, np.inf
    for k, batch in enumerate(BATCHES + [None]):
        if k % 4 == 0 or batch is None:  # every 4th step, and the model after the last
            errors[k] = float(held_out_error(model, None))
            if errors[k] < best_error:
                best, best_error = nnx.clone(model), errors[k]
        if batch is not None:
            value, acc = step(model, optimizer, batch)
            losses.append(float(value))
            accuracies.append(float(acc))

    assert sol.stats.iterations == len(BATCHES) and sol.aux is None
    np.testing.assert_allclose(sol.history.objective, losses, rtol=2e-5)
    np.testing.assert_allclose(sol.history.metrics["accuracy"], accuracies, atol=1.5 / 150)
    evaluation = np.asarray(sol.history.evaluation)
    due = [k for k in errors if k < len(BATCHES)]
    np.testing.assert_allclose(evaluation[due], [errors[k] for k in due], atol=1.5 / 597)
    assert np.all(np.isnan(np.delete(evaluation, due)))
    assert_models_close(sol.x, best, atol=5e-5)
    assert float(held_out_error(sol.x, None)) == pytest.approx(best_error, abs=1.5 / 597)


def test_a_model_checkpoint_resumes_parameters_statistics_and_rng_exactly(tmp_path):
    prob = OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    run = dict(data=(X_TRAIN, Y_TRAIN), batch_size=150, key=jax.random.key(1), epochs=2)
    whole = solve(prob, optsolve.AdamW(1e-2), **run)
    path = tmp_path / "model.npz"
    solve(prob, optsolve.AdamW(1e-2), maxiters=11, checkpoint=path, checkpoint_every=5, **run)
    saved = optsolve.load(path)
    assert saved.stats.iterations == 10
    # epochs count passes from the resume point: maxiters ends the run where the whole ends
    resumed = solve(prob, optsolve.AdamW(1e-2), resume=saved, maxiters=6, **run)
    assert resumed.stats.iterations == whole.stats.iterations == 16
    assert int(resumed.x.drop.rngs.count[...]) == 16
    for a, b in zip(
        jax.tree_util.tree_leaves(nnx.state(whole.x, nnx.Param, nnx.BatchStat)),
        jax.tree_util.tree_leaves(nnx.state(resumed.x, nnx.Param, nnx.BatchStat)),
    ):
        np.testing.assert_array_equal(a, b)  # bitwise in float32


_KILLED_RUN = """
import os, signal, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import optsolve
sys.path.insert(0, {tests!r})
from test_tracking import PROBLEM, RUN

def kill_at(step, x, loss):
    if step == 13:
        os.kill(os.getpid(), signal.SIGKILL)

optsolve.solve(PROBLEM, optsolve.Adam(0.05), callback=kill_at, checkpoint={path!r},
               checkpoint_every=5, **RUN)
"""

SAMPLES = jax.random.normal(jax.random.key(4), (96, 3))
TARGETS = SAMPLES @ jnp.array([1.0, -2.0, 0.5])
PROBLEM = OptimizationProblem(
    lambda w, p, batch: jnp.mean((batch[0] @ w - batch[1]) ** 2), jnp.zeros(3)
)
RUN = dict(data=(SAMPLES, TARGETS), batch_size=8, key=jax.random.key(5), epochs=2)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_killed_run_continues_exactly_from_its_last_checkpoint(tmp_path):
    path = str(tmp_path / "run.npz")
    script = _KILLED_RUN.format(tests=os.path.dirname(__file__), path=path)
    killed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    saved = optsolve.load(path)  # the last one written before the kill, at step 10
    assert saved.retcode == ReturnCode.INTERRUPTED and saved.stats.iterations == 10
    resumed = solve(PROBLEM, optsolve.Adam(0.05), resume=saved, maxiters=14, **RUN)
    whole = solve(PROBLEM, optsolve.Adam(0.05), **RUN)
    assert resumed.stats.iterations == whole.stats.iterations == 24
    np.testing.assert_array_equal(resumed.x, whole.x)
    for a, b in zip(
        jax.tree_util.tree_leaves(resumed.state), jax.tree_util.tree_leaves(whole.state)
    ):
        np.testing.assert_array_equal(a, b)


def test_clear_errors_for_tracking_and_checkpoint_options(tmp_path):
    f = lambda x, p: jnp.sum((x - 1.0) ** 2)
    prob = OptimizationProblem(f, jnp.zeros(2))
    adam = optsolve.Adam(0.1)
    # metrics imply history=True (tests/solve_api/test_errors.py)
    assert solve(prob, adam, maxiters=3, metrics=lambda x, p: x).history is not None
    with pytest.raises(ValueError, match="neither is on"):
        solve(prob, adam, maxiters=3, evaluate=lambda x, p: f(x, p))
    with pytest.raises(ValueError, match="`keep` must be 'last' or 'best', got 'min'"):
        solve(prob, adam, maxiters=3, keep="min")
    with pytest.raises(ValueError, match="`eval_every` is how often `evaluate` runs"):
        solve(prob, adam, maxiters=3, eval_every=5)
    with pytest.raises(TypeError, match="must be a scalar score"):
        solve(prob, adam, maxiters=3, evaluate=lambda x, p: x, keep="best")
    on_data = OptimizationProblem(lambda x, p, b: jnp.sum((x - b) ** 2), jnp.zeros(2))
    with pytest.raises(ValueError, match="keep='best' on `data` needs `evaluate`"):
        solve(on_data, adam, data=[jnp.ones(2)] * 3, keep="best")
    path = tmp_path / "c.npz"
    with pytest.raises(ValueError, match="`checkpoint` .* and `checkpoint_every` .* give both"):
        solve(prob, adam, maxiters=3, checkpoint=path)
    with pytest.raises(
        ValueError, match="ScipyMinimize.* cannot write checkpoints.*Algorithms that can: .*LBFGS"
    ):
        solve(prob, optsolve.ScipyMinimize("BFGS"), maxiters=3, checkpoint=path, checkpoint_every=1)
    with pytest.raises(ValueError, match="keep='best' does not return"):
        solve(prob, adam, maxiters=3, checkpoint=path, checkpoint_every=1, evaluate=f, keep="best")
    with pytest.raises(ValueError, match="call solve outside jax.jit"):
        jax.jit(
            lambda p: (
                solve(prob.replace(p=p), adam, maxiters=3, checkpoint=path, checkpoint_every=1).x
            )
        )(1.0)
    # a checkpoint resumed with another algorithm names the mismatch
    solve(prob, adam, maxiters=3, checkpoint=path, checkpoint_every=2)
    with pytest.raises(
        ValueError,
        match="the checkpoint's state has .* arrays, but this problem and algorithm's has",
    ):
        solve(prob, optsolve.SGD(0.1, momentum=0.9), maxiters=3, resume=optsolve.load(path))
    with pytest.raises(
        ValueError,
        match="the checkpoint's .x is float64\\[2\\], but this "
        "problem and algorithm's is float64\\[3\\]",
    ):
        solve(prob.replace(x0=jnp.zeros(3)), adam, maxiters=3, resume=optsolve.load(path))


def test_metrics_evaluations_and_the_best_iterate_under_jit_and_vmap_equal_eager():
    """The records and the kept iterate come from inside the compiled loop: under jax.jit
    and jax.vmap they equal the eager run's."""
    f = lambda x, p: jnp.sum((x - p) ** 2) + 0.1 * jnp.sum(x**4)
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.array([1.0, -2.0, 0.5]))
    metrics = lambda x, p: {"norm": jnp.linalg.norm(x), "positive": jnp.sum(x > 0)}
    distance = lambda x, p: jnp.sum((x - p) ** 2)
    options = dict(
        maxiters=30, history=True, metrics=metrics, evaluate=distance, eval_every=3, keep="best"
    )
    eager = solve(prob, optsolve.SGD(0.3, momentum=0.9), **options)
    run = lambda p: solve(prob.replace(p=p), optsolve.SGD(0.3, momentum=0.9), **options)
    jitted = jax.jit(run)(prob.p)
    batched = jax.vmap(run)(jnp.stack([prob.p, prob.p]))
    for sol in (jitted, jax.tree_util.tree_map(lambda a: a[1], batched)):
        np.testing.assert_allclose(sol.x, eager.x, rtol=1e-12)
        for a, b in zip(
            jax.tree_util.tree_leaves(sol.history), jax.tree_util.tree_leaves(eager.history)
        ):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    # momentum overshoots: the kept iterate is the evaluated one closest to p, not the last
    scores = np.asarray(eager.history.evaluation)
    assert float(distance(eager.x, prob.p)) == pytest.approx(np.nanmin(scores), rel=1e-12)
    np.testing.assert_array_equal(np.isnan(scores), np.arange(31) % 3 != 0)
    last = solve(prob, optsolve.SGD(0.3, momentum=0.9), maxiters=30)
    assert float(distance(last.x, prob.p)) > 5 * float(distance(eager.x, prob.p))
