"""Quickstart: one problem, every family of optimizer.

Rosenbrock's function from the standard start (-1.2, 1) (minimum 0 at (1, 1)) is solved by
optax optimizers, a raw optax transformation, the JAX-native classical methods, scipy's local
methods and a scipy global method (within bounds), all through the same ``solve``. A callback
records the objective at every iteration; the plot shows each method's convergence.
Writes ``quickstart.png``.

Run: ``python examples/quickstart.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import optax

import optsolve
from _common import pyplot, run_cli, save_figure
from optsolve import OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)


def rosenbrock(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def algorithms(small: bool):
    long = 2000 if small else 20000
    tight = {"gtol": 1e-8}
    return {
        "optax: Adam(0.02)": (optsolve.Adam(0.02), {"maxiters": long, **tight}),
        "optax: optax.lbfgs() (raw)": (optax.lbfgs(), {"maxiters": 200, **tight}),
        "classical: GradientDescent": (optsolve.GradientDescent(), {"maxiters": long, **tight}),
        "classical: NonlinearCG": (optsolve.NonlinearCG(), tight),
        "classical: LBFGS": (optsolve.LBFGS(), tight),
        "classical: BFGS": (optsolve.BFGS(), tight),
        "classical: Newton": (optsolve.Newton(), tight),
        "classical: TrustRegion": (optsolve.TrustRegion(), tight),
        "scipy: Nelder-Mead (no gradient)": (
            optsolve.ScipyMinimize("Nelder-Mead"),
            {"ftol": 1e-12},
        ),
        "scipy: BFGS": (optsolve.ScipyMinimize("BFGS"), tight),
        "scipy: trust-exact": (optsolve.ScipyMinimize("trust-exact"), tight),
    }


def main(small: bool = False, out: Path = Path(".")) -> dict:
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]), p=100.0)
    results = {}
    print(f"{'method':30s} {'retcode':22s} {'objective':>10s} {'iters':>6s} {'f evals':>8s}")
    for name, (algorithm, options) in algorithms(small).items():
        trace = []
        sol = solve(
            prob, algorithm, callback=lambda i, x, f, trace=trace: trace.append(float(f)), **options
        )
        results[name] = {
            "objective": float(sol.objective),
            "retcode": sol.retcode.name,
            "trace": trace,
            "x": [float(v) for v in sol.x],
        }
        print(
            f"{name:30s} {sol.retcode!s:22s} {float(sol.objective):10.2e} "
            f"{int(sol.stats.iterations):6d} {int(sol.stats.f_evals):8d}"
        )
    bounded = prob.replace(bounds=(-2.0, 2.0))
    sol = solve(bounded, optsolve.ScipyGlobal("differential_evolution", seed=0))
    results["scipy global: differential_evolution"] = {
        "objective": float(sol.objective),
        "retcode": sol.retcode.name,
        "trace": [],
        "x": [float(v) for v in sol.x],
    }
    print(
        f"{'scipy global: differential_evolution':30s} {sol.retcode!s:22s} "
        f"{float(sol.objective):10.2e}"
    )

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 5))
    for name, result in results.items():
        trace = [max(v, 1e-20) for v in result["trace"]]
        if trace:
            style = {"optax": ":", "classical": "-", "scipy": "--"}[name.split(":")[0]]
            ax.loglog(range(1, len(trace) + 1), trace, style, label=name, lw=1.6)
    ax.set(
        xlabel="iteration",
        ylabel="objective",
        title="Rosenbrock from (-1.2, 1), one solve call each",
    )
    ax.legend(fontsize=7, ncol=2)
    path = save_figure(fig, out, "quickstart.png")
    return {"results": results, "plot": path}


if __name__ == "__main__":
    run_cli(main, __doc__)
