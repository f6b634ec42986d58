"""Many small constrained problems at once: ``jax.vmap`` of optsolve.InteriorPoint against a
Python loop of jitted solves and against loops of scipy's SLSQP (issue 39).

The problems (float64): HS071,

    min x1 x4 (x1 + x2 + x3) + x3   s.t.   x1 x2 x3 x4 >= b,   sum x_i^2 = s,   1 <= x <= 5,

from x0 = (1, 5, 5, 1), with p = (b, s) varied per problem: b = 25 (1 + 0.2 u),
s = 40 (1 + 0.2 v), u and v uniform on [-1, 1] from a fixed seed (1000 problems; 100 with
``--quick``). p = (25, 40) is HS071 itself (f* = 17.0140173), solved first as a check.

Runners (each with a 1000-iteration budget and otherwise its own default tolerances):

- optsolve.InteriorPoint, ``jax.jit(jax.vmap(solve_one))`` over all the p at once;
- the same ``solve_one`` jitted once and called for one problem at a time in a Python loop,
  ``block_until_ready`` after each (the loop that vmap replaces);
- a loop of ``scipy.optimize.minimize(method="SLSQP")`` fed jitted objective, gradient,
  constraints and their Jacobians (each jitted once, p an argument), as
  ``bench_constrained.py`` feeds scipy;
- a loop of ``optsolve.solve(prob, optsolve.ScipyMinimize("SLSQP"))``, timed on the first
  ``SUBSET`` problems only (its per-problem time extrapolated: about 20 ms a problem would
  make 1000 of them 20 s a turn).

Timing: compile + first call of each runner apart; then ``REPEATS`` turns in which every
runner runs its whole set once, in a new (seeded) order each turn. Steady: the median over
the turns, with the min-max; per problem: the turn's time over the problems it covers.
Ratios are taken within each turn (a runner's per-problem time over vmap's in the same
turn), then their median and min-max over the turns.

Checks (deterministic, whatever the load): vmap and loop agree on every x to 1e-6 (and on
the return code); SUCCESS counts; each run's objective and largest violation (absolute:
b - x1x2x3x4, |sum x^2 - s|, and the bounds) recomputed at its point. A run is *feasible*
when its violation is <= 1e-6, *solved* when feasible and its objective is within
1e-6 (1 + |f*|) of f*, the lowest feasible objective any runner reached on that problem;
a *false SUCCESS* claims success at a point not solved.

Goals (issue 39): vmap at least 20x faster than the loop of jitted solves, and more than
100x faster than the loop of scipy SLSQP.

Run: ``python benchmarks/bench_constrained_vmap.py [--quick]`` or
``python benchmarks/run.py constrained_vmap``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import scipy.optimize as so  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import block, interleaved_times, machine_line, markdown_table  # noqa: E402

BATCH, QUICK_BATCH = 1000, 100
SUBSET, QUICK_SUBSET = 100, 20  # problems timed for the optsolve ScipyMinimize loop
REPEATS, QUICK_REPEATS = 7, 3
MAXITER = 1000
X_TOL, FEAS_TOL, F_TOL = 1e-6, 1e-6, 1e-6
X0 = np.array([1.0, 5.0, 5.0, 1.0])
LOWER, UPPER = 1.0, 5.0
HS071_F = 17.0140173

VMAP = "optsolve.InteriorPoint: jax.vmap"
LOOP = "optsolve.InteriorPoint: Python loop of jitted solves"
SCIPY = "scipy SLSQP loop (jitted derivatives)"
SCIPY_OPTSOLVE = 'optsolve ScipyMinimize("SLSQP") loop'


def objective(x, p):
    return x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2]


def product(x, p):
    """x1 x2 x3 x4 - b >= 0."""
    return jnp.prod(x) - p[0]


def squares(x, p):
    """sum x^2 - s == 0."""
    return jnp.sum(x**2) - p[1]


def parameters(count: int) -> np.ndarray:
    """(count, 2): the (b, s) of each problem, from a fixed seed."""
    u = np.random.default_rng(0).uniform(-1.0, 1.0, (count, 2))
    return np.stack([25.0 * (1 + 0.2 * u[:, 0]), 40.0 * (1 + 0.2 * u[:, 1])], axis=1)


def problem(p) -> optsolve.OptimizationProblem:
    return optsolve.OptimizationProblem(
        objective,
        jnp.asarray(X0),
        jnp.asarray(p),
        bounds=(LOWER, UPPER),
        constraints=[
            optsolve.Constraint(product, lower=0.0),
            optsolve.Constraint(squares, lower=0.0, upper=0.0),
        ],
    )


def violation(x: np.ndarray, p: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    if not np.all(np.isfinite(x)):
        return np.inf
    return float(
        max(p[0] - np.prod(x), abs(np.sum(x**2) - p[1]), np.max(LOWER - x), np.max(x - UPPER), 0.0)
    )


# ------------------------------------------------------------------------------- runners


def interior_point_one(prob: optsolve.OptimizationProblem):
    """solve_one(p) -> (x, claimed success, iterations): one problem, InteriorPoint."""
    alg = optsolve.InteriorPoint()

    def solve_one(p):
        sol = optsolve.solve(prob.replace(p=p), alg, maxiters=MAXITER)
        return sol.x, sol.retcode == optsolve.ReturnCode.SUCCESS, sol.stats.iterations

    return solve_one


def scipy_slsqp():
    """run(p) -> (x, success, nit): scipy's SLSQP fed jitted functions of (x, p)."""
    f, g = jax.jit(objective), jax.jit(jax.grad(objective))
    c1, j1 = jax.jit(product), jax.jit(jax.grad(product))
    c2, j2 = jax.jit(squares), jax.jit(jax.grad(squares))
    bounds = so.Bounds(np.full(4, LOWER), np.full(4, UPPER))

    def run(p):
        cons = [
            {
                "type": "ineq",
                "fun": lambda x: np.asarray(c1(x, p)),
                "jac": lambda x: np.asarray(j1(x, p)),
            },
            {
                "type": "eq",
                "fun": lambda x: np.asarray(c2(x, p)),
                "jac": lambda x: np.asarray(j2(x, p)),
            },
        ]
        res = so.minimize(
            lambda x: float(f(x, p)),
            X0.copy(),
            jac=lambda x: np.asarray(g(x, p)),
            method="SLSQP",
            bounds=bounds,
            constraints=cons,
            options={"maxiter": MAXITER},
        )
        return res.x, bool(res.success), int(res.nit)

    return run


def scipy_through_optsolve(prob: optsolve.OptimizationProblem):
    alg = optsolve.ScipyMinimize("SLSQP")

    def run(p):
        sol = optsolve.solve(prob.replace(p=p), alg, maxiters=MAXITER)
        return (
            np.asarray(sol.x),
            sol.retcode == optsolve.ReturnCode.SUCCESS,
            int(sol.stats.iterations),
        )

    return run


# ----------------------------------------------------------------------------- measuring


def _spread(values: list[float], fmt) -> str:
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def _batched_factorisation_cost(count: int) -> tuple[float, float]:
    """Fastest of 21 timings (the least disturbed by other processes) of one L D L^T
    factorisation (InteriorPoint's, ``newton_system.ldl``) of ``count`` 6x6 symmetric
    matrices under jit(vmap) (the size of HS071's condensed Newton matrix: 4 variables, 2
    constraints), and of one jitted 6x6 factorisation called alone."""
    from optsolve.backends.constrained.newton_system import ldl

    rng = np.random.default_rng(1)
    a = rng.standard_normal((count, 6, 6))
    a = jnp.asarray(a + np.swapaxes(a, 1, 2))
    batched, single = jax.jit(jax.vmap(ldl)), jax.jit(ldl)
    block(batched(a))
    block(single(a[0]))
    times = interleaved_times({"batched": lambda: batched(a), "single": lambda: single(a[0])}, 21)
    return min(times["batched"]), min(times["single"])


def measure(count: int, subset: int, repeats: int) -> str:
    ps_np = parameters(count)
    ps = jnp.asarray(ps_np)
    singles = [ps[i] for i in range(count)]  # made once, outside the timed loop
    block(singles)
    prob = problem(ps_np[0])
    solve_one = interior_point_one(prob)

    vmapped, jitted = jax.jit(jax.vmap(solve_one)), jax.jit(solve_one)
    scipy_run, through = scipy_slsqp(), scipy_through_optsolve(prob)
    runners = {
        VMAP: lambda: vmapped(ps),
        LOOP: lambda: [block(jitted(p)) for p in singles],
        SCIPY: lambda: [scipy_run(p) for p in ps_np],
        SCIPY_OPTSOLVE: lambda: [through(p) for p in ps_np[:subset]],
    }
    covered = {VMAP: count, LOOP: count, SCIPY: count, SCIPY_OPTSOLVE: subset}
    first, results = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's "Values in x were outside bounds"
        for name, fn in runners.items():
            # compile + first: the first problem alone (vmap: the whole batch, its one call)
            start = time.perf_counter()
            if name == VMAP:
                results[name] = block(fn())
            elif name == LOOP:
                block(jitted(singles[0]))
            elif name == SCIPY:
                scipy_run(ps_np[0])
            else:
                through(ps_np[0])
            first[name] = time.perf_counter() - start
            if name != VMAP:
                results[name] = fn()
        load_before = os.getloadavg()
        times = interleaved_times(runners, repeats)
        load_after = os.getloadavg()

    # HS071 itself, the published minimum (after the timings: this call would otherwise
    # compile the loop's solve before its compile + first is timed)
    hs071 = block(jitted(jnp.array([25.0, 40.0])))
    hs071_f = float(objective(np.asarray(hs071[0]), None))

    # every runner's points, claims and iterations as numpy, per problem
    out = {}
    for name, res in results.items():
        if name == VMAP:
            x, claimed, its = (np.asarray(a) for a in res)
        else:
            x = np.stack([np.asarray(r[0], np.float64) for r in res])
            claimed = np.array([bool(r[1]) for r in res])
            its = np.array([int(r[2]) for r in res])
        f = np.array(
            [float(objective(xi, None)) if np.all(np.isfinite(xi)) else np.nan for xi in x]
        )
        viol = np.array([violation(xi, pi) for xi, pi in zip(x, ps_np)])
        out[name] = {"x": x, "claimed": claimed, "its": its, "f": f, "viol": viol}

    best = np.full(count, np.inf)
    for rec in out.values():
        k = len(rec["f"])
        feasible = (rec["viol"] <= FEAS_TOL) & np.isfinite(rec["f"])
        best[:k] = np.minimum(best[:k], np.where(feasible, rec["f"], np.inf))
    for rec in out.values():
        k = len(rec["f"])
        rec["solved"] = (rec["viol"] <= FEAS_TOL) & (
            rec["f"] <= best[:k] + F_TOL * (1 + np.abs(best[:k]))
        )
        rec["false"] = rec["claimed"] & ~rec["solved"]

    x_gap = np.max(np.abs(out[VMAP]["x"] - out[LOOP]["x"]), axis=1)
    agree = int(np.sum((x_gap <= X_TOL) & (out[VMAP]["claimed"] == out[LOOP]["claimed"])))
    f_ip, f_sp = out[VMAP]["f"], out[SCIPY]["f"]
    f_agree = int(np.sum(np.abs(f_ip - f_sp) <= F_TOL * (1 + np.abs(f_sp))))
    both = out[VMAP]["solved"] & out[SCIPY]["solved"]
    ip_lower = int(np.sum(out[VMAP]["solved"] & ~out[SCIPY]["solved"]))
    sp_lower = int(np.sum(out[SCIPY]["solved"] & ~out[VMAP]["solved"]))

    per_problem = {n: [t / covered[n] for t in ts] for n, ts in times.items()}
    rows = []
    for name in runners:
        rec, k = out[name], covered[name]
        ratio = [a / b for a, b in zip(per_problem[name], per_problem[VMAP])]
        rows.append(
            [
                name,
                str(k),
                f"{first[name]:.2f}",
                _spread(times[name], lambda s: f"{s * 1e3:.1f}"),
                _spread(per_problem[name], _us),
                f"{statistics.median(ratio):.2f}x",
                f"{min(ratio):.2f}-{max(ratio):.2f}",
                f"{int(rec['claimed'].sum())}/{k}",
                f"{int(rec['solved'].sum())}/{k}",
                f"**{int(rec['false'].sum())}**" if rec["false"].any() else "0",
                f"{rec['its'].mean():.1f} / {int(rec['its'].max())}",
            ]
        )
    table = markdown_table(
        [
            "runner",
            "problems timed",
            "compile + first (s)",
            "steady, whole set (ms): median (min-max)",
            "per problem (us): median (min-max)",
            "time per problem / vmap's",
            "that ratio: min-max over turns",
            "SUCCESS",
            "solved",
            "false SUCCESS",
            "iterations: mean / max",
        ],
        rows,
    )

    loop_ratio = statistics.median(b / a for a, b in zip(per_problem[VMAP], per_problem[LOOP]))
    scipy_ratio = statistics.median(b / a for a, b in zip(per_problem[VMAP], per_problem[SCIPY]))
    fact_batched, fact_single = _batched_factorisation_cost(count)
    vmap_steady = statistics.median(times[VMAP])
    max_its = int(out[VMAP]["its"].max())
    lines = [
        f"### {count} small constrained problems at once: jax.vmap(InteriorPoint), HS071 "
        "with varied bounds, float64",
        "",
        table,
        "",
        f"**Goals (issue 39): vmap at least 20x faster than the loop of jitted solves: "
        f"{'met' if loop_ratio >= 20 else 'not met'} (the loop takes {loop_ratio:.2f}x "
        f"vmap's time per problem); more than 100x faster than the loop of scipy SLSQP: "
        f"{'met' if scipy_ratio > 100 else 'not met'} ({scipy_ratio:.2f}x).**",
        "",
        f"Checks: vmap and the loop agree on x within {X_TOL:g} (and on the return code) in "
        f"{agree} of {count} problems (largest difference {x_gap.max():.1e}). InteriorPoint "
        f"and scipy's SLSQP reach the same objective within {F_TOL:g} (1 + |f|) in {f_agree} "
        f"of {count}; both solved {int(both.sum())}, InteriorPoint alone {ip_lower}, SLSQP "
        f"alone {sp_lower}. HS071 itself (p = (25, 40)): InteriorPoint f = {hs071_f:.7f} "
        f"({'SUCCESS' if bool(hs071[1]) else 'not SUCCESS'}), published {HS071_F}.",
        "",
        "Where vmap's time goes: under vmap a while loop runs until the batch's slowest "
        "problem stops, and a `lax.cond` becomes a select that runs both branches for "
        "every problem; InteriorPoint's feasibility restoration and second-order correction "
        "are `batch_cond`s instead, which run a branch over the batch only where some "
        "member takes it (optsolve.backends.native.batch_cond). "
        f"The batch ran {max_its} iterations (its slowest problem's): "
        f"{vmap_steady / max_its * 1e3:.1f} ms per batched iteration, "
        f"{vmap_steady / max_its / count * 1e6:.0f} us per problem and iteration. Each "
        "step factorises the 6x6 condensed Newton matrix as L D L^T (one or more times, "
        "with the inertia correction): under jit(vmap) one over the "
        f"{count} problems costs {fact_batched * 1e3:.3f} ms "
        f"({fact_batched / count * 1e6:.2f} us a matrix; fastest of 21), "
        f"{fact_batched / (vmap_steady / max_its):.0%} of a batched iteration at one a step, "
        f"and a jitted single one {fact_single * 1e6:.0f} us with its dispatch. The rest of "
        "a batched iteration is the Hessian, the line search's trial points and the "
        "bookkeeping, all elementwise over the batch.",
        "",
        "Compile + first: the vmapped function's first call (compile and the whole batch); "
        "for the others, their first problem (the loop: compiling its jitted solve; scipy: "
        "compiling the jitted functions it is fed). "
        f"Steady: {repeats} turns after the first call, every runner once per turn in a new "
        "(seeded) order; ratios within each turn, then their median and min-max. The loop "
        "blocks on each solve. The scipy SLSQP loop is timed on all the problems; "
        f"optsolve's ScipyMinimize loop on the first {subset} (per problem: its turn's "
        f"time / {subset}). Solved: violation <= {FEAS_TOL:g} (absolute) and objective within "
        f"{F_TOL:g} (1 + |f*|) of the lowest feasible objective any runner reached; false "
        "SUCCESS: success claimed at a point not solved. BLAS pinned to 1 thread. Load "
        f"average (1, 5, 15 min) when the timed turns began: "
        f"{', '.join(f'{v:.2f}' for v in load_before)}; when they ended: "
        f"{', '.join(f'{v:.2f}' for v in load_after)} (2 cores: absolute times carry that "
        "load, ratios less so).",
        "",
        f"Machine: {machine_line()}.",
    ]
    return "\n".join(lines)


def main(quick: bool = False) -> str:
    count = QUICK_BATCH if quick else BATCH
    subset = QUICK_SUBSET if quick else SUBSET
    repeats = QUICK_REPEATS if quick else REPEATS
    with threadpool_limits(limits=1):
        return measure(count, subset, repeats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_BATCH} problems, {QUICK_REPEATS} turns"
    )
    args = parser.parse_args()
    print(machine_line())
    print(main(args.quick))
