"""The constrained census (issue 39): sif2jax's constrained CUTEst problems through scipy's
SLSQP and trust-constr (fed jitted derivatives, and through optsolve.ScipyMinimize), IPOPT
(cyipopt, exact and limited-memory Hessians), slsqp-jax and, once it exists,
optsolve.InteriorPoint; and the bounds-only set through optsolve.LBFGS against scipy's
L-BFGS-B.

Problems: ``sif2jax.constrained_minimisation_problems`` with n <= ``--max-n`` (20 by
default), float64, each in sif2jax's form: ``objective(y, args)``, ``constraint(y) ->
(equalities, inequalities >= 0)``, optional bounds. A problem that does not evaluate, or
whose objective, constraints or their derivatives are not finite at y0, is left out (listed).

Runners (each with a 1000-iteration budget and otherwise its own default tolerances):
  * scipy SLSQP and scipy trust-constr fed ``jax.jit``-compiled objective, gradient,
    constraints and Jacobians (trust-constr also the Hessians of the objective and of
    each constraint block weighted by its multipliers, i.e. the Lagrangian's);
  * optsolve.ScipyMinimize("SLSQP") and ("trust-constr"): ``solve(prob, alg,
    maxiters=1000)`` with ``Constraint(eq, 0, 0)`` and ``Constraint(ineq, 0, inf)``;
  * IPOPT 3.14 through cyipopt with jitted derivatives: exact Hessian of the Lagrangian
    (dense lower triangle), and ``hessian_approximation=limited-memory``; ``max_iter`` 1000,
    tol 1e-8 (its default); Solve_Succeeded and Solved_To_Acceptable_Level count as
    claimed success;
  * slsqp-jax's SLSQP through ``optimistix.minimise``, jitted, ``max_steps`` 1000;
  * optsolve.InteriorPoint() and optsolve.AugmentedLagrangian(), jitted (the latter with its
    own budget of 100 outer iterations, each an inner L-BFGS run of up to 1000).

Per problem and runner: compile + first solve, the steady median of the solves after the
first (up to ``--repeats``, fewer once they pass ``STEADY_BUDGET`` seconds), the objective
and the largest violation recomputed at the returned point, whether it claimed success,
and its objective evaluations (scipy's nfev, optsolve's f_evals, IPOPT's objective
callbacks counted here; slsqp-jax reports none, so its column counts SQP steps).

The violation is absolute: max(|c_eq|, max(0, -c_ineq), lower - x, x - upper) over every
entry (sif2jax's constraints are all "= 0" or ">= 0", so an absolute test is the same as one
relative to 1 + |bound| on them; on the variable bounds it is the stricter of the two).
A run is *feasible* when its violation is <= 1e-6 and *solved* when it is feasible and its
objective is within 1e-6 (1 + |f*|) of f*, the lowest objective any runner reached at a
feasible point. A *false SUCCESS* claims success at a point that is not solved (infeasible,
or feasible but not at f*). Steady times are compared on the problems every runner solved.
A runner gets ``TIME_LIMIT`` seconds per solve where it can be told (scipy's callback,
IPOPT's max_wall_time, optsolve's maxtime); past it the run counts as unsolved. Every
runner's whole measurement of a problem (compile, first solve and repeats) also runs in a
child process that is killed after ``--runner-timeout`` seconds (``RUNNER_TIMEOUT``, 300 by
default), the same kind of time-limit record: the jitted runners cannot be told a limit.

sif2jax's inequalities are taken as its documentation states them, ">= 0"; a few of its
problems write a "<=" row as LHS - RHS (HS76: pycutest's convention), so those problems
differ from CUTEst's, the same for every runner.

Problems are dealt to ``--jobs`` processes (2 by default), each measuring all runners of a
problem in turn (through one measuring child process, replaced after a kill). ``--only``
keeps the runners whose names contain one of its words, ``--raw`` writes every record (and
each worker's records as it goes, ``RAW.SET.I.jsonl``), and ``--from-raw`` makes the
sections from such files without running anything, merging the runners of separate runs per
problem; ``--images`` names the profiles' folder (docs/images by default). The records
docs/benchmarks.md's two tables are made from are kept in benchmarks/results
(constrained_census.jsonl, bounded_census.jsonl; see its README.md): ``--from-raw`` on them
makes those sections again.

Run: ``python benchmarks/bench_constrained.py [--max-n 20] [--quick] [--limit K]
[--set both] [--jobs 2]`` or ``python benchmarks/run.py constrained``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import scipy.optimize as so  # noqa: E402
import sif2jax  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import optsolve  # noqa: E402
from common import block, machine_line, markdown_table, performance_profile  # noqa: E402

MAXITER = 1000
FEAS_TOL, F_TOL = 1e-6, 1e-6
TIME_LIMIT = 10.0  # seconds a single solve may take where the runner can be told
STEADY_BUDGET = 0.5  # seconds of repeated solves per runner and problem
RUNNER_TIMEOUT = 300.0  # seconds a runner's whole measurement of a problem may take (killed)
IMAGES = Path(__file__).parent.parent / "docs" / "images"
# A smoke subset for --quick: Hock-Schittkowski problems with equalities, inequalities,
# bounds, and one infeasible start each.
QUICK = ("HS6", "HS7", "HS10", "HS14", "HS21", "HS35", "HS71", "HS76", "HS100", "HS118")


class TimeUp(Exception):
    """Raised from a host runner's callback when a solve passes TIME_LIMIT."""


@dataclasses.dataclass
class Case:
    """One sif2jax problem in flat float64 form."""

    name: str
    x0: np.ndarray
    f: Callable  # f(x) -> scalar
    c_eq: Callable  # c_eq(x) -> (m_eq,), == 0
    c_in: Callable  # c_in(x) -> (m_in,), >= 0
    m_eq: int
    m_in: int
    lower: np.ndarray  # -inf where unbounded
    upper: np.ndarray

    @property
    def has_bounds(self) -> bool:
        return bool(np.any(np.isfinite(self.lower)) or np.any(np.isfinite(self.upper)))

    def c_all(self, x):
        return jnp.concatenate([self.c_eq(x), self.c_in(x)])


def _flat(tree) -> jax.Array:
    if tree is None:
        return jnp.zeros((0,), jnp.float64)
    leaves = [jnp.ravel(jnp.asarray(leaf, jnp.float64)) for leaf in jax.tree_util.tree_leaves(tree)]
    return jnp.concatenate(leaves) if leaves else jnp.zeros((0,), jnp.float64)


def convert(problem) -> Case:
    """The problem as a :class:`Case`; raises where sif2jax cannot evaluate it."""
    x0 = np.asarray(problem.y0, np.float64)
    if x0.ndim != 1:
        raise ValueError(f"y0 of shape {x0.shape}")
    args = problem.args

    def f(x):
        return jnp.asarray(problem.objective(x, args), jnp.float64)

    # bounded-only problems have no constraint method
    constraint = getattr(problem, "constraint", lambda x: (None, None))

    def c_eq(x):
        return _flat(constraint(x)[0])

    def c_in(x):
        return _flat(constraint(x)[1])

    eq0, in0 = np.asarray(c_eq(x0)), np.asarray(c_in(x0))
    n = x0.size
    lower, upper = np.full(n, -np.inf), np.full(n, np.inf)
    if problem.bounds is not None:
        lower = np.broadcast_to(np.asarray(problem.bounds[0], np.float64), (n,)).copy()
        upper = np.broadcast_to(np.asarray(problem.bounds[1], np.float64), (n,)).copy()
    return Case(problem.name, x0, f, c_eq, c_in, eq0.size, in0.size, lower, upper)


def violation(case: Case, x: np.ndarray) -> float:
    """The largest absolute violation of the constraints and bounds at x (inf if not finite)."""
    x = np.asarray(x, np.float64)
    eq, ineq = np.asarray(case.c_eq(x)), np.asarray(case.c_in(x))
    parts = [np.abs(eq), -ineq, case.lower - x, x - case.upper]
    values = np.concatenate([np.ravel(p) for p in parts] + [np.zeros(1)])
    with np.errstate(invalid="ignore"):
        return (
            float(np.max(values)) if np.all(np.isfinite(np.concatenate([eq, ineq, x]))) else np.inf
        )


# ------------------------------------------------------------------------------- runners
# Each maker takes a Case and returns run(x0) -> (x, claimed success, evaluations). Every
# maker jits its own functions, so a runner's compile + first includes its compilations.


def _jitted(case: Case) -> dict:
    f, c_eq, c_in = case.f, case.c_eq, case.c_in
    return {
        "f": jax.jit(f),
        "g": jax.jit(jax.grad(f)),
        "ceq": jax.jit(c_eq),
        "jeq": jax.jit(jax.jacfwd(c_eq)),
        "cin": jax.jit(c_in),
        "jin": jax.jit(jax.jacfwd(c_in)),
        "hf": jax.jit(jax.hessian(f)),
        "heq": jax.jit(jax.hessian(lambda x, v: v @ c_eq(x))),
        "hin": jax.jit(jax.hessian(lambda x, v: v @ c_in(x))),
    }


def _box(case: Case):
    return so.Bounds(case.lower, case.upper) if case.has_bounds else None


def _deadline_callback():
    start = time.perf_counter()

    def callback(*_):
        if time.perf_counter() - start > TIME_LIMIT:
            raise TimeUp

    return callback


def scipy_slsqp(case: Case):
    j = _jitted(case)
    cons = []
    if case.m_eq:
        cons.append(
            {
                "type": "eq",
                "fun": lambda x: np.asarray(j["ceq"](x)),
                "jac": lambda x: np.asarray(j["jeq"](x)),
            }
        )
    if case.m_in:
        cons.append(
            {
                "type": "ineq",
                "fun": lambda x: np.asarray(j["cin"](x)),
                "jac": lambda x: np.asarray(j["jin"](x)),
            }
        )

    def run(x0):
        try:
            res = so.minimize(
                lambda x: float(j["f"](x)),
                x0,
                jac=lambda x: np.asarray(j["g"](x)),
                method="SLSQP",
                bounds=_box(case),
                constraints=cons,
                options={"maxiter": MAXITER},
                callback=_deadline_callback(),
            )
        except TimeUp:
            return None
        return res.x, bool(res.success), int(res.nfev)

    return run


def scipy_trust_constr(case: Case):
    j = _jitted(case)
    cons = []
    if case.m_eq:
        cons.append(
            so.NonlinearConstraint(
                lambda x: np.asarray(j["ceq"](x)),
                0.0,
                0.0,
                jac=lambda x: np.asarray(j["jeq"](x)),
                hess=lambda x, v: np.asarray(j["heq"](x, v)),
            )
        )
    if case.m_in:
        cons.append(
            so.NonlinearConstraint(
                lambda x: np.asarray(j["cin"](x)),
                0.0,
                np.inf,
                jac=lambda x: np.asarray(j["jin"](x)),
                hess=lambda x, v: np.asarray(j["hin"](x, v)),
            )
        )

    def run(x0):
        start = time.perf_counter()
        res = so.minimize(
            lambda x: float(j["f"](x)),
            x0,
            jac=lambda x: np.asarray(j["g"](x)),
            hess=lambda x: np.asarray(j["hf"](x)),
            method="trust-constr",
            bounds=_box(case),
            constraints=cons,
            options={"maxiter": MAXITER},
            callback=lambda *_: time.perf_counter() - start > TIME_LIMIT,
        )
        if res.status == 3:  # stopped by the deadline
            return None
        return res.x, bool(res.success), int(res.nfev)

    return run


def optsolve_method(make_alg: Callable[[], object], jitted: bool, maxiters: int | None = None):
    maxiters = MAXITER if maxiters is None else maxiters

    def make(case: Case):
        constraints = []
        if case.m_eq:
            constraints.append(optsolve.Constraint(lambda x, p: case.c_eq(x), 0.0, 0.0))
        if case.m_in:
            constraints.append(optsolve.Constraint(lambda x, p: case.c_in(x), 0.0, jnp.inf))
        bounds = (jnp.asarray(case.lower), jnp.asarray(case.upper)) if case.has_bounds else None
        alg = make_alg()
        # one objective function for every solve: optsolve's scipy path caches its compiled
        # evaluations per problem function, as a user's repeated solves would hit them
        objective = lambda x, p: case.f(x)

        def solve(x0):
            prob = optsolve.OptimizationProblem(
                objective, x0, None, bounds=bounds, constraints=constraints or None
            )
            opts = {} if jitted else {"maxtime": TIME_LIMIT}
            sol = optsolve.solve(prob, alg, maxiters=maxiters, **opts)
            return (
                sol.x,
                sol.retcode == optsolve.ReturnCode.SUCCESS,
                sol.stats.f_evals,
                sol.retcode == optsolve.ReturnCode.MAXTIME,
            )

        if jitted:
            solve = jax.jit(solve)

        def run(x0):
            x, claimed, evals, timed_out = block(solve(jnp.asarray(x0)))
            if bool(timed_out):
                return None
            return np.asarray(x), bool(claimed), int(evals)

        return run

    return make


def ipopt(limited_memory: bool):
    def make(case: Case):
        import cyipopt

        j = _jitted(case)
        n, m = case.x0.size, case.m_eq + case.m_in
        c_all = jax.jit(case.c_all)
        jac_all = jax.jit(jax.jacfwd(case.c_all))
        hess_lag = jax.jit(jax.hessian(lambda x, lam, s: s * case.f(x) + lam @ case.c_all(x)))
        rows, cols = np.tril_indices(n)
        jrows, jcols = np.indices((m, n)).reshape(2, -1)
        counts = {"f": 0}

        class Nlp:
            def objective(self, x):
                counts["f"] += 1
                return float(j["f"](x))

            def gradient(self, x):
                return np.asarray(j["g"](x))

            def constraints(self, x):
                return np.asarray(c_all(x))

            def jacobian(self, x):
                return np.asarray(jac_all(x)).ravel()

            def jacobianstructure(self):
                return jrows, jcols

            def hessianstructure(self):
                return rows, cols

            def hessian(self, x, lagrange, obj_factor):
                return np.asarray(hess_lag(x, lagrange, obj_factor))[rows, cols]

        big = 1e20  # IPOPT reads |bound| >= 1e19 as none
        lb, ub = np.nan_to_num(case.lower, neginf=-big), np.nan_to_num(case.upper, posinf=big)
        cl = np.zeros(m)
        cu = np.concatenate([np.zeros(case.m_eq), np.full(case.m_in, big)])

        def run(x0):
            counts["f"] = 0
            nlp = cyipopt.Problem(n=n, m=m, problem_obj=Nlp(), lb=lb, ub=ub, cl=cl, cu=cu)
            nlp.add_option("print_level", 0)
            nlp.add_option("sb", "yes")
            nlp.add_option("max_iter", MAXITER)
            nlp.add_option("max_wall_time", TIME_LIMIT)
            if limited_memory:
                nlp.add_option("hessian_approximation", "limited-memory")
            x, info = nlp.solve(np.asarray(x0, np.float64))
            if info["status"] == -4:  # max_wall_time exceeded
                return None
            return x, info["status"] in (0, 1), counts["f"]

        return run

    return make


def slsqp_jax_runner(case: Case):
    import optimistix as optx
    from slsqp_jax import SLSQP, SLSQPConfig, ToleranceConfig

    bounds = np.stack([case.lower, case.upper], axis=1) if case.has_bounds else None
    solver = SLSQP(
        eq_constraint_fn=(lambda x, _: case.c_eq(x)) if case.m_eq else None,
        n_eq_constraints=case.m_eq,
        ineq_constraint_fn=(lambda x, _: case.c_in(x)) if case.m_in else None,
        n_ineq_constraints=case.m_in,
        bounds=bounds,
        config=SLSQPConfig(tolerance=ToleranceConfig(max_steps=MAXITER)),
    )

    @jax.jit
    def solve(x0):
        sol = optx.minimise(
            lambda x, _: (case.f(x), None), solver, x0, has_aux=True, max_steps=MAXITER, throw=False
        )
        return sol.value, sol.result == optx.RESULTS.successful, sol.stats["num_steps"]

    def run(x0):
        x, claimed, steps = block(solve(jnp.asarray(x0)))
        return np.asarray(x), bool(claimed), int(steps)

    return run


def constrained_runners() -> dict:
    out = {
        "scipy SLSQP (jitted derivatives)": scipy_slsqp,
        'optsolve ScipyMinimize("SLSQP")': optsolve_method(
            lambda: optsolve.ScipyMinimize("SLSQP"), jitted=False
        ),
        "scipy trust-constr (jitted derivatives)": scipy_trust_constr,
        'optsolve ScipyMinimize("trust-constr")': optsolve_method(
            lambda: optsolve.ScipyMinimize("trust-constr"), jitted=False
        ),
    }
    try:
        import cyipopt  # noqa: F401

        out["IPOPT (cyipopt, exact Hessian)"] = ipopt(False)
        out["IPOPT (cyipopt, limited-memory)"] = ipopt(True)
    except ImportError:
        print("cyipopt is not installed: IPOPT left out", file=sys.stderr)
    try:
        import slsqp_jax  # noqa: F401

        out["slsqp-jax"] = slsqp_jax_runner
    except ImportError:
        print("slsqp-jax is not installed: left out", file=sys.stderr)
    if hasattr(optsolve, "InteriorPoint"):
        out["optsolve.InteriorPoint"] = optsolve_method(
            lambda: optsolve.InteriorPoint(), jitted=True
        )
    if hasattr(optsolve, "AugmentedLagrangian"):
        # its iterations are outer ones, each a whole inner run: its own budget of 100
        out["optsolve.AugmentedLagrangian"] = optsolve_method(
            lambda: optsolve.AugmentedLagrangian(),
            jitted=True,
            maxiters=optsolve.AugmentedLagrangian.default_maxiters,
        )
    return out


# ------------------------------------------------------------------------------- measuring


def measure_runner(case: Case, make, repeats: int) -> dict:
    """One runner's record on one case."""
    start = time.perf_counter()
    try:
        run = make(case)
        out = run(case.x0.copy())
    except Exception as err:  # a runner that raises has not solved the problem
        return {"error": f"{type(err).__name__}: {str(err)[:100]}"}
    first = time.perf_counter() - start
    if out is None:
        return {"timeout": True, "first": first}
    x, claimed, evals = out
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run(case.x0.copy())
        times.append(time.perf_counter() - t)
        if sum(times) > STEADY_BUDGET:
            break
    x = np.asarray(x, np.float64)
    fx = float(case.f(x)) if np.all(np.isfinite(x)) else np.nan
    return {
        "first": first,
        "steady": statistics.median(times) if times else first,
        "f": fx,
        "viol": violation(case, x),
        "claimed": claimed,
        "evals": evals,
    }


def _serve(conn, kind: str, repeats: int) -> None:
    """A measuring process: answers each (problem name, runner name) sent on ``conn`` with
    that runner's record, until it is sent None; a problem's Case is kept for its runners."""
    from sif2jax.cutest import get_problem

    case = None
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn.send("ready")
        while (task := conn.recv()) is not None:
            name, runner = task
            try:
                if case is None or case.name != name:
                    case = None
                    case = _prepare(get_problem(name), kind)
                record = measure_runner(case, _makers(kind, case)[runner], repeats)
            except Exception as err:
                record = {"error": f"{type(err).__name__}: {str(err)[:100]}"}
            conn.send(record)


class Measurer:
    """Measures one runner on one problem at a time in a child process (started on first use,
    'spawn'), which is killed once a measurement passes ``timeout`` seconds: that measurement
    is a time-limit record and the next one starts a fresh process."""

    def __init__(self, kind: str, repeats: int, timeout: float):
        self.kind, self.repeats, self.timeout = kind, repeats, timeout
        self.proc = self.conn = None

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # not fork: JAX runs threads here
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.kind, self.repeats), daemon=True)
        self.proc.start()
        child.close()
        self.conn.recv()  # "ready": its imports (sif2jax's take half a minute) are not timed

    def _kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()
        self.proc = self.conn = None

    def measure(self, name: str, runner: str) -> dict:
        # a child process: a jitted runner can be neither told a time limit nor interrupted
        if self.proc is None:
            self._start()
        start = time.perf_counter()
        self.conn.send((name, runner))
        try:
            if self.conn.poll(self.timeout):
                return self.conn.recv()
            record = {"timeout": True, "first": time.perf_counter() - start}
        except EOFError:  # it died (a crash in a runner's native code)
            self.proc.join()
            record = {"error": f"its process died (exit code {self.proc.exitcode})"}
        self._kill()
        return record

    def close(self) -> None:
        if self.proc is not None:
            self.conn.send(None)
            self.proc.join(30)
            self._kill()


def feasible(record: dict) -> bool:
    return "f" in record and np.isfinite(record["f"]) and record["viol"] <= FEAS_TOL


def best_feasible(records: dict, bar: float = FEAS_TOL) -> float:
    """The lowest objective among the records feasible to ``bar`` (at most FEAS_TOL), or
    among those feasible to FEAS_TOL where none is feasible to ``bar``."""
    fs = [r["f"] for r in records.values() if feasible(r) and r["viol"] <= bar]
    if not fs and bar < FEAS_TOL:
        return best_feasible(records)
    return min(fs) if fs else np.nan


def stricter_bars(results: dict, names: list[str]) -> str:
    """Solved and false SUCCESS counts with the best objective taken only over points
    feasible to 1e-8 and 1e-9 ("solved" still feasible to FEAS_TOL): a point outside the
    constraints by a tolerated violation can sit below the exact optimum."""
    parts = []
    for bar in (1e-8, 1e-9):
        counts = []
        for n in names:
            bests = {p: best_feasible(r, bar) for p, r in results.items()}
            n_solved = sum(solved(r[n], bests[p]) for p, r in results.items())
            n_false = sum(false_success(r[n], bests[p]) for p, r in results.items())
            counts.append(f"{n} {n_solved} / {n_false}")
        parts.append(f"to {bar:g}: " + "; ".join(counts))
    return (
        "With the best objective taken only over points feasible to a stricter bar "
        "(solved / false SUCCESS; IPOPT returns points outside the constraints by up to "
        "1e-8, its bound_relax_factor, and where multipliers are large such a point's "
        "objective is below the exact optimum by more than the census's tolerance) "
        + "; ".join(parts)
        + "."
    )


def solved(record: dict, best: float) -> bool:
    return feasible(record) and record["f"] <= best + F_TOL * (1 + abs(best))


def false_success(record: dict, best: float) -> bool:
    return bool(record.get("claimed")) and not solved(record, best)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _quartiles(values: list[float], fmt) -> str:
    if not values:
        return "-"
    if len(values) < 4:
        return fmt(statistics.median(values))
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    return f"{fmt(q2)} ({fmt(q1)}-{fmt(q3)})"


def summary(results: dict, names: list[str]) -> tuple[list[list[str]], int]:
    """Table rows, and how many problems every runner solved."""
    common = [
        p
        for p, records in results.items()
        if all(solved(records.get(n, {}), best_feasible(records)) for n in names)
    ]
    rows = []
    for n in names:
        n_solved = n_false = n_timeout = n_error = 0
        evals, steady, firsts = [], [], []
        for p, records in results.items():
            record, best = records.get(n, {}), best_feasible(records)
            ok = solved(record, best)
            n_solved += ok
            n_false += false_success(record, best)
            n_timeout += bool(record.get("timeout"))
            n_error += "error" in record
            if "first" in record:
                firsts.append(record["first"])
            if ok:
                evals.append(record["evals"])
            if p in common:
                steady.append(record["steady"])
        rows.append(
            [
                n,
                str(n_solved),
                f"**{n_false}**" if n_false else "0",
                f"{n_timeout} / {n_error}",
                _quartiles(evals, lambda v: f"{v:.0f}"),
                _quartiles(steady, _ms),
                _quartiles(firsts, _ms),
            ]
        )
    return rows, len(common)


def _unique(problems: list) -> list:
    """The problems with their first instance per name (sif2jax lists a few twice)."""
    seen, out = set(), []
    for q in problems:
        if q.name not in seen:
            seen.add(q.name)
            out.append(q)
    return out


def _progress(case: Case, records: dict) -> None:
    """One line per problem on stderr: per runner (in order) S solved, - not, T time limit,
    E raised; c where it claimed success."""
    best = best_feasible(records)
    marks = [
        ("T" if r.get("timeout") else "E" if "error" in r else "S" if solved(r, best) else "-")
        + ("c" if r.get("claimed") else "")
        for r in records.values()
    ]
    print(
        f"{case.name} n={case.x0.size} eq={case.m_eq} in={case.m_in}",
        " ".join(marks),
        file=sys.stderr,
        flush=True,
    )


def _pool(kind: str, max_n: int, limit: int | None, quick: bool) -> list:
    """The sif2jax problems of one set, in sif2jax's order."""
    source = (
        sif2jax.constrained_minimisation_problems
        if kind == "constrained"
        else sif2jax.bounded_minimisation_problems
    )
    pool = _unique([q for q in source if int(q.num_variables()) <= max_n])
    if quick:
        pool = [q for q in pool if q.name in QUICK] if kind == "constrained" else pool[:8]
    return pool if limit is None else pool[:limit]


def _prepare(problem, kind: str) -> Case:
    """The problem as a Case, checked finite at its start (ValueError where not)."""
    case = convert(problem)
    if kind == "bounded":
        # the start projected onto the box, as L-BFGS-B does
        case = dataclasses.replace(case, x0=np.clip(case.x0, case.lower, case.upper))
    values = [case.f(case.x0), jax.grad(case.f)(case.x0)]
    if case.m_eq + case.m_in:
        values += [case.c_all(case.x0), jax.jacfwd(case.c_all)(case.x0)]
    if not all(np.all(np.isfinite(np.asarray(v))) for v in values):
        raise ValueError("not finite at y0")
    return case


def _makers(kind: str, case: Case) -> dict:
    if kind == "constrained":
        return constrained_runners()
    from bench_cutest import _optsolve, _scipy_lbfgsb

    box = (jnp.asarray(case.lower), jnp.asarray(case.upper))
    makers = {
        "optsolve.LBFGS (bounds)": _wrap_cutest(_optsolve(optsolve.LBFGS(), box)),
        "scipy L-BFGS-B (jitted gradient)": _wrap_cutest(_scipy_lbfgsb(box)),
    }
    if hasattr(optsolve, "InteriorPoint"):
        makers["optsolve.InteriorPoint"] = optsolve_method(
            lambda: optsolve.InteriorPoint(), jitted=True
        )
    return makers


def collect(
    kind: str,
    problems: list,
    repeats: int,
    only: str | None = None,
    log: str | None = None,
    runner_timeout: float = RUNNER_TIMEOUT,
) -> tuple[dict, list[str]]:
    """Every runner's record on every problem (each measured in a child process, see
    :class:`Measurer`), and the problems left out (with why)."""
    results, left_out = {}, []
    measurer = Measurer(kind, repeats, runner_timeout)
    try:
        _collect(kind, problems, only, log, measurer, results, left_out)
    finally:
        measurer.close()
    return results, left_out


def _collect(
    kind: str,
    problems: list,
    only: str | None,
    log: str | None,
    measurer: Measurer,
    results: dict,
    left_out: list,
) -> None:
    for problem in problems:
        try:
            case = _prepare(problem, kind)
        except ValueError as err:
            left_out.append(f"{problem.name} ({err})")
            continue
        except Exception as err:  # sif2jax cannot evaluate it here
            left_out.append(f"{problem.name} ({type(err).__name__})")
            continue
        makers = {
            n: m
            for n, m in _makers(kind, case).items()
            if only is None or any(part in n for part in only.split(","))
        }
        results[case.name] = {n: measurer.measure(case.name, n) for n in makers}
        _progress(case, results[case.name])
        if log is not None:  # each problem as it is measured, so that a cut run keeps them
            import json

            with open(log, "a") as out:
                out.write(json.dumps({case.name: results[case.name]}, default=_plain) + "\n")


def collect_in_workers(
    kind: str,
    max_n: int,
    limit: int | None,
    repeats: int,
    quick: bool,
    jobs: int,
    only: str | None,
    raw: str | None = None,
    names: str | None = None,
    runner_timeout: float = RUNNER_TIMEOUT,
) -> tuple[dict, list[str]]:
    """:func:`collect` over the set, its problems dealt round-robin to ``jobs`` fresh
    processes (each problem's runners stay together in one process, measured in turn)."""
    import json
    import subprocess
    import tempfile

    if names:  # given: listing a set evaluates each of its problems, minutes on a busy machine
        from sif2jax.cutest import get_problem

        pool = [get_problem(name) for name in names.split(",")]
    else:
        pool = _pool(kind, max_n, limit, quick)
    if jobs <= 1:
        return collect(
            kind, pool, repeats, only, f"{raw}.{kind}.0.jsonl" if raw else None, runner_timeout
        )
    order = [q.name for q in pool]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i in range(jobs):
            out = Path(tmp) / f"{i}.json"
            # the worker is told its problems by name (listing a set evaluates every problem)
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                ",".join(order[i::jobs]),
                str(out),
                "--set",
                kind,
                "--repeats",
                str(repeats),
                "--runner-timeout",
                str(runner_timeout),
            ] + (["--only", only] if only else [])
            if raw:  # each problem's records as measured, beside the final file
                cmd += ["--log", f"{raw}.{kind}.{i}.jsonl"]
            procs.append((subprocess.Popen(cmd), out))
        parts = []
        for proc, out in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"a worker of the {kind} census failed ({proc.returncode})")
            parts.append(json.loads(out.read_text()))
    merged = {k: v for part in parts for k, v in part["results"].items()}
    return (
        {k: merged[k] for k in order if k in merged},
        [item for part in parts for item in part["left_out"]],
    )


def census(
    results: dict,
    left_out: list[str],
    max_n: int,
    repeats: int,
    quick: bool,
    jobs: int,
    runner_timeout: float = RUNNER_TIMEOUT,
    images: Path = IMAGES,
) -> str:
    """The constrained census's section: table, profiles (written to ``images``) and how it
    was measured."""
    names = list(next(iter(results.values())))
    images = Path(images)
    images.mkdir(parents=True, exist_ok=True)
    tag = "quick" if quick else f"n{max_n}"
    time_png, evals_png = (
        f"constrained_profile_time_{tag}.png",
        f"constrained_profile_evals_{tag}.png",
    )

    def solved_by(records: dict, name: str) -> bool:
        return solved(records[name], best_feasible(records))

    performance_profile(
        results,
        names,
        "steady",
        f"steady time, {len(results)} constrained problems (n <= {max_n})",
        images / time_png,
        solved_by,
    )
    performance_profile(
        results,
        names,
        "evals",
        "objective evaluations (slsqp-jax: steps)",
        images / evals_png,
        solved_by,
    )
    rows, n_common = summary(results, names)
    table = markdown_table(
        [
            "runner",
            "solved",
            "false SUCCESS",
            "time limit / raised",
            "median evaluations, solved (IQR)",
            f"median steady, the {n_common} solved by all (IQR)",
            "median compile + first (IQR)",
        ],
        rows,
    )
    return "\n".join(
        [
            f"### Constrained census (sif2jax, n <= {max_n}{', --quick subset' if quick else ''}): "
            f"{len(results)} problems",
            "",
            table,
            "",
            f"![time profile](images/{time_png}) ![evaluations profile](images/{evals_png})",
            "",
            f"Solved: violation (absolute, constraints and bounds) <= {FEAS_TOL:g} and objective "
            f"within {F_TOL:g} (1 + |f*|) of the best feasible objective any runner reached; false "
            "SUCCESS: success claimed at a point not solved. 1000 iterations, each runner's "
            f"default tolerances, {TIME_LIMIT:g} s per solve where the runner can be told "
            f"(IPOPT, scipy, optsolve's scipy path), and {runner_timeout:g} s for a runner's "
            "whole measurement of a problem, in a process killed past it (the jitted runners). "
            "Evaluations: "
            "objective evaluations (slsqp-jax: SQP steps, it "
            "counts no evaluations). Steady: median of up to "
            f"{repeats} solves after the first; {jobs} problems measured at a time (one process "
            "each, all runners of a problem in one process), so absolute times carry the other "
            "process's load; compare within the table. Left out: "
            f"{', '.join(left_out) if left_out else 'none'}.",
            "",
            stricter_bars(results, names),
        ]
    )


def bounds_census(results: dict, left_out: list[str], max_n: int, quick: bool) -> str:
    """The bounds-only section."""
    names = list(next(iter(results.values())))
    rows = []
    for n in names:
        n_solved = sum(solved(r[n], best_feasible(r)) for r in results.values())
        n_false = sum(false_success(r[n], best_feasible(r)) for r in results.values())
        firsts = [r[n]["first"] for r in results.values() if "first" in r[n]]
        rows.append(
            [n, str(n_solved), f"**{n_false}**" if n_false else "0", _quartiles(firsts, _ms)]
        )
    table = markdown_table(
        ["runner", "solved", "false SUCCESS", "median compile + first (IQR)"], rows
    )
    return "\n".join(
        [
            f"### Bounds alone (sif2jax's bounded problems, n <= {max_n}"
            f"{', --quick subset' if quick else ''}): {len(results)} problems",
            "",
            table,
            "",
            "Same stop for both: projected gradient inf-norm <= 1e-6 or 1000 iterations (scipy: "
            "gtol=1e-6, ftol=0); start projected onto the box. Solved and false SUCCESS as above "
            "(the bounds are the constraints). Left out: "
            f"{', '.join(left_out) if left_out else 'none'}.",
        ]
    )


def _wrap_cutest(make_fp):
    """A bench_cutest maker (f(x, p), p) -> run(x0) as a Case maker."""

    def make(case: Case):
        run = make_fp(lambda x, p: case.f(x), None)

        def go(x0):
            x, claimed, evals = block(run(jnp.asarray(x0)))
            return np.asarray(x), bool(claimed), int(evals)

        return go

    return make


def main(
    max_n: int = 20,
    limit: int | None = None,
    sets: tuple[str, ...] = ("constrained", "bounded"),
    repeats: int = 3,
    quick: bool = False,
    bounded_max_n: int = 100,
    jobs: int = 2,
    only: str | None = None,
    raw: str | None = None,
    names: str | None = None,
    runner_timeout: float = RUNNER_TIMEOUT,
    images: Path = IMAGES,
) -> str:
    """The sections of both sets (``raw``: also write every record there as JSON;
    ``names``: these problems, comma-separated, instead of the set's;
    ``runner_timeout``: seconds per runner and problem; ``images``: the profiles' folder)."""
    import json

    sections, dump = [], {}
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "constrained" in sets:
            results, left_out = collect_in_workers(
                "constrained", max_n, limit, repeats, quick, jobs, only, raw, names, runner_timeout
            )
            dump["constrained"] = {"results": results, "left_out": left_out}
            sections.append(
                census(results, left_out, max_n, repeats, quick, jobs, runner_timeout, images)
            )
        if "bounded" in sets:
            results, left_out = collect_in_workers(
                "bounded",
                bounded_max_n,
                limit,
                repeats,
                quick,
                jobs,
                only,
                raw,
                names,
                runner_timeout,
            )
            dump["bounded"] = {"results": results, "left_out": left_out}
            sections.append(bounds_census(results, left_out, bounded_max_n, quick))
    if raw:
        Path(raw).write_text(json.dumps(dump, default=_plain, indent=1))
    return "\n\n".join(sections)


def from_raw(
    paths: list[str],
    max_n: int,
    bounded_max_n: int,
    repeats: int,
    jobs: int,
    note: str = "",
    runner_timeout: float = RUNNER_TIMEOUT,
    images: Path = IMAGES,
) -> str:
    """The sections from records written by earlier runs (``--raw``; a cut run's
    ``RAW.SET.I.jsonl`` logs serve too), the runners of all of them merged per problem:
    for runners measured in separate runs (``--only``), whose times then carry each run's
    own load. A JSONL file holds the bounded set where its name has ``.bounded.`` or starts
    with ``bounded`` (benchmarks/results/bounded_census.jsonl), the constrained set
    otherwise."""
    import json

    merged = {"constrained": ({}, []), "bounded": ({}, [])}
    for path in paths:
        if path.endswith(".jsonl"):
            # a worker's log (RAW.bounded.I.jsonl) or a kept record (results/bounded_*.jsonl)
            name = Path(path).name
            bounded = ".bounded." in name or name.startswith("bounded")
            kind = "bounded" if bounded else "constrained"
            parts = {
                kind: {
                    "results": {
                        k: v
                        for line in Path(path).read_text().splitlines()
                        for k, v in json.loads(line).items()
                    },
                    "left_out": [],
                }
            }
        else:
            parts = json.loads(Path(path).read_text())
        for kind, part in parts.items():
            results, left_out = merged[kind]
            for problem, records in part["results"].items():
                results.setdefault(problem, {}).update(records)
            left_out += [p for p in part["left_out"] if p not in left_out]
    sections = []
    for kind, (results, left_out) in merged.items():
        if not results:
            continue
        # a problem counts where every runner measured it
        names = {n for records in results.values() for n in records}
        results = {p: r for p, r in results.items() if set(r) == names}
        if kind == "constrained":
            sections.append(
                census(results, left_out, max_n, repeats, False, jobs, runner_timeout, images)
            )
        else:
            sections.append(bounds_census(results, left_out, bounded_max_n, False))
    return "\n\n".join(sections) + (f"\n\n{note}" if note else "")


def _plain(value):
    return value.item() if hasattr(value, "item") else str(value)


def _worker(names: str, out: str, args) -> None:
    """Collect the named problems (comma-separated) of a set into ``out`` (JSON)."""
    import json

    from sif2jax.cutest import get_problem

    pool = [get_problem(name) for name in names.split(",") if name]
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, left_out = collect(
            args.set, pool, args.repeats, args.only, args.log, args.runner_timeout
        )
    Path(out).write_text(json.dumps({"results": results, "left_out": left_out}, default=_plain))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-n", type=int, default=20, help="constrained set: n <= this")
    parser.add_argument("--bounded-max-n", type=int, default=100, help="bounded set: n <= this")
    parser.add_argument("--limit", type=int, default=None, help="the first K problems")
    parser.add_argument("--quick", action="store_true", help="a smoke subset, one repeat")
    parser.add_argument("--set", choices=("constrained", "bounded", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="problems measured at a time")
    parser.add_argument(
        "--only",
        default=None,
        help="only the runners whose name has one of these (comma-separated)",
    )
    parser.add_argument("--raw", default=None, help="write every record to this JSON file")
    parser.add_argument(
        "--names",
        default=None,
        help="these constrained problems (comma-separated) instead of the set",
    )
    parser.add_argument(
        "--runner-timeout",
        type=float,
        default=RUNNER_TIMEOUT,
        help="seconds a runner's measurement of one problem may take (its "
        "process is killed past it; a time-limit record)",
    )
    parser.add_argument(
        "--images", type=Path, default=IMAGES, help="the folder the profile PNGs are written to"
    )
    parser.add_argument(
        "--from-raw",
        nargs="+",
        default=None,
        help="no runs: the sections from these --raw files (runners merged)",
    )
    parser.add_argument("--log", default=None, help=argparse.SUPPRESS)  # a worker's JSONL
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker[0], args.worker[1], args)
        sys.exit(0)
    if args.from_raw:
        print(
            from_raw(
                args.from_raw,
                args.max_n,
                args.bounded_max_n,
                args.repeats,
                args.jobs,
                runner_timeout=args.runner_timeout,
                images=args.images,
            )
        )
        sys.exit(0)
    sets = ("constrained", "bounded") if args.set == "both" else (args.set,)
    print(machine_line())
    print(
        main(
            args.max_n,
            args.limit,
            sets,
            1 if args.quick else args.repeats,
            args.quick,
            args.bounded_max_n,
            args.jobs,
            args.only,
            args.raw,
            args.names,
            args.runner_timeout,
            args.images,
        )
    )
