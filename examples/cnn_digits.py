"""Train a small flax NNX CNN with BatchNorm and Dropout on scikit-learn's digits, one epoch
per solve (each resuming the last), and plot the learning curves.

The model itself is x0 (``trainable=nnx.Param``): its BatchNorm statistics and Dropout RNG
counter are carried through the compiled loop, not trained. After every epoch the model is
evaluated in eval mode (running averages, no dropout) on held-out digits. At the end the
same run is made by a hand-written ``nnx.Optimizer`` loop over the same shuffled batches,
and the two models are compared. Writes ``cnn_digits.png``.

Run: ``python examples/cnn_digits.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

import optsolve
from _common import pyplot, run_cli, save_figure
from optsolve import OptimizationProblem, solve

BATCH = 64


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 16, kernel_size=(3, 3), use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.25, rngs=rngs)
        self.out = nnx.Linear(4 * 4 * 16, 10, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.norm(self.conv(x[..., None])))
        h = nnx.avg_pool(h, window_shape=(2, 2), strides=(2, 2))
        return self.out(self.drop(h.reshape(h.shape[0], -1)))


def loss(model, p, batch):
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def accuracy(model, data) -> float:
    evaluated = nnx.clone(model)  # eval mode on a copy: the trained model stays in train mode
    evaluated.eval()
    x, y = data
    return float(jnp.mean(jnp.argmax(evaluated(x), -1) == y))


def hand_written(tx, train, key, epochs):
    """The reference: a jitted nnx.Optimizer step over the batches solve draws (each epoch
    a permutation from ``jax.random.fold_in(key, epoch)``, the remainder dropped)."""
    model = CNN(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        optimizer.update(model, nnx.grad(lambda m: loss(m, None, batch))(model))

    n = train[0].shape[0]
    for epoch in range(epochs):
        order = jax.random.permutation(jax.random.fold_in(key, epoch), n)
        for i in range(n // BATCH):
            rows = order[i * BATCH : (i + 1) * BATCH]
            step(model, optimizer, (train[0][rows], train[1][rows]))
    return model


def main(small: bool = False, out: Path = Path(".")) -> dict:
    digits = load_digits()
    images = jnp.asarray(digits.images / 16.0, jnp.float32)
    labels = jnp.asarray(digits.target)
    train, test = (images[:1200], labels[:1200]), (images[1200:], labels[1200:])
    epochs = 3 if small else 15
    key = jax.random.key(1)
    algorithm = optsolve.AdamW(3e-3, weight_decay=1e-4)

    prob = OptimizationProblem(loss, CNN(nnx.Rngs(0)), trainable=nnx.Param)
    sol, losses, test_accuracy = None, [], []
    for _ in range(epochs):
        sol = solve(
            prob, algorithm, data=train, batch_size=BATCH, key=key, resume=sol, history=True
        )
        losses.append(float(np.mean(sol.history.objective)))
        test_accuracy.append(accuracy(sol.x, test))

    reference = hand_written(optax.adamw(3e-3, weight_decay=1e-4), train, key, epochs)
    difference = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(
            jax.tree_util.tree_leaves(nnx.state(sol.x, nnx.Param)),
            jax.tree_util.tree_leaves(nnx.state(reference, nnx.Param)),
        )
    )
    statistics_difference = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(
            jax.tree_util.tree_leaves(nnx.state(sol.x, nnx.BatchStat)),
            jax.tree_util.tree_leaves(nnx.state(reference, nnx.BatchStat)),
        )
    )

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(1, epochs + 1)
    axes[0].semilogy(steps, losses, "o-")
    axes[0].set(
        xlabel="epoch",
        ylabel="mean minibatch loss (train mode)",
        title=f"AdamW(3e-3), batches of {BATCH}",
    )
    axes[1].plot(steps, test_accuracy, "o-")
    axes[1].set(
        xlabel="epoch",
        ylabel="test accuracy (eval mode)",
        title=f"held-out digits: {test_accuracy[-1]:.3f}",
    )
    path = save_figure(fig, out, "cnn_digits.png")
    summary = {
        "losses": losses,
        "test_accuracy": test_accuracy,
        "reference_test_accuracy": accuracy(reference, test),
        "max_parameter_difference": difference,
        "max_statistics_difference": statistics_difference,
        "steps": int(sol.stats.iterations),
        "dropout_draws": int(sol.x.drop.rngs.count[...]),
        "plot": path,
    }
    print(
        f"{epochs} epochs, {summary['steps']} steps: test accuracy {test_accuracy[-1]:.3f} "
        f"(hand-written nnx.Optimizer loop: {summary['reference_test_accuracy']:.3f}; "
        f"largest parameter difference {difference:.1e}, statistics {statistics_difference:.1e})"
    )
    return summary


if __name__ == "__main__":
    run_cli(main, __doc__)
