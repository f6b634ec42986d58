"""The scipy backend: every method on a problem it suits, published constrained optima,
global optimizers, agreement with scipy driven by hand, pytrees, jit / vmap, callbacks.

References: the unconstrained problems and minima of Moré, Garbow & Hillstrom (1981)
(tests/support/problems.py); W. Hock, K. Schittkowski, *Test Examples for Nonlinear Programming
Codes*, Lecture Notes in Economics and Mathematical Systems 187, Springer 1981 (HS035,
HS071); Rastrigin and Ackley with their global minimum 0 at the origin.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize as so
from scipy.optimize import NonlinearConstraint

import optsolve
from constrained_problems import hs035_objective
from optsolve import Constraint, OptimizationProblem, ReturnCode, ScipyGlobal, ScipyMinimize, solve
from optsolve.backends.scipy import compiled as scipy_compiled
from problems import PROBLEMS

pytestmark = pytest.mark.usefixtures("one_blas_thread")


MGH = {p.name.split()[0]: p for p in PROBLEMS}
ALL_METHODS = [
    "Nelder-Mead",
    "Powell",
    "CG",
    "BFGS",
    "Newton-CG",
    "L-BFGS-B",
    "TNC",
    "COBYLA",
    "COBYQA",
    "SLSQP",
    "trust-constr",
    "dogleg",
    "trust-ncg",
    "trust-exact",
    "trust-krylov",
]
GRADIENT_METHODS = [
    "CG",
    "BFGS",
    "Newton-CG",
    "L-BFGS-B",
    "TNC",
    "SLSQP",
    "trust-constr",
    "dogleg",
    "trust-ncg",
    "trust-exact",
    "trust-krylov",
]

# (MGH problem number, scipy options, solve options, rtol of f <= f* + rtol (1 + |f*|)).
# Wood (14) has a stationary point at f = 7.876 where L-BFGS-B and SLSQP legitimately stop;
# dogleg needs a positive definite Hessian everywhere it goes (variably dimensioned is).
SUITED = {
    "Nelder-Mead": ("5", {"xatol": 1e-10, "fatol": 1e-14}, {"maxiters": 10_000}, 1e-10),
    "Powell": ("14", {"xtol": 1e-10, "ftol": 1e-14}, {}, 1e-10),
    "CG": ("1", {}, {}, 1e-10),
    # at scipy's gtol 1e-5 BFGS stops at f of 4e-12 or 2e-10 (f - f* ~ gtol^2 / curvature),
    # by rounding: at 1e-8 it is below 1e-19 on every compile option tried
    "BFGS": ("21", {}, {"gtol": 1e-8}, 1e-10),
    "Newton-CG": ("21", {}, {}, 1e-8),
    "L-BFGS-B": ("21", {}, {}, 1e-10),
    "TNC": ("1", {}, {}, 1e-8),
    "COBYLA": ("5", {"maxiter": 20_000, "rhobeg": 0.5, "tol": 1e-10}, {}, 1e-8),
    "COBYQA": ("1", {"final_tr_radius": 1e-10}, {}, 1e-10),
    "SLSQP": ("1", {"ftol": 1e-14}, {}, 1e-10),
    "trust-constr": ("7", {}, {}, 1e-10),
    "dogleg": ("25", {}, {}, 1e-10),
    "trust-ncg": ("14", {}, {}, 1e-10),
    "trust-exact": ("14", {}, {}, 1e-10),
    "trust-krylov": ("14", {}, {}, 1e-10),
}


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_reaches_a_known_minimum(method):
    number, scipy_options, solve_options, rtol = SUITED[method]
    problem = MGH[number]
    sol = solve(
        OptimizationProblem(problem.f, problem.x0_array()),
        ScipyMinimize(method, **scipy_options),
        **solve_options,
    )
    assert sol.retcode == ReturnCode.SUCCESS, sol.original.message
    assert problem.reached(float(sol.objective), rtol), (problem.name, float(sol.objective))
    assert sol.stats.f_evals > 0 and sol.stats.iterations > 0
    assert isinstance(sol.original, so.OptimizeResult)
    np.testing.assert_allclose(
        float(sol.objective), float(problem.f(sol.x)), rtol=1e-12, atol=1e-15
    )


# ---------------------------------------------------------------- Hock-Schittkowski


def hs071_f(x, p):
    return x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2]


HS071 = OptimizationProblem(
    hs071_f,
    jnp.array([1.0, 5.0, 5.0, 1.0]),
    bounds=(1.0, 5.0),
    constraints=[
        Constraint(lambda x, p: jnp.prod(x), lower=25.0),
        Constraint(lambda x, p: jnp.sum(x**2), lower=40.0, upper=40.0),
    ],
)
HS071_F = 17.0140173  # Hock & Schittkowski (1981), problem 71


HS035 = OptimizationProblem(
    hs035_objective,
    jnp.array([0.5, 0.5, 0.5]),
    bounds=(0.0, None),
    constraints=Constraint(lambda x, p: 3.0 - x[0] - x[1] - 2 * x[2], lower=0.0),
)
HS035_F = 1.0 / 9.0  # Hock & Schittkowski (1981), problem 35, at (4/3, 7/9, 4/9)

CONSTRAINED = {
    # ftol 1e-10: at 1e-12, scipy's own SLSQP ends HS071 with "Positive directional
    # derivative for linesearch" (mode 8) on some machines, at the optimum to 1e-9
    "SLSQP": (ScipyMinimize("SLSQP", ftol=1e-10), {}),
    "trust-constr": (ScipyMinimize("trust-constr", xtol=1e-14, barrier_tol=1e-14), {"gtol": 1e-14}),
    "COBYQA": (ScipyMinimize("COBYQA", final_tr_radius=1e-10), {}),
}


@pytest.mark.parametrize("method", sorted(CONSTRAINED))
@pytest.mark.parametrize(
    "problem, f_star, x_star",
    [
        (HS071, HS071_F, None),
        (HS035, HS035_F, (4 / 3, 7 / 9, 4 / 9)),
    ],
    ids=["HS071", "HS035"],
)
def test_hock_schittkowski(method, problem, f_star, x_star):
    algorithm, options = CONSTRAINED[method]
    sol = solve(problem, algorithm, **options)
    assert sol.retcode == ReturnCode.SUCCESS, sol.original.message
    assert abs(float(sol.objective) - f_star) <= 1e-6 * f_star
    if x_star is not None:
        np.testing.assert_allclose(sol.x, x_star, atol=1e-5)


def test_cobyla_on_hs035():
    sol = solve(HS035, ScipyMinimize("COBYLA", tol=1e-10))
    assert sol.retcode == ReturnCode.SUCCESS
    assert abs(float(sol.objective) - HS035_F) <= 1e-6 * HS035_F


# ---------------------------------------------------------------- global methods


def rastrigin(x, p):
    return 10.0 * x.size + jnp.sum(x**2 - 10.0 * jnp.cos(2 * jnp.pi * x))


def ackley(x, p):
    # sqrt with a finite gradient at 0 (the double-where idiom): d sqrt(r)/dr is infinite
    # at the minimum, and a non-finite gradient anywhere in a run makes it a FAILURE.
    r2 = jnp.mean(x**2)
    r = jnp.where(r2 > 0, jnp.sqrt(jnp.where(r2 > 0, r2, 1.0)), 0.0)
    return -20.0 * jnp.exp(-0.2 * r) - jnp.exp(jnp.mean(jnp.cos(2 * jnp.pi * x))) + 20.0 + jnp.e


GLOBAL = {
    "differential_evolution": (ScipyGlobal("differential_evolution", rng=0), {}),
    "dual_annealing": (ScipyGlobal("dual_annealing", rng=0), {}),
    "shgo": (ScipyGlobal("shgo"), {}),
    "direct": (ScipyGlobal("direct"), {}),
}


@pytest.mark.parametrize("method", sorted(GLOBAL) + ["basinhopping"])
@pytest.mark.parametrize(
    "f, box", [(rastrigin, 5.12), (ackley, 32.768)], ids=["rastrigin", "ackley"]
)
def test_global_methods_find_the_global_minimum(method, f, box):
    problem = OptimizationProblem(f, jnp.full(5, 2.3), bounds=(-box, box))
    if method == "basinhopping":
        # The local method is the user's: TNC escapes Rastrigin's basins more reliably than
        # L-BFGS-B, which often stops short (ABNORMAL) of the exact zero and is rejected.
        local = "TNC" if f is rastrigin else "L-BFGS-B"
        algorithm = ScipyGlobal("basinhopping", local=local, stepsize=1.0, rng=0)
        sol = solve(problem, algorithm, maxiters=300 if f is rastrigin else 60)
    else:
        algorithm, options = GLOBAL[method]
        sol = solve(problem, algorithm, **options)
    # basinhopping's hops are its budget: the maxiters given above ends it; dual_annealing
    # has no convergence test: its own budget ends every run
    expected = (
        ReturnCode.MAXITERS if method in ("basinhopping", "dual_annealing") else ReturnCode.SUCCESS
    )
    assert sol.retcode == expected, sol.original.message
    assert float(sol.objective) <= 1e-6
    np.testing.assert_allclose(sol.x, np.zeros(5), atol=1e-5)


# ---------------------------------------------------------------- agreement with scipy by hand


def rosen_jax(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


ROSEN_X0 = np.array([-1.2, 1.0, -1.2, 1.0, -1.2])

# A smooth, strictly convex objective whose hand-written derivatives are the same
# floating-point expressions JAX evaluates (u * u for u ** 2, ...), so both runs take the
# same steps: f(x) = sum c_i u_i^2 / 2 + u_i^4 / 4 with u = x - a; minimum at x = a.
QUARTIC_C = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
QUARTIC_A = np.array([1.0, 2.0, 3.0, -1.0, -2.0])


def quartic_jax(x, p):
    u = x - QUARTIC_A
    return jnp.sum(0.5 * QUARTIC_C * u**2 + 0.25 * u**4)


def quartic_by_hand(x):
    u = x - QUARTIC_A
    f = np.sum(0.5 * QUARTIC_C * (u * u) + 0.25 * ((u * u) * (u * u)))
    return f, QUARTIC_C * u + u * u * u


def quartic_hess_by_hand(x):
    u = x - QUARTIC_A
    return np.diag(QUARTIC_C + 3.0 * (u * u))


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_same_as_scipy_by_hand(method):
    spec = type(ScipyMinimize(method)).spec
    kwargs = {}
    if spec.hessian == "hess":
        kwargs["hess"] = quartic_hess_by_hand
    elif spec.hessian == "hessp":
        kwargs["hessp"] = lambda x, v: quartic_hess_by_hand(x) @ v
    # TNC's Hessian-vector products are finite differences of the gradient over a step
    # sqrt(accuracy): at the default (machine precision) they amplify the last-bit
    # difference of two correct gradients ~1e8-fold; accuracy=1e-6 keeps that below 1e-12.
    options = {"accuracy": 1e-6} if method == "TNC" else {}
    x0 = np.zeros(5)
    ref = so.minimize(quartic_by_hand, x0, jac=True, method=method, options=options, **kwargs)
    sol = solve(OptimizationProblem(quartic_jax, jnp.asarray(x0)), ScipyMinimize(method, **options))
    assert ref.nit > 3
    np.testing.assert_allclose(np.asarray(sol.x), ref.x, rtol=0, atol=1e-10)
    np.testing.assert_allclose(float(sol.objective), ref.fun, rtol=1e-10, atol=1e-12)
    assert sol.stats.f_evals == ref.nfev
    assert sol.stats.grad_evals == ref.get("njev", ref.nfev)  # TNC: one gradient per f
    assert sol.stats.iterations == ref.nit
    assert sol.original.get("nhev") == ref.get("nhev")
    assert sol.original.status == ref.status


def _hs071_by_hand():
    def fg(x):
        s = x[0] + x[1] + x[2]
        return (
            x[0] * x[3] * s + x[2],
            np.array([x[3] * (x[0] + s), x[0] * x[3], x[0] * x[3] + 1.0, x[0] * s]),
        )

    def hessp(x, v):
        h = np.array(
            [
                [2 * x[3], x[3], x[3], 2 * x[0] + x[1] + x[2]],
                [x[3], 0.0, 0.0, x[0]],
                [x[3], 0.0, 0.0, x[0]],
                [2 * x[0] + x[1] + x[2], x[0], x[0], 0.0],
            ]
        )
        return h @ v

    def cons(x):
        return np.array([np.prod(x), np.sum(x**2)])

    def cons_jac(x):
        prod_grad = np.array(
            [x[1] * x[2] * x[3], x[0] * x[2] * x[3], x[0] * x[1] * x[3], x[0] * x[1] * x[2]]
        )
        return np.stack([prod_grad, 2 * x])

    def cons_hess(x, v):
        h = np.zeros((4, 4))
        for i in range(4):
            for j in range(4):
                if i != j:
                    h[i, j] = np.prod([x[k] for k in range(4) if k not in (i, j)])
        return v[0] * h + v[1] * 2 * np.eye(4)

    return fg, hessp, cons, cons_jac, cons_hess


@pytest.mark.parametrize("method", ["SLSQP", "trust-constr"])
def test_constrained_same_as_scipy_by_hand(method):
    fg, hessp, cons, cons_jac, cons_hess = _hs071_by_hand()
    if method == "trust-constr":
        extra = {"hessp": hessp}
        nlc = [
            NonlinearConstraint(cons, [25.0, 40.0], [np.inf, 40.0], jac=cons_jac, hess=cons_hess)
        ]
    else:  # SLSQP takes equalities and inequalities apart
        extra = {}
        nlc = [
            NonlinearConstraint(lambda x: cons(x)[1:], 40.0, 40.0, jac=lambda x: cons_jac(x)[1:]),
            NonlinearConstraint(lambda x: cons(x)[:1], 25.0, np.inf, jac=lambda x: cons_jac(x)[:1]),
        ]
    ref = so.minimize(
        fg,
        np.array([1.0, 5.0, 5.0, 1.0]),
        jac=True,
        method=method,
        bounds=so.Bounds(1.0, 5.0),
        constraints=nlc,
        **extra,
    )
    sol = solve(HS071, ScipyMinimize(method))
    np.testing.assert_allclose(np.asarray(sol.x), ref.x, rtol=0, atol=1e-10)
    assert (sol.stats.f_evals, sol.stats.grad_evals, sol.stats.iterations) == (
        ref.nfev,
        ref.njev,
        ref.nit,
    )


EXPECTED_KINDS = {
    "Nelder-Mead": {"f"},
    "Powell": {"f"},
    "COBYLA": {"f"},
    "COBYQA": {"f"},
    "CG": {"fg"},
    "BFGS": {"fg"},
    "L-BFGS-B": {"fg"},
    "TNC": {"fg"},
    "SLSQP": {"fg"},
    "Newton-CG": {"fg", "hessp"},
    "trust-ncg": {"fg", "hessp"},
    "trust-krylov": {"fg", "hessp"},
    "trust-constr": {"fg", "hessp"},
    "dogleg": {"fg", "hess"},
    "trust-exact": {"fg", "hess"},
}


@pytest.mark.parametrize("method", ALL_METHODS)
def test_only_what_the_method_uses_is_computed(method, monkeypatch):
    kinds = set()
    original = scipy_compiled.compiled

    def spy(kind, *args, **kwargs):
        kinds.add(kind)
        return original(kind, *args, **kwargs)

    monkeypatch.setattr(scipy_compiled, "compiled", spy)
    solve(OptimizationProblem(rosen_jax, jnp.asarray(ROSEN_X0)), ScipyMinimize(method), maxiters=3)
    assert kinds == EXPECTED_KINDS[method]


@pytest.mark.parametrize(
    "method, kinds",
    [
        ("SLSQP", {"fg", "cj"}),
        ("trust-constr", {"fg", "hessp", "cj", "chvp"}),
        ("COBYLA", {"f", "c"}),
        ("COBYQA", {"f", "c"}),
    ],
)
def test_constraint_derivatives_only_where_used(method, kinds, monkeypatch):
    seen = set()
    original = scipy_compiled.compiled
    monkeypatch.setattr(
        scipy_compiled,
        "compiled",
        lambda kind, *a, **k: (seen.add(kind), original(kind, *a, **k))[1],
    )
    solve(HS071, ScipyMinimize(method), maxiters=3)
    assert seen == kinds


# ---------------------------------------------------------------- pytrees, dtypes, jit, vmap


def dict_objective(x, p):
    return jnp.sum((x["w"] - p) ** 2) + jnp.sum((x["b"] + 1.0) ** 2).astype(jnp.float64)


def test_dict_x0_round_trips():
    x0 = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(4, jnp.float32)}
    sol = solve(OptimizationProblem(dict_objective, x0, 2.0), ScipyMinimize("L-BFGS-B"))
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(x0)
    assert jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), sol.x) == jax.tree_util.tree_map(
        lambda a: (a.shape, a.dtype), x0
    )
    np.testing.assert_allclose(sol.x["w"], 2.0, atol=1e-6)
    np.testing.assert_allclose(sol.x["b"], -1.0, atol=1e-6)
    assert sol.objective.dtype == jnp.float64


def test_bounds_are_honoured_and_pytree_shaped():
    x0 = {"a": jnp.zeros(2), "b": jnp.zeros(())}
    f = lambda x, p: jnp.sum((x["a"] - 3.0) ** 2) + (x["b"] + 3.0) ** 2
    prob = OptimizationProblem(f, x0, bounds=({"a": -1.0, "b": -2.0}, {"a": 1.0, "b": 2.0}))
    # trust-constr is an interior-point method: it stops a barrier's width inside, its
    # barrier parameter above 1e-6 (1 + |f|), so its success is STALLED, saying why
    for method, options, atol in (
        ("L-BFGS-B", {}, 1e-8),
        ("TNC", {}, 1e-8),
        ("SLSQP", {}, 1e-8),
        ("Powell", {"xtol": 1e-10}, 1e-8),
        ("trust-constr", {}, 1e-4),
    ):
        sol = solve(prob, ScipyMinimize(method, **options))
        if method == "trust-constr":
            assert sol.retcode == ReturnCode.STALLED, sol.message
            assert "barrier parameter" in sol.message
        else:
            assert sol.retcode == ReturnCode.SUCCESS, method
        np.testing.assert_allclose(sol.x["a"], [1.0, 1.0], atol=atol)
        np.testing.assert_allclose(sol.x["b"], -2.0, atol=atol)
        assert np.all(np.abs(np.asarray(sol.x["a"])) <= 1.0)


def _rosen_p(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


@pytest.mark.parametrize("method", ["BFGS", "Nelder-Mead", "trust-constr"])
def test_jit_matches_eager_and_has_no_original(method):
    prob = OptimizationProblem(_rosen_p, jnp.zeros(3), 100.0)
    opts = {"maxiters": 5000} if method == "Nelder-Mead" else {}
    eager = solve(prob, ScipyMinimize(method), **opts)
    jitted = jax.jit(lambda p: solve(prob.replace(p=p), ScipyMinimize(method), **opts))(100.0)
    assert jitted.original is None
    np.testing.assert_array_equal(jitted.x, eager.x)
    assert int(jitted.retcode) == int(eager.retcode)
    assert int(jitted.stats.f_evals) == eager.stats.f_evals
    assert int(jitted.stats.iterations) == eager.stats.iterations


def test_vmap_over_p_runs_each_element():
    prob = OptimizationProblem(_rosen_p, jnp.zeros(3), 100.0)
    ps = jnp.array([1.0, 10.0, 100.0])
    batched = jax.vmap(lambda p: solve(prob.replace(p=p), ScipyMinimize("BFGS")))(ps)
    for i, p in enumerate([1.0, 10.0, 100.0]):
        one = solve(prob.replace(p=p), ScipyMinimize("BFGS"))
        np.testing.assert_array_equal(batched.x[i], one.x)
        assert int(batched.stats.f_evals[i]) == one.stats.f_evals
    assert bool(jnp.all(batched.retcode == ReturnCode.SUCCESS))


def test_vmap_with_constraints_and_bounds():
    def run(lower):
        c = Constraint(lambda x, p: x[0] + x[1], lower=lower)
        prob = OptimizationProblem(
            lambda x, p: jnp.sum(x**2), jnp.ones(2), constraints=[c], bounds=(-5.0, 5.0)
        )
        return solve(prob, ScipyMinimize("SLSQP"))

    sol = jax.vmap(run)(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(sol.x, [[0.5, 0.5], [1.0, 1.0]], atol=1e-6)


def test_no_recompilation_for_a_new_p():
    from compile_count import count_compilations

    prob = OptimizationProblem(_rosen_p, jnp.zeros(3), 100.0)
    solve(prob, ScipyMinimize("BFGS"))
    with count_compilations() as counter:
        solve(prob.replace(p=50.0), ScipyMinimize("BFGS"))
    assert counter.count == 0


def test_algorithms_are_immutable_pytrees_with_method_traits():
    alg = ScipyMinimize("l-bfgs-b", maxcor=7)
    assert isinstance(alg, ScipyMinimize) and alg.method == "L-BFGS-B"
    assert alg.options == {"maxcor": 7}
    leaves, treedef = jax.tree_util.tree_flatten(alg)
    assert leaves == [] and jax.tree_util.tree_unflatten(treedef, leaves) == alg
    assert alg.takes_bounds and not alg.takes_constraints and alg.needs_gradient
    assert ScipyMinimize("trust-constr").takes_constraints
    assert not ScipyMinimize("BFGS").takes_bounds
    assert ScipyMinimize("dogleg").needs_hessian
    with pytest.raises(AttributeError, match="immutable"):
        alg.maxcor = 3
    assert repr(alg) == "ScipyMinimize(method='L-BFGS-B', maxcor=7)"
    names = [c.__name__ for c in optsolve.solve_api.registry.algorithm_classes()]
    assert "ScipyMinimize(method='SLSQP')" in names and "ScipyMinimize" not in names


# ---------------------------------------------------------------- callbacks and stopping


def test_callback_called_once_per_iteration_with_pytree_x():
    seen = []
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x["a"] - 1.0) ** 2 * jnp.arange(1.0, 4.0)), {"a": jnp.zeros(3)}
    )
    sol = solve(
        prob,
        ScipyMinimize("BFGS"),
        callback=lambda k, x, f: seen.append((k, x["a"].copy(), float(f))),
    )
    assert [k for k, _, _ in seen] == list(range(1, sol.stats.iterations + 1))
    np.testing.assert_array_equal(seen[-1][1], sol.x["a"])


def test_callback_every():
    seen = []
    sol = solve(
        OptimizationProblem(rosen_jax, jnp.asarray(ROSEN_X0)),
        ScipyMinimize("BFGS"),
        callback=lambda k, x, f: seen.append(k),
        callback_every=5,
    )
    assert seen == list(range(5, sol.stats.iterations + 1, 5))


@pytest.mark.parametrize("method", ALL_METHODS)
def test_callback_true_stops_with_the_current_iterate(method):
    seen = []

    def callback(k, x, f):
        seen.append((np.array(x), float(f)))
        return k == 3

    prob = OptimizationProblem(rosen_jax, jnp.asarray(ROSEN_X0))
    sol = solve(prob, ScipyMinimize(method), callback=callback)
    assert sol.retcode == ReturnCode.TERMINATED
    # Nelder-Mead's first callback is at scipy's iteration 2 (iteration 1 builds the simplex)
    assert len(seen) == (2 if method == "Nelder-Mead" else 3)
    np.testing.assert_array_equal(np.asarray(sol.x), seen[-1][0])
    assert float(sol.objective) == seen[-1][1]


def test_ftol_stops_with_success():
    prob = OptimizationProblem(rosen_jax, jnp.asarray(ROSEN_X0))
    seen = []
    sol = solve(
        prob,
        ScipyMinimize("Nelder-Mead"),
        ftol=1e-2,
        callback=lambda k, x, f: seen.append((np.array(x), float(f))),
    )
    assert sol.retcode == ReturnCode.SUCCESS
    # ftol is tested on iterations that moved x (Nelder-Mead's best vertex often stays put)
    moved = [(a[1], b[1]) for a, b in itertools.pairwise(seen) if np.any(a[0] != b[0])]
    small = [abs(a - b) <= 1e-2 * max(abs(a), abs(b), 1.0) for a, b in moved]
    assert small[-1] and not any(small[:-1])


def test_gtol_for_newton_cg_is_tested_by_optsolve():
    prob = OptimizationProblem(lambda x, p: jnp.sum(jnp.cosh(x - 1.0)), jnp.full(3, 4.0))
    sol = solve(prob, ScipyMinimize("Newton-CG"), gtol=1e-3)
    g = jax.grad(prob.f)(sol.x, None)
    assert sol.retcode == ReturnCode.SUCCESS and float(jnp.max(jnp.abs(g))) <= 1e-3


def test_maxtime():
    sol = solve(
        OptimizationProblem(rosen_jax, jnp.asarray(ROSEN_X0)), ScipyMinimize("CG"), maxtime=1e-9
    )
    assert sol.retcode == ReturnCode.MAXTIME and sol.stats.iterations == 1


def test_global_callback_stops_differential_evolution():
    prob = OptimizationProblem(rastrigin, jnp.full(3, 2.3), bounds=(-5.12, 5.12))
    sol = solve(prob, ScipyGlobal("differential_evolution", rng=0), callback=lambda k, x, f: k >= 2)
    assert sol.retcode == ReturnCode.TERMINATED and sol.stats.iterations == 2


@pytest.mark.parametrize("method", ["shgo", "direct", "dual_annealing"])
def test_global_callback_stops_the_others(method):
    prob = OptimizationProblem(rastrigin, jnp.full(3, 2.3), bounds=(-5.12, 5.12))
    sol = solve(
        prob,
        ScipyGlobal(method, **({"rng": 0} if method == "dual_annealing" else {})),
        callback=lambda k, x, f: True,
    )
    assert sol.retcode == ReturnCode.TERMINATED
    assert np.all(np.isfinite(np.asarray(sol.x)))


def test_constrained_differential_evolution():
    # HS035 within a box (to the precision of the polish: trust-constr, default tolerances).
    prob = HS035.replace(bounds=(jnp.zeros(3), jnp.full(3, 3.0)))
    for alg in (ScipyGlobal("differential_evolution", rng=0),):
        sol = solve(prob, alg)
        assert sol.retcode == ReturnCode.SUCCESS, alg
        assert abs(float(sol.objective) - HS035_F) <= 1e-3 * HS035_F
        assert float(3.0 - jnp.sum(sol.x * jnp.array([1.0, 1.0, 2.0]))) >= -1e-8


def test_float32_problem_keeps_its_dtypes():
    prob = OptimizationProblem(lambda x, p: jnp.sum((x - 2.0) ** 2), jnp.zeros(3, jnp.float32))
    sol = solve(prob, ScipyMinimize("BFGS"))
    assert sol.x.dtype == jnp.float32 and sol.objective.dtype == jnp.float32
    np.testing.assert_allclose(sol.x, 2.0, atol=1e-4)


def test_hypergradient_through_scipy():
    # f = sum (x - p)^2 + 0.1 sum x^4 separates: x_i* solves 2 (x - p_i) + 0.4 x^3 = 0 (one
    # real root, numpy's), and dx_i*/dp_i = 2 / (2 + 1.2 x_i*^2), so the gradient of
    # sum x*^2 is 2 x* dx*/dp in closed form. gtol 1e-9 is met by the gradient test on every
    # compile option and BLAS kernel tried (at 1e-12 BFGS ends by precision loss on some).
    f = lambda x, p: jnp.sum((x - p) ** 2) + 0.1 * jnp.sum(x**4)
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.array([0.5, 1.0, -1.0]))

    def loss(p):
        return jnp.sum(solve(prob.replace(p=p), ScipyMinimize("BFGS"), gtol=1e-9).x ** 2)

    p = np.array([0.5, 1.0, -1.0])
    x_star = np.array(
        [
            np.real(r[np.abs(np.imag(r)) < 1e-12][0])
            for r in (np.roots([0.4, 0.0, 2.0, -2.0 * pi]) for pi in p)
        ]
    )
    expected = 2 * x_star * 2 / (2 + 1.2 * x_star**2)
    np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(p)), expected, rtol=1e-7)


def test_global_method_under_jit_and_vmap():
    def run(shift):
        prob = OptimizationProblem(
            lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(2), shift, bounds=(-3.0, 3.0)
        )
        return solve(prob, ScipyGlobal("direct"))

    eager = run(1.0)
    jitted = jax.jit(run)(1.0)
    assert jitted.original is None
    np.testing.assert_array_equal(jitted.x, eager.x)
    batched = jax.vmap(run)(jnp.array([1.0, -1.0]))
    np.testing.assert_allclose(batched.x, [[1.0, 1.0], [-1.0, -1.0]], atol=1e-3)


def test_four_argument_callback_gets_the_gradient_norm():
    norms = []
    prob = OptimizationProblem(quartic_jax, jnp.zeros(5))
    sol = solve(prob, ScipyMinimize("BFGS"), callback=lambda k, x, f, g: norms.append(g))
    g_final = jax.grad(quartic_jax)(sol.x, None)
    assert len(norms) == sol.stats.iterations
    np.testing.assert_allclose(norms[-1], float(jnp.max(jnp.abs(g_final))), rtol=1e-12)
    seen = []
    solve(
        prob, ScipyMinimize("Nelder-Mead"), maxiters=3, callback=lambda k, x, f, g: seen.append(g)
    )
    assert seen and all(np.isnan(seen))


def test_float32_problems_are_evaluated_in_float64():
    # scipy works in float64: f sees x (and p's float leaves) in float64; x comes back float32.
    seen = []

    def f(x, p):
        seen.append((x.dtype, p.dtype))
        return jnp.sum((x - p) ** 2)

    prob = OptimizationProblem(f, jnp.zeros(3, jnp.float32), jnp.full(3, 0.1, jnp.float32))
    sol = solve(prob, ScipyMinimize("BFGS"), gtol=1e-10)
    assert (jnp.float64, jnp.float64) in seen
    assert sol.retcode == ReturnCode.SUCCESS and sol.x.dtype == jnp.float32
    np.testing.assert_array_equal(sol.x, np.full(3, 0.1, np.float32))


def test_ftol_is_l_bfgs_b_own():
    x0 = np.zeros(5)
    ref = so.minimize(quartic_by_hand, x0, jac=True, method="L-BFGS-B", options={"ftol": 1e-3})
    sol = solve(
        OptimizationProblem(quartic_jax, jnp.asarray(x0)), ScipyMinimize("L-BFGS-B"), ftol=1e-3
    )
    np.testing.assert_allclose(np.asarray(sol.x), ref.x, rtol=0, atol=1e-12)
    assert sol.stats.f_evals == ref.nfev and sol.retcode == ReturnCode.SUCCESS
    assert "RELATIVE REDUCTION" in sol.original.message  # scipy's own ftol test stopped it
    with pytest.raises(TypeError, match=r"`ftol` is set through solve's common option"):
        ScipyMinimize("L-BFGS-B", ftol=1e-3)


@pytest.mark.parametrize("method", ["dogleg", "trust-ncg", "trust-exact", "trust-krylov"])
def test_trust_region_gtol_is_the_infinity_norm(method):
    # scipy's trust-region gtol tests the 2-norm; solve's gtol means the infinity norm.
    prob = OptimizationProblem(quartic_jax, jnp.zeros(5))
    seen = []
    sol = solve(prob, ScipyMinimize(method), gtol=1e-3, callback=lambda k, x, f, g: seen.append(g))
    assert sol.retcode == ReturnCode.SUCCESS
    assert seen[-1] <= 1e-3 and all(g > 1e-3 for g in seen[:-1])
