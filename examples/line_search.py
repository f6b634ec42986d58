"""Line searches without wrappers: optax's backtracking and zoom line searches through solve.

In a hand-written loop, optax's line searches need ``value``, ``grad`` and ``value_fn`` passed
at every step (flax nnx users write a split/merge wrapper for it). ``solve`` supplies them
because it knows ``f``. This script checks that solve reproduces the loop from optax's
documentation exactly, then compares a fixed step, backtracking (Armijo), zoom (strong
Wolfe) and L-BFGS on the extended Rosenbrock function. Writes ``line_search.png``.

Run: ``python examples/line_search.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from _common import pyplot, run_cli, save_figure
from optsolve import OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)


def rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1::2] - x[::2] ** 2) ** 2 + (1.0 - x[::2]) ** 2)


def optax_documented_loop(tx, fn, x, steps):
    """The loop from optax's documentation for line searches."""
    value_and_grad = optax.value_and_grad_from_state(fn)
    state = tx.init(x)

    @jax.jit
    def step(x, state):
        value, grad = value_and_grad(x, state=state)
        updates, state = tx.update(grad, state, x, value=value, grad=grad, value_fn=fn)
        return optax.apply_updates(x, updates), state

    for _ in range(steps):
        x, state = step(x, state)
    return x


def main(small: bool = False, out: Path = Path(".")) -> dict:
    n = 10 if small else 100
    x0 = jnp.tile(jnp.array([-1.2, 1.0]), n // 2)
    prob = OptimizationProblem(rosenbrock, x0)
    zoom = optax.chain(optax.sgd(1.0), optax.scale_by_zoom_linesearch(max_linesearch_steps=30))
    by_hand = optax_documented_loop(zoom, lambda x: rosenbrock(x, None), x0, 50)
    through_solve = solve(prob, zoom, maxiters=50).x
    same = float(jnp.max(jnp.abs(by_hand - through_solve)))
    print(f"solve vs the documented optax loop, 50 zoom steps: max difference {same:.1e}")

    runs = {
        "sgd(1e-3), fixed step": optax.sgd(1e-3),
        "sgd + backtracking (Armijo)": optax.chain(
            optax.sgd(1.0), optax.scale_by_backtracking_linesearch(max_backtracking_steps=30)
        ),
        "sgd + zoom (strong Wolfe)": zoom,
        "lbfgs (zoom)": optax.lbfgs(),
    }
    results = {}
    maxiters = 2000 if small else 20000
    for name, tx in runs.items():
        sol = solve(prob, tx, maxiters=maxiters, gtol=1e-6, history=True)
        curve = np.asarray(sol.history.objective)
        results[name] = {
            "objective": float(sol.objective),
            "retcode": sol.retcode.name,
            "iterations": int(sol.stats.iterations),
            "f_evals": int(sol.stats.f_evals),
            "grad_evals": int(sol.stats.grad_evals),
            "curve": curve[np.isfinite(curve)],
        }
        print(
            f"{name:30s} {sol.retcode!s:20s} f={float(sol.objective):.2e} "
            f"iterations={int(sol.stats.iterations)} f_evals={int(sol.stats.f_evals)} "
            f"grad_evals={int(sol.stats.grad_evals)}"
        )

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, result in results.items():
        ax.loglog(
            np.arange(1, len(result["curve"]) + 1),
            np.maximum(result["curve"], 1e-20),
            label=f"{name} ({result['f_evals']} f evals)",
        )
    ax.set(
        xlabel="iteration",
        ylabel="objective",
        title=f"Extended Rosenbrock, n = {n}: line searches through solve, no wrapper",
    )
    ax.legend(fontsize=8)
    path = save_figure(fig, out, "line_search.png")
    return {"max_difference_to_documented_loop": same, "results": results, "plot": path}


if __name__ == "__main__":
    run_cli(main, __doc__)
