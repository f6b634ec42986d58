"""A constrained design problem: the tension/compression spring (Arora, 1989).

Minimise the weight (N + 2) D d^2 of a coil spring over the wire diameter d, the coil
diameter D and the number of active coils N, subject to four inequality constraints
(minimum deflection, shear stress, surge frequency, outer diameter) and bounds. The best
known optimum is f* = 0.012665 (Coello & Mezura-Montes 2002; Arora, *Introduction to
Optimum Design*, 1989). Solved by scipy's SLSQP, trust-constr and COBYQA through
``optsolve.Constraint``, with the Jacobians from JAX; writes ``constrained_design.png``.

Run: ``python examples/constrained_design.py [--small] [--out DIR]``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

import optsolve
from _common import pyplot, run_cli, save_figure
from optsolve import Constraint, OptimizationProblem, solve

jax.config.update("jax_enable_x64", True)

BEST_KNOWN = 0.012665


def weight(x, p):
    d, coil, n = x
    return (n + 2.0) * coil * d**2


def constraints_g(x, p):
    """The four constraints as g(x) <= 0."""
    d, coil, n = x
    return jnp.stack(
        [
            1.0 - coil**3 * n / (71785.0 * d**4),
            (4.0 * coil**2 - d * coil) / (12566.0 * (coil * d**3 - d**4))
            + 1.0 / (5108.0 * d**2)
            - 1.0,
            1.0 - 140.45 * d / (coil**2 * n),
            (d + coil) / 1.5 - 1.0,
        ]
    )


def main(small: bool = False, out: Path = Path(".")) -> dict:
    prob = OptimizationProblem(
        weight,
        jnp.array([0.05, 0.5, 10.0]),
        bounds=(jnp.array([0.05, 0.25, 2.0]), jnp.array([2.0, 1.3, 15.0])),
        constraints=[Constraint(constraints_g, upper=0.0)],
    )
    results = {}
    for method in ("SLSQP", "trust-constr", "COBYQA"):
        trace = []
        sol = solve(
            prob,
            optsolve.ScipyMinimize(method),
            maxiters=2000,
            callback=lambda i, x, f, trace=trace: trace.append(float(f)),
        )
        g = constraints_g(sol.x, None)
        results[method] = {
            "objective": float(sol.objective),
            "retcode": sol.retcode.name,
            "max_violation": float(jnp.max(jnp.maximum(g, 0.0))),
            "x": [float(v) for v in sol.x],
            "trace": trace,
        }
        print(
            f"{method:13s} {sol.retcode!s:20s} f={float(sol.objective):.6f} "
            f"(best known {BEST_KNOWN}) x={[round(float(v), 6) for v in sol.x]} "
            f"max violation {results[method]['max_violation']:.1e}"
        )

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for method, result in results.items():
        ax.plot(range(1, len(result["trace"]) + 1), result["trace"], label=method)
    ax.axhline(BEST_KNOWN, color="gray", ls="--", label=f"best known {BEST_KNOWN}")
    ax.set_yscale("log")
    ax.set(
        xlabel="iteration",
        ylabel="spring weight",
        title="Tension/compression spring design, 4 constraints + bounds",
    )
    ax.legend()
    path = save_figure(fig, out, "constrained_design.png")
    return {"results": results, "plot": path}


if __name__ == "__main__":
    run_cli(main, __doc__)
