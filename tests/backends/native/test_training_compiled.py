"""Training on in-memory data inside the compiled loop: under jax.jit, jax.vmap and jax.grad
(UnrolledAdjoint), equal to the eager run, to hand-written lax.scan loops of optax steps and
to finite differences; and the data path's fixed bugs (maxtime, the last step's callback)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

_rng = np.random.default_rng(0)
FEATURES = jnp.asarray(_rng.normal(size=(96, 4)))
LABELS = jnp.asarray(
    (
        np.asarray(FEATURES) @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 * _rng.normal(size=96) > 0
    ).astype(float)
)
DATA = (FEATURES, LABELS)
KEY = jax.random.key(42)
BATCH = 20  # 4 batches an epoch, 16 samples dropped


def batch_loss(params, p, batch):
    x, y = batch
    z = x @ params["w"] + params["b"]
    return jnp.mean(jnp.logaddexp(0.0, z) - y * z) + p * jnp.sum(params["w"] ** 2)


PROBLEM = OptimizationProblem(
    batch_loss, {"w": jnp.zeros(4), "b": jnp.zeros(())}, jnp.asarray(1e-3)
)


def hand_scan(tx, p, x0, order, epochs, steps=None):
    """optax steps over the batches of ``order`` (the documented stream), by lax.scan."""
    rows = jnp.concatenate([o[: 4 * BATCH] for o in order[:epochs]]).reshape(-1, BATCH)
    rows = rows if steps is None else rows[:steps]

    def step(carry, idx):
        x, state = carry
        grads = jax.grad(batch_loss)(x, p, (FEATURES[idx], LABELS[idx]))
        updates, state = tx.update(grads, state, x)
        return (optax.apply_updates(x, updates), state), None

    return jax.lax.scan(step, (x0, tx.init(x0)), rows)[0][0]


def orders(key, epochs):
    if key is None:
        return [jnp.arange(96)] * epochs
    return [jax.random.permutation(jax.random.fold_in(key, e), 96) for e in range(epochs)]


def assert_close(a, b, rtol=1e-12):
    for la, lb in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(la, lb, rtol=rtol, atol=rtol * 1e-2)


@pytest.mark.parametrize("key", [KEY, None], ids=["shuffled", "in order"])
def test_jit_equals_eager_and_the_hand_written_scan(key):
    run = dict(data=DATA, batch_size=BATCH, key=key, epochs=3)
    eager = solve(PROBLEM, optsolve.Adam(0.05), **run)
    jitted = jax.jit(lambda prob: solve(prob, optsolve.Adam(0.05), **run))(PROBLEM)
    assert eager.retcode == ReturnCode.MAXITERS and int(jitted.retcode) == ReturnCode.MAXITERS
    assert eager.stats.iterations == int(jitted.stats.iterations) == 12
    assert_close(jitted.x, eager.x)
    assert_close(jitted.state, eager.state)
    np.testing.assert_allclose(jitted.objective, eager.objective, rtol=1e-12)
    by_hand = hand_scan(optax.adam(0.05), PROBLEM.p, PROBLEM.x0, orders(key, 3), 3)
    assert_close(jitted.x, by_hand)


def test_the_data_and_the_key_may_be_traced():
    # the arrays and the key are leaves of the compiled program, not constants in it
    run = jax.jit(
        lambda data, key: (
            solve(PROBLEM, optsolve.SGD(0.1), data=data, batch_size=BATCH, key=key, epochs=2).x
        )
    )
    assert_close(
        run(DATA, KEY), hand_scan(optax.sgd(0.1), PROBLEM.p, PROBLEM.x0, orders(KEY, 2), 2)
    )
    other = jax.random.key(7)
    assert_close(
        run(DATA, other), hand_scan(optax.sgd(0.1), PROBLEM.p, PROBLEM.x0, orders(other, 2), 2)
    )


def test_vmap_over_keys_learning_rates_x0_and_data_equals_the_loop():
    run = dict(data=DATA, batch_size=BATCH, epochs=2)
    keys = jax.random.split(jax.random.key(0), 3)
    by_key = jax.vmap(lambda k: solve(PROBLEM, optsolve.Adam(0.05), key=k, **run).x)(keys)
    for i, k in enumerate(keys):
        assert_close(
            jax.tree_util.tree_map(lambda a: a[i], by_key),  # noqa: B023  (called in this iteration)
            solve(PROBLEM, optsolve.Adam(0.05), key=k, **run).x,
        )
    rates = jnp.array([0.01, 0.05, 0.2])
    by_rate = jax.vmap(lambda lr: solve(PROBLEM, optsolve.Adam(lr), key=KEY, **run).x)(rates)
    for i, lr in enumerate(rates):
        assert_close(
            jax.tree_util.tree_map(lambda a: a[i], by_rate),  # noqa: B023  (called in this iteration)
            solve(PROBLEM, optsolve.Adam(float(lr)), key=KEY, **run).x,
        )
    starts = jnp.linspace(-1.0, 1.0, 3)
    by_start = jax.vmap(
        lambda b0: (
            solve(
                PROBLEM.replace(x0={"w": jnp.zeros(4), "b": b0}), optsolve.SGD(0.1), key=KEY, **run
            ).x
        )
    )(starts)
    for i, b0 in enumerate(starts):
        x0 = {"w": jnp.zeros(4), "b": b0}
        assert_close(
            jax.tree_util.tree_map(lambda a: a[i], by_start),  # noqa: B023  (called in this iteration)
            hand_scan(optax.sgd(0.1), PROBLEM.p, x0, orders(KEY, 2), 2),
        )
    # the data batched: each model trains on its own copy, scaled
    scales = jnp.array([0.5, 1.0])
    by_data = jax.vmap(
        lambda s: (
            solve(
                PROBLEM, optsolve.SGD(0.1), data=(FEATURES * s, LABELS), batch_size=BATCH, epochs=2
            ).x
        )
    )(scales)
    for i, s in enumerate(scales):
        assert_close(
            jax.tree_util.tree_map(lambda a: a[i], by_data),  # noqa: B023  (called in this iteration)
            solve(
                PROBLEM,
                optsolve.SGD(0.1),
                data=(FEATURES * float(s), LABELS),
                batch_size=BATCH,
                epochs=2,
            ).x,
        )


def _validation_loss(lr, weight):
    sol = solve(
        PROBLEM.replace(p=weight),
        optsolve.SGD(lr),
        data=DATA,
        batch_size=BATCH,
        key=KEY,
        epochs=3,
        adjoint=optsolve.UnrolledAdjoint(),
    )
    return batch_loss(sol.x, 0.0, (FEATURES[80:], LABELS[80:]))


def test_unrolled_derivatives_through_minibatch_training_equal_finite_differences():
    grads = jax.grad(_validation_loss, argnums=(0, 1))(0.3, 0.01)
    h = 1e-5
    by_lr = (_validation_loss(0.3 + h, 0.01) - _validation_loss(0.3 - h, 0.01)) / (2 * h)
    by_weight = (_validation_loss(0.3, 0.01 + h) - _validation_loss(0.3, 0.01 - h)) / (2 * h)
    np.testing.assert_allclose(grads[0], by_lr, rtol=1e-6)
    np.testing.assert_allclose(grads[1], by_weight, rtol=1e-6)
    # forward mode agrees with reverse mode
    np.testing.assert_allclose(jax.jacfwd(_validation_loss)(0.3, 0.01), grads[0], rtol=1e-10)


def test_a_derivative_needs_the_unrolled_adjoint():
    def loss(lr, adjoint=None):
        return solve(
            PROBLEM, optsolve.SGD(lr), data=DATA, batch_size=BATCH, adjoint=adjoint
        ).objective

    with pytest.raises(ValueError, match="UnrolledAdjoint"):
        jax.grad(loss)(0.1)
    with pytest.raises(ValueError, match="ImplicitAdjoint does not apply.*UnrolledAdjoint"):
        loss(0.1, optsolve.ImplicitAdjoint())
    with pytest.raises(ValueError, match="cannot run inside jax.jit"):
        jax.jit(lambda lr: solve(PROBLEM, optsolve.SGD(lr), data=[DATA]).x)(0.1)


def test_stops_under_jit_equal_the_eager_run():
    # a NaN sample that the first epoch drops and the second trains on: FAILURE at the
    # last good iterate, the one the failing batch's step started from
    first, second = (np.asarray(o).tolist() for o in orders(KEY, 2))
    sample = next(i for i in first[80:] if second.index(i) < 80)
    failing_step = 4 + second.index(sample) // BATCH
    bad = FEATURES.at[sample].set(jnp.nan)
    run = dict(data=(bad, LABELS), batch_size=BATCH, key=KEY, epochs=2)
    eager = solve(PROBLEM, optsolve.Adam(0.05), **run)
    jitted = jax.jit(lambda: solve(PROBLEM, optsolve.Adam(0.05), **run))()
    assert eager.retcode == ReturnCode.FAILURE and eager.stats.iterations == failing_step
    assert int(jitted.retcode) == ReturnCode.FAILURE
    assert int(jitted.stats.iterations) == failing_step
    assert_close(
        eager.x,
        hand_scan(optax.adam(0.05), PROBLEM.p, PROBLEM.x0, orders(KEY, 2), 2, steps=failing_step),
    )
    assert_close(jitted.x, eager.x)
    assert_close(jitted.state, eager.state)
    # the callback stops after step 5's update, which it keeps
    stop = dict(data=DATA, batch_size=BATCH, key=KEY, epochs=2, callback=lambda k, x, f: k >= 5)
    eager = solve(PROBLEM, optsolve.Adam(0.05), **stop)
    jitted = jax.jit(lambda: solve(PROBLEM, optsolve.Adam(0.05), **stop))()
    assert eager.retcode == ReturnCode.TERMINATED and eager.stats.iterations == 5
    assert int(jitted.retcode) == ReturnCode.TERMINATED and int(jitted.stats.iterations) == 5
    assert_close(jitted.x, eager.x)
    assert_close(
        jitted.x, hand_scan(optax.adam(0.05), PROBLEM.p, PROBLEM.x0, orders(KEY, 2), 2, steps=5)
    )


def test_stops_under_vmap_equal_each_members_own_run():
    # members stop at different steps (a NaN sample in one copy of the data, a callback
    # stop in another) or not at all: each equals its own run, which the loop gives
    first, second = (np.asarray(o).tolist() for o in orders(KEY, 2))
    sample = next(i for i in first[80:] if second.index(i) < 80)
    nan_at = jnp.array([jnp.inf, float(sample), jnp.inf])  # the sample made NaN, per member
    b0 = jnp.array([0.0, 0.0, 100.0])  # the callback stops at step 3 where |b| > 50

    def run(nan_sample, b_start):
        bad = jnp.where(jnp.arange(96)[:, None] == nan_sample, jnp.nan, FEATURES)
        return solve(
            PROBLEM.replace(x0={"w": jnp.zeros(4), "b": b_start}),
            optsolve.Adam(0.05),
            data=(bad, LABELS),
            batch_size=BATCH,
            key=KEY,
            epochs=2,
            callback=lambda k, x, f: (k >= 3) & (jnp.abs(x["b"]) > 50),
        )

    together = jax.jit(jax.vmap(run))(nan_at, b0)
    codes = [ReturnCode.MAXITERS, ReturnCode.FAILURE, ReturnCode.TERMINATED]
    for i in range(3):
        alone = jax.jit(run)(nan_at[i], b0[i])
        assert int(together.retcode[i]) == int(alone.retcode) == codes[i]
        assert int(together.stats.iterations[i]) == int(alone.stats.iterations)
        assert_close(jax.tree_util.tree_map(lambda a: a[i], together.x), alone.x)  # noqa: B023  (called in this iteration)
        assert_close(jax.tree_util.tree_map(lambda a: a[i], together.state), alone.state)  # noqa: B023  (called in this iteration)
    assert int(together.stats.iterations[2]) == 3


def test_resume_on_shuffled_data_continues_exactly_under_jit():
    run = dict(data=DATA, batch_size=BATCH, key=KEY)
    whole = solve(PROBLEM, optsolve.Adam(0.05), epochs=3, **run)
    # 6 steps (into the second epoch), then the rest: each part under jit
    first = jax.jit(lambda: solve(PROBLEM, optsolve.Adam(0.05), epochs=3, maxiters=6, **run))()
    rest = jax.jit(
        lambda s: solve(PROBLEM, optsolve.Adam(0.05), epochs=3, maxiters=6, resume=s, **run)
    )(first)
    assert int(rest.stats.iterations) == 12
    assert_close(rest.x, whole.x)
    assert_close(rest.state, whole.state)


def test_history_under_jit_is_each_steps_batch_loss():
    run = dict(data=DATA, batch_size=BATCH, key=KEY, epochs=2, history=True)
    eager = solve(PROBLEM, optsolve.Adam(0.05), **run)
    jitted = jax.jit(lambda: solve(PROBLEM, optsolve.Adam(0.05), **run))()
    assert jitted.history.objective.shape == eager.history.objective.shape == (8,)
    np.testing.assert_allclose(jitted.history.objective, eager.history.objective, rtol=1e-12)
    np.testing.assert_allclose(jitted.history.grad_norm, eager.history.grad_norm, rtol=1e-12)


def test_maxtime_with_data():
    # used to raise TypeError: a local function shadowed the run's start time
    sol = solve(PROBLEM, optsolve.SGD(0.1), data=DATA, batch_size=BATCH, epochs=3, maxtime=60.0)
    assert sol.retcode == ReturnCode.MAXITERS and sol.stats.iterations == 12
    listed = solve(PROBLEM, optsolve.SGD(0.1), data=[DATA] * 5, maxtime=60.0)
    assert listed.retcode == ReturnCode.MAXITERS and listed.stats.iterations == 5


@pytest.mark.parametrize(
    "every, steps, expected", [(1, 8, list(range(1, 9))), (5, 40, list(range(5, 41, 5)))]
)
def test_the_callback_sees_the_last_step(every, steps, expected):
    for data in (dict(data=[DATA] * steps), dict(data=DATA, batch_size=BATCH, epochs=steps // 4)):
        seen = []
        sol = solve(
            PROBLEM,
            optsolve.SGD(0.1),
            callback=lambda k, x, f: seen.append(int(k)),  # noqa: B023  (called in this iteration)
            callback_every=every,
            **data,
        )
        assert sol.stats.iterations == steps and seen == expected


def test_maxiters_beyond_the_epochs_warns():
    with pytest.warns(UserWarning, match="maxiters=20 exceeds the 12 steps that epochs=3"):
        sol = solve(PROBLEM, optsolve.SGD(0.1), data=DATA, batch_size=BATCH, epochs=3, maxiters=20)
    assert sol.stats.iterations == 12
    with pytest.warns(UserWarning, match="maxiters=9 exceeds the 5 steps that epochs=1"):
        solve(PROBLEM, optsolve.SGD(0.1), data=[DATA] * 5, maxiters=9)
