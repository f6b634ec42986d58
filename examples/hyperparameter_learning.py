"""Learn regularisation strengths by gradient descent on a validation loss (bilevel).

Inner problem: L2-regularised logistic regression with one regularisation strength per
feature, lam_j = exp(p_j):  x*(p) = argmin_x  mean log-loss(train; x) + sum_j lam_j x_j^2.
Outer problem: minimise the validation log-loss of x*(p) over p, with gradients
d val(x*(p)) / dp from implicit differentiation through ``optsolve.solve``.

Compared with the usual alternative, a grid search over one shared strength. Most
features are noise, so per-feature strengths (20 of them, beyond a grid's reach) should do
better. Writes ``hyperparameter_learning.png``.

Run: ``python examples/hyperparameter_learning.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import optsolve
from _common import pyplot, run_cli, save_figure
from optsolve import OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)


def make_data(n_train: int, n_val: int, n_features: int = 20, informative: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    w_true = np.zeros(n_features)
    w_true[:informative] = rng.normal(scale=2.0, size=informative)

    def sample(n):
        x = rng.normal(size=(n, n_features))
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-x @ w_true))).astype(float)
        return jnp.asarray(x), jnp.asarray(y)

    return sample(n_train), sample(n_val), sample(4000)


def log_loss(w, data):
    x, y = data
    z = x @ w
    return jnp.mean(jnp.logaddexp(0.0, z) - y * z)


def main(small: bool = False, out: Path = Path(".")) -> dict:
    n_train = 60 if small else 100
    outer_steps = 15 if small else 60
    train, val, test = make_data(n_train, 200)

    def inner(w, log_lam):
        return log_loss(w, train) + jnp.sum(jnp.exp(log_lam) * w**2)

    prob = OptimizationProblem(inner, jnp.zeros(train[0].shape[1]), jnp.zeros(train[0].shape[1]))
    inner_solver = optsolve.ScipyMinimize("L-BFGS-B")

    def fit(log_lam):
        return solve(prob.replace(p=log_lam), inner_solver, gtol=1e-8).x

    def validation(log_lam):
        return log_loss(fit(log_lam), val)

    # The outer problem is itself solved by optsolve: Adam on p, whose gradient flows through
    # the inner solve (implicit differentiation, the inner scipy run called from compiled code).
    history = []
    outer = OptimizationProblem(
        lambda log_lam, _: validation(log_lam), jnp.full(train[0].shape[1], np.log(0.01))
    )
    result = solve(
        outer,
        optsolve.Adam(0.3),
        maxiters=outer_steps,
        callback=lambda i, q, value: history.append(float(value)),
    )
    log_lam = result.x
    learned_val = float(validation(log_lam))
    learned_test = float(log_loss(fit(log_lam), test))

    grid = np.logspace(-4, 1, 6 if small else 16)
    grid_val = [float(validation(jnp.full_like(log_lam, np.log(lam)))) for lam in grid]
    best = grid[int(np.argmin(grid_val))]
    grid_test = float(log_loss(fit(jnp.full_like(log_lam, np.log(best))), test))

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(range(1, len(history) + 1), history, label="per-feature strengths (hypergradient)")
    axes[0].axhline(min(grid_val), color="gray", ls="--", label=f"best grid value (lam={best:.1e})")
    axes[0].set(xlabel="outer step", ylabel="validation log-loss", title="Bilevel learning")
    axes[0].legend()
    axes[1].semilogx(grid, grid_val, "o-", label="grid search, one shared strength")
    axes[1].axhline(learned_val, color="C1", label="learned per-feature strengths")
    axes[1].set(xlabel="shared regularisation strength", ylabel="validation log-loss")
    axes[1].legend()
    path = save_figure(fig, out, "hyperparameter_learning.png")

    summary = {
        "learned_validation": learned_val,
        "grid_validation": min(grid_val),
        "learned_test": learned_test,
        "grid_test": grid_test,
        "history": history,
        "plot": path,
    }
    print(f"validation log-loss: learned {learned_val:.4f} vs best grid {min(grid_val):.4f}")
    print(f"held-out test log-loss: learned {learned_test:.4f} vs best grid {grid_test:.4f}")
    return summary


if __name__ == "__main__":
    run_cli(main, __doc__)
