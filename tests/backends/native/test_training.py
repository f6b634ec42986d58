"""Training on data: minibatches from iterables and in-memory arrays, equal to hand-written
optax loops over the same batches; interrupts, failures, callbacks, history, resume."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from optsolve import OptimizationProblem, ReturnCode, solve

_rng = np.random.default_rng(0)
FEATURES = _rng.normal(size=(96, 4))
LABELS = (FEATURES @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 * _rng.normal(size=96) > 0).astype(float)


def batch_loss(params, p, batch):
    x, y = batch
    z = x @ params["w"] + params["b"]
    return jnp.mean(jnp.logaddexp(0.0, z) - y * z) + p * jnp.sum(params["w"] ** 2)


def make_problem(dtype=jnp.float64):
    x0 = {"w": jnp.zeros(4, dtype), "b": jnp.zeros((), dtype)}
    return OptimizationProblem(batch_loss, x0, jnp.asarray(1e-3, dtype))


def batches(n_batches=6, size=16, dtype=np.float64):
    return [
        (
            FEATURES[i * size : (i + 1) * size].astype(dtype),
            LABELS[i * size : (i + 1) * size].astype(dtype),
        )
        for i in range(n_batches)
    ]


def hand_loop(tx, prob, batch_list):
    @jax.jit
    def step(x, state, batch):
        grads = jax.grad(batch_loss)(x, prob.p, batch)
        updates, state = tx.update(grads, state, x)
        return optax.apply_updates(x, updates), state

    x, state = prob.x0, tx.init(prob.x0)
    for batch in batch_list:
        x, state = step(x, state, batch)
    return x


def assert_close(a, b, rtol):
    for la, lb in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(la, lb, rtol=rtol, atol=rtol * 1e-2)


@pytest.mark.parametrize(
    "algorithm, tx",
    [
        (optsolve.Adam(0.05), optax.adam(0.05)),
        (optsolve.SGD(0.2, momentum=0.9), optax.sgd(0.2, momentum=0.9)),
        (optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.05)), None),
    ],
    ids=["Adam", "SGD", "chain"],
)
def test_iterable_of_batches_equals_hand_loop(algorithm, tx):
    tx = tx or algorithm
    prob = make_problem()
    data = batches()
    sol = solve(prob, algorithm, data=data, epochs=3)
    assert sol.retcode == ReturnCode.MAXITERS  # the epochs ran out
    assert int(sol.stats.iterations) == 18
    assert_close(sol.x, hand_loop(tx, prob, data * 3), rtol=1e-12)


def test_generator_is_consumed_and_maxiters_stops_early():
    prob = make_problem()
    sol = solve(prob, optsolve.Adam(0.05), data=(b for b in batches()), maxiters=4)
    assert int(sol.stats.iterations) == 4
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, batches()[:4]), rtol=1e-12)
    with pytest.raises(ValueError, match="one-shot iterator"):
        solve(prob, optsolve.Adam(0.05), data=(b for b in batches()), epochs=2)


def test_in_memory_epochs_equal_hand_written_scan():
    prob = make_problem()
    key = jax.random.key(42)
    data = (jnp.asarray(FEATURES), jnp.asarray(LABELS))
    sol = solve(prob, optsolve.Adam(0.05), data=data, batch_size=20, key=key, epochs=3)
    # the same batches by hand: a permutation per epoch, the remainder (96 % 20) dropped
    order = []
    for epoch in range(3):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), 96))[:80]
        order += [(FEATURES[idx], LABELS[idx]) for idx in perm.reshape(4, 20)]
    assert int(sol.stats.iterations) == 12
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, order), rtol=1e-12)
    # several epochs run in one compiled call: maxiters stops inside the second, and the
    # history holds exactly the steps taken
    part = solve(
        prob,
        optsolve.Adam(0.05),
        data=data,
        batch_size=20,
        key=key,
        epochs=3,
        maxiters=6,
        history=True,
    )
    assert part.retcode == ReturnCode.MAXITERS and int(part.stats.iterations) == 6
    assert_close(part.x, hand_loop(optax.adam(0.05), prob, order[:6]), rtol=1e-12)
    assert part.history.objective.shape == (6,)
    x5 = hand_loop(optax.adam(0.05), prob, order[:5])
    np.testing.assert_allclose(
        part.history.objective[5], batch_loss(x5, prob.p, order[5]), rtol=1e-12
    )
    # without a key, batches are taken in order
    plain = solve(prob, optsolve.SGD(0.1), data=data, batch_size=32)
    assert_close(plain.x, hand_loop(optax.sgd(0.1), prob, batches(3, 32)), rtol=1e-12)


def test_float32_training_matches_to_float32_precision():
    prob = make_problem(jnp.float32)
    data = batches(dtype=np.float32)
    sol = solve(prob, optsolve.Adam(0.05), data=data, epochs=2)
    assert sol.x["w"].dtype == jnp.float32
    # float32 parameters with a float64 p promoted to weak float: ~1e-6 relative agreement
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, data * 2), rtol=2e-6)


def test_keyboard_interrupt_keeps_the_last_completed_step():
    prob = make_problem()

    def interrupted_after(k):
        for i, batch in enumerate(batches()):
            if i == k:
                raise KeyboardInterrupt
            yield batch

    sol = solve(prob, optsolve.Adam(0.05), data=interrupted_after(4))
    assert sol.retcode == ReturnCode.INTERRUPTED
    assert int(sol.stats.iterations) == 4
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, batches()[:4]), rtol=1e-12)


def test_keyboard_interrupt_between_chunks_keeps_the_last_completed_step(monkeypatch):
    # Ctrl-C while the host reads the first batch of a chunk (none read yet): the steps run
    # so far are kept, and the run is INTERRUPTED, not a run whose data ran out (MAXITERS)
    from optsolve.backends.native import training
    from optsolve.solve_api.cache import BoundedCache

    monkeypatch.setattr(training, "_SECONDS_PER_STEP", BoundedCache(4))  # chunks of 16 first
    prob = make_problem()
    data = batches(6, 16) * 3

    def interrupted_at(k):
        for i, batch in enumerate(data):
            if i == k:
                raise KeyboardInterrupt
            yield batch

    sol = solve(prob, optsolve.Adam(0.05), data=interrupted_at(training._FIRST_STEPS))
    assert sol.retcode == ReturnCode.INTERRUPTED
    assert int(sol.stats.iterations) == training._FIRST_STEPS
    assert_close(
        sol.x, hand_loop(optax.adam(0.05), prob, data[: training._FIRST_STEPS]), rtol=1e-12
    )


def test_nan_batch_gives_failure_with_last_good_iterate():
    prob = make_problem()
    data = batches()
    data[3] = (np.full_like(data[3][0], np.nan), data[3][1])
    sol = solve(prob, optsolve.Adam(0.05), data=data)
    assert sol.retcode == ReturnCode.FAILURE and int(sol.stats.iterations) == 3
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, data[:3]), rtol=1e-12)


def test_failure_deep_in_a_later_chunk_keeps_the_last_good_iterate():
    # 42 batches of 16 samples run as chunks of 32: the NaN batch 37 lies in the second chunk,
    # whose start the host keeps and re-runs up to step 37
    prob = make_problem()
    data = batches(6, 16) * 7
    data[37] = (np.full_like(data[37][0], np.nan), data[37][1])
    sol = solve(prob, optsolve.Adam(0.05), data=data, history=True)
    assert sol.retcode == ReturnCode.FAILURE and int(sol.stats.iterations) == 37
    assert int(sol.stats.f_evals) == 38  # the failing step's evaluation counts
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, data[:37]), rtol=1e-12)
    assert sol.history.objective.shape == (38,) and np.isnan(sol.history.objective[37])
    # in memory: the same failure inside an epoch
    features = np.array(FEATURES)
    features[50] = np.nan
    mem = solve(prob, optsolve.SGD(0.1), data=(features, LABELS), batch_size=16, epochs=2)
    assert mem.retcode == ReturnCode.FAILURE and int(mem.stats.iterations) == 3
    in_order = [(features[i : i + 16], LABELS[i : i + 16]) for i in range(0, 48, 16)]
    assert_close(mem.x, hand_loop(optax.sgd(0.1), prob, in_order), rtol=1e-12)


def test_divergence_inside_a_multi_epoch_chunk_keeps_the_last_finite_iterate():
    # SGD with a far too large step on a least-squares loss grows geometrically until the
    # loss overflows, some epochs into a chunk of several epochs run in one call
    def loss(w, p, batch):
        x, y = batch
        return jnp.mean((x @ w - y) ** 2)

    prob = OptimizationProblem(loss, jnp.zeros(4))
    data = (jnp.asarray(FEATURES), jnp.asarray(LABELS))
    key = jax.random.key(3)
    sol = solve(prob, optsolve.SGD(3.0), data=data, batch_size=24, key=key, epochs=200)
    assert sol.retcode == ReturnCode.FAILURE
    # the same run by hand: the iterates until the first non-finite loss
    tx, w, iterates = optax.sgd(3.0), jnp.zeros(4), []
    state = tx.init(w)
    for epoch in range(200):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), 96))
        for idx in perm.reshape(4, 24):
            f, g = jax.value_and_grad(loss)(w, None, (FEATURES[idx], LABELS[idx]))
            if not np.isfinite(f):
                break
            iterates.append(w)
            updates, state = tx.update(g, state, w)
            w = optax.apply_updates(w, updates)
        else:
            continue
        break
    j = len(iterates)  # the loss at x_j is the first non-finite one
    assert j > 8 * 4, "the failure should come after the first chunk of epochs"
    expected = w if np.all(np.isfinite(w)) else iterates[-1]
    np.testing.assert_allclose(sol.x, expected, rtol=1e-12)
    assert int(sol.stats.iterations) == (j if np.all(np.isfinite(w)) else j - 1)


def test_non_finite_gradient_with_a_finite_loss_is_a_failure():
    # sqrt(|w|^2) has a finite value and a NaN gradient at w = 0: the update turns the iterate
    # into NaN, and the run returns the iterate before it
    def loss(x, p, batch):
        return jnp.sqrt(jnp.sum((x - batch) ** 2))

    prob = OptimizationProblem(loss, jnp.zeros(2))
    data = [jnp.ones(2), jnp.full(2, 2.0), jnp.full(2, 2.0)]
    # SGD(sqrt 2) steps by exactly 1 per coordinate: x1 = (1, 1), x2 = (2, 2), and the third
    # batch's gradient at x2 is 0/0. With 3 batches the NaN iterate x3 ends the chunk (caught
    # by the chunk's end check); with 4 the loss at x3 is NaN inside the chunk.
    for target in (data, data + data[-1:]):
        expected = hand_loop_fn(loss, optax.sgd(2**0.5), jnp.zeros(2), target)
        assert not np.all(np.isfinite(expected[2]))  # the unguarded loop ends in NaN
        sol = solve(prob, optsolve.SGD(2**0.5), data=target)
        assert sol.retcode == ReturnCode.FAILURE and int(sol.stats.iterations) == 2
        assert "not finite" in sol.message, sol.message
        np.testing.assert_allclose(sol.x, expected[1], rtol=1e-12)
        np.testing.assert_allclose(sol.x, [2.0, 2.0], rtol=1e-12)


def hand_loop_fn(loss, tx, x0, batch_list):
    """The iterates of a hand-written optax loop: [x1, x2, ...]."""
    x, state, out = x0, tx.init(x0), []
    for batch in batch_list:
        updates, state = tx.update(jax.grad(loss)(x, None, batch), state, x)
        x = optax.apply_updates(x, updates)
        out.append(x)
    return out


def test_batches_of_another_shape_start_a_new_chunk():
    prob = make_problem()
    data = batches(5, 16) + [(FEATURES[80:90], LABELS[80:90])] + batches(5, 16)
    sol = solve(prob, optsolve.Adam(0.05), data=data, history=True)
    assert int(sol.stats.iterations) == 11
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, data), rtol=1e-12)
    x_k = hand_loop(optax.adam(0.05), prob, data[:5])
    np.testing.assert_allclose(
        sol.history.objective[5], batch_loss(x_k, prob.p, data[5]), rtol=1e-12
    )


def test_callback_sees_steps_with_grad_norm_and_stops():
    prob = make_problem()
    seen = []

    def callback(step, x, loss, grad_norm):
        seen.append((step, float(loss), float(grad_norm)))
        return step >= 4

    sol = solve(prob, optsolve.Adam(0.05), data=batches() * 3, callback=callback, callback_every=2)
    assert sol.retcode == ReturnCode.TERMINATED and int(sol.stats.iterations) == 4
    assert [s for s, _, _ in seen] == [2, 4]
    # step k reports x_k (after k updates) with the loss and gradient of the batch it
    # trained on (batch k - 1, at x_{k-1}), as a training loop logs them; the stop keeps x_k
    x3 = hand_loop(optax.adam(0.05), prob, batches()[:3])
    x4 = hand_loop(optax.adam(0.05), prob, batches()[:4])
    g = jax.grad(batch_loss)(x3, prob.p, batches()[3])
    expected_norm = max(float(jnp.max(jnp.abs(leaf))) for leaf in jax.tree_util.tree_leaves(g))
    np.testing.assert_allclose(seen[-1][1], batch_loss(x3, prob.p, batches()[3]), rtol=1e-12)
    np.testing.assert_allclose(seen[-1][2], expected_norm, rtol=1e-12)
    assert_close(sol.x, x4, rtol=1e-12)
    # the stop returns x_4 with its own optimizer state (the callback saw steps 2 and 4
    # once), so a resumed run continues exactly
    rest = solve(prob, optsolve.Adam(0.05), data=batches()[4:6], resume=sol)
    assert_close(rest.x, hand_loop(optax.adam(0.05), prob, batches()[:6]), rtol=1e-12)


def test_history_is_the_batch_losses_and_resume_continues():
    prob = make_problem()
    data = batches()
    sol = solve(prob, optsolve.Adam(0.05), data=data, history=True, maxiters=6)
    for k in range(6):
        x_k = hand_loop(optax.adam(0.05), prob, data[:k])
        np.testing.assert_allclose(
            sol.history.objective[k], batch_loss(x_k, prob.p, data[k]), rtol=1e-12
        )
    first = solve(prob, optsolve.Adam(0.05), data=data[:2])
    second = solve(prob, optsolve.Adam(0.05), data=data[2:], resume=first)
    for a, b in zip(jax.tree_util.tree_leaves(second.x), jax.tree_util.tree_leaves(sol.x)):
        np.testing.assert_array_equal(a, b)
    assert int(second.stats.iterations) == 6


def test_data_errors():
    prob = make_problem()
    with pytest.raises(ValueError, match="`gtol` is not meaningful when training on `data`"):
        solve(prob, optsolve.Adam(0.05), data=batches(), gtol=1e-3)
    with pytest.raises(ValueError, match="`batch_size` is only meaningful together with `data`"):
        solve(prob, optsolve.Adam(0.05), maxiters=3, batch_size=4)
    with pytest.raises(ValueError, match="sharing a leading dimension"):
        solve(prob, optsolve.Adam(0.05), data=(FEATURES, LABELS[:10]), batch_size=4)
    with pytest.raises(
        ValueError,
        match="configured this way .only without a line search: a "
        "line search needs one deterministic objective",
    ):
        solve(prob, optax.lbfgs(), data=batches())
    with pytest.raises(TypeError, match=r"`data` must be an iterable of batches"):
        solve(prob, optsolve.Adam(0.05), data=3.0)
    # in-memory arrays without batch_size would be read as one batch per array
    with pytest.raises(ValueError, match=r"`data` is a tuple of arrays .*pass `batch_size`"):
        solve(prob, optsolve.Adam(0.05), data=(FEATURES, LABELS))
    with pytest.raises(ValueError, match=r"`data` is a dict of arrays .*pass `batch_size`"):
        solve(prob, optsolve.Adam(0.05), data={"x": FEATURES, "y": LABELS})


def test_data_path_runs_the_full_batch_step():
    # the same batch at every step is a full-batch run: one driver, so x, the history, the
    # callback's arguments and the counts agree exactly
    prob = make_problem()
    whole = (FEATURES, LABELS)
    full = OptimizationProblem(lambda x, p: batch_loss(x, p, whole), prob.x0, prob.p)
    seen = {"data": [], "full": []}

    def recorder(path):
        def callback(step, x, loss, grad_norm):
            seen[path].append((step, float(loss), float(grad_norm)))

        return callback

    on_data = solve(
        prob, optsolve.Adam(0.05), data=[whole] * 20, history=True, callback=recorder("data")
    )
    on_full = solve(full, optsolve.Adam(0.05), maxiters=20, history=True, callback=recorder("full"))
    assert on_data.retcode == on_full.retcode == ReturnCode.MAXITERS
    assert on_data.stats.iterations == on_full.stats.iterations == 20
    assert_close(on_data.x, on_full.x, rtol=1e-12)
    assert_close(on_data.state, on_full.state, rtol=1e-12)
    # the full-batch run evaluates x_20 too (its stopping test); the data run has no batch 21
    np.testing.assert_allclose(
        on_data.history.objective, on_full.history.objective[:20], rtol=1e-12
    )
    np.testing.assert_allclose(
        on_data.history.grad_norm, on_full.history.grad_norm[:20], rtol=1e-12
    )
    # on data the callback sees every step after its update, the last included, with the
    # loss and gradient norm of the batch it trained on: the full-batch run's values one
    # iterate earlier
    assert [s for s, _, _ in seen["data"]] == list(range(1, 21))
    assert [v for _, *v in seen["data"]] == [
        [f, g]
        for f, g in zip(
            on_full.history.objective[:20].tolist(), on_full.history.grad_norm[:20].tolist()
        )
    ]


def test_a_chunk_holds_at_most_32_batches_and_64_mib():
    from optsolve.backends.native.training import chunk_length

    small = (np.zeros((64, 64), np.float32), np.zeros((64, 10), np.float32))  # 19 KiB
    assert chunk_length(small) == 32
    three_mib = np.broadcast_to(np.float32(0), (3 * 2**20 // 4,))
    assert chunk_length(three_mib) == 16  # 32 * 3 MiB > 64 MiB >= 16 * 3 MiB
    images = {"x": np.broadcast_to(np.float32(0), (256, 224, 224, 3)), "y": np.zeros(256, int)}
    assert chunk_length(images) == 1  # 147 MiB a batch
    keys = (np.zeros((64, 10), np.float32), jax.random.split(jax.random.key(0), 64))
    assert chunk_length(keys) == 32  # a batch may hold PRNG keys (dropout, say)


def test_resume_on_shuffled_in_memory_data_continues_the_stream_bit_for_bit():
    """N steps, then M more from the same key, equal N + M steps in one run (float32,
    bitwise): the resumed run starts mid-epoch, at the batch and permutation where the
    first one stopped (6 batches an epoch; 7 + 6 steps cross two epoch boundaries)."""
    prob = make_problem(jnp.float32)
    data = (FEATURES.astype(np.float32), LABELS.astype(np.float32))
    run = functools.partial(
        solve, prob, optsolve.Adam(0.05), data=data, batch_size=16, key=jax.random.key(3)
    )
    whole = run(maxiters=13, epochs=3)
    with pytest.warns(UserWarning, match="maxiters=7 exceeds the 6 steps"):
        first = run(maxiters=7)
    assert first.stats.iterations == 6  # one epoch of 6 batches unless epochs says more
    first = run(maxiters=7, epochs=2)
    resumed = run(maxiters=6, epochs=2, resume=first)
    assert resumed.stats.iterations == 13
    for a, b in zip(
        jax.tree_util.tree_leaves((whole.x, whole.state)),
        jax.tree_util.tree_leaves((resumed.x, resumed.state)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.objective, resumed.objective)


def test_nonfinite_skip_skips_the_batch_and_fails_after_too_many_in_a_row():
    prob = make_problem()
    data = batches()
    data[2] = (np.full_like(data[2][0], np.nan), data[2][1])
    kept = [b for i, b in enumerate(batches()) if i != 2]
    # Adam skips batch 2's update (its state too): the run is the hand loop without it
    for algorithm in (optsolve.Adam(0.05), optax.apply_if_finite(optax.adam(0.05), 3)):
        policy = (
            {} if isinstance(algorithm, optax.GradientTransformation) else dict(nonfinite="skip")
        )
        sol = solve(prob, algorithm, data=data, **policy)
        assert sol.retcode == ReturnCode.MAXITERS and sol.stats.iterations == 6
        assert sol.stats.skipped == 1 and "1 step(s) skipped" in sol.message
        assert_close(sol.x, hand_loop(optax.adam(0.05), prob, kept), rtol=1e-12)
    # in memory, under jit: the same
    features = np.concatenate([b[0] for b in data])
    jitted = jax.jit(
        lambda: solve(
            prob, optsolve.Adam(0.05), data=(features, LABELS), batch_size=16, nonfinite="skip"
        )
    )()
    assert int(jitted.stats.skipped) == 1
    assert_close(jitted.x, hand_loop(optax.adam(0.05), prob, kept), rtol=1e-12)
    # the third skip in a row fails with max_consecutive_skips=2, at the last good iterate
    worse = batches()[:2] + [data[2]] * 4
    sol = solve(prob, optsolve.Adam(0.05), data=worse, nonfinite="skip", max_consecutive_skips=2)
    assert sol.retcode == ReturnCode.FAILURE and sol.stats.skipped == 2
    assert_close(sol.x, hand_loop(optax.adam(0.05), prob, batches()[:2]), rtol=1e-12)
    # the default fails at the first one
    assert solve(prob, optsolve.Adam(0.05), data=data).retcode == ReturnCode.FAILURE
    with pytest.raises(ValueError, match="needs `data`"):
        solve(prob, optsolve.Adam(0.05), maxiters=3, nonfinite="skip")
    with pytest.raises(ValueError, match="'fail' or 'skip'"):
        solve(prob, optsolve.Adam(0.05), data=data, nonfinite="ignore")
