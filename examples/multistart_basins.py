"""Multistart on Rastrigin: where the starts were and which basin each run reached.

Rastrigin's function in 2-D, shifted so that its global minimum (0) sits at (0.7, -1.1),
has a local minimum near every point of the integer lattice: one L-BFGS run from the box's
centre stops in the basin it starts in. ``optsolve.Multistart(LBFGS(), n, key)`` samples
``n`` Sobol' starts in the box [-5.12, 5.12]^2, runs them as one vmapped compiled solve and
returns the best; ``sol.original`` holds every run's start, end point and objective. The plot
shows each start coloured by the objective of the minimum its run reached, a segment from
start to end for the runs that reached the global minimum, and the best point. Writes
``multistart_basins.png`` (the docs' figure: ``--out docs/images``).

Run: ``python examples/multistart_basins.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import optsolve
from _common import pyplot, run_cli, save_figure

jax.config.update("jax_enable_x64", True)

SHIFT = jnp.array([0.7, -1.1])
HALF = 5.12


def rastrigin(x, p):
    z = x - p
    return 10.0 * z.size + jnp.sum(z**2 - 10.0 * jnp.cos(2.0 * jnp.pi * z))


def main(small: bool = False, out: Path = Path(".")) -> dict:
    n_starts = 256  # (--small coarsens only the plot's grid: the runs are one compiled call)
    prob = optsolve.OptimizationProblem(rastrigin, jnp.zeros(2), SHIFT, bounds=(-HALF, HALF))
    single = optsolve.solve(prob, optsolve.LBFGS())
    sol = optsolve.solve(prob, optsolve.Multistart(optsolve.LBFGS(), n_starts, jax.random.key(0)))
    runs = sol.original
    starts, ends = np.asarray(runs.starts), np.asarray(runs.x)
    objective = np.asarray(runs.objective)
    basins = len({tuple(np.round(e, 3)) for e in ends})
    global_runs = objective < 1e-8
    print(f"one L-BFGS run from the centre: f = {float(single.objective):.4f}")
    print(
        f"{n_starts} starts, {sol.retcode}: f = {float(sol.objective):.2e} at "
        f"{np.round(np.asarray(sol.x), 6)}; {basins} distinct minima reached, "
        f"{int(global_runs.sum())} runs in the global one"
    )

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    grid = np.linspace(-HALF, HALF, 120 if small else 400)
    xx, yy = np.meshgrid(grid, grid)
    points = jnp.stack([xx.ravel(), yy.ravel()], axis=1)
    zz = np.asarray(jax.vmap(rastrigin, (0, None))(points, SHIFT)).reshape(xx.shape)
    ax.contourf(xx, yy, zz, levels=30, cmap="Greys", alpha=0.6)
    for s, e in zip(starts[global_runs], ends[global_runs]):
        ax.annotate("", e, s, arrowprops=dict(arrowstyle="->", color="C3", lw=1.2))
    scatter = ax.scatter(
        starts[:, 0],
        starts[:, 1],
        c=objective,
        cmap="viridis",
        s=18,
        edgecolors="k",
        linewidths=0.3,
        zorder=3,
    )
    ax.scatter(
        ends[:, 0],
        ends[:, 1],
        marker="x",
        c="C1",
        s=14,
        linewidths=0.8,
        zorder=3,
        label="minima the runs reached",
    )
    ax.scatter(
        *np.asarray(sol.x),
        marker="*",
        c="C3",
        s=220,
        edgecolors="k",
        zorder=4,
        label=f"best: f = {float(sol.objective):.1e}",
    )
    ax.scatter(
        *np.asarray(single.x),
        marker="s",
        c="w",
        s=50,
        edgecolors="k",
        zorder=4,
        label=f"one run from the centre: f = {float(single.objective):.2f}",
    )
    fig.colorbar(scatter, ax=ax, label="objective of the minimum the start's run reached")
    ax.set_xlim(-HALF, HALF)
    ax.set_ylim(-HALF, HALF)
    ax.set_title(
        f"Multistart(LBFGS(), {n_starts}) on Rastrigin: Sobol' starts and their basins", fontsize=9
    )
    ax.legend(loc="lower left", fontsize=7)
    plot = save_figure(fig, out, "multistart_basins.png")
    return {
        "plot": plot,
        "objective": float(sol.objective),
        "single_objective": float(single.objective),
        "basins": basins,
        "global_runs": int(global_runs.sum()),
        "n_starts": n_starts,
    }


if __name__ == "__main__":
    run_cli(main, __doc__)
