"""Minibatch training under JAX's transformations: an ensemble of seeds trained at once with
``jax.vmap``, and a learning rate learned by gradient descent on a held-out loss, through
the minibatch training itself (``jax.grad`` with ``UnrolledAdjoint``).

An MLP 64-32-10 on scikit-learn's digits. The learning rate is learned in log space by an
outer ``solve`` (Adam on log(lr)), whose objective is the validation loss after a few epochs
of minibatch SGD: a solve inside a solve, one compiled program. Writes
``minibatch_under_transformations.png``.

Run: ``python examples/minibatch_under_transformations.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import optsolve
from _common import pyplot, run_cli, save_figure
from optsolve import OptimizationProblem, solve


def init(key, hidden=32):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (64, hidden)) / 8.0,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, 10)) / hidden**0.5,
        "b2": jnp.zeros(10),
    }


def logits(params, x):
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loss(params, _p, batch):
    x, y = batch
    return jnp.mean(optax.softmax_cross_entropy(logits(params, x), y))


def main(small: bool = False, out: Path = Path(".")) -> dict:
    digits = load_digits()
    x = jnp.asarray(digits.data / 16.0, jnp.float32)
    y = jax.nn.one_hot(digits.target, 10, dtype=jnp.float32)
    train, held, test = (x[:1000], y[:1000]), (x[1000:1400], y[1000:1400]), (x[1400:], y[1400:])
    problem = OptimizationProblem(loss, init(jax.random.key(0)))

    # 1. an ensemble: 8 seeds (initialisation and shuffling) trained at once under jax.vmap
    seeds = 4 if small else 8
    epochs = 3 if small else 20

    def train_one(key):
        start, shuffle = jax.random.split(key)
        sol = solve(
            problem.replace(x0=init(start)),
            optsolve.Adam(3e-3),
            data=train,
            batch_size=50,
            key=shuffle,
            epochs=epochs,
            history=True,
        )
        return sol.x, sol.history.objective

    members, losses = jax.jit(jax.vmap(train_one))(jax.random.split(jax.random.key(1), seeds))
    member_logits = jax.vmap(logits, in_axes=(0, None))(members, test[0])
    labels = jnp.argmax(test[1], -1)
    member_accuracy = np.asarray(jnp.mean(jnp.argmax(member_logits, -1) == labels, axis=-1))
    ensemble_accuracy = float(
        jnp.mean(jnp.argmax(jnp.mean(jax.nn.softmax(member_logits), 0), -1) == labels)
    )

    # 2. the learning rate, learned: d(validation loss)/d(log lr) through the SGD epochs
    inner_epochs = 2 if small else 5

    def validation_loss(log_lr, _p=None):
        sol = solve(
            problem,
            optsolve.SGD(jnp.exp(log_lr)),
            data=train,
            batch_size=50,
            key=jax.random.key(2),
            epochs=inner_epochs,
            adjoint=optsolve.UnrolledAdjoint(),
        )
        return loss(sol.x, None, held)

    start = jnp.log(jnp.asarray(0.05, jnp.float32))
    outer_steps = 6 if small else 40
    # keep="best": past the best rate SGD diverges within the epochs (the grid's cliff),
    # and the outer run returns the rate of lowest validation loss it met
    learned = solve(
        OptimizationProblem(validation_loss, start),
        optsolve.Adam(0.1),
        maxiters=outer_steps,
        keep="best",
    )
    grid = np.geomspace(0.005, 3.0, 5 if small else 25)
    grid_losses = np.asarray(
        jax.jit(jax.vmap(validation_loss))(jnp.log(jnp.asarray(grid, jnp.float32)))
    )

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i in range(seeds):
        axes[0].plot(
            np.asarray(losses[i]),
            lw=0.8,
            alpha=0.7,
            label=f"seed {i}: test accuracy {member_accuracy[i]:.3f}" if i < 3 else None,
        )
    axes[0].set(
        title=f"{seeds} seeds under jax.vmap; ensemble test accuracy {ensemble_accuracy:.3f}",
        xlabel="step",
        ylabel="batch loss",
        yscale="log",
    )
    axes[0].legend(fontsize=8)
    axes[1].plot(grid, grid_losses, "o-", color="C7", label="validation loss (grid)")
    axes[1].axvline(float(jnp.exp(start)), color="C1", ls=":", label="starting learning rate")
    axes[1].axvline(
        float(jnp.exp(learned.x)),
        color="C0",
        label=f"learned by jax.grad: {float(jnp.exp(learned.x)):.3f}",
    )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="SGD learning rate",
        ylabel="validation loss",
        title=f"after {inner_epochs} epochs of minibatch SGD",
    )
    axes[1].legend(fontsize=8)
    return {
        "plot": save_figure(fig, out, "minibatch_under_transformations.png"),
        "member_accuracy": member_accuracy,
        "ensemble_accuracy": ensemble_accuracy,
        "initial_validation": float(validation_loss(start)),
        "learned_validation": float(validation_loss(learned.x)),
        "learned_rate": float(jnp.exp(learned.x)),
        "grid": grid,
        "grid_losses": grid_losses,
    }


if __name__ == "__main__":
    run_cli(main, __doc__)
