"""optsolve's least-squares solvers against scipy, optimistix and jaxopt, side by side.

Runners (float64):
  * optsolve.LevenbergMarquardt() and optsolve.GaussNewton(): ``solve`` inside one
    ``jax.jit``-compiled function of (x0, data), default tolerances (Moré's relative tests
    at ftol = xtol = 1e-8, gtol 1e-8 on J^T r);
  * optsolve.ScipyLeastSquares("lm") (scipy's MINPACK with JAX's Jacobian, eager);
  * scipy.optimize.least_squares(method="lm") by hand, with a jitted residual and a jitted
    jax.jacfwd Jacobian (its defaults: ftol = xtol = gtol = 1e-8);
  * optimistix.LevenbergMarquardt and optimistix.GaussNewton (rtol = atol = 1e-8) through
    ``optx.least_squares``, jitted, max_steps 1000;
  * jaxopt.LevenbergMarquardt(tol=1e-8, maxiter=50), jitted ``run`` (its test is on the
    gradient's norm, absolute: on the large fits it never holds, and 1000 iterations took
    minutes, so the budget is 50).
Problems: a small curve fit (two-parameter exponential decay, 100 points) and a large one
(sums of K Gaussian peaks of fixed width with free heights and centres: 10^5 residuals,
2K = 10 and 40 parameters; the forward-mode Jacobian's intermediates hold m K n numbers, 640 MB
at n = 40), each from a start near the truth; seeded noise.

Measured: compile + first solve; steady median wall time over interleaved repeats; the
final sum of squares over the best any runner reached (1.000000 = the best); and the
evaluations each runner reports (optsolve: residual / Jacobian evaluations; scipy: nfev /
njev; optimistix: steps; jaxopt: iterations; each counts in its own terms).

Run: ``python benchmarks/bench_least_squares.py`` or ``python benchmarks/run.py
least_squares``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import jaxopt  # noqa: E402
import optimistix as optx  # noqa: E402
import scipy.optimize as so  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import machine_line, markdown_table  # noqa: E402

TOL = 1e-8


def decay(b, data):
    t, y = data
    return b[0] * jnp.exp(-b[1] * t) - y


def peaks(b, data):
    t, y = data
    k = b.size // 2
    heights, centres = b[:k], b[k:]
    model = jnp.exp(-0.5 * ((t[:, None] - centres[None, :]) / 0.02) ** 2) @ heights
    return model - y


def problems():
    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 4.0, 100)
    small = (
        decay,
        np.array([1.0, 0.5]),
        (t, 2.5 * np.exp(-1.3 * t) + 0.01 * rng.standard_normal(t.size)),
    )
    out = {"decay (m=100, n=2)": small}
    t = np.linspace(0.0, 1.0, 100_000)
    for k in (5, 20):
        centres = np.linspace(0.05, 0.95, k)
        heights = 1.0 + rng.random(k)
        truth = np.concatenate([heights, centres])
        y = np.asarray(peaks(jnp.asarray(truth), (t, np.zeros_like(t))))
        y = y + 0.01 * rng.standard_normal(t.size)
        start = np.concatenate([np.ones(k), centres + 0.003 * rng.standard_normal(k)])
        out[f"peaks (m=1e5, n={2 * k})"] = (peaks, start, (t, y))
    return out


def runners(residual, data):
    data = tuple(jnp.asarray(a) for a in data)

    def optsolve_run(alg):
        @jax.jit
        def run(x0, data):
            sol = optsolve.solve(optsolve.LeastSquaresProblem(residual, x0, data), alg)
            return sol.x, sol.stats.f_evals, sol.stats.grad_evals

        return lambda x0: _counted(run(x0, data), "{} r / {} J")

    res_jit = jax.jit(lambda b: residual(b, data))
    jac_jit = jax.jit(jax.jacfwd(lambda b: residual(b, data)))

    def scipy_lm(x0):
        out = so.least_squares(
            lambda b: np.asarray(res_jit(b)),
            np.asarray(x0),
            jac=lambda b: np.asarray(jac_jit(b)),
            method="lm",
        )
        return out.x, f"{out.nfev} r / {out.njev} J"

    def optsolve_scipy(x0):
        sol = optsolve.solve(
            optsolve.LeastSquaresProblem(residual, jnp.asarray(x0), data),
            optsolve.ScipyLeastSquares("lm"),
        )
        return sol.x, f"{sol.stats.f_evals} r / {sol.stats.grad_evals} J"

    def optimistix_run(solver):
        @jax.jit
        def run(x0, data):
            sol = optx.least_squares(
                lambda b, d: residual(b, d), solver, x0, args=data, max_steps=1000, throw=False
            )
            return sol.value, sol.stats["num_steps"]

        return lambda x0: _counted(run(x0, data), "{} steps")

    jaxopt_lm = jaxopt.LevenbergMarquardt(
        residual_fun=lambda b, d: residual(b, d), tol=TOL, maxiter=50, jit=True
    )

    @jax.jit
    def jaxopt_run(x0, data):
        params, state = jaxopt_lm.run(x0, data)
        return params, state.iter_num

    return {
        "optsolve.LevenbergMarquardt": optsolve_run(optsolve.LevenbergMarquardt()),
        "optsolve.GaussNewton": optsolve_run(optsolve.GaussNewton()),
        "optsolve.ScipyLeastSquares(lm)": optsolve_scipy,
        "scipy least_squares(lm)": scipy_lm,
        "optimistix.LevenbergMarquardt": optimistix_run(
            optx.LevenbergMarquardt(rtol=TOL, atol=TOL)
        ),
        "optimistix.GaussNewton": optimistix_run(optx.GaussNewton(rtol=TOL, atol=TOL)),
        "jaxopt.LevenbergMarquardt": lambda x0: _counted(jaxopt_run(x0, data), "{} iterations"),
    }


def _counted(out, form):
    x, *counts = jax.block_until_ready(out)
    return x, form.format(*(int(c) for c in counts))


def measure(name, residual, x0, data, budget_s=8.0):
    runs = runners(residual, data)
    x0 = jnp.asarray(x0)
    first, results = {}, {}
    for label, run in runs.items():
        start = time.perf_counter()
        results[label] = run(x0)
        first[label] = time.perf_counter() - start
    steady = {label: [] for label in runs}
    repeats = 0
    started = time.perf_counter()
    while repeats < 3 or (time.perf_counter() - started < budget_s and repeats < 15):
        for label, run in runs.items():
            start = time.perf_counter()
            run(x0)
            steady[label].append(time.perf_counter() - start)
        repeats += 1
    cost = {
        label: 0.5 * float(jnp.sum(residual(jnp.asarray(x), tuple(map(jnp.asarray, data))) ** 2))
        for label, (x, _) in results.items()
    }
    best = min(cost.values())
    median = {label: statistics.median(ts) for label, ts in steady.items()}
    fastest_peer = min(v for k, v in median.items() if not k.startswith("optsolve"))
    rows = [
        [
            label,
            _fmt(first[label]),
            _fmt(median[label]),
            f"{median[label] / fastest_peer:.2f}x",
            f"{cost[label] / best:.6f}",
            results[label][1],
        ]
        for label in runs
    ]
    return (
        f"### {name}\n\n"
        + markdown_table(
            [
                "runner",
                "compile + first",
                "steady",
                "steady / fastest peer",
                "cost / best",
                "evaluations (as reported)",
            ],
            rows,
        )
        + f"\n\n{repeats} interleaved repeats."
    )


def _fmt(s):
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def main() -> str:
    sections = [
        "## Least squares: LevenbergMarquardt against scipy, optimistix, jaxopt",
        f"Machine: {machine_line()}.",
        "Command: `python benchmarks/run.py least_squares`. Times are medians of "
        "interleaved repeats in one process; ratios are against the fastest peer "
        "(scipy by hand, optimistix or jaxopt).",
    ]
    for name, (residual, x0, data) in problems().items():
        print(f"  {name} ...", flush=True)
        sections.append(measure(name, residual, x0, data))
    return "\n\n".join(sections)


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        text = main()
    print(text)
