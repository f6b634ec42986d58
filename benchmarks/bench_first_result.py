"""Time to a first result: import, and import + first solve, each in a fresh process.

Problems, each with its peer:

- ``lbfgs``: the chained Rosenbrock function, n = 10, from (-1.2, 1, -1.2, 1, ...), float64,
  ``solve(OptimizationProblem(f, x0), LBFGS())`` against
  ``optx.minimise(f, optx.LBFGS(rtol=1e-9, atol=1e-9), x0, max_steps=1000)``;
- ``bfgs``: the same problem, ``BFGS()`` against ``optx.BFGS(rtol=1e-9, atol=1e-9)``;
- ``adam``: the MLP 64-32-10 (tanh) on scikit-learn's digits of ``bench_optax.py``, float32,
  ``ADAM_STEPS`` full-batch steps of Adam (learning rate 1e-3), ``solve(..., Adam(1e-3),
  maxiters=ADAM_STEPS)`` against a hand-written ``jax.jit`` of a ``lax.fori_loop`` of
  ``optax.adam`` updates (the peer: its import is ``import optax``). The digits are loaded
  before the clock starts, in every process alike. A second optax runner waits for the
  trained parameters before evaluating the loss, as ``solve`` returns a finished run: the
  plain one's steps still run while the loss's eager operations compile (JAX's dispatch is
  asynchronous).

Runners of each problem, each a new Python process that imports its library, builds the
problem and solves it twice (the second solve: a new problem object, the same function):
optsolve; optsolve with the cache on (``optsolve.enable_compilation_cache(dir)``, with a
directory that an unmeasured process of the same script filled first, a script's second
run; its deterministic measure is JAX's count of cache hits and misses in the process); and
the peer (optimistix where it is installed, the ``bench`` extra). Every process reads the
modules' compiled bytecode from one directory (``PYTHONPYCACHEPREFIX``), written by one
unmeasured run of each runner first, as an install writes it: an environment with
``PYTHONDONTWRITEBYTECODE`` set would otherwise make each process compile optsolve's source
again (about 0.2 s of its import), while the peers' installed bytecode is read.

The deterministic measure of each runner (without the cache): the fused kernels XLA
compiled for its first result, in the largest loop and in all its programs, counted in the
optimised programs that one more unmeasured process dumps (``--xla_dump_to``), as
``program_size.py`` counts them; compile time follows them.

The processes run in turns, in a new order each turn (seeded); each figure is the median
over the turns, with the smallest and largest in brackets; the ratio to the peer is taken
within each turn (both processes ran under the same load), then its median and min-max.

Goals (issue 37): import at most optimistix's; import + first solve at most optimistix's
(L-BFGS and BFGS), at most 1.1x the hand-written optax loop's (Adam); with the cache on,
the first solve at most 0.3 s.

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
    "import included, every module read from its compiled bytecode (written by one "
    "unmeasured run of each runner, as an install writes it); first solve is everything "
    "after it up to the first result (x64 on, "
    "the problem built, tracing, compilation, the run); second solve is the same call on "
    "a new problem object, the compiled program reused. With the cache on, the first "
    "solve still traces and lowers the program, then loads XLA's executable from disk "
    "instead of compiling it. The Adam runners train the same MLP from the same "
    "parameters: the last column is the loss each reached."
)

_CHILD = r"""
import json, sys, time
if PROBLEM == "adam":  # the data, before the clock starts
    from sklearn.datasets import load_digits
    import numpy as np
    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32)
    Y = np.eye(10, dtype=np.float32)[digits.target]
start = time.perf_counter()
if MODE == "optimistix":
    import optimistix as optx
elif MODE.startswith("optax"):
    import optax
else:
    import optsolve
imported = time.perf_counter()
import jax
import jax.numpy as jnp
if PROBLEM != "adam":
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

def mlp_loss(params, data):
    x, y = data
    h = jnp.tanh(x @ params[0]["w"] + params[0]["b"])
    logits = h @ params[1]["w"] + params[1]["b"]
    return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(logits), axis=-1))

def mlp_params():
    keys = jax.random.split(jax.random.key(0), 2)
    return [{"w": jax.random.normal(k, (i, o), jnp.float32) / jnp.sqrt(jnp.float32(i)),
             "b": jnp.zeros(o, jnp.float32)} for k, (i, o) in zip(keys, [(64, 32), (32, 10)])]

if MODE.startswith("optax"):
    opt = optax.adam(1e-3)

    @jax.jit
    def optax_train(params, data):
        def step(_, carry):
            params, state = carry
            grads = jax.grad(mlp_loss)(params, data)
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state
        return jax.lax.fori_loop(0, ADAM_STEPS, step, (params, opt.init(params)))[0]

def first_result():
    if PROBLEM == "adam":
        data, params = (jnp.asarray(X), jnp.asarray(Y)), mlp_params()
        if MODE.startswith("optax"):
            params = optax_train(params, data)
            if MODE == "optax-waited":  # as solve, which returns a finished run
                params = jax.block_until_ready(params)
        else:
            sol = optsolve.solve(optsolve.OptimizationProblem(mlp_loss, params, data),
                                 optsolve.Adam(1e-3), maxiters=ADAM_STEPS)
            params = sol.x
        return float(jax.block_until_ready(mlp_loss(params, data)))
    x0 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    if MODE == "optimistix":
        solver = (optx.LBFGS if PROBLEM == "lbfgs" else optx.BFGS)(rtol=1e-9, atol=1e-9)
        sol = optx.minimise(rosenbrock, solver, x0, max_steps=1000, throw=False)
        x = jax.block_until_ready(sol.value)
    else:
        alg = optsolve.LBFGS() if PROBLEM == "lbfgs" else optsolve.BFGS()
        sol = optsolve.solve(optsolve.OptimizationProblem(rosenbrock, x0), alg)
        assert sol.success, sol.message
        x = jax.block_until_ready(sol.x)
    assert float(jnp.max(jnp.abs(x - 1.0))) < 1e-6, x
    return 0.0

value = first_result()
solved = time.perf_counter()
first_result()
again = time.perf_counter()
print(json.dumps({"import": imported - start, "first": solved - imported,
                  "second": again - solved, "value": value,
                  "hits": hits["/jax/compilation_cache/cache_hits"],
                  "misses": hits["/jax/compilation_cache/cache_misses"]}))
"""

ADAM_STEPS = 500
PROBLEMS = {
    "lbfgs": ("optsolve.LBFGS", "optimistix.LBFGS"),
    "bfgs": ("optsolve.BFGS", "optimistix.BFGS"),
    "adam": ("optsolve.Adam", "optax.adam fori_loop"),
}


def run_child(
    problem: str, mode: str, cache: str | None, bytecode: str, dump: str | None = None
) -> dict:
    """One fresh process of ``mode`` on ``problem``: its timings (s) and cache events.
    ``bytecode``: the directory of Python's compiled modules (``PYTHONPYCACHEPREFIX``);
    ``dump``: a directory for XLA's optimised programs (not for a measured run)."""
    script = (
        f"PROBLEM = {problem!r}\nMODE = {mode!r}\nCACHE = {cache!r}\n"
        f"ADAM_STEPS = {ADAM_STEPS}\n" + _CHILD
    )
    # a cache the user set up for JAX would turn the no-cache runners into cached ones
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.pop("JAX_ENABLE_X64", None)
    # Every library's modules imported from their compiled bytecode, as after an install
    # (pip writes it; an editable install on first import). A PYTHONDONTWRITEBYTECODE
    # environment would make every process compile optsolve's source again, while the
    # peers' installed bytecode is read.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = bytecode
    if dump is not None:
        env["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    if out.returncode:
        raise RuntimeError(f"{problem} / {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compiled_kernels(problem: str, mode: str, bytecode: str) -> tuple[int, int] | None:
    """The deterministic measure of a first result: the fused kernels XLA compiled for it
    in one process, (in the largest loop, in all its programs), counted as
    ``program_size.py`` counts them; None without that benchmark's dependencies."""
    try:
        from program_size import loop_kernels
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as dump:
        run_child(problem, mode, None, bytecode, dump)
        counts = [
            loop_kernels(path.read_text())
            for path in Path(dump).glob("*cpu_after_optimizations.txt")
        ]
    return max(loop for loop, _ in counts), sum(total for _, total in counts)


def _spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    med, lo, hi = (scale * v for v in (statistics.median(values), min(values), max(values)))
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def _peer(problem: str) -> str | None:
    if problem == "adam":
        return "optax"
    return "optimistix" if importlib.util.find_spec("optimistix") is not None else None


def measure(turns: int) -> tuple[dict[tuple[str, str], list[dict]], dict]:
    """Every (problem, runner)'s results, ``turns`` fresh processes each, in shuffled turns,
    and the kernels each runner without the cache compiles (:func:`compiled_kernels`)."""
    runs = [
        (problem, mode)
        for problem in PROBLEMS
        for mode in ("optsolve", "optsolve-cache", _peer(problem))
        if mode is not None
    ]
    runs.append(("adam", "optax-waited"))
    results: dict[tuple[str, str], list[dict]] = {r: [] for r in runs}
    kernels = {}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as bytecode:
        # one unmeasured run of each: it writes every module's bytecode, and the cached
        # runners' first run fills the compilation cache
        for problem, mode in runs:
            run_child(problem, mode, cache, bytecode)
        for problem, mode in runs:  # another unmeasured one, dumping XLA's programs
            if mode not in ("optsolve-cache", "optax-waited"):  # the same programs
                kernels[problem, mode] = compiled_kernels(problem, mode, bytecode)
        order = list(runs)
        shuffle = random.Random(0).shuffle
        for _ in range(turns):
            shuffle(order)
            for problem, mode in order:
                results[problem, mode].append(run_child(problem, mode, cache, bytecode))
    return results, kernels


def main(turns: int = 5) -> str:
    from common import machine_line, markdown_table

    results, kernels = measure(turns)
    rows = []
    for (problem, mode), runs in results.items():
        ours, peer_name = PROBLEMS[problem]
        name = {
            "optsolve": ours,
            "optsolve-cache": f"{ours}, cache on",
            "optax-waited": f"{peer_name}, waited for before the loss",
        }.get(mode, peer_name)
        total = [r["import"] + r["first"] for r in runs]
        peer = results.get((problem, _peer(problem)))
        ratio = spread = "-"
        if peer is not None and mode.startswith("optsolve"):
            # per turn: both processes of a turn ran under the same load
            ratios = [t / (p["import"] + p["first"]) for t, p in zip(total, peer)]
            ratio = f"{statistics.median(ratios):.2f}x"
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        cache = (
            f"{statistics.median(r['hits'] for r in runs):.0f} / "
            f"{statistics.median(r['misses'] for r in runs):.0f}"
            if mode == "optsolve-cache"
            else "-"
        )
        loss = f"{statistics.median(r['value'] for r in runs):.6f}" if problem == "adam" else "-"
        counted = kernels.get((problem, mode))
        compiled = "-" if counted is None else f"{counted[0]} / {counted[1]}"
        rows.append(
            [
                name,
                _spread([r["import"] for r in runs]),
                _spread([r["first"] for r in runs]),
                _spread(total),
                _spread([r["second"] for r in runs], 1e3, 1),
                ratio,
                spread,
                compiled,
                cache,
                loss,
            ]
        )
    waited = _against(results, "optax-waited")
    table = markdown_table(
        [
            "runner",
            "import (s)",
            "first solve (s)",
            "import + first (s)",
            "second solve (ms)",
            "import + first / peer",
            "that ratio: min-max over turns",
            "fused kernels compiled: loop / all",
            "cache hits / misses",
            "final loss (Adam)",
        ],
        rows,
    )
    return "\n\n".join(
        [
            "### Import and first result",
            f"Chained Rosenbrock n = 10, float64, L-BFGS and BFGS; the digits MLP 64-32-10, "
            f"float32, {ADAM_STEPS} full-batch Adam steps; each runner in {turns} fresh "
            f"processes, run in shuffled turns: median [min-max]. {machine_line()}.",
            table,
            waited,
        ]
    )


def _against(results: dict, mode: str) -> str:
    """optsolve.Adam's import + first against the optax loop's waited for before its loss
    is evaluated (the loss's eager operations compile while the plain loop still runs)."""
    ours, waited = results.get(("adam", "optsolve")), results.get(("adam", mode))
    if not ours or not waited:
        return ""
    ratios = [(a["import"] + a["first"]) / (b["import"] + b["first"]) for a, b in zip(ours, waited)]
    return (
        f"optsolve.Adam against the optax loop waited for before its loss: "
        f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] "
        f"(import + first, per turn). A JAX call returns before its computation ends, so "
        f"the plain loop's {ADAM_STEPS} steps still run while the loss's eager operations "
        "compile; solve returns a finished run (its return code read on the host)."
    )


if __name__ == "__main__":
    started = time.perf_counter()
    print(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
    print(f"\n({time.perf_counter() - started:.0f} s)")
