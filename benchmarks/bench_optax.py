"""optsolve's optax backend against the hand-written optax loop, side by side in one run.

Problem (as in shared/PEERS.md): an MLP 64-32-10 with tanh on scikit-learn's digits,
softmax cross-entropy, 2000 full-batch Adam(1e-3) steps, float32.

Measured: steady-state median wall time of a full run, compile + first run, and the number
of compilations over five learning rates for the closure approach (a jitted train function
taking the optax transform as a static argument) and for optsolve.

Run: ``python benchmarks/bench_optax.py`` (or ``make bench`` for every benchmark).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import optsolve
from common import interleaved_medians, machine_line, markdown_table, time_first_call
from compile_count import count_compilations

STEPS = 2000
LEARNING_RATE = 1e-3


def make_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[digits.target]
    return jnp.asarray(x), jnp.asarray(y)


def init_params(key):
    sizes = [(64, 32), (32, 10)]
    params = []
    for k, (n_in, n_out) in zip(jax.random.split(key, len(sizes)), sizes):
        w = jax.random.normal(k, (n_in, n_out), jnp.float32) / jnp.sqrt(n_in).astype(jnp.float32)
        params.append({"w": w, "b": jnp.zeros(n_out, jnp.float32)})
    return params


def make_loss():
    # A fresh function object each call, so each runner compiles from scratch when timed.
    def loss(params, data):
        x, y = data
        h = jnp.tanh(x @ params[0]["w"] + params[0]["b"])
        logits = h @ params[1]["w"] + params[1]["b"]
        return jnp.mean(optax.softmax_cross_entropy(logits, y))

    return loss


def hand_written_fori_loop(loss, lr):
    """The loop an optax user writes: lax.fori_loop over jitted Adam steps."""

    @jax.jit
    def train(params, data):
        tx = optax.adam(lr)

        def body(_, carry):
            params, state = carry
            grads = jax.grad(loss)(params, data)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        return jax.lax.fori_loop(0, STEPS, body, (params, tx.init(params)))[0]

    return train


def python_loop(loss, lr):
    """A Python loop calling a jitted step (common, slower)."""
    tx = optax.adam(lr)

    @jax.jit
    def step(params, state, data):
        grads = jax.grad(loss)(params, data)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def train(params, data):
        state = tx.init(params)
        for _ in range(STEPS):
            params, state = step(params, state, data)
        return params

    return train


def optsolve_runner(loss, lr):
    def train(params, data):
        prob = optsolve.OptimizationProblem(loss, params, data)
        return optsolve.solve(prob, optsolve.Adam(lr), maxiters=STEPS).x

    return train


def count_closure_compiles(params, data) -> int:
    loss = make_loss()

    def train(tx, params, data):
        def body(_, carry):
            params, state = carry
            updates, state = tx.update(jax.grad(loss)(params, data), state, params)
            return optax.apply_updates(params, updates), state

        return jax.lax.fori_loop(0, 10, body, (params, tx.init(params)))[0]

    train_jit = jax.jit(train, static_argnums=0)
    with count_compilations() as counter:
        for lr in (1e-3, 2e-3, 5e-3, 1e-2, 2e-2):
            jax.block_until_ready(train_jit(optax.adam(lr), params, data))
    return counter.count


def count_optsolve_compiles(params, data) -> int:
    loss = make_loss()
    prob = optsolve.OptimizationProblem(loss, params, data)
    with count_compilations() as counter:
        for lr in (1e-3, 2e-3, 5e-3, 1e-2, 2e-2):
            jax.block_until_ready(optsolve.solve(prob, optsolve.Adam(lr), maxiters=10).x)
    return counter.count


def main(repeats: int = 7) -> str:
    data = make_data()
    params = init_params(jax.random.key(0))
    factories = {
        "hand-written jitted lax.fori_loop (optax.adam)": hand_written_fori_loop,
        "optsolve.solve(prob, optsolve.Adam(1e-3), maxiters=2000)": optsolve_runner,
        "Python loop calling a jitted optax step": python_loop,
    }
    runners, first = {}, {}
    for name, factory in factories.items():
        train = factory(make_loss(), LEARNING_RATE)
        runners[name] = lambda train=train: train(params, data)
        first[name] = time_first_call(runners[name])
    # the same numbers: optsolve's loop is the user's loop
    reference = runners[next(iter(runners))]()
    ours = runners["optsolve.solve(prob, optsolve.Adam(1e-3), maxiters=2000)"]()
    max_diff = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree_util.tree_leaves(reference), jax.tree_util.tree_leaves(ours))
    )
    steady = interleaved_medians(runners, repeats)
    base = steady["hand-written jitted lax.fori_loop (optax.adam)"]
    base_first = first["hand-written jitted lax.fori_loop (optax.adam)"]
    rows = [
        [
            name,
            f"{steady[name]:.3f}",
            f"{steady[name] / base:.3f}x",
            f"{first[name]:.2f}",
            f"{first[name] / base_first:.2f}x",
        ]
        for name in runners
    ]
    closure, ours_compiles = (
        count_closure_compiles(params, data),
        count_optsolve_compiles(params, data),
    )
    report = [
        "### optax backend: Adam on an MLP (digits), 2000 full-batch steps, float32",
        "",
        markdown_table(
            ["runner", "steady median (s)", "ratio", "compile + first (s)", "ratio"], rows
        ),
        "",
        f"Largest parameter difference between optsolve and the hand-written loop: {max_diff:.1e}.",
        "",
        "Compilations over five learning rates (10 steps each): "
        f"closure approach (jitted train with the optax transform static) **{closure}**, "
        f"optsolve.solve with optsolve.Adam(lr) **{ours_compiles}**.",
        "",
        f"Median of {repeats} interleaved runs after warm-up; BLAS pinned to 1 thread.",
    ]
    return "\n".join(report)


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(machine_line())
        print(main())
