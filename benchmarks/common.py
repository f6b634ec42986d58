"""Shared benchmark helpers: machine facts, interleaved timing, markdown tables."""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from importlib import metadata

import jax


def machine_line() -> str:
    versions = []
    for pkg in ("jax", "optax", "scipy", "numpy", "jaxopt", "optimistix"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            pass
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {jax.default_backend()} backend; "
        + ", ".join(versions)
    )


def block(tree):
    return jax.block_until_ready(tree)


def time_first_call(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    block(fn())
    return time.perf_counter() - start


def interleaved_medians(runners: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time of each runner, measured in turns so drift hits all alike, in a new
    order each turn (seeded) so that no runner always follows the same one."""
    times = interleaved_times(runners, repeats)
    return {name: statistics.median(ts) for name, ts in times.items()}


def interleaved_times(
    runners: dict[str, Callable[[], object]], repeats: int
) -> dict[str, list[float]]:
    """The wall times of :func:`interleaved_medians`, turn by turn: entry i of every list
    comes from turn i, so ratios between runners can be taken within one turn."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            fn = runners[name]
            start = time.perf_counter()
            block(fn())
            times[name].append(time.perf_counter() - start)
    return times


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def optax_lbfgs_loop(fun: Callable, x0, gtol: float, maxiter: int):
    """optax.lbfgs() driven by the ``lax.while_loop`` of optax's documentation (L-BFGS
    example, with ``value_and_grad_from_state``), stopped at gradient inf-norm ``gtol`` or
    ``maxiter`` steps: (x, steps taken)."""
    import optax
    import optax.tree_utils as otu

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(fun)

    def step(carry):
        params, state = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=fun)
        return optax.apply_updates(params, updates), state

    def keep_going(carry):
        _, state = carry
        count = otu.tree_get(state, "count")
        err = jax.numpy.max(jax.numpy.abs(otu.tree_get(state, "grad")))
        return (count == 0) | ((count < maxiter) & (err >= gtol))

    params, state = jax.lax.while_loop(keep_going, step, (x0, opt.init(x0)))
    return params, otu.tree_get(state, "count")


def performance_profile(
    results: dict,
    names: list[str],
    key: str,
    title: str,
    path,
    solved: Callable[[dict, str], bool],
    max_tau: float = 1e3,
) -> None:
    """Dolan and Moré (2002), Benchmarking optimization software with performance profiles:
    the fraction of problems each runner solves within a factor tau of the best runner on
    that problem (unsolved runs count as never). ``results``: problem -> runner -> record;
    ``key``: the record's cost; ``solved(records, name)``: whether that runner solved the
    problem whose records are ``records``. Saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ratios = {name: [] for name in names}
    for records in results.values():
        costs = {
            n: max(float(records[n][key]), 1e-12)
            for n in names
            if n in records and solved(records, n)
        }
        if not costs:
            continue
        least = min(costs.values())
        for n in names:
            ratios[n].append(costs[n] / least if n in costs else np.inf)
    taus = np.logspace(0, np.log10(max_tau), 300)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, n in enumerate(names):
        r = np.asarray(ratios[n])
        ax.step(
            taus,
            [(r <= t).mean() for t in taus],
            where="post",
            label=n,
            lw=2.2 if "optsolve" in n else 1.3,
            ls="-" if i < 10 else "--",
        )
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("tau: within this factor of the best runner")
    ax.set_ylabel("fraction of problems solved")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6.5, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
