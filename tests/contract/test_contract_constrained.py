"""SUCCESS means feasible: the contract rule over every class that takes constraints.

A constrained method's SUCCESS must mean that the returned point satisfies the constraints
and bounds to the tolerance (1e-6, relative to max(1, |bound|): the scipy backend's
``FEASIBILITY_TOL``, which InteriorPoint shares) as well as that the method's own
convergence test held. Rules, over every registered class whose capabilities say
``takes_constraints`` (the registry's, so a new constrained class joins by registering;
one without a case here fails ``test_every_constrained_class_has_a_case``):

  * wherever a run stops (a budget of 1, 2, 3 iterations, a loose tolerance of the method's
    own, the full budget), SUCCESS comes only at a feasible point;
  * on the problems below, SUCCESS comes only at the published optimum (where the problem
    has one KKT point, a convex program, any SUCCESS must be there);
  * an infeasible problem (x >= 1 and x <= 0) ends INFEASIBLE, and its message states
    the violation at the returned point.

References: the problems and optimal values are Hock and Schittkowski's, written out by
hand from W. Hock, K. Schittkowski, *Test Examples for Nonlinear Programming Codes*,
Lecture Notes in Economics and Mathematical Systems 187, Springer 1981 (problems 21, 35,
71, 76), and checked against sif2jax 0.0.8's definitions of the same problems at x0 and
at the optima (the committed tests do not import sif2jax, a benchmark extra; sif2jax writes
HS76's two "<=" rows as LHS - RHS, the negatives of the ">= 0" form its documentation
states, so they were compared with the sign flipped). The
census that found the scipy path's false SUCCESS is ``benchmarks/bench_constrained.py``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from constrained_problems import hs035_objective
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve
from optsolve.solve_api.registry import algorithm_classes

pytestmark = pytest.mark.usefixtures("one_blas_thread")

FEASIBILITY_TOL = 1e-6  # relative to max(1, |bound|), as scipy's and InteriorPoint's paths


@dataclasses.dataclass(frozen=True)
class Published:
    """A Hock-Schittkowski problem in optsolve's form, with its published optimum."""

    name: str
    f: Callable
    x0: tuple
    constraints: tuple  # (g, lower, upper) triples
    lower: tuple
    upper: tuple
    f_star: float
    x_star: tuple

    def problem(self) -> OptimizationProblem:
        return OptimizationProblem(
            self.f,
            jnp.asarray(self.x0, jnp.float64),
            bounds=(jnp.asarray(self.lower, jnp.float64), jnp.asarray(self.upper, jnp.float64)),
            constraints=[Constraint(g, lo, up) for g, lo, up in self.constraints],
        )


INF = np.inf

# HS21: a convex QP with a bound and one linear inequality, from an infeasible start.
HS21 = Published(
    "HS21",
    lambda x, p: 0.01 * x[0] ** 2 + x[1] ** 2 - 100.0,
    (-1.0, -1.0),
    ((lambda x, p: 10 * x[0] - x[1] - 10, 0.0, INF),),
    (2.0, -50.0),
    (50.0, 50.0),
    -99.96,
    (2.0, 0.0),
)

# HS35 (Beale's): a convex QP, one linear inequality, x >= 0.
HS35 = Published(
    "HS35",
    hs035_objective,
    (0.5, 0.5, 0.5),
    ((lambda x, p: 3 - x[0] - x[1] - 2 * x[2], 0.0, INF),),
    (0.0, 0.0, 0.0),
    (INF, INF, INF),
    1 / 9,
    (4 / 3, 7 / 9, 4 / 9),
)

# HS71: a nonlinear equality and inequality, 1 <= x <= 5 (f* 17.0140173 at x*).
HS71 = Published(
    "HS71",
    lambda x, p: x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2],
    (1.0, 5.0, 5.0, 1.0),
    ((lambda x, p: x[0] * x[1] * x[2] * x[3], 25.0, INF), (lambda x, p: jnp.sum(x**2), 40.0, 40.0)),
    (1.0,) * 4,
    (5.0,) * 4,
    17.0140173,
    (1.0, 4.7429994, 3.8211503, 1.3794082),
)

# HS76: a convex QP, three linear inequalities, x >= 0.
HS76 = Published(
    "HS76",
    lambda x, p: (
        x[0] ** 2
        + 0.5 * x[1] ** 2
        + x[2] ** 2
        + 0.5 * x[3] ** 2
        - x[0] * x[2]
        + x[2] * x[3]
        - x[0]
        - 3 * x[1]
        + x[2]
        - x[3]
    ),
    (0.5, 0.5, 0.5, 0.5),
    (
        (
            lambda x, p: jnp.stack(
                [
                    5 - x[0] - 2 * x[1] - x[2] - x[3],
                    4 - 3 * x[0] - x[1] - 2 * x[2] + x[3],
                    x[1] + 4 * x[2] - 1.5,
                ]
            ),
            0.0,
            INF,
        ),
    ),
    (0.0,) * 4,
    (INF,) * 4,
    -4.681818181,
    (0.2727273, 2.090909, 0.0, 0.5454545),
)

PROBLEMS = (HS21, HS35, HS71, HS76)
CONVEX = (HS21, HS35, HS76)  # one KKT point each: a SUCCESS anywhere else is false


def violation(prob: OptimizationProblem, x) -> float:
    """The largest violation of the bounds and constraints at x, relative to max(1, |bound|)."""
    x = np.asarray(x, np.float64)
    worst = 0.0
    pairs = (
        [(x, *(np.broadcast_to(np.asarray(b, np.float64), x.shape) for b in prob.bounds))]
        if prob.bounds is not None
        else []
    )
    pairs += [
        (
            np.atleast_1d(np.asarray(c.g(jnp.asarray(x), prob.p), np.float64)),
            np.asarray(c.lower, np.float64),
            np.asarray(c.upper, np.float64),
        )
        for c in prob.constraints or ()
    ]
    for value, lo, up in pairs:
        with np.errstate(invalid="ignore"):
            below = np.where(np.isfinite(lo), (lo - value) / np.maximum(1, np.abs(lo)), 0.0)
            above = np.where(np.isfinite(up), (value - up) / np.maximum(1, np.abs(up)), 0.0)
        worst = max(worst, float(np.max(below, initial=0)), float(np.max(above, initial=0)))
    return worst


# --------------------------------------------------------------------------- the cases


@dataclasses.dataclass(frozen=True)
class Case:
    """How to build a constrained class for these rules.

    make: the configuration under test.
    loose: the same method with a tolerance of its own so loose that it stops before the
      constraints hold (None where the method has none to loosen), with ``loose_options``
      for ``solve``; ``stops_infeasible`` says the loose run is known to stop at an
      infeasible point (so the rule is exercised).
    box: the method needs finite bounds on every variable (the global methods).
    maxiters: the budget that lets it converge on these problems.
    """

    make: Callable[[], Any]
    loose: Callable[[], Any] | None = None
    loose_options: dict = dataclasses.field(default_factory=dict)
    stops_infeasible: bool = False
    box: bool = False
    maxiters: int = 300


def _native_case(cls) -> Case:
    """The default for a JAX-native constrained class: its defaults."""
    return Case(cls)


def _cases() -> dict[type, Case]:
    cases: dict[type, Case] = {}
    for name in ("InteriorPoint", "AugmentedLagrangian"):  # JAX-native, as they arrive
        if hasattr(optsolve, name):
            cases[getattr(optsolve, name)] = _native_case(getattr(optsolve, name))
    by_method = {
        # SLSQP's acc is both its test on f and its bar on the constraints: at 1e-1 its
        # "success" comes with the constraints violated (HS71: by ~1e-2)
        "SLSQP": Case(
            lambda: optsolve.ScipyMinimize("SLSQP"),
            loose=lambda: optsolve.ScipyMinimize("SLSQP", ftol=1e-1),
            stops_infeasible=True,
        ),
        # trust-constr's gtol is also its bar on the violation (solve's gtol maps to it)
        "trust-constr": Case(
            lambda: optsolve.ScipyMinimize("trust-constr"),
            loose=lambda: optsolve.ScipyMinimize("trust-constr"),
            loose_options={"gtol": 1e-1},
            stops_infeasible=True,
        ),
        "COBYLA": Case(
            lambda: optsolve.ScipyMinimize("COBYLA"),
            loose=lambda: optsolve.ScipyMinimize("COBYLA", rhobeg=0.5, tol=1e-1),
            maxiters=2000,
        ),
        "COBYQA": Case(
            lambda: optsolve.ScipyMinimize("COBYQA"),
            loose=lambda: optsolve.ScipyMinimize("COBYQA", final_tr_radius=1e-1),
            maxiters=2000,
        ),
        "differential_evolution": Case(
            lambda: optsolve.ScipyGlobal("differential_evolution", rng=0),
            loose=lambda: optsolve.ScipyGlobal(
                "differential_evolution", rng=0, tol=0.5, polish=False
            ),
            box=True,
            maxiters=100,
        ),
        "shgo": Case(lambda: optsolve.ScipyGlobal("shgo"), box=True, maxiters=3),
        "basinhopping": Case(
            lambda: optsolve.ScipyGlobal("basinhopping", rng=0, local="SLSQP", niter=3),
            loose=lambda: optsolve.ScipyGlobal(
                "basinhopping", rng=0, niter=2, local=optsolve.ScipyMinimize("SLSQP", ftol=1e-1)
            ),
            maxiters=3,
        ),
    }
    for cls in algorithm_classes():
        name = getattr(getattr(cls, "spec", None), "name", None)
        if name in by_method and cls.traits()["takes_constraints"]:
            cases[cls] = by_method[name]
    return cases


CASES = _cases()
CONSTRAINED = [cls for cls in algorithm_classes() if cls.traits().get("takes_constraints")]


def _id(cls) -> str:
    return getattr(getattr(cls, "spec", None), "name", None) or cls.__name__


def _problem(case: Case, published: Published) -> OptimizationProblem:
    prob = published.problem()
    if case.box:  # the global methods search a finite box: the published one, capped at 10
        lo, up = (np.clip(np.asarray(b, np.float64), -10.0, 10.0) for b in prob.bounds)
        prob = prob.replace(bounds=(jnp.asarray(lo), jnp.asarray(up)))
    return prob


def _solve(prob, alg, maxiters, **options):
    import warnings

    with warnings.catch_warnings():
        # scipy's own warnings on a deliberately loose or short run are not the subject
        warnings.simplefilter("ignore")
        return solve(prob, alg, maxiters=maxiters, **options)


# --------------------------------------------------------------------------- the rules


def test_every_constrained_class_has_a_case():
    assert CONSTRAINED, "no registered class takes constraints"
    missing = [_id(c) for c in CONSTRAINED if c not in CASES]
    assert not missing, f"constrained classes without a case in {__name__}: {missing}"


@pytest.mark.parametrize("cls", CONSTRAINED, ids=_id)
@pytest.mark.parametrize("published", PROBLEMS, ids=lambda p: p.name)
def test_success_is_feasible_wherever_the_run_stops(cls, published):
    """Budgets of 1, 2 and 3 iterations and the full one: SUCCESS only where feasible; the
    full budget ends feasible (SUCCESS, or a budget's code) for a local method."""
    case = CASES[cls]
    prob = _problem(case, published)
    for maxiters in (1, 2, 3, case.maxiters):
        sol = _solve(prob, case.make(), maxiters)
        v = violation(prob, sol.x)
        if sol.retcode == ReturnCode.SUCCESS:
            assert v <= FEASIBILITY_TOL, (
                f"{_id(cls)} on {published.name}, maxiters={maxiters}: SUCCESS at a point "
                f"violating the constraints by {v:.3g}: {sol.message}"
            )
        if v > FEASIBILITY_TOL and sol.retcode not in (
            ReturnCode.MAXITERS,
            ReturnCode.MAXTIME,
            ReturnCode.FAILURE,
            ReturnCode.STALLED,
        ):
            assert sol.retcode == ReturnCode.INFEASIBLE, (maxiters, sol.retcode, sol.message)


# Known breaches, each failing strictly until it is fixed (then the xfail must go).
KNOWN_FALSE_SUCCESS = {
    (
        "differential_evolution",
        "HS35",
    ): "scipy's differential_evolution polishes a constrained problem with trust-constr, "
    "whose gtol test holds for its barrier subproblem (barrier parameter 3.2e-5; f* + "
    "3.2e-5); the polish's result is not exposed to optsolve's check on trust-constr",
}


@pytest.mark.parametrize("cls", CONSTRAINED, ids=_id)
@pytest.mark.parametrize("published", CONVEX, ids=lambda p: p.name)
def test_success_on_a_convex_program_is_its_optimum(cls, published, request):
    """A convex program has one KKT point: a SUCCESS elsewhere is a false one."""
    if (_id(cls), published.name) in KNOWN_FALSE_SUCCESS:
        request.applymarker(
            pytest.mark.xfail(strict=True, reason=KNOWN_FALSE_SUCCESS[_id(cls), published.name])
        )
    case = CASES[cls]
    prob = _problem(case, published)
    sol = _solve(prob, case.make(), case.maxiters)
    if sol.retcode != ReturnCode.SUCCESS:
        return
    f = float(sol.objective)
    assert violation(prob, sol.x) <= FEASIBILITY_TOL
    assert abs(f - published.f_star) <= 1e-5 * (1 + abs(published.f_star)), (
        f"{_id(cls)} on {published.name}: SUCCESS at f = {f!r}, published f* = "
        f"{published.f_star!r}: {sol.message}"
    )


@pytest.mark.parametrize(
    "cls", [c for c in CONSTRAINED if CASES.get(c) and CASES[c].loose], ids=_id
)
def test_a_loose_own_tolerance_never_gives_success_outside_the_constraints(cls):
    """The method's own test made loose (SLSQP's acc, trust-constr's xtol, ...) stops it
    early on HS71 from its infeasible start; where that stop is outside the constraints the
    code is not SUCCESS (SLSQP and trust-constr reported success there before)."""
    case = CASES[cls]
    prob = _problem(case, HS71)
    sol = _solve(prob, case.loose(), case.maxiters, **case.loose_options)
    v = violation(prob, sol.x)
    if case.stops_infeasible:
        assert v > FEASIBILITY_TOL, f"the loose run ended feasible ({v:.3g}): rule not tested"
    if v > FEASIBILITY_TOL:
        assert sol.retcode != ReturnCode.SUCCESS, sol.message
        assert sol.retcode == ReturnCode.INFEASIBLE, (sol.retcode, sol.message)


def _infeasible_problems(case: Case) -> list[tuple[str, OptimizationProblem, float]]:
    """(name, problem, the least violation any point has) for two infeasible problems."""
    f = lambda x, p: jnp.sum((x - 0.25) ** 2)
    box = (jnp.full(2, -2.0), jnp.full(2, 2.0)) if case.box else None
    # x0 >= 1 and x0 <= 0: every point violates one of them by 1/2 or more
    two_sides = OptimizationProblem(
        f,
        jnp.array([0.5, 0.5]),
        bounds=box,
        constraints=[
            Constraint(lambda x, p: x[0], lower=1.0),
            Constraint(lambda x, p: x[0], upper=0.0),
        ],
    )
    # a bound against a constraint: x >= 1 by the box, x0 + x1 <= 0
    lower = (jnp.ones(2), jnp.full(2, 2.0 if case.box else jnp.inf))
    against_box = OptimizationProblem(
        f,
        jnp.array([1.5, 1.5]),
        bounds=lower,
        constraints=[Constraint(lambda x, p: x[0] + x[1], upper=0.0)],
    )
    # (a point may trade one violation for the other: at x = (1/3, 1/3) both are 2/3)
    return [("x>=1 and x<=0", two_sides, 0.5), ("bound against constraint", against_box, 2 / 3)]


def _numbers(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"(?<![\w.])[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", text)]


@pytest.mark.parametrize("cls", CONSTRAINED, ids=_id)
def test_an_infeasible_problem_is_infeasible_with_the_violation_in_the_message(cls):
    case = CASES[cls]
    for name, prob, least in _infeasible_problems(case):
        sol = _solve(prob, case.make(), case.maxiters)
        v = violation(prob, sol.x)
        assert sol.retcode == ReturnCode.INFEASIBLE, (name, sol.retcode, sol.message)
        assert v >= least * (1 - 1e-6), (name, v)
        message = sol.message
        assert "violat" in message, (name, message)
        # the violation at the returned point is stated (to the 3 digits a message gives)
        assert any(abs(n - v) <= 5e-3 * v for n in _numbers(message)), (
            f"{name}: the message does not state the violation {v:.3g} at the returned "
            f"point: {message!r}"
        )
