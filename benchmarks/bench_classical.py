"""optsolve's JAX-native LBFGS and BFGS against the JAX and scipy peers, side by side.

Runners (float64; every JAX runner is one ``jax.jit``-compiled function of x0):
  * optsolve.LBFGS and optsolve.BFGS: ``solve(prob, alg, gtol=1e-6, maxiters=1000)``;
  * jaxopt.LBFGS(fun, tol=1e-6, maxiter=1000) (its tol is on the gradient's 2-norm);
  * optimistix.BFGS and optimistix.LBFGS(rtol=atol=1e-9) via ``optx.minimise``, max_steps
    1000 (no gradient test in optimistix: a Cauchy test on steps, tuned so that the
    returned gradients are comparable; the table shows them);
  * optax.lbfgs() driven by the ``lax.while_loop`` of optax's documentation (L-BFGS
    example, with ``value_and_grad_from_state``), stopped at inf-norm 1e-6 or 1000 steps;
  * jax.scipy.optimize.minimize(method="BFGS", gtol=1e-6, maxiter=1000);
  * scipy L-BFGS-B (gtol=1e-6, ftol=0, maxiter=1000) with a jitted value_and_grad.
Problems: chained Rosenbrock n=2 and n=100, extended Rosenbrock n=1000 (x0 = (-1.2, 1, ...)),
L2-regularised logistic regression (mean log-loss + 0.005 ||w||^2, intercept column) on
scikit-learn's breast_cancer (standardised, d=31) and on a synthetic 20000 x 500 set.

Measured per runner: compile + first solve (each from a freshly collected heap);
steady-state median wall time of full solves from x0 over interleaved repeats; iterations
and function/gradient evaluations, counted in a separate, untimed run by host callbacks in
a custom_vjp wrapper of f (forward = one function evaluation, backward = one gradient
evaluation: the same count for every runner);
f and the gradient inf-norm recomputed at each returned point. BLAS pinned to one thread
with threadpoolctl; JAX's own threads untouched.

Run: ``python benchmarks/bench_classical.py`` (writes docs/benchmarks-classical.md) or
``python benchmarks/run.py classical``. About 4 minutes on 2 cores.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import jax.scipy.optimize  # noqa: E402
import jaxopt  # noqa: E402
import optimistix as optx  # noqa: E402
import scipy.optimize as so  # noqa: E402
from sklearn.datasets import load_breast_cancer  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import machine_line, markdown_table, optax_lbfgs_loop  # noqa: E402

GTOL, MAXITER = 1e-6, 1000
JAX_PEERS = ("jaxopt.LBFGS", "optimistix.BFGS", "optimistix.LBFGS", "optax.lbfgs", "jax.scipy BFGS")


# ----------------------------------------------------------------------------- problems


def chained_rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def extended_rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1::2] - x[0::2] ** 2) ** 2 + (1.0 - x[0::2]) ** 2)


def logistic(w, p):
    X, y = p
    z = X @ w
    return jnp.mean(jnp.logaddexp(0.0, z) - y * z) + 0.005 * jnp.sum(w**2)


def _with_intercept(features):
    features = (features - features.mean(0)) / features.std(0)
    return np.hstack([features, np.ones((features.shape[0], 1))])


def problems():
    bc = load_breast_cancer()
    rng = np.random.default_rng(0)
    Xs = rng.normal(size=(20000, 500))
    ys = Xs @ rng.normal(size=500) / np.sqrt(500) + 0.5 * rng.normal(size=20000) > 0
    rosen_x0 = lambda n: jnp.asarray(np.tile([-1.2, 1.0], n // 2))
    return {
        "Rosenbrock chained n=2": (chained_rosenbrock, rosen_x0(2), None),
        "Rosenbrock chained n=100": (chained_rosenbrock, rosen_x0(100), None),
        "Rosenbrock extended n=1000": (extended_rosenbrock, rosen_x0(1000), None),
        "logistic breast_cancer d=31": (
            logistic,
            jnp.zeros(31),
            (jnp.asarray(_with_intercept(bc.data)), jnp.asarray(bc.target, jnp.float64)),
        ),
        "logistic synthetic 20000x500": (
            logistic,
            jnp.zeros(501),
            (jnp.asarray(_with_intercept(Xs)), jnp.asarray(ys, jnp.float64)),
        ),
    }


# ------------------------------------------------------------------------------ runners


def jax_runners(f, p):
    """name -> jitted function x0 -> (x, iterations)."""
    fun = lambda x: f(x, p)

    def optsolve_run(alg):
        def run(x0):
            sol = optsolve.solve(
                optsolve.OptimizationProblem(f, x0, p), alg, gtol=GTOL, maxiters=MAXITER
            )
            return sol.x, sol.stats.iterations

        return run

    def jaxopt_run(x0):
        res = jaxopt.LBFGS(fun=fun, tol=GTOL, maxiter=MAXITER).run(x0)
        return res.params, res.state.iter_num

    def optx_run(solver):
        def run(x0):
            sol = optx.minimise(lambda x, _: fun(x), solver, x0, max_steps=MAXITER, throw=False)
            return sol.value, sol.stats["num_steps"]

        return run

    def optax_run(x0):
        return optax_lbfgs_loop(fun, x0, GTOL, MAXITER)

    def jsp_run(x0):
        res = jax.scipy.optimize.minimize(
            fun, x0, method="BFGS", options={"gtol": GTOL, "maxiter": MAXITER}
        )
        return res.x, res.nit

    tol = 1e-9
    return {
        "optsolve.LBFGS": optsolve_run(optsolve.LBFGS()),
        "optsolve.BFGS": optsolve_run(optsolve.BFGS()),
        "jaxopt.LBFGS": jaxopt_run,
        "optimistix.BFGS": optx_run(optx.BFGS(rtol=tol, atol=tol)),
        "optimistix.LBFGS": optx_run(optx.LBFGS(rtol=tol, atol=tol)),
        "optax.lbfgs": optax_run,
        "jax.scipy BFGS": jsp_run,
    }


def scipy_runner(f, p):
    value_and_grad = jax.jit(jax.value_and_grad(f))

    def fun(x):
        v, g = value_and_grad(x, p)
        return float(v), np.asarray(g)

    def run(x0):
        res = so.minimize(
            fun,
            np.asarray(x0),
            jac=True,
            method="L-BFGS-B",
            options={"gtol": GTOL, "ftol": 0.0, "maxiter": MAXITER},
        )
        return res.x, res.nit

    return run


def counted(f):
    """f with host-side counters: forward = one f evaluation, backward = one gradient."""
    counts = {"f": 0, "g": 0}

    def bump(key):
        def cb():
            counts[key] += 1

        return cb

    @jax.custom_vjp
    def fc(x, p):
        jax.debug.callback(bump("f"))
        return f(x, p)

    def fwd(x, p):
        jax.debug.callback(bump("f"))
        return jax.vjp(f, x, p)

    def bwd(vjp, ct):
        jax.debug.callback(bump("g"))
        return vjp(ct)

    fc.defvjp(fwd, bwd)
    return fc, counts


# ---------------------------------------------------------------------------- measuring


def _time(fn, x0):
    start = time.perf_counter()
    jax.block_until_ready(fn(x0))
    return time.perf_counter() - start


def _time_first(fn, x0):
    """Compile + first solve, from a freshly collected heap: otherwise a full collection of
    the whole process's heap (~0.1 s here, mostly JAX's and the peers' own objects) falls
    into whichever runner's trace happens to trigger it."""
    gc.collect()
    start = time.perf_counter()
    jax.block_until_ready(fn(x0))
    return time.perf_counter() - start


def measure_problem(name, f, x0, p, budget_s=6.0):
    runners = {k: jax.jit(v) for k, v in jax_runners(f, p).items()}
    runners["scipy L-BFGS-B"] = scipy_runner(f, p)
    if x0.size >= 1000:
        runners.pop("jax.scipy BFGS")  # O(n^3) per iteration: ~5 s a solve at n = 1000
    vg = jax.jit(jax.value_and_grad(f))
    rows = {}
    for rname, fn in runners.items():
        first = _time_first(fn, x0)
        x, nit = fn(x0)
        value, grad = vg(jnp.asarray(x), p)
        rows[rname] = {
            "first": first,
            "nit": int(nit),
            "f": float(value),
            "gnorm": float(jnp.max(jnp.abs(grad))),
            "times": [],
        }
    # Compile + first solve of a plain solve() call (no caller jit).
    for rname, alg in (("optsolve.LBFGS", optsolve.LBFGS()), ("optsolve.BFGS", optsolve.BFGS())):
        prob = optsolve.OptimizationProblem(f, x0, p)
        gc.collect()
        start = time.perf_counter()
        optsolve.solve(prob, alg, gtol=GTOL, maxiters=MAXITER)
        rows[rname]["first_solve"] = time.perf_counter() - start
    # Steady state: interleaved turns so machine drift hits every runner alike.
    est = sum(_time(fn, x0) for fn in runners.values())
    repeats = int(min(25, max(9, budget_s / max(est, 1e-9))))
    for _ in range(repeats):
        for rname, fn in runners.items():
            rows[rname]["times"].append(_time(fn, x0))
    # Evaluation counts in a separate, untimed run.
    fc, counts = counted(f)
    count_runners = {k: jax.jit(v) for k, v in jax_runners(fc, p).items()}
    count_runners["scipy L-BFGS-B"] = scipy_runner(fc, p)
    for rname in rows:
        counts["f"] = counts["g"] = 0
        jax.block_until_ready(count_runners[rname](x0))
        rows[rname]["fev"], rows[rname]["gev"] = counts["f"], counts["g"]
    for r in rows.values():
        r["median"] = statistics.median(r["times"])
    return rows, repeats


def _fmt_t(s):
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def warm_up_jax() -> None:
    """Compile and run an unrelated jitted loop first, so that JAX's and XLA's one-time start-up
    is not charged to whichever runner happens to compile first (optsolve's, in the first
    problem). Nothing here is shared with any runner's program."""

    def loop(x):
        def body(c):
            y, k = c
            value, grad = jax.value_and_grad(lambda z: jnp.sum(jnp.cos(z) * z**2))(y)
            return y - 0.1 * grad / (1.0 + value**2), k + 1

        return jax.lax.while_loop(lambda c: c[1] < 10, body, (x, 0))[0]

    jax.block_until_ready(jax.jit(loop)(jnp.linspace(0.0, 1.0, 7)))


def memory_layouts() -> list[str]:
    """optsolve.LBFGS(memory_size=10) with each memory layout forced, around XLA's 512-byte
    sequential-execution limit (where LBFGS switches between them by itself)."""
    try:
        from optsolve.backends.classical import quasi_newton as qn
    except ImportError:  # the layout before the family subpackages (benchmarks/compare.py)
        from optsolve.backends import quasi_newton as qn

    rows = []
    for n in (2, 6, 8):
        x0 = jnp.asarray(np.tile([-1.2, 1.0], n // 2))
        runs = {}
        for layout, limit in (("two-loop", 10**9), ("compact", -1)):
            qn._SEQUENTIAL_BUFFER_BYTES, original = limit, qn._SEQUENTIAL_BUFFER_BYTES
            try:
                jax.clear_caches()  # a fresh trace under the forced layout, compiled ahead
                gc.collect()
                start = time.perf_counter()
                fn = (
                    jax.jit(
                        lambda x: (
                            optsolve.solve(
                                optsolve.OptimizationProblem(chained_rosenbrock, x),
                                optsolve.LBFGS(),
                                gtol=GTOL,
                                maxiters=MAXITER,
                            ).stats.grad_evals
                        )
                    )
                    .lower(x0)
                    .compile()
                )
                gev = int(fn(x0))
                runs[layout] = {
                    "fn": fn,
                    "first": time.perf_counter() - start,
                    "gev": gev,
                    "times": [],
                }
            finally:
                qn._SEQUENTIAL_BUFFER_BYTES = original
        for _ in range(25):
            for r in runs.values():
                r["times"].append(_time(r["fn"], x0))
        two_loop, compact = (statistics.median(r["times"]) for r in runs.values())
        own = optsolve.LBFGS().make_solver(optsolve.OptimizationProblem(chained_rosenbrock, x0))
        chosen = "two-loop" if isinstance(own, qn._TwoLoopLBFGSSolver) else "compact"
        rows.append(
            [
                f"chained Rosenbrock n={n}",
                f"{10 * n * 8} B",
                _fmt_t(two_loop),
                _fmt_t(compact),
                f"{two_loop / compact:.2f}x",
                f"{_fmt_t(runs['two-loop']['first'])} / {_fmt_t(runs['compact']['first'])}",
                f"{runs['two-loop']['gev']} / {runs['compact']['gev']}",
                chosen,
            ]
        )
    jax.clear_caches()
    return [
        "### L-BFGS memory layout around XLA's sequential-execution limit (m = 10)",
        "XLA's CPU runtime runs a loop body's kernels in the calling thread only when every "
        "buffer is at most 512 bytes, otherwise as a dataflow graph on its thread pool. "
        "optsolve.LBFGS keeps its memory as (m, n) arrays for the two-loop recursion while "
        "one fits (m n 8 bytes in float64), else in compact form (m x m matrices). Both "
        "forced here (median of 25 interleaved solves; first = compile + first solve).",
        markdown_table(
            [
                "problem",
                "(m, n) array size",
                "two-loop",
                "compact",
                "two-loop / compact",
                "first (two-loop / compact)",
                "gev",
                "LBFGS() uses",
            ],
            rows,
        ),
    ]


def main() -> str:
    warm_up_jax()
    sections = [
        "## Classical methods: optsolve.LBFGS / BFGS vs JAX and scipy peers",
        "Command: `python benchmarks/bench_classical.py`. Float64; stop at gradient inf-norm "
        "<= 1e-6 or 1000 iterations (jaxopt: 2-norm; optimistix: Cauchy test rtol=atol=1e-9); "
        "f and |g|_inf recomputed at each returned point. *steady*: median of full solves "
        "from x0 (interleaved repeats); *first*: compile + first solve (after an unrelated "
        "warm-up compile, so no runner pays JAX's start-up, and from a freshly collected heap, "
        "so none pays a collection of the whole process's heap). fev/gev: function / "
        "gradient evaluations counted by host callbacks in a separate run. BLAS pinned to 1 "
        "thread (threadpoolctl); JAX threads untouched. Machine: " + machine_line() + ".",
    ]
    summary = []
    for pname, (f, x0, p) in problems().items():
        rows, repeats = measure_problem(pname, f, x0, p)
        # Peers that met the stopping rule (a peer stopped early by failure is not "fast").
        peers = {k: v for k, v in rows.items() if k in JAX_PEERS and v["gnorm"] <= GTOL}
        fastest = min(peers, key=lambda k: peers[k]["median"])
        ref = rows[fastest]["median"]
        table = []
        for rname, r in sorted(rows.items(), key=lambda kv: kv[1]["median"]):
            table.append(
                [
                    rname,
                    _fmt_t(r["median"]),
                    f"{r['median'] / ref:.2f}x",
                    _fmt_t(r["first"]),
                    r["nit"],
                    r["fev"],
                    r["gev"],
                    f"{r['f']:.10g}",
                    f"{r['gnorm']:.1e}" + ("" if r["gnorm"] <= GTOL else " (not converged)"),
                ]
            )
        sections.append(
            f"### {pname} ({repeats} repeats; ratio to the fastest converged JAX peer, {fastest})"
        )
        sections.append(
            markdown_table(
                ["runner", "steady", "ratio", "first", "iters", "fev", "gev", "f", "|g|_inf"], table
            )
        )
        lb = rows["optsolve.LBFGS"]
        median_gev = statistics.median(v["gev"] for v in peers.values())
        quickest = min(peers, key=lambda k: peers[k]["first"])
        summary.append(
            [
                pname,
                f"{lb['median'] / ref:.2f}x",
                f"{lb['gev']} vs {median_gev:g}",
                f"{lb['first']:.2f} s ({lb['first_solve']:.2f} s) vs "
                f"{rows[fastest]['first']:.2f} s ({fastest}); quickest to compile: "
                f"{peers[quickest]['first']:.2f} s ({quickest})",
            ]
        )
        if pname.startswith("Rosenbrock extended"):
            bfgs = {k: rows[k] for k in ("optsolve.BFGS", "optimistix.BFGS")}
        print(sections[-2] + "\n" + sections[-1], flush=True)
    sections.append("### Goals (optsolve.LBFGS)")
    sections.append(
        markdown_table(
            [
                "problem",
                "steady / fastest JAX peer",
                "gradient evals vs median JAX peer",
                "first: optsolve jitted (plain solve()) vs the fastest JAX peer's",
            ],
            summary,
        )
    )
    sections.extend(memory_layouts())
    per = lambda r, k: f"{r['median'] / max(r[k], 1) * 1e3:.3g} ms"
    sections.append("### Dense BFGS at n = 1000 (extended Rosenbrock)")
    sections.append(
        markdown_table(
            ["runner", "per iteration", "per gradient evaluation (= per inverse-Hessian update)"],
            [[k, per(r, "nit"), per(r, "gev")] for k, r in bfgs.items()],
        )
    )
    sections.append(
        "optimistix counts rejected line-search trials as steps, so its time per "
        "gradient evaluation is the like-for-like figure."
    )
    return "\n\n".join(sections)


def only(names: list[str]) -> None:
    """Steady medians of the named problems alone (a quicker, repeatable check of one row):
    ``python benchmarks/bench_classical.py "logistic synthetic 20000x500"``."""
    warm_up_jax()
    for name in names:
        f, x0, p = problems()[name]
        rows, repeats = measure_problem(name, f, x0, p, budget_s=12.0)
        print(f"{name} ({repeats} repeats)")
        for rname, r in sorted(rows.items(), key=lambda kv: statistics.median(kv[1]["times"])):
            print(
                f"  {rname:20s} {_fmt_t(r['median']):>10s}  first {_fmt_t(r['first']):>8s}  "
                f"iters {r['nit']:4d}  gev {r['gev']:4d}  |g|_inf {r['gnorm']:.1e}"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        with threadpool_limits(limits=1):
            only(sys.argv[1:])
        sys.exit()
    with threadpool_limits(limits=1):
        text = main()
    out = Path(__file__).parent.parent / "docs" / "benchmarks-classical.md"
    out.write_text("# Benchmarks: classical methods\n\n" + text + "\n")
    print(text)
    print(f"wrote {out}")
