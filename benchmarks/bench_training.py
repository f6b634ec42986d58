"""Training on data: optsolve's loops against the hand-written optax loops, side by side.

Problem: an MLP 64-32-10 (tanh) on scikit-learn's digits (1797 samples), softmax
cross-entropy, Adam(1e-3), minibatches of 64, float32.

- data iterator: a list of 28 batches x 10 epochs through ``solve(..., data=batches,
  epochs=10)`` against a Python loop calling one jitted optax step per batch;
- in-memory epochs: ``solve(..., data=arrays, batch_size=64, key=key, epochs=10)`` (one
  compiled scan per epoch) against a hand-written jitted epoch scan with the same shuffling.

Run: ``python benchmarks/bench_training.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from sklearn.datasets import load_digits
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))

import optsolve
from common import interleaved_medians, machine_line, markdown_table

BATCH, EPOCHS, LR = 64, 10, 1e-3


def setup():
    digits = load_digits()
    x = jnp.asarray(digits.data / 16.0, jnp.float32)
    y = jax.nn.one_hot(digits.target, 10, dtype=jnp.float32)
    keys = jax.random.split(jax.random.key(0), 2)
    params = [
        {
            "w": jax.random.normal(keys[0], (64, 32), jnp.float32) / 8.0,
            "b": jnp.zeros(32, jnp.float32),
        },
        {
            "w": jax.random.normal(keys[1], (32, 10), jnp.float32) / 32**0.5,
            "b": jnp.zeros(10, jnp.float32),
        },
    ]

    def loss(params, _p, batch):
        xb, yb = batch
        h = jnp.tanh(xb @ params[0]["w"] + params[0]["b"])
        return jnp.mean(optax.softmax_cross_entropy(h @ params[1]["w"] + params[1]["b"], yb))

    return x, y, params, loss


def main(repeats: int = 31) -> str:
    x, y, params, loss = setup()
    n_batches = x.shape[0] // BATCH
    batches = [
        (x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(n_batches)
    ]
    key = jax.random.key(1)
    tx = optax.adam(LR)
    prob = optsolve.OptimizationProblem(loss, params)

    @jax.jit
    def hand_step(params, state, batch):
        grads = jax.grad(loss)(params, None, batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def hand_iterator():
        p, s = params, tx.init(params)
        for _ in range(EPOCHS):
            for batch in batches:
                p, s = hand_step(p, s, batch)
        return p

    def optsolve_iterator():
        return optsolve.solve(prob, optsolve.Adam(LR), data=batches, epochs=EPOCHS).x

    @jax.jit
    def hand_epoch(p, s, epoch):
        perm = jax.random.permutation(jax.random.fold_in(key, epoch), x.shape[0])[
            : n_batches * BATCH
        ]
        xb = x[perm].reshape(n_batches, BATCH, -1)
        yb = y[perm].reshape(n_batches, BATCH, -1)

        def body(carry, batch):
            return hand_step(*carry, batch), None

        return jax.lax.scan(body, (p, s), (xb, yb))[0]

    def hand_scan():
        p, s = params, tx.init(params)
        for epoch in range(EPOCHS):
            p, s = hand_epoch(p, s, epoch)
        return p

    def optsolve_scan():
        return optsolve.solve(
            prob, optsolve.Adam(LR), data=(x, y), batch_size=BATCH, key=key, epochs=EPOCHS
        ).x

    runners = {
        "hand-written: Python loop over batches calling a jitted optax step": hand_iterator,
        "optsolve: solve(..., data=batches, epochs=10)": optsolve_iterator,
        "hand-written: jitted epoch scan": hand_scan,
        "optsolve: solve(..., data=arrays, batch_size=64, key=key, epochs=10)": optsolve_scan,
    }
    results = {name: jax.block_until_ready(fn()) for name, fn in runners.items()}
    names = list(runners)
    diffs = {
        "iterator": max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(
                jax.tree_util.tree_leaves(results[names[0]]),
                jax.tree_util.tree_leaves(results[names[1]]),
            )
        ),
        "scan": max(
            float(jnp.max(jnp.abs(a - b)))
            for a, b in zip(
                jax.tree_util.tree_leaves(results[names[2]]),
                jax.tree_util.tree_leaves(results[names[3]]),
            )
        ),
    }
    medians = interleaved_medians(runners, repeats)
    rows = [
        [names[0], f"{medians[names[0]] * 1e3:.1f}", "1.000x"],
        [
            names[1],
            f"{medians[names[1]] * 1e3:.1f}",
            f"{medians[names[1]] / medians[names[0]]:.3f}x",
        ],
        [names[2], f"{medians[names[2]] * 1e3:.1f}", "1.000x"],
        [
            names[3],
            f"{medians[names[3]] * 1e3:.1f}",
            f"{medians[names[3]] / medians[names[2]]:.3f}x",
        ],
    ]
    return "\n".join(
        [
            f"### Training on data: MLP on digits, Adam, batches of {BATCH}, {EPOCHS} epochs, "
            "float32",
            "",
            markdown_table(
                ["runner", "steady median (ms)", "ratio to its hand-written loop"], rows
            ),
            "",
            "Largest parameter difference to the hand-written loop: iterator "
            f"{diffs['iterator']:.1e}, "
            f"scan {diffs['scan']:.1e} (float32). Median of {repeats} interleaved runs after "
            "warm-up; BLAS pinned to 1 thread.",
        ]
    )


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(machine_line())
        print(main())
