"""Time to a first result: import, and import + first solve, each in a fresh process.

Problem: the chained Rosenbrock function, n = 10, from (-1.2, 1, -1.2, 1, ...), float64.
Runners, each a new Python process that imports its library, enables x64, builds the
problem and solves it twice (the second solve: a new problem object, the same function):

- optsolve: ``solve(OptimizationProblem(f, x0), LBFGS())`` (gtol 1e-8);
- optsolve, cache on: the same after ``optsolve.enable_compilation_cache(dir)``, with a
  directory that an unmeasured process of the same script filled first (a script's second
  run); its deterministic measure is JAX's count of cache hits and misses in the process;
- optimistix: ``optx.minimise(f, optx.LBFGS(rtol=1e-9, atol=1e-9), x0, max_steps=1000)``,
  where optimistix is installed (the ``bench`` extra).

The processes run in turns, in a new order each turn (seeded); each figure is the median
over the turns, with the smallest and largest in brackets.

Goals (issue 37): import at most optimistix's; import + first solve at most optimistix's;
with the cache on, the first solve at most 0.3 s.

Run: ``python benchmarks/bench_first_result.py [turns]``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

NOTES = (
    "Import is `import optsolve` (or `import optimistix`) in a bare interpreter, jax's own "
    "import included; first solve is everything after it up to the first result (x64 on, "
    "the problem built, tracing, compilation, the run); second solve is the same call on "
    "a new problem object, the compiled program reused. With the cache on, the first "
    "solve still traces and lowers the program, then loads XLA's executable from disk "
    "instead of compiling it.")

_CHILD = r"""
import json, sys, time
start = time.perf_counter()
if MODE == "optimistix":
    import optimistix as optx
else:
    import optsolve
imported = time.perf_counter()
import jax
import jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
hits = {"/jax/compilation_cache/cache_hits": 0, "/jax/compilation_cache/cache_misses": 0}
if MODE == "optsolve-cache":
    optsolve.enable_compilation_cache(CACHE)
    def count(event, **kwargs):
        if event in hits:
            hits[event] += 1
    jax.monitoring.register_event_listener(count)

def rosenbrock(x, p=None):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

def first_result():
    x0 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    if MODE == "optimistix":
        solver = optx.LBFGS(rtol=1e-9, atol=1e-9)
        sol = optx.minimise(rosenbrock, solver, x0, max_steps=1000, throw=False)
        return jax.block_until_ready(sol.value)
    sol = optsolve.solve(optsolve.OptimizationProblem(rosenbrock, x0), optsolve.LBFGS())
    assert sol.success, sol.message
    return jax.block_until_ready(sol.x)

x = first_result()
solved = time.perf_counter()
first_result()
again = time.perf_counter()
assert float(jnp.max(jnp.abs(x - 1.0))) < 1e-6, x
print(json.dumps({"import": imported - start, "first": solved - imported,
                  "second": again - solved, "hits": hits["/jax/compilation_cache/cache_hits"],
                  "misses": hits["/jax/compilation_cache/cache_misses"]}))
"""


def run_child(mode: str, cache: str | None) -> dict:
    """One fresh process of ``mode``: its timings (s) and cache events."""
    script = f"MODE = {mode!r}\nCACHE = {cache!r}\n" + _CHILD
    # a cache the user set up for JAX would turn the no-cache runners into cached ones
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("JAX_ENABLE_X64", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=False, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    med, lo, hi = (scale * v for v in (statistics.median(values), min(values), max(values)))
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def measure(turns: int) -> dict[str, list[dict]]:
    """Every runner's results, ``turns`` fresh processes each, run in shuffled turns."""
    modes = ["optsolve", "optsolve-cache"]
    if importlib.util.find_spec("optimistix") is not None:
        modes.append("optimistix")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as cache:
        run_child("optsolve-cache", cache)  # the script's first run: it fills the cache
        order = list(modes)
        shuffle = random.Random(0).shuffle
        for _ in range(turns):
            shuffle(order)
            for mode in order:
                results[mode].append(run_child(mode, cache))
    return results


def main(turns: int = 5) -> str:
    from common import machine_line, markdown_table

    results = measure(turns)
    names = {"optsolve": "optsolve.LBFGS", "optsolve-cache": "optsolve.LBFGS, cache on",
             "optimistix": "optimistix.LBFGS"}
    peer = results.get("optimistix")
    rows = []
    for mode, runs in results.items():
        total = [r["import"] + r["first"] for r in runs]
        ratio = "-"
        if peer is not None and mode != "optimistix":
            # per turn: both processes of a turn ran under the same load
            ratios = [t / (p["import"] + p["first"]) for t, p in zip(total, peer)]
            ratio = f"{statistics.median(ratios):.2f}x"
        cache = (f"{statistics.median(r['hits'] for r in runs):.0f} / "
                 f"{statistics.median(r['misses'] for r in runs):.0f}"
                 if mode == "optsolve-cache" else "-")
        rows.append([names[mode], _spread([r["import"] for r in runs]),
                     _spread([r["first"] for r in runs]), _spread(total),
                     _spread([r["second"] for r in runs], 1e3, 1), ratio, cache])
    table = markdown_table(
        ["runner", "import (s)", "first solve (s)", "import + first (s)", "second solve (ms)",
         "import + first / optimistix", "cache hits / misses"], rows)
    return "\n\n".join([
        "### Import and first result",
        f"Chained Rosenbrock n = 10, float64, L-BFGS; each runner in {turns} fresh processes, "
        f"run in shuffled turns: median [min-max]. {machine_line()}.",
        table])


if __name__ == "__main__":
    started = time.perf_counter()
    print(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
    print(f"\n({time.perf_counter() - started:.0f} s)")
