"""Train a flax MLP on scikit-learn's digits with Adam (minibatches), then with L-BFGS
(full batch) on the same problem, and plot both.

The flax linen parameter dict is x0 as it is; the data is p, so the same problem serves the
stochastic and the deterministic solve. Writes ``mlp_digits.png``.

Run: ``python examples/mlp_digits.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import optsolve
from _common import pyplot, run_cli, save_figure
from optsolve import OptimizationProblem, solve


class MLP(nn.Module):
    hidden: int = 32

    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(jnp.tanh(nn.Dense(self.hidden)(x)))


def main(small: bool = False, out: Path = Path(".")) -> dict:
    digits = load_digits()
    x_all = jnp.asarray(digits.data / 16.0, jnp.float32)
    y_all = jax.nn.one_hot(digits.target, 10, dtype=jnp.float32)
    n_train = 1200
    train, test = (x_all[:n_train], y_all[:n_train]), (x_all[n_train:], y_all[n_train:])
    model = MLP()
    params = model.init(jax.random.key(0), x_all[:1])

    def loss(params, _p, batch):
        x, y = batch
        return jnp.mean(optax.softmax_cross_entropy(model.apply(params, x), y))

    def accuracy(params, data):
        x, y = data
        return float(jnp.mean(jnp.argmax(model.apply(params, x), -1) == jnp.argmax(y, -1)))

    epochs = 5 if small else 40
    adam = solve(
        OptimizationProblem(loss, params),
        optsolve.Adam(3e-3),
        data=train,
        batch_size=100,
        key=jax.random.key(1),
        epochs=epochs,
        history=True,
    )
    full_batch = OptimizationProblem(lambda w, p: loss(w, p, train), params)
    lbfgs_iters = 50 if small else 400
    lbfgs = solve(full_batch, optax.lbfgs(), maxiters=lbfgs_iters, gtol=1e-5, history=True)

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps_per_epoch = n_train // 100
    adam_epochs = np.asarray(adam.history.objective).reshape(-1, steps_per_epoch).mean(axis=1)
    axes[0].semilogy(np.arange(1, len(adam_epochs) + 1), adam_epochs, "o-")
    axes[0].set(
        xlabel="epoch",
        ylabel="mean minibatch loss",
        title=f"Adam(3e-3), batches of 100: test accuracy {accuracy(adam.x, test):.3f}",
    )
    lbfgs_curve = np.asarray(lbfgs.history.objective)
    axes[1].semilogy(np.arange(len(lbfgs_curve)), lbfgs_curve)
    axes[1].set(
        xlabel="iteration",
        ylabel="full-batch loss",
        title=f"optax.lbfgs, full batch: test accuracy {accuracy(lbfgs.x, test):.3f}",
    )
    path = save_figure(fig, out, "mlp_digits.png")
    summary = {
        "adam_test_accuracy": accuracy(adam.x, test),
        "lbfgs_test_accuracy": accuracy(lbfgs.x, test),
        "adam_train_loss": float(loss(adam.x, None, train)),
        "lbfgs_train_loss": float(lbfgs.objective),
        "initial_loss": float(loss(params, None, train)),
        "plot": path,
    }
    print(
        f"Adam:   train loss {summary['adam_train_loss']:.4f}, "
        f"test accuracy {summary['adam_test_accuracy']:.3f} ({adam.stats.time:.1f} s)"
    )
    print(
        f"L-BFGS: train loss {summary['lbfgs_train_loss']:.4f}, "
        f"test accuracy {summary['lbfgs_test_accuracy']:.3f} ({lbfgs.stats.time:.1f} s, "
        f"{int(lbfgs.stats.iterations)} iterations, {lbfgs.retcode})"
    )
    return summary


if __name__ == "__main__":
    run_cli(main, __doc__)
