"""The CUTEst census (issue 18): optsolve's L-BFGS, BFGS and Newton against the JAX and scipy
peers on the problems of sif2jax (pure-JAX definitions of the CUTEst set), one stopping rule
for every runner.

Problems: sif2jax's unconstrained problems with n <= ``--max-n`` (100 by default) and its
bounded ones (optsolve.LBFGS against scipy's L-BFGS-B only; ``--set`` picks one set). A problem
whose objective or gradient is not finite at its start is left out (listed).

Runners (float64; every JAX runner is one ``jax.jit``-compiled function of x0):
  * optsolve.LBFGS, optsolve.BFGS, optsolve.Newton: ``solve(prob, alg, gtol=1e-6,
    maxiters=1000)``;
  * optax.lbfgs() in the ``lax.while_loop`` of optax's documentation, stopped at gradient
    inf-norm 1e-6 or 1000 steps;
  * optimistix.BFGS and optimistix.LBFGS(rtol=atol=1e-9), max_steps 1000 (optimistix has no
    gradient test: its Cauchy test on steps is tuned tight);
  * scipy L-BFGS-B (gtol=1e-6, ftol=0, maxiter=1000) with a jitted value_and_grad.

Per problem and runner: compile + first solve, the steady median of ``--repeats`` solves,
the objective and the gradient inf-norm recomputed at the returned point, whether the runner
claimed success, and its gradient evaluations as it reports them (optsolve's grad_evals,
scipy's njev; optimistix's steps and optax's iterations, one gradient each).

A run is *solved* when its objective is within 1e-6 (1 + |f*|) of the best any runner
reached (f*); a *false SUCCESS* claims success with a gradient inf-norm above 10 x 1e-6.
Ratios of steady time are over the fastest L-BFGS peer (optax.lbfgs, optimistix.LBFGS,
scipy L-BFGS-B) on the problems both solved, and for optsolve.BFGS also over optimistix.BFGS
(like with like); gradient evaluations are over the fewest any runner that solved the
problem used, on the problems the runner solved. Dolan-More performance profiles of time and of
gradient evaluations are plotted to docs/images/cutest_profile_*.png.

Run: ``python benchmarks/bench_cutest.py [--max-n 100] [--limit K] [--set both]`` or
``python benchmarks/run.py cutest`` (about half an hour on 2 cores for the default set).
"""

from __future__ import annotations

import argparse
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

import optimistix as optx  # noqa: E402
import scipy.optimize as so  # noqa: E402
import sif2jax  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import (  # noqa: E402
    block,
    machine_line,
    markdown_table,
    optax_lbfgs_loop,
    performance_profile,
)

GTOL, MAXITER = 1e-6, 1000
LBFGS_PEERS = ("optax.lbfgs", "optimistix.LBFGS", "scipy L-BFGS-B")
LIKE_PEER = {"optsolve.BFGS": "optimistix.BFGS"}  # like with like, beside the L-BFGS peers
IMAGES = Path(__file__).parent.parent / "docs" / "images"


def _optsolve(alg, bounds=None):
    def make(f, p):
        def run(x0):
            prob = optsolve.OptimizationProblem(f, x0, p, bounds=bounds)
            sol = optsolve.solve(prob, alg, gtol=GTOL, maxiters=MAXITER)
            return sol.x, sol.retcode == optsolve.ReturnCode.SUCCESS, sol.stats.grad_evals

        return jax.jit(run)

    return make


def _optax_lbfgs(f, p):
    def run(x0):
        params, count = optax_lbfgs_loop(lambda x: f(x, p), x0, GTOL, MAXITER)
        return params, count < MAXITER, count

    return jax.jit(run)


def _optimistix(solver):
    def make(f, p):
        def run(x0):
            sol = optx.minimise(lambda x, _: f(x, p), solver, x0, max_steps=MAXITER, throw=False)
            return sol.value, sol.result == optx.RESULTS.successful, sol.stats["num_steps"]

        return jax.jit(run)

    return make


def _scipy_lbfgsb(bounds=None):
    def make(f, p):
        value_and_grad = jax.jit(jax.value_and_grad(f))

        def fun(x):
            v, g = value_and_grad(x, p)
            return float(v), np.asarray(g)

        box = None if bounds is None else list(zip(np.asarray(bounds[0]), np.asarray(bounds[1])))

        def run(x0):
            res = so.minimize(
                fun,
                np.asarray(x0),
                jac=True,
                method="L-BFGS-B",
                bounds=box,
                options={"gtol": GTOL, "ftol": 0.0, "maxiter": MAXITER},
            )
            return res.x, bool(res.success), res.njev

        return run

    return make


def runners(bounds=None) -> dict:
    if bounds is not None:
        return {
            "optsolve.LBFGS": _optsolve(optsolve.LBFGS(), bounds),
            "scipy L-BFGS-B": _scipy_lbfgsb(bounds),
        }
    tol = 1e-9
    return {
        "optsolve.LBFGS": _optsolve(optsolve.LBFGS()),
        "optsolve.BFGS": _optsolve(optsolve.BFGS()),
        "optsolve.Newton": _optsolve(optsolve.Newton()),
        "optax.lbfgs": _optax_lbfgs,
        "optimistix.BFGS": _optimistix(optx.BFGS(rtol=tol, atol=tol)),
        "optimistix.LBFGS": _optimistix(optx.LBFGS(rtol=tol, atol=tol)),
        "scipy L-BFGS-B": _scipy_lbfgsb(),
    }


def _projected_norm(x, g, bounds) -> float:
    if bounds is None:
        return float(jnp.max(jnp.abs(g)))
    return float(jnp.max(jnp.abs(x - jnp.clip(x - g, bounds[0], bounds[1]))))


def measure(problem, bounded: bool, repeats: int) -> dict | None:
    """Each runner's record on one problem, or None where the start is not finite."""
    f, p = (lambda x, args: problem.objective(x, args)), problem.args
    x0 = jnp.asarray(problem.y0, jnp.float64)
    bounds = None
    if bounded:
        bounds = tuple(
            jnp.broadcast_to(jnp.asarray(b, jnp.float64), x0.shape) for b in problem.bounds
        )
        x0 = jnp.clip(x0, *bounds)  # the start projected, as L-BFGS-B does
    value_and_grad = jax.jit(jax.value_and_grad(f))
    f0, g0 = value_and_grad(x0, p)
    if not (np.isfinite(f0) and np.all(np.isfinite(g0))):
        return None
    out = {}
    for name, make in runners(bounds).items():
        run = make(f, p)
        start = time.perf_counter()
        try:
            x, claimed, evals = block(run(x0))
        except Exception as err:  # a runner that raises has not solved the problem
            out[name] = {"error": f"{type(err).__name__}: {str(err)[:80]}"}
            continue
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            block(run(x0))
            times.append(time.perf_counter() - start)
        fx, gx = value_and_grad(jnp.asarray(x), p)
        out[name] = {
            "first": first,
            "steady": statistics.median(times),
            "f": float(fx),
            "gnorm": _projected_norm(jnp.asarray(x), gx, bounds),
            "claimed": bool(claimed),
            "evals": int(evals),
        }
    return out


def _solved(record: dict, best: float) -> bool:
    return (
        "f" in record and np.isfinite(record["f"]) and record["f"] <= best + 1e-6 * (1 + abs(best))
    )


def summary(results: dict, bounded: bool) -> list[list[str]]:
    names = list(next(iter(results.values())))
    rows = []
    for n in names:
        solved = false_success = 0
        ratios, like_ratios, eval_ratios, firsts = [], [], [], []
        like = LIKE_PEER.get(n)
        for records in results.values():
            best = min(r["f"] for r in records.values() if "f" in r and np.isfinite(r["f"]))
            record = records[n]
            ok = _solved(record, best)
            solved += ok
            false_success += record.get("claimed", False) and record["gnorm"] > 10 * GTOL
            if "first" in record:
                firsts.append(record["first"])
            peers = [
                records[q]
                for q in LBFGS_PEERS
                if q in records and q != n and _solved(records[q], best)
            ]
            if ok and peers and not bounded:
                ratios.append(record["steady"] / min(q["steady"] for q in peers))
            if ok and like in records and _solved(records[like], best):
                like_ratios.append(record["steady"] / records[like]["steady"])
            if ok:
                fewest = min(r["evals"] for r in records.values() if _solved(r, best))
                eval_ratios.append(record["evals"] / max(fewest, 1))
        rows.append(
            [
                n,
                str(solved),
                str(false_success),
                _median_ratio(ratios),
                f"{_median_ratio(like_ratios)} ({like})" if like else "-",
                _median_ratio(eval_ratios),
                f"{statistics.median(firsts):.2f} s" if firsts else "-",
            ]
        )
    return rows


def _median_ratio(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x" if ratios else "-"


def main(
    max_n: int = 100,
    limit: int | None = None,
    sets: tuple[str, ...] = ("unconstrained", "bounded"),
    repeats: int = 3,
) -> str:
    """The census's sections, one per set of problems."""
    return "\n\n".join(census(max_n, limit, kind == "bounded", repeats) for kind in sets)


def census(max_n: int, limit: int | None, bounded: bool, repeats: int) -> str:
    pool = (
        sif2jax.bounded_minimisation_problems
        if bounded
        else sif2jax.unconstrained_minimisation_problems
    )
    chosen = [q for q in pool if int(q.num_variables()) <= max_n]
    if limit is not None:
        chosen = chosen[:limit]
    results, left_out = {}, []
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for problem in chosen:
            try:
                record = measure(problem, bounded, repeats)
            except Exception as err:  # sif2jax cannot evaluate it here
                left_out.append(f"{problem.name} ({type(err).__name__})")
                continue
            if record is None:
                left_out.append(f"{problem.name} (not finite at the start)")
                continue
            results[problem.name] = record
            print(
                problem.name,
                {n: round(r.get("steady", np.nan) * 1e3, 2) for n, r in record.items()},
                file=sys.stderr,
                flush=True,
            )
    kind = "bounded" if bounded else "unconstrained"
    names = list(next(iter(results.values())))
    suffix = "bounded" if bounded else "unconstrained"
    IMAGES.mkdir(parents=True, exist_ok=True)

    def solved_by(records: dict, name: str) -> bool:
        best_f = min(r["f"] for r in records.values() if "f" in r and np.isfinite(r["f"]))
        return _solved(records[name], best_f)

    performance_profile(
        results,
        names,
        "steady",
        f"steady time, {kind}",
        IMAGES / f"cutest_profile_time_{suffix}.png",
        solved_by,
        max_tau=1e2,
    )
    performance_profile(
        results,
        names,
        "evals",
        f"gradient evaluations, {kind}",
        IMAGES / f"cutest_profile_evals_{suffix}.png",
        solved_by,
        max_tau=1e2,
    )
    table = markdown_table(
        [
            "runner",
            "solved",
            "false SUCCESS",
            "median steady / fastest L-BFGS peer",
            "median steady / like peer",
            "median gradient evaluations / fewest",
            "median compile + first",
        ],
        summary(results, bounded),
    )
    return "\n".join(
        [
            f"### CUTEst census ({kind}, n <= {max_n}): {len(results)} problems from sif2jax",
            "",
            table,
            "",
            f"![time profile](images/cutest_profile_time_{suffix}.png) "
            f"![evaluations profile](images/cutest_profile_evals_{suffix}.png)",
            "",
            f"Left out: {', '.join(left_out) if left_out else 'none'}. Steady times are medians "
            f"of {repeats} solves; BLAS pinned to 1 thread.",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=100)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--set", choices=("unconstrained", "bounded", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sets = ("unconstrained", "bounded") if args.set == "both" else (args.set,)
    print(machine_line())
    print(main(args.max_n, args.limit, sets, args.repeats))
