"""The contract's rules for training on data, over every registered algorithm class: those
whose capabilities say they train on data record each step's batch loss and metrics (inside
the compiled loop, checked against the objective and the metrics evaluated by hand on the
same shuffled batches), move the progress bar to the steps taken, and continue exactly from
a checkpoint (at the same epoch, batch and permutation); the others refuse data, naming
those that can."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_contract import (  # noqa: F401
    CASES,
    CLASSES,
    X0,
    _assert_progress_reached,
    _id,
    _leaves,
    _rosenbrock,
    pytestmark,
)

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

SAMPLES = jnp.linspace(0.5, 1.5, 32)  # one scale per sample
BATCH, EPOCHS = 4, 2  # 8 batches an epoch
KEY = jax.random.key(3)


def _loss(x, p, batch):
    """Rosenbrock scaled by the batch's mean sample."""
    return _rosenbrock(x, p * jnp.mean(batch))


def _batch_metrics(x, p, batch):
    return {"loss": _loss(x, p, batch), "largest": jnp.max(batch)}


def _batches_by_hand(steps: int) -> list:
    """The batches the run sees, in order: each epoch a permutation under
    ``fold_in(KEY, epoch)`` cut into batches (the documented stream)."""
    out = []
    for epoch in range(EPOCHS):
        order = jax.random.permutation(jax.random.fold_in(KEY, epoch), SAMPLES.shape[0])
        out += [SAMPLES[order[i : i + BATCH]] for i in range(0, SAMPLES.shape[0], BATCH)]
    return out[:steps]


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_training_on_data_records_resumes_and_reports_progress(cls, tmp_path, capsys):
    alg = CASES[cls].make()
    prob = OptimizationProblem(_loss, X0, 10.0)
    data = dict(data=SAMPLES, batch_size=BATCH, key=KEY, epochs=EPOCHS)
    if not alg.capabilities()["takes_data"]:
        with pytest.raises(ValueError, match="does not train on `data`. Algorithms that do"):
            solve(prob, alg, maxiters=3, **data)
        return
    # the checkpoint falls inside the first epoch (8 batches), the run ends in the second;
    # the run writes one checkpoint (at n: the next would be at 2n > n + m), which is where
    # it is resumed from below, as after a kill
    n, m = 7, 5
    path = tmp_path / "run.npz"
    options = dict(history=True, metrics=_batch_metrics, progress=True, **data)
    whole = solve(prob, alg, maxiters=n + m, checkpoint=path, checkpoint_every=n, **options)
    _assert_progress_reached(capsys.readouterr().err, n + m, n + m)
    assert whole.stats.iterations == n + m

    # the history: each step's batch loss and metrics, at the iterate the step started from
    losses = np.asarray(whole.history.objective)
    metrics = whole.history.metrics
    np.testing.assert_allclose(metrics["loss"], losses, rtol=1e-12)
    batches = _batches_by_hand(n + m)
    np.testing.assert_allclose(metrics["largest"], [float(jnp.max(b)) for b in batches])
    np.testing.assert_allclose(losses[0], _loss(X0, 10.0, batches[0]), rtol=1e-12)

    # resumed from the checkpoint at step n: the run is the uninterrupted one
    saved = optsolve.load(path)
    assert saved.retcode == ReturnCode.INTERRUPTED and saved.stats.iterations == n
    resumed = solve(prob, alg, maxiters=m, resume=saved, **options)
    for a, b in zip(_leaves(whole.x), _leaves(resumed.x)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(_leaves(whole.state), _leaves(resumed.state)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert resumed.stats.iterations == n + m
    np.testing.assert_allclose(resumed.history.objective, losses[n:], rtol=1e-12)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_on_data_under_jit_equals_eager_and_the_callback_sees_every_step(cls):
    """Two rules of every class that trains on data: in-memory data runs inside jax.jit and
    gives the eager run's result, and the callback sees every step after its update, the
    last included (steps 1 to 8 of one epoch)."""
    alg = CASES[cls].make()
    if not alg.capabilities()["takes_data"]:
        return  # refused, by the rule above
    prob = OptimizationProblem(_loss, X0, 10.0)
    seen = {"eager": [], "jit": []}

    def run(path):
        return solve(
            prob,
            alg,
            data=SAMPLES,
            batch_size=BATCH,
            key=KEY,
            callback=lambda k, x, f: seen[path].append(int(k)),
        )

    eager = run("eager")
    jitted = jax.jit(lambda: run("jit"))()
    assert eager.retcode == ReturnCode.MAXITERS and eager.stats.iterations == 8
    assert int(jitted.retcode) == ReturnCode.MAXITERS and int(jitted.stats.iterations) == 8
    for a, b in zip(_leaves(eager.x), _leaves(jitted.x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(_leaves(eager.state), _leaves(jitted.state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert seen["eager"] == seen["jit"] == list(range(1, 9))
