"""Many small problems at once: ``jax.vmap(solve)`` against a Python loop of jitted solves
and against optimistix's vmap (issue 18).

Problem sets (float64, 1000 problems each):

- chained Rosenbrock, n = 10, from the standard start (-1.2, 1, ...), with its coefficient
  varied per problem (p drawn uniformly from [50, 150]);
- L2-regularised logistic regression, 30 features and 200 samples per problem, each with its
  own data and its own penalty (10^-3 to 10^-1), from w = 0.

Runners (each one ``jax.jit``-compiled function):

- optsolve.LBFGS and optsolve.BFGS: ``jax.vmap`` of ``solve(prob.replace(p=p), alg,
  gtol=1e-6, maxiters=1000)``; and the same solve, jitted once, called for one problem
  at a time in a Python loop (the loop is what vmap replaces);
- optsolve.LBFGS under ``jax.lax.map``: one compiled loop over the problems, one at a time;
- optimistix.LBFGS and optimistix.BFGS (rtol = atol = 1e-9, max_steps 1000), vmapped.

Per runner: compile + first call, the steady median, how many problems end with a gradient
inf-norm at most 1e-5 (recomputed at the returned points), the iterations (mean and max over
the problems: a vmapped loop runs as many as the slowest problem), and ratios: the loop over vmap,
and vmap over optimistix's vmap of the same method (like with like).

Goals (issue 18): vmap at least 50x faster than the loop, and at most 1.0x optimistix's vmap.

Run: ``python benchmarks/bench_vmap.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import optimistix as optx  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import block, interleaved_medians, machine_line, markdown_table  # noqa: E402

BATCH, GTOL, MAXITER, CONVERGED = 1000, 1e-6, 1000, 1e-5

NOTES = (
    "Under vmap, a while loop runs until every problem of the batch has stopped, and each "
    "iteration advances all of them (finished ones masked): the batch takes as many "
    "iterations as its slowest problem, and each batched iteration costs the fixed work of "
    "its kernels over the whole batch. The Python loop pays one dispatch and one "
    "synchronisation per problem instead."
)


def rosenbrock(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def logistic(w, p):
    features, labels, penalty = p
    margins = labels * (features @ w)
    return jnp.mean(jnp.logaddexp(0.0, -margins)) + 0.5 * penalty * jnp.dot(w, w)


def problem_sets():
    rng = np.random.default_rng(0)
    coefficients = jnp.asarray(rng.uniform(50.0, 150.0, BATCH))
    start = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    features = rng.standard_normal((BATCH, 200, 30))
    truth = rng.standard_normal((BATCH, 30))
    noise = 0.5 * rng.standard_normal((BATCH, 200))
    labels = np.sign(np.einsum("bsf,bf->bs", features, truth) + noise)
    penalties = 10.0 ** rng.uniform(-3.0, -1.0, BATCH)
    data = (jnp.asarray(features), jnp.asarray(labels), jnp.asarray(penalties))
    return {
        "chained Rosenbrock n = 10, varied coefficient": (rosenbrock, start, coefficients),
        "logistic regression, 30 features, 200 samples": (logistic, jnp.zeros(30), data),
    }


def _optsolve(f, x0, p0, algorithm):
    prob = optsolve.OptimizationProblem(f, x0, p0)

    def one(p):
        sol = optsolve.solve(prob.replace(p=p), algorithm, gtol=GTOL, maxiters=MAXITER)
        return sol.x, sol.stats.iterations, sol.stats.grad_evals

    return one


def _optimistix(f, x0, solver):
    def one(p):
        sol = optx.minimise(f, solver, x0, args=p, max_steps=MAXITER, throw=False)
        return sol.value, sol.stats["num_steps"], sol.stats["num_steps"]

    return one


def measure(f, x0, ps, repeats: int) -> tuple[list[list[str]], str]:
    tol = 1e-9
    p0 = jax.tree_util.tree_map(lambda a: a[0], ps)
    singles = {
        "optsolve.LBFGS": _optsolve(f, x0, p0, optsolve.LBFGS()),
        "optsolve.BFGS": _optsolve(f, x0, p0, optsolve.BFGS()),
        "optimistix.LBFGS": _optimistix(f, x0, optx.LBFGS(rtol=tol, atol=tol)),
        "optimistix.BFGS": _optimistix(f, x0, optx.BFGS(rtol=tol, atol=tol)),
    }
    batched = {who: jax.jit(jax.vmap(one)) for who, one in singles.items()}
    runners = {f"{who}: vmap": (lambda fn=fn: fn(ps)) for who, fn in batched.items()}
    problems = [jax.tree_util.tree_map(lambda a, i=i: a[i], ps) for i in range(BATCH)]
    for who in ("optsolve.LBFGS", "optsolve.BFGS"):
        jitted = jax.jit(singles[who])
        runners[f"{who}: Python loop of jitted solves"] = lambda fn=jitted: [
            fn(p) for p in problems
        ]
    # one compiled loop over the problems, one at a time: no dispatch per problem, and each
    # problem's data stays in cache through its iterations
    mapped = jax.jit(lambda ps: jax.lax.map(singles["optsolve.LBFGS"], ps))
    runners["optsolve.LBFGS: lax.map (one compiled loop over the problems)"] = lambda: mapped(ps)
    first, results = {}, {}
    for runner, fn in runners.items():
        start = time.perf_counter()
        results[runner] = block(fn())
        first[runner] = time.perf_counter() - start
    medians = interleaved_medians(runners, repeats)
    gradient = jax.jit(jax.vmap(jax.grad(f)))
    rows = []
    for runner in runners:
        out = results[runner]
        x, iterations, _ = (
            [jnp.stack(parts) for parts in zip(*out)] if isinstance(out, list) else out
        )
        converged = int(jnp.sum(jnp.max(jnp.abs(gradient(x, ps)), axis=1) <= CONVERGED))
        who, how = runner.split(": ")
        loop = f"{who}: Python loop of jitted solves"
        speedup = (
            f"{medians[loop] / medians[runner]:.1f}x" if loop in medians and runner != loop else ""
        )
        peer = f"optimistix.{who.split('.')[1]}: vmap"
        over_peer = (
            f"{medians[runner] / medians[peer]:.2f}x"
            if how == "vmap" and who.startswith("optsolve")
            else ""
        )
        rows.append(
            [
                runner,
                f"{medians[runner] * 1e3:.1f}",
                f"{first[runner]:.2f}",
                f"{converged}/{BATCH}",
                f"{float(jnp.mean(iterations)):.0f} / {int(jnp.max(iterations))}",
                speedup,
                over_peer,
            ]
        )
    # what one batched evaluation costs: the floor of each batched iteration
    # at one point per problem (a shared point would make the products one large matmul)
    evaluate = jax.jit(jax.vmap(jax.value_and_grad(f)))
    points = jnp.broadcast_to(x0, (BATCH,) + x0.shape) + 0.0
    block(evaluate(points, ps))
    one = interleaved_medians({"evaluation": lambda: evaluate(points, ps)}, 21)["evaluation"]
    evals = int(jnp.max(results["optsolve.LBFGS: vmap"][2]))
    vmapped = medians["optsolve.LBFGS: vmap"]
    iterations = int(jnp.max(results["optsolve.LBFGS: vmap"][1]))
    note = (
        f"One batched evaluation of f and its gradient over the {BATCH} problems (one "
        f"point each): {one * 1e3:.2f} ms. The vmapped optsolve.LBFGS run makes at least "
        f"{evals} (its slowest problem's gradient evaluations; more where a line search's "
        "trial runs for the whole batch because some problems need it): at least "
        f"{evals * one * 1e3:.0f} ms of its {vmapped * 1e3:.0f} ms, which leaves at most "
        f"{(vmapped - evals * one) / iterations * 1e3:.2f} ms for each of its {iterations} "
        "batched iterations' own work."
    )
    return rows, note


def main(repeats: int = 5) -> str:
    sections = []
    for name, (f, x0, ps) in problem_sets().items():
        rows, note = measure(f, x0, ps, repeats)
        sections += [
            f"#### {name}",
            "",
            markdown_table(
                [
                    "runner",
                    "steady median (ms)",
                    "compile + first (s)",
                    f"gradient inf-norm <= {CONVERGED:g}",
                    "iterations: mean / max",
                    "the loop's time / this time",
                    "ratio over optimistix's vmap (same method)",
                ],
                rows,
            ),
            "",
            note,
            "",
        ]
    return "\n".join(
        [
            f"### {BATCH} small problems at once: jax.vmap(solve), float64",
            "",
            *sections,
            f"Medians of {repeats} interleaved runs after the first; BLAS pinned to 1 thread. "
            "Goals (issue 18): vmap at least 50x faster than the loop, and at most 1.0x "
            "optimistix's vmap.",
        ]
    )


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(machine_line())
        print(main())
