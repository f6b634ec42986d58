"""NewtonRaphson under jax.vmap over 1000 values of p against a Python loop of
``scipy.optimize.root(method="hybr")`` fed a jitted Jacobian (issue 38).

The system: scipy's pressure network (``test_minpack.pressure_network``), four parallel
pipes whose pressure drops ``k_i Q_i^2`` are equal and whose flows add up to ``Qtot = 4``:
``F(Q, k) = (k_i Q_i^2 - k_0 Q_0^2 for i = 1..3, sum(Q) - 4)``. p is the valve vector k:
1000 of them, ``k = exp(U(-2, 2))`` per entry (key 0), float64. Two starts, the same for
every k: scipy's test start ``Q = (2, 0, 2, 0)``, where the Jacobian is singular, and
``Q = (1, 1, 1, 1)``, where it is not.

Runners:

- optsolve: ``jax.jit(jax.vmap(lambda k: solve(RootProblem(F, x0, (4.0, k)),
  NewtonRaphson())))``: one compiled while loop over the whole batch;
- scipy: a Python loop of ``scipy.optimize.root(F, x0, jac=J, method="hybr")`` with F and
  J = ``jax.jacfwd(F)`` each ``jax.jit``-compiled once (numpy in, numpy out), scipy's default
  tolerance (``xtol`` = 1.49e-8).

A run is a root where max|F| <= 1e-8 (optsolve's SUCCESS; scipy's x judged the same way).
Times: the median, min and max of 7 interleaved warm runs (compilation apart). Beside them,
deterministic counts: the batched loop's iterations (its trip count: the slowest element's)
against the mean per-element iterations, F and Jacobian evaluations, and the fused kernels
of the batched solve's optimised HLO (as ``bench_data_compiled.fusions`` counts them),
with the LAPACK calls in it (LU: getrf; SVD: gesdd).

Goal (issue 38): the vmapped NewtonRaphson at least 20x faster than the scipy loop.

A second table runs the matrix-free NewtonRaphson (BiCGStab, and GMRES, on Jacobian-vector
products) on large systems: Moré, Garbow & Hillstrom's Broyden tridiagonal function at
n = 10^4 and the 1-D Bratu problem (condition number of order n^2) at n = 2000, against
``scipy.optimize.root(method="krylov")`` (scipy's Newton-Krylov, LGMRES on finite-difference
products) fed F jitted, and the dense NewtonRaphson where n^2 fits. Times: median (min-max)
of 3 warm runs; the deterministic counts are iterations and F evaluations.

Run: ``python benchmarks/bench_roots.py`` (or ``python benchmarks/run.py roots``).
"""

from __future__ import annotations

import datetime
import re
import statistics
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import optsolve  # noqa: E402
from common import block, interleaved_times, machine_line, markdown_table  # noqa: E402

N, REPEATS, QTOT = 1000, 7, 4.0
STARTS = {
    "singular start (2, 0, 2, 0)": (2.0, 0.0, 2.0, 0.0),
    "regular start (1, 1, 1, 1)": (1.0, 1.0, 1.0, 1.0),
}

NOTES = (
    "What limits the batched solve: its while loop runs until the slowest of the 1000 "
    "elements has converged (the trip count against the mean per-element iterations above), "
    "and every trip evaluates F, its Jacobian (4 forward passes) and the line search for "
    "every element, the converged ones included, their results discarded. Each trip also "
    "holds the SVD fallback behind a condition (the LAPACK calls above): from the singular "
    "start some element needs it in the first iteration, so that trip runs the batched SVD "
    "as well as the LU. The scipy loop pays per element: scipy's Python driver and MINPACK "
    "call, and one Python-to-XLA dispatch per evaluation of F and of J (tens of "
    "microseconds each, against a few nanoseconds of arithmetic for a 4 x 4 system)."
)


def pressure_network(Q, p):
    Qtot, k = p
    P = k * Q**2
    return jnp.concatenate([P[1:] - P[0], jnp.atleast_1d(Q.sum() - Qtot)])


def fusions_and_lapack(fn, *args) -> tuple[int, int, int]:
    """Fused kernels in ``fn``'s optimised HLO (``bench_data_compiled.fusions``' count), and
    its LU (getrf) and SVD (gesdd / gesvd) LAPACK calls."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    fused = len(re.findall(r"^\s*(?:ROOT )?%?\S+ = \S+ fusion\(", text, flags=re.MULTILINE))
    lu = len(re.findall(r"custom_call_target=\"\w*getrf\w*\"", text))
    svd = len(re.findall(r"custom_call_target=\"\w*ges[dv]\w*\"", text))
    return fused, lu, svd


def ported_tests() -> str:
    """tests/backends/classical/test_roots.py (scipy's own root / fsolve / nonlin tests, ported) and
    tests/contract/test_contract_roots.py, run by pytest: its summary line."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/backends/classical/test_roots.py",
        ],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in result.stdout.splitlines() if " passed" in line or " failed" in line]
    return lines[-1].strip("= ") if lines else f"pytest exited {result.returncode}"


def broyden_tridiagonal(x, p):
    left = jnp.concatenate([jnp.zeros(1, x.dtype), x[:-1]])
    right = jnp.concatenate([x[1:], jnp.zeros(1, x.dtype)])
    return (3 - p * x) * x - left - 2 * right + 1


def bratu(u, lam):
    h = 1.0 / (u.size + 1)
    left = jnp.concatenate([jnp.zeros(1, u.dtype), u[:-1]])
    right = jnp.concatenate([u[1:], jnp.zeros(1, u.dtype)])
    return (2 * u - left - right) / h**2 - lam * jnp.exp(u)


LARGE = {
    "Broyden tridiagonal, n = 10^4": (broyden_tridiagonal, -np.ones(10_000), 2.0),
    "Bratu, n = 2000": (bratu, np.zeros(2000), 1.0),
}


def matrix_free(repeats: int = 3) -> str:
    """The large-system table (see the module docstring)."""
    import scipy.optimize

    rows = []
    for name, (F, x0, p) in LARGE.items():
        F_jit = jax.jit(F)
        runners = {}
        for label, solver in (("BiCGStab", "bicgstab"), ("GMRES(50)", "gmres"), ("dense", "dense")):
            if solver == "dense" and x0.size > 2000:
                continue
            alg = optsolve.NewtonRaphson(linear_solver=solver)
            run = jax.jit(
                lambda q, alg=alg, F=F, x0=x0: optsolve.solve(
                    optsolve.RootProblem(F, jnp.asarray(x0), q), alg, maxiters=100
                )
            )
            runners[f"optsolve NewtonRaphson ({label})"] = (run, lambda r: r)

        def krylov(F_jit=F_jit, x0=x0, p=p):
            return scipy.optimize.root(
                lambda x: np.asarray(F_jit(x, p)),  # noqa: B023  (x: the lambda's own argument)
                x0,
                method="krylov",
                options={"maxiter": 100},
            )

        for run, _ in list(runners.values()):
            block(run(p).x)
        krylov()
        times = interleaved_times(
            {
                **{k: (lambda run=run: run(p).x) for k, (run, _) in runners.items()},  # noqa: B023  (timed in this iteration)
                "scipy root krylov": krylov,
            },
            repeats,
        )
        for label in times:
            if label == "scipy root krylov":
                r = krylov()
                x, iters, fev, ok = r.x, r.nit, r.nfev, r.success
            else:
                sol = runners[label][0](p)
                x, iters, fev = sol.x, int(sol.stats.iterations), int(sol.stats.f_evals)
                ok = sol.success
            ts = times[label]
            rows.append(
                [
                    name,
                    label,
                    f"{1e3 * statistics.median(ts):.0f} ms ({1e3 * min(ts):.0f}-"
                    f"{1e3 * max(ts):.0f})",
                    f"{float(np.max(np.abs(np.asarray(F_jit(jnp.asarray(x), p))))):.1e}",
                    str(bool(ok)),
                    str(iters),
                    str(fev),
                ]
            )
    header = [
        "system",
        "runner",
        "steady: median (min-max)",
        "max abs F at the end",
        "success claimed",
        "iterations",
        "F evaluations",
    ]
    return "\n\n".join(
        [
            "### Large systems, matrix-free",
            "`NewtonRaphson` matrix-free (BiCGStab, and GMRES(50), on Jacobian-vector products; "
            "the default above 256 unknowns) against `scipy.optimize.root(method='krylov')` "
            "(scipy's Newton-Krylov: LGMRES on finite-difference products) fed F jitted, and the "
            "dense `NewtonRaphson` where n^2 fits; float64, at most 100 iterations, median "
            f"(min-max) of {repeats} warm interleaved runs.",
            markdown_table(header, rows),
            "F evaluations: optsolve counts F's evaluations (its line search's), not the "
            "Jacobian-vector products inside each Krylov solve; scipy's count includes the "
            "finite-difference products. What limits the matrix-free Newton: the Krylov solve's "
            "products, each a forward pass of F (no preconditioner: on Bratu the products per "
            "solve grow with the condition number, n^2), and restarted GMRES(50) stagnates there "
            "(it reports MAXITERS, not SUCCESS), which is why BiCGStab is the default. The dense "
            "solver needs n forward passes and an n x n LU an iteration.",
        ]
    )


def main(repeats: int = REPEATS) -> str:
    import scipy.optimize

    ks = jnp.exp(jax.random.uniform(jax.random.key(0), (N, 4), minval=-2.0, maxval=2.0))
    ks_host = np.asarray(ks)

    F_jit = jax.jit(pressure_network)
    J_jit = jax.jit(jax.jacfwd(pressure_network))
    rows, goal_met = [], []
    for start_name, start in STARTS.items():
        x0 = jnp.asarray(start)
        x0_host = np.asarray(start)

        def one(k, x0=x0):
            sol = optsolve.solve(
                optsolve.RootProblem(pressure_network, x0, (QTOT, k)), optsolve.NewtonRaphson()
            )
            return sol.x, sol.retcode, sol.stats.iterations, sol.stats.f_evals, sol.stats.grad_evals

        batched = jax.jit(jax.vmap(one))
        block(batched(ks))  # compile

        def scipy_loop(x0_host=x0_host):
            out = []
            for k in ks_host:
                p = (QTOT, k)
                out.append(
                    scipy.optimize.root(
                        lambda Q: np.asarray(F_jit(Q, p)),  # noqa: B023  (called in this iteration)
                        x0_host,
                        method="hybr",
                        jac=lambda Q: np.asarray(J_jit(Q, p)),  # noqa: B023  (called in this iteration)
                    )
                )
            return out

        scipy_loop()  # F and J compiled
        # timed in this iteration, before `batched` is rebound
        times = interleaved_times({"optsolve": lambda: batched(ks), "scipy": scipy_loop}, repeats)  # noqa: B023
        per_turn = [s / o for o, s in zip(times["optsolve"], times["scipy"])]

        x, _codes, iterations, f_evals, jac_evals = (np.asarray(v) for v in batched(ks))
        results = scipy_loop()
        max_F = np.max(
            np.abs(np.asarray(jax.vmap(pressure_network)(x, (jnp.full(N, QTOT), ks)))), axis=1
        )
        scipy_F = np.array(
            [np.max(np.abs(np.asarray(F_jit(r.x, (QTOT, k))))) for r, k in zip(results, ks_host)]
        )
        fused, lu, svd = fusions_and_lapack(jax.vmap(one), ks)
        ratio = statistics.median(per_turn)
        goal_met.append(ratio >= 20)

        def spread(ts):
            return f"{1e3 * statistics.median(ts):.1f} ms ({1e3 * min(ts):.1f}-{1e3 * max(ts):.1f})"

        rows.append(
            [
                start_name,
                spread(times["optsolve"]),
                spread(times["scipy"]),
                f"**{ratio:.0f}x**",
                f"{min(per_turn):.0f}-{max(per_turn):.0f}x",
                f"{int(np.sum(max_F <= 1e-8))} / {int(np.sum(scipy_F <= 1e-8))}",
                f"{int(iterations.max())} / {iterations.mean():.2f}",
                f"{f_evals.mean():.2f} + {jac_evals.mean():.2f} J / "
                f"{np.mean([r.nfev for r in results]):.2f} + "
                f"{np.mean([r.njev for r in results]):.2f} J",
                f"{fused} ({lu} LU, {svd} SVD)",
            ]
        )
    header = [
        "start (same for all 1000 k)",
        "optsolve vmap: median (min-max)",
        "scipy hybr loop: median (min-max)",
        "scipy / optsolve",
        "per turn: min-max",
        "roots (max abs F <= 1e-8): optsolve / scipy",
        "batched loop trips / mean per-element iterations",
        "mean F + Jacobian evaluations per element: optsolve / scipy",
        "fused kernels in the batched solve's HLO (LAPACK calls)",
    ]
    verdict = "met" if all(goal_met) else "not met"
    return "\n\n".join(
        [
            "## Roots",
            f"`NewtonRaphson` under `jax.jit(jax.vmap(...))` over {N} valve vectors k of scipy's "
            "pressure network (4 unknowns, float64) against a Python loop of "
            "`scipy.optimize.root(method='hybr')` fed F and a `jax.jacfwd` Jacobian, each "
            f"jitted once; median, min and max of {repeats} interleaved warm runs. Goal (issue "
            f"38): at least 20x faster; {verdict}. Measured {datetime.date.today().isoformat()} "
            f"on {machine_line()} (a shared 2-core box: times move between runs, compare the "
            "ratios); BLAS pinned to one thread. Command: `python benchmarks/run.py roots`.",
            markdown_table(header, rows),
            "Ported tests (`pytest tests/backends/classical/test_roots.py`: scipy's own "
            f"`root` / `fsolve` / "
            f"`nonlin` tests on the JAX-native root finders and ScipyRoot): {ported_tests()}.",
            matrix_free(),
        ]
    )


if __name__ == "__main__":
    print(machine_line())
    print(main())
    print()
    print(NOTES)
