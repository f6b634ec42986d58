"""The size of each JAX-native method's compiled loop, beside its peers (issues 18 and 37).

Every JAX-native class of the registry has a row (a class without one fails the run: the
rows are checked against ``algorithm_classes()``; the optax family is summarised by Adam).
Each runner is one ``jax.jit``-compiled function of x0 (as in the census), float64:

- minimisers: chained Rosenbrock, n = 10, from (-1.2, 1, ...), ``gtol=1e-6,
  maxiters=1000`` (optimistix: rtol = atol = 1e-9); LBFGS and BFGS with each line search,
  beside optimistix's (backtracking Armijo) and optax.lbfgs (zoom);
- GaussNewton, LevenbergMarquardt: the small curve fit of ``bench_least_squares`` (an
  exponential decay, m = 100, n = 2), beside optimistix's (rtol = atol = 1e-8);
- NewtonRaphson, Broyden: scipy's pressure network (``bench_roots``, 4 unknowns, start
  (1, 1, 1, 1)), beside optimistix.Newton;
- Bisection, Brentq: the root of x^3 - 7 in [0, 4]; Brent, GoldenSection: the minimum of
  (x - 1.5)^2 + sin(3x) on [-3, 3]; beside optimistix.Bisection and optimistix.GoldenSearch;
- InteriorPoint and AugmentedLagrangian: Hock & Schittkowski's problem 71 (4 variables,
  bounds, an inequality and an equality constraint), from (1, 5, 5, 1); no peer
  (optimistix has no constrained solver);
- Adam (1000 steps, learning rate 1e-2) beside a hand-written optax ``fori_loop``;
  Multistart(LBFGS(), 8 starts) in the box [-2, 2]^10.

Deterministic counts per runner, from XLA's optimised HLO (``.compile().as_text()``) and a
profile:

- fused kernels in the loop: the ``fusion`` instructions of the outermost while loop's body
  and condition, with every loop and branch they call (the kernels one iteration may run);
- fused kernels in all: the whole program's (the loop, its set-up and its finish);
- executed thunks per solve: XLA's CPU runtime events that name an HLO op, in a
  ``jax.profiler`` trace of 3 solves, divided by 3 (every kernel, copy, loop and library
  call a solve ran; a count, not a time);
- iterations of the solve (thunks per solve grow with them).

Beside them, the compile time: median [min-max] of 3 compilations (wall clock).

Run: ``python benchmarks/run.py program_size`` (the docs' section), or
``python benchmarks/program_size.py [method prefix ...]`` for some rows (e.g. "L-BFGS").
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import optax  # noqa: E402
import optimistix as optx  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import machine_line, markdown_table, optax_lbfgs_loop  # noqa: E402
from optsolve.solve_api.registry import algorithm_classes  # noqa: E402

PROFILED_SOLVES = 3
COMPILATIONS = 3


def rosenbrock(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def decay(b, data):
    t, y = data
    return b[0] * jnp.exp(-b[1] * t) - y


def pressure_network(Q, k):
    P = k * Q**2
    return jnp.concatenate([P[1:] - P[0], jnp.atleast_1d(Q.sum() - 4.0)])


def cubic(x, p):
    return x**3 - p


def wavy(x, p):
    return (x - p) ** 2 + jnp.sin(3.0 * x)


def hs071(x, p):
    return x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2]


class Runner(NamedTuple):
    fn: Callable  # x0 -> (x, iterations)
    x0: jax.Array


class Row(NamedTuple):
    """One method: optsolve's runner and, where one exists, the peer's (same method, same
    line-search type), and what limits optsolve's count (NOTES_BY_ROW)."""

    method: str
    classes: tuple  # the registry's classes this row stands for
    ours: str
    peer: str | None


def runners() -> dict[str, Runner]:
    x_rosen = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    rosen = optsolve.OptimizationProblem(rosenbrock, x_rosen, 100.0)

    def minimise(alg, **options):
        options = {"gtol": 1e-6, "maxiters": 1000, **options}

        def run(x):
            sol = optsolve.solve(rosen.replace(x0=x), alg, **options)
            return sol.x, sol.stats.iterations

        return Runner(run, x_rosen)

    def optimistix_min(solver, fn=rosenbrock, args=100.0, x0=x_rosen, **kw):
        def run(x):
            sol = optx.minimise(fn, solver, x, args=args, max_steps=1000, throw=False, **kw)
            return sol.value, sol.stats["num_steps"]

        return Runner(run, x0)

    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 4.0, 100)
    data = (jnp.asarray(t), jnp.asarray(2.5 * np.exp(-1.3 * t) + 0.01 * rng.standard_normal(100)))
    b0 = jnp.array([1.0, 0.5])

    def fit(alg):
        def run(b):
            sol = optsolve.solve(optsolve.LeastSquaresProblem(decay, b, data), alg)
            return sol.x, sol.stats.iterations

        return Runner(run, b0)

    def optimistix_fit(solver):
        def run(b):
            sol = optx.least_squares(decay, solver, b, args=data, max_steps=1000, throw=False)
            return sol.value, sol.stats["num_steps"]

        return Runner(run, b0)

    k = jnp.array([1.0, 2.0, 0.5, 3.0])
    q0 = jnp.ones(4)

    def root(alg):
        def run(q):
            sol = optsolve.solve(optsolve.RootProblem(pressure_network, q, k), alg)
            return sol.x, sol.stats.iterations

        return Runner(run, q0)

    def optimistix_root(solver, fn, x0, args, **kw):
        def run(x):
            sol = optx.root_find(fn, solver, x, args=args, max_steps=1000, throw=False, **kw)
            return sol.value, sol.stats["num_steps"]

        return Runner(run, x0)

    def bracketed(alg):
        def run(x):
            sol = optsolve.solve(optsolve.RootProblem(cubic, x, 7.0, bracket=(0.0, 4.0)), alg)
            return sol.x, sol.stats.iterations

        return Runner(run, jnp.array(1.0))

    def scalar(alg):
        def run(x):
            prob = optsolve.OptimizationProblem(wavy, x, 1.5, bounds=(-3.0, 3.0))
            sol = optsolve.solve(prob, alg)
            return sol.x, sol.stats.iterations

        return Runner(run, jnp.array(0.0))

    def optax_adam(x):
        opt = optax.adam(1e-2)

        def step(_, carry):
            params, state = carry
            grad = jax.grad(rosenbrock)(params, 100.0)
            updates, state = opt.update(grad, state, params)
            return optax.apply_updates(params, updates), state

        return jax.lax.fori_loop(0, 1000, step, (x, opt.init(x)))[0], jnp.asarray(1000)

    def multistart(x):
        prob = optsolve.OptimizationProblem(rosenbrock, x, 100.0, bounds=(-2.0, 2.0))
        sol = optsolve.solve(
            prob,
            optsolve.Multistart(optsolve.LBFGS(), 8, jax.random.key(0)),
            gtol=1e-6,
            maxiters=1000,
        )
        return sol.x, sol.stats.iterations

    def constrained(alg):
        cons = [
            optsolve.Constraint(lambda x, p: jnp.prod(x), lower=25.0),
            optsolve.Constraint(lambda x, p: jnp.sum(x**2), lower=40.0, upper=40.0),
        ]

        def run(x):
            prob = optsolve.OptimizationProblem(hs071, x, bounds=(1.0, 5.0), constraints=cons)
            sol = optsolve.solve(prob, alg)
            return sol.x, sol.stats.iterations

        return Runner(run, jnp.array([1.0, 5.0, 5.0, 1.0]))

    bt, zoom = optsolve.Backtracking(), optsolve.Zoom()
    tol = {"rtol": 1e-9, "atol": 1e-9}
    return {
        "optsolve.LBFGS(Backtracking)": minimise(optsolve.LBFGS(linesearch=bt)),
        "optimistix.LBFGS": optimistix_min(optx.LBFGS(**tol)),
        "optsolve.LBFGS(Zoom)": minimise(optsolve.LBFGS(linesearch=zoom)),
        "optax.lbfgs": Runner(
            lambda x: optax_lbfgs_loop(lambda y: rosenbrock(y, 100.0), x, 1e-6, 1000), x_rosen
        ),
        "optsolve.BFGS(Backtracking)": minimise(optsolve.BFGS(linesearch=bt)),
        "optimistix.BFGS": optimistix_min(optx.BFGS(**tol)),
        "optsolve.BFGS(Zoom)": minimise(optsolve.BFGS(linesearch=zoom)),
        "optsolve.NonlinearCG(Backtracking)": minimise(optsolve.NonlinearCG(linesearch=bt)),
        "optimistix.NonlinearCG": optimistix_min(optx.NonlinearCG(**tol)),
        "optsolve.NonlinearCG(Zoom)": minimise(optsolve.NonlinearCG()),
        "optsolve.GradientDescent": minimise(optsolve.GradientDescent()),
        "optsolve.Newton": minimise(optsolve.Newton()),
        "optsolve.TrustRegion": minimise(optsolve.TrustRegion()),
        "optsolve.AdaHessian": minimise(optsolve.AdaHessian(), gtol=None),
        "optsolve.Adam": minimise(optsolve.Adam(1e-2), gtol=None),
        "optax.adam fori_loop": Runner(optax_adam, x_rosen),
        "optsolve.Multistart(LBFGS, 8)": Runner(multistart, x_rosen),
        "optsolve.GaussNewton": fit(optsolve.GaussNewton()),
        "optimistix.GaussNewton": optimistix_fit(optx.GaussNewton(rtol=1e-8, atol=1e-8)),
        "optsolve.LevenbergMarquardt": fit(optsolve.LevenbergMarquardt()),
        "optimistix.LevenbergMarquardt": optimistix_fit(
            optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)
        ),
        "optsolve.NewtonRaphson": root(optsolve.NewtonRaphson()),
        "optimistix.Newton": optimistix_root(
            optx.Newton(rtol=1e-8, atol=1e-8), pressure_network, q0, k
        ),
        "optsolve.Broyden": root(optsolve.Broyden()),
        "optsolve.Bisection": bracketed(optsolve.Bisection()),
        "optimistix.Bisection": optimistix_root(
            optx.Bisection(rtol=1e-10, atol=1e-10),
            cubic,
            jnp.array(1.0),
            7.0,
            options={"lower": 0.0, "upper": 4.0},
        ),
        "optsolve.Brentq": bracketed(optsolve.Brentq()),
        "optsolve.Brent": scalar(optsolve.Brent()),
        "optsolve.GoldenSection": scalar(optsolve.GoldenSection()),
        "optimistix.GoldenSearch": optimistix_min(
            optx.GoldenSearch(rtol=1e-8, atol=1e-8),
            wavy,
            1.5,
            jnp.array(0.0),
            options={"lower": -3.0, "upper": 3.0},
        ),
        "optsolve.InteriorPoint": constrained(optsolve.InteriorPoint()),
        "optsolve.AugmentedLagrangian": constrained(optsolve.AugmentedLagrangian()),
    }


ROWS = [
    Row("L-BFGS, backtracking", ("LBFGS",), "optsolve.LBFGS(Backtracking)", "optimistix.LBFGS"),
    Row("L-BFGS, zoom", ("LBFGS",), "optsolve.LBFGS(Zoom)", "optax.lbfgs"),
    Row("BFGS, backtracking", ("BFGS",), "optsolve.BFGS(Backtracking)", "optimistix.BFGS"),
    Row("BFGS, zoom", ("BFGS",), "optsolve.BFGS(Zoom)", None),
    Row(
        "nonlinear CG, backtracking",
        ("NonlinearCG",),
        "optsolve.NonlinearCG(Backtracking)",
        "optimistix.NonlinearCG",
    ),
    Row("nonlinear CG, zoom", ("NonlinearCG",), "optsolve.NonlinearCG(Zoom)", None),
    Row("gradient descent", ("GradientDescent",), "optsolve.GradientDescent", None),
    Row("Newton-CG", ("Newton",), "optsolve.Newton", None),
    Row("trust region (Steihaug)", ("TrustRegion",), "optsolve.TrustRegion", None),
    Row("AdaHessian, 1000 steps", ("AdaHessian",), "optsolve.AdaHessian", None),
    Row("optax family: Adam, 1000 steps", ("optax",), "optsolve.Adam", "optax.adam fori_loop"),
    Row("Multistart", ("Multistart",), "optsolve.Multistart(LBFGS, 8)", None),
    Row("Gauss-Newton", ("GaussNewton",), "optsolve.GaussNewton", "optimistix.GaussNewton"),
    Row(
        "Levenberg-Marquardt",
        ("LevenbergMarquardt",),
        "optsolve.LevenbergMarquardt",
        "optimistix.LevenbergMarquardt",
    ),
    Row(
        "Newton-Raphson (roots)", ("NewtonRaphson",), "optsolve.NewtonRaphson", "optimistix.Newton"
    ),
    Row("Broyden (roots)", ("Broyden",), "optsolve.Broyden", None),
    Row("bisection", ("Bisection",), "optsolve.Bisection", "optimistix.Bisection"),
    Row("Brent's root finder", ("Brentq",), "optsolve.Brentq", None),
    Row("Brent's minimiser", ("Brent",), "optsolve.Brent", None),
    Row("golden section", ("GoldenSection",), "optsolve.GoldenSection", "optimistix.GoldenSearch"),
    Row("interior point (HS071)", ("InteriorPoint",), "optsolve.InteriorPoint", None),
    Row(
        "augmented Lagrangian (HS071)",
        ("AugmentedLagrangian",),
        "optsolve.AugmentedLagrangian",
        None,
    ),
]

# What limits each optsolve count, read in the loop's optimised HLO
# (``jax.jit(fn).lower(x0).compile().as_text()``) and the profile's thunk names.
_DRIVER = (
    "the driver's tests of every step (finiteness of f, g and x and the gradient "
    "norm, which the line-search methods hand it from one reduction with their "
    "tiny-step test; the status and reason, the best-so-far values (one array) and "
    "the idle counter: about 7 kernels)"
)
_TRIAL = (
    "the line search's first trial made before its loop (f, g and the tests twice in "
    "the program): entering the loop every iteration instead measured 10 more "
    "executed thunks per iteration"
)
LIMITS: dict[str, str] = {
    "optsolve.LBFGS(Backtracking)": (
        f"{_TRIAL}; {_DRIVER}; the compact memory's products (5 reductions) and its update "
        "(one select per model array: the memory, R^-1 and Y^T Y stacked, D and gamma, the "
        "count). optimistix makes one trial per outer step, with no inner loop and no "
        "per-step finiteness test"
    ),
    "optsolve.LBFGS(Zoom)": (
        f"the zoom search's bracket and cubic (one loop: the trial's 4 kernels, the "
        f"finiteness of its point, 2 selects of the best point and its gradient, 6 kernels "
        f"of scalars, the bracket's two ends and the steps being one (3, 3) array); "
        f"{_DRIVER}"
    ),
    "optsolve.BFGS(Backtracking)": (
        f"{_TRIAL}; {_DRIVER}. optimistix.BFGS's loop is one trial a step, its update behind "
        "a conditional: a different structure, not more arithmetic"
    ),
    "optsolve.BFGS(Zoom)": f"the zoom search's bracket and cubic; {_DRIVER}",
    "optsolve.NonlinearCG(Backtracking)": (
        f"{_TRIAL}; {_DRIVER}; beta's four products. At maxiters here, as optimistix"
    ),
    "optsolve.NonlinearCG(Zoom)": f"the zoom search; {_DRIVER}",
    "optsolve.GradientDescent": f"{_TRIAL}; {_DRIVER}. At maxiters on Rosenbrock",
    "optsolve.Newton": (
        f"truncated CG's loop on Hessian products (forward over reverse), "
        f"inside each iteration; {_DRIVER}"
    ),
    "optsolve.TrustRegion": f"Steihaug-CG's loop and the radius update; {_DRIVER}",
    "optsolve.AdaHessian": (
        f"a Hutchinson probe (random vector, Hessian product) every step, and {_DRIVER}"
    ),
    "optsolve.Adam": (
        "the driver's per-step tests and counts on optax's update, against a "
        "bare fori_loop with none"
    ),
    "optsolve.Multistart(LBFGS, 8)": "LBFGS's loop under vmap, and the pick of the best run",
    "optsolve.GaussNewton": (
        f"the SVD least-squares solve of J d = -r, {_TRIAL}, and "
        f"{_DRIVER}; optimistix solves by QR, one trial a step"
    ),
    "optsolve.LevenbergMarquardt": (
        "Moré's trial loop inside each iteration (the SVD of R D^-1 before it; in it the "
        "secular equation's search behind a conditional on the Gauss-Newton step fitting, "
        "the trial's residuals, their sum of squares (3 kernels: partial sums of 32, then "
        "their sum) and the radius update, its scalars packed in one array), the QR of "
        f"[J | r] behind a conditional on acceptance, and {_DRIVER}"
    ),
    "optsolve.NewtonRaphson": (
        "the scaled LU solve, its SVD (damped step) fallback, the "
        f"line search on |F|^2, and {_DRIVER}"
    ),
    "optsolve.Broyden": (
        "the solve with the secant matrix B and its rank-one update, the "
        "restart from the true Jacobian (LU and SVD), the line search on "
        f"|F|^2, and {_DRIVER}"
    ),
    "optsolve.Bisection": (
        "the bracket's midpoint and sign test; the whole loop is one "
        "kernel (XLA's small-loop pass), as optimistix's"
    ),
    "optsolve.Brentq": (
        "Brent's interpolation and bisection safeguards, and the driver's "
        "tests: a loop of scalars just above the 1 kB that XLA's small-loop "
        "pass compiles as one kernel, so it runs thunk by thunk"
    ),
    "optsolve.Brent": (
        "the parabolic step and golden-section fallback, and the driver's "
        "tests: just above the small-loop pass's 1 kB, as Brentq"
    ),
    "optsolve.GoldenSection": (
        "one evaluation a step and the driver's tests; the whole loop "
        "is one kernel (XLA's small-loop pass), as "
        "optimistix.GoldenSearch's: its fused kernels are counted "
        "before that pass"
    ),
    "optsolve.InteriorPoint": (
        "the KKT system's factorisation with inertia correction, the "
        "filter line search and the restoration phase, in one loop"
    ),
    "optsolve.AugmentedLagrangian": (
        "a whole inner L-BFGS run (its own loop and line "
        "search) inside each outer step, and the multiplier and "
        "penalty updates"
    ),
}


NOTES = (
    "How to read it. A fused kernel is one `fusion` of XLA's optimised HLO; on the CPU "
    "backend each runs as one thunk, as do copies, loops, conditionals, matrix products and "
    "LAPACK calls. The loop's kernels are what compilation grows with; the executed thunks "
    "are what a small solve's time follows (on problems this small each thunk's launch "
    "costs more than its arithmetic). Kernels come from reductions (each reduction of a vector "
    "ends a kernel, though XLA fuses reductions of one operand into one), from every value "
    "the loop carries (each carried array is written by its own kernel, one per pytree "
    "leaf), and from divisions and square roots shared by several of them (XLA does not "
    "duplicate them into their consumers). optimistix's quasi-Newton loops make one "
    "line-search trial per outer step, with no inner loop, and test finiteness only at the "
    "end; optsolve's driver tests every step (non-finite values, stalls, the status and "
    "its reason), and its line searches are loops inside the iteration. XLA's CPU backend "
    "compiles a whole while loop as one kernel (its small-while-loop pass) where the loop "
    "touches under 1 kB per iteration and holds no matrix product, custom call or scatter: "
    "the scalar methods' rows; a reduction in the loop's status logic (jnp.select's argmax) "
    "kept GoldenSection out of it until 2026-12-06 (958 executed thunks per solve then)."
)


def check_every_class_has_a_row(fail: bool = True) -> None:
    """Fail loudly where a JAX-native class of the registry has no row (only warn when
    ``fail`` is False: a run of a few rows)."""
    covered = {c for row in ROWS for c in row.classes}
    missing = [
        cls.__name__
        for cls in algorithm_classes()
        if cls.family != "scipy"
        and cls.__name__ not in covered
        and not (cls.family == "optax" and "optax" in covered)
    ]
    if missing:
        message = (
            f"program_size: no row for the JAX-native class(es) {', '.join(missing)}: "
            "add one to ROWS (and its runner)."
        )
        if fail:
            raise SystemExit(message)
        print("warning:", message, file=sys.stderr)


# ---------------------------------------------------------------------- the HLO's counts

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
_FUSION = re.compile(r"^\s*(?:ROOT )?%?\S+ = .*? fusion\(")
_CALLED = re.compile(
    r"(?:condition|body|to_apply|true_computation|false_computation)=%?"
    r"([\w.\-]+)|branch_computations=\{([^}]*)\}"
)


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """The module's computations, name -> instruction lines, and the entry's name."""
    comps, entry, current = {}, None, None
    for line in text.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            current = match.group(1)
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif line.startswith("}"):
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps, entry


def _callees(line: str) -> list[str]:
    """Computations an instruction runs as control flow (not a fusion's own body)."""
    if " fusion(" in line:
        return []
    names = []
    for single, branches in _CALLED.findall(line):
        names += [single] if single else [b.strip().lstrip("%") for b in branches.split(",")]
    return names


def _fusions(comps: dict, name: str, seen: set | None = None) -> int:
    """Fusions in computation ``name`` and every computation it runs."""
    seen = set() if seen is None else seen
    if name in seen or name not in comps:
        return 0
    seen.add(name)
    return sum(
        bool(_FUSION.match(line)) + sum(_fusions(comps, c, seen) for c in _callees(line))
        for line in comps[name]
    )


def loop_kernels(text: str) -> tuple[int, int]:
    """(fused kernels of the outermost while loop, fused kernels of the whole program). The
    loop is the outermost while with the most kernels (the solve's; others run set-up)."""
    comps, entry = _computations(text)
    best = 0

    def outer_whiles(name, seen):
        nonlocal best
        if name in seen or name not in comps:
            return
        seen.add(name)
        for line in comps[name]:
            if " while(" in line:
                called = _callees(line)
                best = max(best, sum(_fusions(comps, c) for c in called))
            else:
                for c in _callees(line):
                    outer_whiles(c, seen)

    outer_whiles(entry, set())
    return best, _fusions(comps, entry)


def executed_thunks(compiled, x0) -> int:
    """Thunks XLA's CPU runtime executed per call, from a profile of PROFILED_SOLVES calls."""
    jax.block_until_ready(compiled(x0))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(PROFILED_SOLVES):
                jax.block_until_ready(compiled(x0))
        (path,) = Path(tmp).glob("**/perfetto_trace.json.gz")
        with gzip.open(path) as trace:
            events = json.load(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    count = sum(1 for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {}))
    return round(count / PROFILED_SOLVES)


def measure(runner: Runner) -> dict:
    times = []
    for _ in range(COMPILATIONS):
        jax.clear_caches()  # else a second compilation of the same module is a cache hit
        lowered = jax.jit(runner.fn).lower(runner.x0)
        start = time.perf_counter()
        compiled = lowered.compile()
        times.append(time.perf_counter() - start)
    loop, total = loop_kernels(compiled.as_text())
    iterations = int(compiled(runner.x0)[1])
    return {
        "loop": loop,
        "total": total,
        "thunks": executed_thunks(compiled, runner.x0),
        "iterations": iterations,
        "compile": times,
    }


def _time(ts: list[float]) -> str:
    return f"{statistics.median(ts):.2f} [{min(ts):.2f}-{max(ts):.2f}]"


def main(only: list[str] | None = None) -> str:
    """The section; ``only``: the methods (ROWS' first column, or a prefix) to measure."""
    check_every_class_has_a_row(fail=only is None)
    all_runners = runners()
    chosen = [row for row in ROWS if only is None or any(row.method.startswith(o) for o in only)]
    names = [n for row in chosen for n in (row.ours, row.peer) if n is not None]
    results = {name: measure(all_runners[name]) for name in dict.fromkeys(names)}
    rows = []
    for row in chosen:
        ours = results[row.ours]
        peer = results[row.peer] if row.peer else None
        rows.append(
            [
                row.method,
                row.ours.removeprefix("optsolve."),
                str(ours["loop"]),
                str(ours["total"]),
                str(ours["thunks"]),
                str(ours["iterations"]),
                row.peer or "-",
                str(peer["loop"]) if peer else "-",
                str(peer["thunks"]) if peer else "-",
                str(peer["iterations"]) if peer else "-",
                _time(ours["compile"]),
                _time(peer["compile"]) if peer else "-",
                LIMITS.get(row.ours, ""),
            ]
        )
    return "\n".join(
        [
            "### Program size: fused kernels and executed thunks of every JAX-native method",
            "",
            "Command: `python benchmarks/run.py program_size`. " + machine_line() + ".",
            "",
            markdown_table(
                [
                    "method",
                    "optsolve runner",
                    "fused kernels in the loop",
                    "fused kernels in all",
                    "executed thunks per solve",
                    "iterations",
                    "peer (same method and line search)",
                    "peer's fused kernels in the loop",
                    "peer's executed thunks per solve",
                    "peer's iterations",
                    "compile (s)",
                    "peer's compile (s)",
                    "what limits it",
                ],
                rows,
            ),
            "",
            f"Problems and counts as in `benchmarks/program_size.py`'s docstring: kernels from "
            f"XLA's optimised HLO, thunks from a profile of {PROFILED_SOLVES} solves, compile "
            f"times median [min-max] of {COMPILATIONS} compilations. The counts are the "
            "measure; the compile times move with the machine's load.",
        ]
    )


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(main(sys.argv[1:] or None))
