"""optsolve.schedules: optax's schedules as pytrees. References: optax's own schedule of
the same arguments, and a hand-written optax loop; a compile counter for the sweep."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, solve

S = optsolve.schedules
ARGUMENTS = {
    S.ConstantSchedule: dict(value=0.1),
    S.LinearSchedule: dict(init_value=0.1, end_value=0.01, transition_steps=10),
    S.CosineDecaySchedule: dict(init_value=0.1, decay_steps=10, alpha=0.1, exponent=2.0),
    S.ExponentialDecay: dict(init_value=0.1, transition_steps=5, decay_rate=0.5, end_value=0.02),
    S.PolynomialSchedule: dict(init_value=0.1, end_value=0.01, power=2.0, transition_steps=10),
    S.PiecewiseConstantSchedule: dict(init_value=0.1, boundaries_and_scales={5: 0.5, 9: 0.1}),
    S.WarmupConstantSchedule: dict(init_value=0.0, peak_value=0.1, warmup_steps=3),
    S.WarmupCosineDecaySchedule: dict(
        init_value=0.0, peak_value=0.1, warmup_steps=3, decay_steps=10, end_value=0.01
    ),
    S.WarmupExponentialDecaySchedule: dict(
        init_value=0.0, peak_value=0.1, warmup_steps=3, transition_steps=5, decay_rate=0.5
    ),
    S.CosineOnecycleSchedule: dict(transition_steps=10, peak_value=0.1),
    S.LinearOnecycleSchedule: dict(transition_steps=10, peak_value=0.1),
}


def test_every_schedule_has_a_case():
    assert set(ARGUMENTS) == set(S.SCHEDULES)


@pytest.mark.parametrize("cls", S.SCHEDULES, ids=lambda c: c.__name__)
def test_values_equal_optax_with_traced_leaves(cls):
    kwargs = ARGUMENTS[cls]
    reference = cls.source
    steps = jnp.arange(16)
    ours = jax.jit(lambda schedule: jax.vmap(schedule)(steps))(cls(**kwargs))
    np.testing.assert_allclose(ours, jax.vmap(reference(**kwargs))(steps), rtol=2e-7, atol=1e-9)
    assert jax.tree_util.tree_leaves(cls(**kwargs))  # at least one number is a leaf


def test_a_peak_learning_rate_sweep_compiles_once_and_equals_optax():
    f = lambda x, p: jnp.sum((x - p) ** 2) + 0.1 * jnp.sum(x**4)
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.asarray(1.0))

    def adamw(peak):
        return optsolve.AdamW(
            S.warmup_cosine_decay_schedule(0.0, peak, 5, 40),
            weight_decay=S.linear_schedule(1e-2, 0, 40),
        )

    solve(prob, adamw(0.1), maxiters=40)
    with count_compilations() as counter:
        results = {peak: solve(prob, adamw(peak), maxiters=40).x for peak in (0.05, 0.2, 0.3)}
    assert counter.count == 0
    tx = optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, 0.2, 5, 40),
        weight_decay=optax.linear_schedule(1e-2, 0.0, 40),
    )
    x, state = jnp.zeros(3), None
    state = tx.init(x)
    for _ in range(40):
        updates, state = tx.update(jax.grad(f)(x, 1.0), state, x)
        x = optax.apply_updates(x, updates)
    np.testing.assert_allclose(results[0.2], x, rtol=1e-6, atol=1e-7)
    assert not np.allclose(results[0.05], results[0.3])
