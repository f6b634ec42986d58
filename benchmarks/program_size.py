"""The size of each runner's compiled loop: what compile time grows with (issue 18).

Problem: chained Rosenbrock, n = 10, float64, ``gtol=1e-6, maxiters=1000`` (optimistix:
rtol = atol = 1e-9), each runner one ``jax.jit``-compiled function of x0 (as in the census).
Per runner: its jaxpr's equations (counted into every sub-jaxpr), the fused kernels, while
loops and conditionals of XLA's optimised HLO, and the time to lower and to compile; for
optsolve's runners, the equations by source module.

Run: ``python benchmarks/program_size.py``.
"""

from __future__ import annotations

import collections
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import optimistix as optx  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import machine_line, markdown_table, optax_lbfgs_loop  # noqa: E402


def rosenbrock(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def runners() -> dict:
    prob = optsolve.OptimizationProblem(rosenbrock, jnp.zeros(10), 100.0)

    def with_optsolve(alg):
        return lambda x: optsolve.solve(prob.replace(x0=x), alg, gtol=1e-6, maxiters=1000).x

    def with_optimistix(solver):
        return lambda x: optx.minimise(rosenbrock, solver, x, args=100.0, max_steps=1000,
                                       throw=False).value

    return {
        "optsolve.LBFGS": with_optsolve(optsolve.LBFGS()),
        "optsolve.BFGS": with_optsolve(optsolve.BFGS()),
        "optimistix.LBFGS": with_optimistix(optx.LBFGS(rtol=1e-9, atol=1e-9)),
        "optimistix.BFGS": with_optimistix(optx.BFGS(rtol=1e-9, atol=1e-9)),
        "optax.lbfgs": lambda x: optax_lbfgs_loop(lambda y: rosenbrock(y, 100.0), x, 1e-6,
                                                  1000)[0],
    }


def _equations(jaxpr, counts: collections.Counter) -> int:
    """Equations of ``jaxpr`` and its sub-jaxprs; ``counts`` gets them by optsolve module."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        frames = [] if eqn.source_info.traceback is None else [
            f.file_name for f in eqn.source_info.traceback.frames
            if "optsolve" in f.file_name and "site-packages" not in f.file_name]
        counts[frames[0].split("src/optsolve/")[-1] if frames else "(jax, optax, user f)"] += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    total += _equations(inner, counts)
    return total


def main() -> str:
    x0 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    rows, modules = [], {}
    for name, fn in runners().items():
        counts = collections.Counter()
        equations = _equations(jax.make_jaxpr(fn)(x0).jaxpr, counts)
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(x0)
        lowering = time.perf_counter() - start
        start = time.perf_counter()
        text = lowered.compile().as_text()
        compiling = time.perf_counter() - start
        fusions = len(re.findall(r"^\s*(?:ROOT )?\S+ = \S+ fusion\(", text, re.M))
        rows.append([name, str(equations), str(fusions), str(text.count(" while(")),
                     str(text.count(" conditional(")), f"{lowering:.2f}", f"{compiling:.2f}"])
        if name.startswith("optsolve"):
            modules[name] = counts
    lines = [
        "### The size of the compiled loop: chained Rosenbrock n = 10, float64", "",
        markdown_table(["runner", "jaxpr equations", "fused kernels", "while loops",
                        "conditionals", "lower, after tracing (s)", "compile (s)"], rows), ""]
    for name, counts in modules.items():
        top = ", ".join(f"{module} {n}" for module, n in counts.most_common(6))
        lines.append(f"{name}'s equations by module: {top}.")
    return "\n".join(lines)


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(machine_line())
        print(main())
