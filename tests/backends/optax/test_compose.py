"""Composition as pytrees: optsolve.chain, the optax wrappers as parts, MultiSteps and
ApplyIfFinite. References: hand-written optax loops (and a hand-written accumulation loop),
and a compile counter for the sweep."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, solve

W_TRUE = jnp.array([1.0, -2.0, 0.5, 3.0])
_rng = np.random.default_rng(0)
FEATURES = jnp.asarray(_rng.normal(size=(64, 4)))
TARGETS = FEATURES @ W_TRUE


def loss(w, p, batch=(FEATURES, TARGETS)):
    x, y = batch
    return jnp.mean((x @ w - y) ** 2)


PROBLEM = OptimizationProblem(loss, jnp.zeros(4))


def hand_loop(tx, steps, batches=None):
    w = jnp.zeros(4)
    state = tx.init(w)
    for k in range(steps):
        batch = (FEATURES, TARGETS) if batches is None else batches[k]
        updates, state = tx.update(jax.grad(loss)(w, None, batch), state, w)
        w = optax.apply_updates(w, updates)
    return w


def test_chain_equals_optax_chain():
    alg = optsolve.chain(
        optsolve.ClipByGlobalNorm(1.0), optsolve.AdamW(0.05, weight_decay=1e-2), optsolve.Scale(0.5)
    )
    sol = solve(PROBLEM, alg, maxiters=30)
    reference = hand_loop(
        optax.chain(
            optax.clip_by_global_norm(1.0), optax.adamw(0.05, weight_decay=1e-2), optax.scale(0.5)
        ),
        30,
    )
    np.testing.assert_allclose(sol.x, reference, rtol=1e-12, atol=1e-14)
    assert len(jax.tree_util.tree_leaves(alg)) == 8  # every number a leaf


def test_a_clip_adamw_schedule_sweep_compiles_once():
    def alg(norm, peak, decay):
        return optsolve.chain(
            optsolve.ClipByGlobalNorm(norm),
            optsolve.AdamW(
                optsolve.schedules.warmup_cosine_decay_schedule(0.0, peak, 3, 20),
                weight_decay=decay,
            ),
        )

    solve(PROBLEM, alg(1.0, 0.1, 0.0), maxiters=20)
    grid = list(itertools.product((0.5, 1.0, 2.0), (0.02, 0.05, 0.1), (0.0, 1e-3, 1e-2)))
    with count_compilations() as counter:
        results = {point: solve(PROBLEM, alg(*point), maxiters=20).x for point in grid}
    assert counter.count == 0 and len(results) == 27
    norm, peak, decay = grid[14]
    reference = hand_loop(
        optax.chain(
            optax.clip_by_global_norm(norm),
            optax.adamw(optax.warmup_cosine_decay_schedule(0.0, peak, 3, 20), weight_decay=decay),
        ),
        20,
    )
    np.testing.assert_allclose(results[grid[14]], reference, rtol=1e-10, atol=1e-12)


def test_multisteps_equals_a_hand_written_accumulation_loop():
    """Every k = 3 steps, one Adam update with the mean of the 3 batches' gradients; x is
    unchanged in between (the reference does not use optax.MultiSteps)."""
    batches = [(FEATURES[i : i + 8], TARGETS[i : i + 8]) for i in range(0, 64, 8)] + [
        (FEATURES[i : i + 8], TARGETS[i : i + 8]) for i in range(0, 64, 8)
    ][:1]
    sol = solve(PROBLEM, optsolve.MultiSteps(optsolve.Adam(0.1), every_k=3), data=batches)
    tx, w = optax.adam(0.1), jnp.zeros(4)
    state, accumulated = tx.init(w), []
    for batch in batches:
        accumulated.append(jax.grad(loss)(w, None, batch))
        if len(accumulated) == 3:
            updates, state = tx.update(sum(accumulated) / 3, state, w)
            w, accumulated = optax.apply_updates(w, updates), []
    # optax's running mean of the gradients rounds differently from this sum / 3 (5e-8
    # relative after three updates, with optax.MultiSteps in a hand loop too)
    np.testing.assert_allclose(sol.x, w, rtol=1e-7)
    np.testing.assert_allclose(
        sol.x,
        hand_loop(optax.MultiSteps(optax.adam(0.1), 3).gradient_transformation(), 9, batches),
        rtol=1e-12,
        atol=1e-14,
    )
    assert sol.stats.iterations == 9


def test_apply_if_finite_skips_a_batch_whose_gradient_overflows():
    def rooted(w, p, batch):  # a finite loss, a NaN gradient (inf * 0) where shift == 0
        x, y, shift = batch
        return jnp.mean((x @ w - y) ** 2) + jnp.sqrt(jnp.abs(w[0] - w[0] + shift))

    batches = [(FEATURES, TARGETS, jnp.asarray(s)) for s in (5.0, 5.0, 0.0, 5.0, 5.0)]
    prob = OptimizationProblem(rooted, jnp.zeros(4))
    sol = solve(prob, optsolve.ApplyIfFinite(optsolve.SGD(0.01), 2), data=batches)
    w, skipped = jnp.zeros(4), []
    for batch in batches:
        g = jax.grad(rooted)(w, None, batch)
        skipped.append(not bool(jnp.all(jnp.isfinite(g))))
        if not skipped[-1]:
            w = w - 0.01 * g
    assert skipped == [False, False, True, False, False]
    np.testing.assert_allclose(sol.x, w, rtol=1e-12, atol=1e-14)
    assert sol.stats.iterations == 5


def test_optsolve_algorithms_work_inside_optax_chain():
    tx = optax.chain(optax.clip_by_global_norm(1.0), optsolve.Adam(0.05))
    reference = hand_loop(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05)), 20)
    np.testing.assert_allclose(hand_loop(tx, 20), reference, rtol=1e-12)
    np.testing.assert_allclose(solve(PROBLEM, tx, maxiters=20).x, reference, rtol=1e-12)


def test_parts_are_not_algorithms_and_members_are_checked():
    with pytest.raises(TypeError, match=r"ClipByGlobalNorm is a part of an algorithm.*chain"):
        solve(PROBLEM, optsolve.ClipByGlobalNorm(1.0), maxiters=3)
    with pytest.raises(TypeError, match="member 1 must be an optsolve optax-family"):
        optsolve.chain(optsolve.Adam(0.1), optsolve.LBFGS())
    with pytest.raises(TypeError, match="`every_k` must be a positive int"):
        optsolve.MultiSteps(optsolve.Adam(0.1), 0)
