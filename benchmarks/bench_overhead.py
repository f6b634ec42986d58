"""The fixed cost of an eager ``solve`` call: eager against the same solve under ``jax.jit``.

Problems (float32, Adam(1e-3), ``maxiters=1``, so that the computation is small and the
call's own cost shows):

- an NNX MLP 64-64-10 (``nnx.Linear`` layers, the whole module as x0) on scikit-learn's
  digits (1797 samples), softmax cross-entropy;
- the same parameters as a plain dict of arrays (``nnx.state(model).to_pure_dict()``), with
  f merging them into the module: what the model's own pytree flattening costs;
- the same module with f the sum of its parameters' squares (no data): the call's own cost
  on the MLP's structure, with a computation too small to vary between calls;
- a 10-variable quadratic: the call's floor (validation, dispatch, reading the result).

Runners for each: ``solve(prob, Adam(1e-3), maxiters=1)`` called eagerly; the same call
inside ``jax.jit`` (one compiled program, compiled once: the computation itself, with
jit's own dispatch); and, for the MLP, a hand-written jitted optax step. The overhead is
eager minus jitted, per turn of the interleaved runs (the median and the quartiles of the
per-turn differences). The deterministic measure beside it: the Python function calls an
eager call makes (cProfile over 100 calls).

Goal (issue 37): the eager call's overhead on the NNX MLP at most 0.2 ms.

Run: ``python benchmarks/bench_overhead.py`` (``--profile``: the median time of each stage
of an eager call).
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from sklearn.datasets import load_digits
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))

import optsolve
from common import interleaved_times, machine_line, markdown_table

NOTES = (
    "The overhead is what an eager call adds to the compiled computation: validating the "
    "problem and the options (once per structure: a later plain call of that structure "
    "takes the recorded plan, solve_api/plans.py, and from its second call on the run the "
    "backend handed the plan: the compiled chunk with its first carry, dispatched from the "
    "inputs' leaves), the plan's key (one flatten of the problem), the compiled chunk's "
    "dispatch, the host reading the return code and the counts, and the Solution in "
    "Python's types (the model's structure is rebuilt while the chunk computes). An NNX "
    "module is a pytree whose flattening runs in Python (a few tens of microseconds per "
    "module, per flatten), so every flatten of the problem costs more on the MLP than on "
    "the same parameters as a dict of arrays, whose flattening is JAX's C++."
)


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, 64, rngs=rngs)
        self.out = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def main(repeats: int = 301) -> str:
    digits = load_digits()
    x = jnp.asarray(digits.data / 16.0, jnp.float32)
    y = jnp.asarray(digits.target)
    model = MLP(nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def loss(m, _p):
        return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    def loss_of_dict(params, p):
        filled = jax.tree_util.tree_map(lambda v: v, state)
        nnx.replace_by_pure_dict(filled, params)
        return loss(nnx.merge(graphdef, filled), p)

    def squares(m, _p):
        return sum(jnp.sum(v**2) for v in jax.tree_util.tree_leaves(nnx.state(m)))

    problems = {
        "NNX MLP (module as x0)": optsolve.OptimizationProblem(loss, model),
        "the same module, f without the data (sum of squares)": optsolve.OptimizationProblem(
            squares, MLP(nnx.Rngs(1))
        ),
        "the MLP's parameters as a dict of arrays": optsolve.OptimizationProblem(
            loss_of_dict, state.to_pure_dict()
        ),
        "10-variable quadratic": optsolve.OptimizationProblem(
            lambda v, p: jnp.sum((v - p) ** 2), jnp.zeros(10, jnp.float32), 1.0
        ),
    }
    algorithm = optsolve.Adam(1e-3)
    tx = optax.adam(1e-3)

    @jax.jit
    def hand_step(state):
        grads = jax.grad(lambda s: loss(nnx.merge(graphdef, s), None))(state)
        updates, _ = tx.update(grads, tx.init(state), state)
        return optax.apply_updates(state, updates)

    jitted_solve = jax.jit(lambda prob: optsolve.solve(prob, algorithm, maxiters=1))
    medians, spreads, calls = {}, {}, {}
    for name, prob in problems.items():
        # each problem's runners interleaved among themselves: a call that follows another
        # problem's multi-threaded matmul would pay for that one's threads winding down
        runners = {
            (name, "eager"): lambda prob=prob: optsolve.solve(prob, algorithm, maxiters=1),
            (name, "jitted"): lambda prob=prob: jitted_solve(prob),
        }
        if prob.x0 is model:
            runners[("hand", "step")] = lambda: hand_step(state)
        for fn in runners.values():  # compile, then one warm call
            jax.block_until_ready(fn())
            jax.block_until_ready(fn())
        times = interleaved_times(runners, repeats)
        medians.update({key: statistics.median(ts) for key, ts in times.items()})
        turns = [e - j for e, j in zip(times[(name, "eager")], times[(name, "jitted")])]
        spreads[name] = statistics.quantiles(turns, n=4)
        calls[name] = python_calls(runners[(name, "eager")])
    rows = []
    for name in problems:
        eager, jitted = medians[(name, "eager")], medians[(name, "jitted")]
        low, mid, high = spreads[name]
        rows.append(
            [
                name,
                f"{eager * 1e3:.3f}",
                f"{jitted * 1e3:.3f}",
                f"{mid * 1e3:.3f} [{low * 1e3:.3f}-{high * 1e3:.3f}]",
                f"{eager / jitted:.2f}x",
                f"{calls[name]:.0f}",
            ]
        )
    return "\n".join(
        [
            "### The fixed cost of an eager solve call: Adam, maxiters=1, float32",
            "",
            markdown_table(
                [
                    "problem",
                    "eager solve (ms)",
                    "the same solve under jax.jit (ms)",
                    "overhead: eager - jitted, per turn (ms): median [quartiles]",
                    "eager / jitted",
                    "Python calls per eager call",
                ],
                rows,
            ),
            "",
            f"A hand-written jitted optax step on the MLP: "
            f"{medians[('hand', 'step')] * 1e3:.3f} ms. Goal (issue 37): an overhead of at most "
            f"0.2 ms on the NNX MLP. Medians of {repeats} interleaved calls after warm-up; BLAS "
            "pinned to 1 thread.",
            "",
            "Where an eager call's time goes (``python benchmarks/bench_overhead.py --profile``, "
            "run after the table above: each stage timed by wrapping it, medians of 500 calls):",
            "",
            profile(),
        ]
    )


def python_calls(run, calls: int = 100) -> float:
    """The Python function calls one ``run()`` makes (cProfile's count, a mean over
    ``calls``): the deterministic measure of an eager call's own work."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        run()
    profiler.disable()
    return pstats.Stats(profiler).total_calls / calls


# Where an eager call's time goes: solve's stages, timed by wrapping them (private names of
# optsolve, read here only).
STAGES = {
    "optsolve.solve_api.solve": {
        "enter_stages": "the call's stages (options, checks, the "
        "model split; skipped where a plan stands for them)",
        "FlatInputs": "flattening the inputs once",
        "_eager": "the counts as Python ints",
        "leave_stages": "the Solution in the user's terms",
    },
    "optsolve.solve_api.plans": {"key": "the plan's key (leaf shapes and dtypes, keywords)"},
    "optsolve.backends.native.chunked": {
        "_template": "the first carry (cached; skipped where a plan holds the run)",
        "_first_chunk": "the compiled chunk's dispatch (within "
        "the layers; skipped where a plan holds the run)",
        "_PlannedRun.__call__": "the run a plan holds "
        "(the chunk's dispatch and the three stages below)",
        "_status": "waiting for the chunk, reading its summary",
        "_on_host": "the host's numbers into the Solution",
    },
    "optsolve.backends.native.prepared": {
        "SharingLeaves.unpack": "rebuilding the Solution (while the chunk computes)"
    },
}


def profile(calls: int = 500) -> str:
    """Median time of each stage of an eager solve (and of the whole call), per problem:
    each stage's time summed over one call (0 where the call skips it)."""
    import collections
    import importlib
    import time

    spent = collections.defaultdict(list)
    in_call = collections.defaultdict(float)
    for module_name, stages in STAGES.items():
        module = importlib.import_module(module_name)
        for attr, label in stages.items():
            owner, _, name = attr.rpartition(".")  # a module's function or a class's method
            owner = getattr(module, owner) if owner else module

            # the defaults bind this iteration's original and label, once
            def timed(*args, _inner=getattr(owner, name), _label=label, **kwargs):  # noqa: B008
                start = time.perf_counter()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    in_call[_label] += time.perf_counter() - start

            setattr(owner, name, timed)
    digits = load_digits()
    x = jnp.asarray(digits.data / 16.0, jnp.float32)
    y = jnp.asarray(digits.target)

    def loss(m, _p):
        return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()

    problems = {
        "NNX MLP": optsolve.OptimizationProblem(loss, MLP(nnx.Rngs(0))),
        "10-variable quadratic": optsolve.OptimizationProblem(
            lambda v, p: jnp.sum((v - p) ** 2), jnp.zeros(10, jnp.float32), 1.0
        ),
    }
    labels = [label for stages in STAGES.values() for label in stages.values()]
    columns = {}
    for name, prob in problems.items():
        for _ in range(20):
            optsolve.solve(prob, optsolve.Adam(1e-3), maxiters=1)
        spent.clear()
        totals = []
        for _ in range(calls):
            in_call.clear()
            start = time.perf_counter()
            optsolve.solve(prob, optsolve.Adam(1e-3), maxiters=1)
            totals.append(time.perf_counter() - start)
            for label in labels:
                spent[label].append(in_call[label])
        median = lambda ts: sorted(ts)[len(ts) // 2] * 1e3
        columns[name] = [median(spent[label]) for label in labels] + [median(totals)]
    rows = [
        [label] + [f"{columns[name][i]:.3f}" for name in problems]
        for i, label in enumerate(labels + ["the whole call"])
    ]
    return markdown_table(["stage of an eager solve (median ms)", *problems], rows)


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(machine_line())
        print(profile() if sys.argv[1:] == ["--profile"] else main())
