"""What a model's number of parameter arrays costs an Adam solve, beside a hand-written optax
loop (issue 37: the driver's work per step and per program grows with the leaves).

Problem: a tanh MLP of ``L`` layers 16 -> 16 (2 L parameter arrays: 4, 20, 60), batch of 64
random inputs, mean square of the output, float32, 100 Adam steps (learning rate 1e-3).

Runners for each size: a hand-written ``jax.jit`` of ``lax.fori_loop`` over optax.adam
steps; ``solve(prob, Adam(1e-3), maxiters=100)`` under ``jax.jit``; the same call eager.

Deterministic measures, from XLA's optimised HLO (``.compile().as_text()``): the fused
kernels of the jitted program and its copies (a copy is a kernel of its own, in the loop
one per step). Wall clock: the compile time of each jitted program (median of 3
compilations, JAX's caches cleared before each) and the steady run (median of 31
interleaved calls after warm-up).

Run: ``python benchmarks/bench_model_leaves.py`` (``python benchmarks/run.py
model_leaves``).
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))

import optsolve
from common import block, interleaved_times, machine_line, markdown_table

STEPS = 100
LAYERS = (2, 10, 30)

NOTES = (
    "Per step the solve's loop does what the hand-written loop does (the gradient and "
    "Adam's update, one kernel per parameter array for each of its moments and the "
    "iterate) and, for the guarantees of DEVELOPERS.md (FAILURE at the last finite "
    "iterate), a finiteness test of the gradient: one reduction per parameter array, so its "
    "kernels, and the compile time they take, grow with the arrays. An eager run keeps no "
    "previous iterate (the host runs a failed chunk again up to its last good iterate); a "
    "jitted run, which has no host to do so, keeps it: one copy of every parameter array "
    "per step and a select of each at the end."
)


def _problem(layers: int):
    keys = jax.random.split(jax.random.key(0), layers)
    params = [{"w": jax.random.normal(k, (16, 16)) / 4, "b": jnp.zeros(16)} for k in keys]
    inputs = jax.random.normal(jax.random.key(1), (64, 16))

    def loss(params, inputs):
        h = inputs
        for layer in params:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        return jnp.mean(h**2)

    return loss, params, inputs


def _kernels(compiled) -> tuple[int, int]:
    text = compiled.as_text()
    return text.count(" fusion("), len(re.findall(r"= \S+ copy\(", text))


def _compile_seconds(lower) -> float:
    times = []
    for _ in range(3):
        jax.clear_caches()
        lowered = lower()
        start = time.perf_counter()
        lowered.compile()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(layers: int) -> dict:
    loss, params, inputs = _problem(layers)
    tx = optax.adam(1e-3)

    def hand_written(params, inputs):
        def step(_, carry):
            params, state = carry
            updates, state = tx.update(jax.grad(loss)(params, inputs), state, params)
            return optax.apply_updates(params, updates), state

        return jax.lax.fori_loop(0, STEPS, step, (params, tx.init(params)))[0]

    prob = optsolve.OptimizationProblem(loss, params, inputs)
    algorithm = optsolve.Adam(1e-3)
    hand = jax.jit(hand_written)
    jitted = jax.jit(lambda pr: optsolve.solve(pr, algorithm, maxiters=STEPS).x)
    row = {
        "leaves": 2 * layers,
        "hand kernels": _kernels(hand.lower(params, inputs).compile()),
        "jitted kernels": _kernels(jitted.lower(prob).compile()),
        "hand compile": _compile_seconds(lambda: hand.lower(params, inputs)),
        "jitted compile": _compile_seconds(lambda: jitted.lower(prob)),
    }
    runners = {
        "hand": lambda: hand(params, inputs),
        "jitted": lambda: jitted(prob),
        "eager": lambda: optsolve.solve(prob, algorithm, maxiters=STEPS).x,
    }
    for run in runners.values():
        block(run())
        block(run())
    times = interleaved_times(runners, 31)
    row.update({name: statistics.median(ts) for name, ts in times.items()})
    return row


def main() -> str:
    rows = []
    with threadpool_limits(1):
        for layers in LAYERS:
            r = measure(layers)
            rows.append(
                [
                    str(r["leaves"]),
                    f"{r['hand kernels'][0]} / {r['hand kernels'][1]}",
                    f"{r['jitted kernels'][0]} / {r['jitted kernels'][1]}",
                    f"{r['hand compile']:.2f}",
                    f"{r['jitted compile']:.2f}",
                    f"{r['jitted compile'] / r['hand compile']:.2f}x",
                    f"{r['hand'] * 1e3:.2f}",
                    f"{r['jitted'] * 1e3:.2f}",
                    f"{r['jitted'] / r['hand']:.2f}x",
                    f"{r['eager'] * 1e3:.2f}",
                    f"{r['eager'] / r['hand']:.2f}x",
                ]
            )
    return "\n".join(
        [
            f"### Adam on models of more parameter arrays: {STEPS} steps, float32",
            "",
            f"Command: `python benchmarks/run.py model_leaves`. {machine_line()}.",
            "",
            markdown_table(
                [
                    "parameter arrays",
                    "hand-written loop: fused kernels / copies",
                    "jitted solve: fused kernels / copies",
                    "hand-written compile (s)",
                    "jitted solve compile (s)",
                    "compile ratio",
                    "hand-written steady (ms)",
                    "jitted solve steady (ms)",
                    "jitted / hand",
                    "eager solve steady (ms)",
                    "eager / hand",
                ],
                rows,
            ),
            "",
            "Compile: median of 3 compilations; steady: median of 31 interleaved calls after "
            "warm-up; BLAS pinned to 1 thread.",
        ]
    )


if __name__ == "__main__":
    print(main() + "\n\n" + NOTES)
