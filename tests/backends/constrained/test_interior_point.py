"""optsolve.InteriorPoint against published minima and independent solvers.

References: Hock & Schittkowski, *Test Examples for Nonlinear Programming Codes* (1981)
(problems 4, 21, 28, 35, 39, 71, 76 with their published f* and x*), IPOPT itself through
cyipopt where installed, scipy's SLSQP at a tight tolerance, and closed forms worked by
hand. Derivatives against central finite differences of the solve itself.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from constrained_problems import (
    hs035_objective,
    hs071,
    hs071_objective,
    hs071_product,
    hs071_squares,
    wachter_biegler,
)
from optsolve import Constraint, OptimizationProblem, ReturnCode, solve

jax.config.update("jax_enable_x64", True)

# tol given (IPOPT's default): the tight runs below differ in its value only, so that
# they share the compiled loop
IP = optsolve.InteriorPoint(tol=1e-8)
TIGHT = optsolve.InteriorPoint(tol=1e-12)


# HS035: a convex quadratic, one linear inequality, x >= 0 (f* = 1/9 at (4/3, 7/9, 4/9)).
HS035 = OptimizationProblem(
    hs035_objective,
    jnp.full(3, 0.5),
    bounds=(0.0, None),
    constraints=[Constraint(lambda x, p: x[0] + x[1] + 2 * x[2], upper=3.0)],
)

# HS076: four variables, three linear inequalities, x >= 0 (f* = -4.681818181).
HS076 = OptimizationProblem(
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
    jnp.full(4, 0.5),
    bounds=(0.0, None),
    constraints=[
        Constraint(
            lambda x, p: jnp.stack(
                [x[0] + 2 * x[1] + x[2] + x[3], 3 * x[0] + x[1] + 2 * x[2] - x[3]]
            ),
            upper=jnp.array([5.0, 4.0]),
        ),
        Constraint(lambda x, p: x[1] + 4 * x[2], lower=1.5),
    ],
)

# HS021: x0 = (-1, -1) lies outside the box 2 <= x1 <= 50, -50 <= x2 <= 50
# (f* = -99.96 at (2, 0)).
HS021 = OptimizationProblem(
    lambda x, p: 0.01 * x[0] ** 2 + x[1] ** 2 - 100,
    jnp.array([-1.0, -1.0]),
    bounds=(jnp.array([2.0, -50.0]), jnp.array([50.0, 50.0])),
    constraints=[Constraint(lambda x, p: 10 * x[0] - x[1], lower=10.0)],
)

# HS028: one linear equality (f* = 0 at (0.5, -0.5, 0.5)).
HS028 = OptimizationProblem(
    lambda x, p: (x[0] + x[1]) ** 2 + (x[1] + x[2]) ** 2,
    jnp.array([-4.0, 1.0, 1.0]),
    constraints=[Constraint(lambda x, p: x[0] + 2 * x[1] + 3 * x[2], lower=1.0, upper=1.0)],
)

# HS039: two nonlinear equalities (f* = -1 at (1, 1, 0, 0)).
HS039 = OptimizationProblem(
    lambda x, p: -x[0],
    jnp.full(4, 2.0),
    constraints=[
        Constraint(
            lambda x, p: jnp.stack([x[1] - x[0] ** 3 - x[2] ** 2, x[0] ** 2 - x[1] - x[3] ** 2]),
            lower=0.0,
            upper=0.0,
        )
    ],
)

# HS004: bounds only, both active... x1 >= 1 active, x2 >= 0 active (f* = 8/3 at (1, 0)).
HS004 = OptimizationProblem(
    lambda x, p: (x[0] + 1) ** 3 / 3 + x[1],
    jnp.array([1.125, 0.125]),
    bounds=(jnp.array([1.0, 0.0]), None),
)

# HS005: bounds only, interior minimum (f* = -sqrt(3)/2 - pi/3 at (-pi/3 + 1/2, -pi/3 - 1/2)).
HS005 = OptimizationProblem(
    lambda x, p: jnp.sin(x[0] + x[1]) + (x[0] - x[1]) ** 2 - 1.5 * x[0] + 2.5 * x[1] + 1,
    jnp.zeros(2),
    bounds=(jnp.array([-1.5, -3.0]), jnp.array([4.0, 3.0])),
)

PUBLISHED = [
    ("HS071", hs071(), 17.0140173, [1.0, 4.7429994, 3.8211503, 1.3794082]),
    ("HS035", HS035, 1.0 / 9.0, [4.0 / 3.0, 7.0 / 9.0, 4.0 / 9.0]),
    ("HS076", HS076, -4.681818181, [0.2727273, 2.090909, 0.0, 0.5454545]),
    ("HS028", HS028, 0.0, [0.5, -0.5, 0.5]),
    ("HS039", HS039, -1.0, [1.0, 1.0, 0.0, 0.0]),
    ("HS004", HS004, 8.0 / 3.0, [1.0, 0.0]),
    ("HS005", HS005, -np.sqrt(3) / 2 - np.pi / 3, [-np.pi / 3 + 0.5, -np.pi / 3 - 0.5]),
]


@pytest.mark.parametrize(
    "alg", [IP, optsolve.InteriorPoint(tol=1e-8, linear_solver="minres")], ids=["dense", "minres"]
)
@pytest.mark.parametrize("name, prob, f_star, x_star", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_minima(name, prob, f_star, x_star, alg):
    sol = solve(prob, alg)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    # the published values are given to 7-10 digits
    np.testing.assert_allclose(sol.objective, f_star, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(sol.x, x_star, rtol=1e-6, atol=1e-7)
    assert "E_0" in sol.message


@pytest.mark.parametrize(
    "name, prob",
    [(p[0], p[1]) for p in PUBLISHED[:3]] + [("HS021", HS021)],
    ids=["HS071", "HS035", "HS076", "HS021"],
)
def test_agrees_with_scipy_slsqp_and_the_kkt_multipliers(name, prob):
    """The point and the multipliers SLSQP finds at a tight tolerance, and the
    least-squares KKT multipliers at our point. f agrees to 1e-8: the last barrier
    parameter, about tol / 11, leaves f above f* by about mu per active bound.

    SLSQP's ftol is 1e-10, which it meets under every OpenBLAS kernel tried (Katmai,
    Sandybridge, Haswell: OPENBLAS_CORETYPE): at 1e-12 its line search ends in "Positive
    directional derivative" on HS071 under Sandybridge and Haswell, at the same point."""
    import warnings

    from optsolve.solve_api.kkt import multipliers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HS021's x0 outside the box (its own test below)
        ours = solve(prob, IP)
        theirs = solve(prob, optsolve.ScipyMinimize("SLSQP"), ftol=1e-10, maxiters=500)
    assert ours.retcode == theirs.retcode == ReturnCode.SUCCESS, (ours.message, theirs.message)
    np.testing.assert_allclose(ours.objective, theirs.objective, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(ours.x, theirs.x, rtol=1e-6, atol=1e-7)
    for a, b in zip(ours.multipliers, theirs.multipliers):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for own, least_squares in zip(ours.multipliers, multipliers(prob, ours.x)):
        np.testing.assert_allclose(own, least_squares, rtol=1e-6, atol=1e-7)


def test_agrees_with_ipopt_itself():
    """cyipopt (IPOPT 3.x, exact Hessians) on HS071: the same point, multipliers and a
    similar iteration count (IPOPT takes 8)."""
    cyipopt = pytest.importorskip("cyipopt")
    fun = jax.jit(lambda x: hs071_objective(x, None))

    def constraint(g, bound):
        value = jax.jit(lambda x: g(x, None) - bound)
        return {
            "fun": value,
            "jac": jax.jit(jax.grad(value)),
            "hess": jax.jit(lambda x, v: v[0] * jax.hessian(value)(x)),
        }

    with np.errstate(all="ignore"):
        res = cyipopt.minimize_ipopt(
            fun,
            np.array([1.0, 5.0, 5.0, 1.0]),
            jac=jax.jit(jax.grad(fun)),
            hess=jax.jit(jax.hessian(fun)),
            bounds=[(1.0, 5.0)] * 4,
            constraints=[
                {"type": "ineq", **constraint(hs071_product, 25.0)},
                {"type": "eq", **constraint(hs071_squares, 40.0)},
            ],
            options={"tol": 1e-8, "print_level": 0},
        )
    assert res.success, res.message
    sol = solve(hs071(), IP)
    np.testing.assert_allclose(sol.x, res.x, rtol=1e-7, atol=1e-8)
    # both stop at E_0 <= 1e-8: their f differ by about tol
    np.testing.assert_allclose(sol.objective, res.fun, rtol=1e-8)
    # IPOPT's multipliers of g (its sign: grad f + J^T lambda = 0, optsolve's too)
    np.testing.assert_allclose([float(m) for m in sol.multipliers], res.info["mult_g"], rtol=1e-6)
    np.testing.assert_allclose(res.info["mult_g"], [-0.55229366, 0.16146857], rtol=1e-6)
    assert sol.stats.iterations <= 2 * res.nit


def test_a_two_sided_constraint_holds_at_the_side_that_binds():
    """min |x - (a, 1)|^2 s.t. 1 <= x1 + x2 <= 2: the projection onto the band, in closed
    form: for a = 2 the upper side holds, x* = (1.5, 0.5), multiplier +1 (f* falls as the
    upper bound rises); for a = -2 the lower one, x* = (-1, 2), multiplier -2."""

    def prob(a):
        return OptimizationProblem(
            lambda x, p: (x[0] - p) ** 2 + (x[1] - 1) ** 2,
            jnp.zeros(2),
            a,
            constraints=[Constraint(lambda x, p: x[0] + x[1], lower=1.0, upper=2.0)],
        )

    upper = solve(prob(2.0), IP)
    np.testing.assert_allclose(upper.x, [1.5, 0.5], atol=1e-8)
    np.testing.assert_allclose(upper.multipliers[0], 1.0, atol=1e-7)
    lower = solve(prob(-2.0), IP)
    np.testing.assert_allclose(lower.x, [-1.0, 2.0], atol=1e-8)
    np.testing.assert_allclose(lower.multipliers[0], -2.0, atol=1e-7)
    assert upper.retcode == lower.retcode == ReturnCode.SUCCESS


def test_the_waechter_biegler_example_is_solved_from_its_failing_starts():
    """The Wächter-Biegler example (constrained_problems.wachter_biegler), feasible with
    x* = (1, 0, 1/2), from its own start (-2, 1, 1) and two others where a line-search
    interior-point method without restoration stalls at an infeasible point. A search that
    fails right after a restoration hands back must restore again, not stop."""
    for x0 in ([-2.0, 1.0, 1.0], [-3.0, 1.0, 1.0], [-2.0, 3.0, 0.5]):
        sol = solve(wachter_biegler(x0), IP)
        assert sol.retcode == ReturnCode.SUCCESS, (x0, sol.message)
        assert float(sol.state.resto_theta) > 0  # it went through restoration
        np.testing.assert_allclose(sol.x, [1.0, 0.0, 0.5], atol=1e-7)


def test_an_infeasible_problem_is_infeasible_with_its_violation():
    """|x|^2 <= 1 and x1 + x2 >= 3 have no common point: INFEASIBLE (never SUCCESS) at a
    finite point, the violation in the message."""
    prob = OptimizationProblem(
        lambda x, p: jnp.sum((x - 0.3) ** 2),
        jnp.array([0.1, -0.2]),
        constraints=[
            Constraint(lambda x, p: jnp.sum(x**2), upper=1.0),
            Constraint(lambda x, p: x[0] + x[1], lower=3.0),
        ],
    )
    sol = solve(prob, IP)
    assert sol.retcode == ReturnCode.INFEASIBLE, sol.message
    assert np.all(np.isfinite(np.asarray(sol.x)))
    assert "locally infeasible" in sol.message, sol.message
    # the violation it reports is that of the point it returns (relative to max(1, bound))
    violation = max(float(jnp.sum(sol.x**2)) - 1.0, (3.0 - float(jnp.sum(sol.x))) / 3.0)
    reported = float(sol.message.split("largest violation is ")[1].split(";")[0])
    np.testing.assert_allclose(reported, violation, rtol=1e-6)
    # the least violation lies between the two constraints' (on the diagonal x = (t, t):
    # t = 1/sqrt(2) violates only the second, by 1.59 / 3, t = 1.5 the first, by 3.5)
    assert 0.3 < violation < 1.59 / 3 + 0.2


def test_x0_outside_the_bounds_is_projected_then_pushed_inside():
    with pytest.warns(UserWarning, match="x0 lies outside the bounds"):
        sol = solve(HS021, IP)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, -99.96, rtol=1e-10)
    np.testing.assert_allclose(sol.x, [2.0, 0.0], atol=1e-7)


def test_jit_and_vmap_equal_each_members_own_solve():
    products = jnp.array([24.0, 25.0, 26.5])

    def run(b):
        sol = solve(hs071(b), IP)
        return sol.x, sol.objective, sol.retcode

    xs, fs, codes = jax.jit(jax.vmap(run))(products)
    for i, b in enumerate(products):
        own = solve(hs071(float(b)), IP)
        assert own.retcode == ReturnCode.SUCCESS and int(codes[i]) == int(own.retcode)
        np.testing.assert_allclose(xs[i], own.x, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(fs[i], own.objective, rtol=1e-12)
    np.testing.assert_allclose(fs[1], 17.0140173, rtol=1e-7)


def test_float32():
    # the default tol for float32 (1e-5): 1e-8 is below what its rounding resolves
    sol = solve(hs071(dtype=jnp.float32), optsolve.InteriorPoint())
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert sol.x.dtype == jnp.float32
    np.testing.assert_allclose(sol.objective, 17.0140173, rtol=1e-5)
    np.testing.assert_allclose(sol.x, [1.0, 4.7429994, 3.8211503, 1.3794082], rtol=1e-4, atol=1e-5)


def _central(fn, v, h):
    return (fn(v + h) - fn(v - h)) / (2 * h)


def test_derivatives_of_f_and_x_wrt_the_constraint_bound_match_finite_differences():
    """HS071 with its product bound b active: d f*/db = -lambda_1 (0.5522937) and dx*/db
    through the KKT adjoint, against central differences of the solve."""
    f_of = lambda b: solve(hs071(b), TIGHT).objective
    x_of = lambda b: solve(hs071(b), TIGHT).x
    grad = jax.grad(f_of)(25.0)
    np.testing.assert_allclose(grad, 0.55229366, rtol=1e-6)
    np.testing.assert_allclose(grad, _central(f_of, 25.0, 1e-4), rtol=1e-6)
    jac = jax.jacfwd(x_of)(25.0)
    np.testing.assert_allclose(jac, _central(x_of, 25.0, 1e-4), rtol=1e-5, atol=1e-7)


def _hs035_scaled(x, p):
    """HS035's objective with p scaling its linear term in x[0] (-8 x[0])."""
    return hs035_objective(x, p) - 8 * (p - 1) * x[0]


def _hs035_shifted(x, p):
    """HS035's constraint with p moving its right-hand side."""
    return x[0] + x[1] + 2 * x[2] - p


def test_derivatives_wrt_p_in_f_and_in_a_constraint_match_finite_differences():
    """HS035 with p scaling its objective's linear term and the right-hand side of its
    constraint (active at the solution): x*(p) against central differences. The functions
    are module-level, so that every solve here is one problem structure (one compiled loop
    for the eager solves, one for the differentiated ones)."""

    def prob(p):
        return OptimizationProblem(
            _hs035_scaled,
            jnp.full(3, 0.5),
            p,
            bounds=(0.0, None),
            constraints=[Constraint(_hs035_shifted, upper=2.0)],
        )

    x_of = lambda p: solve(prob(p), TIGHT).x
    jac = jax.jacrev(x_of)(1.0)
    np.testing.assert_allclose(jac, _central(x_of, 1.0, 1e-5), rtol=1e-6, atol=1e-8)
    f_of = lambda p: solve(prob(p), TIGHT).objective
    np.testing.assert_allclose(jax.grad(f_of)(1.0), _central(f_of, 1.0, 1e-5), rtol=1e-6)


@pytest.mark.parametrize("linear_solver", ["dense", "minres"])
def test_a_variable_with_equal_bounds_is_held_there(linear_solver):
    """IPOPT's fixed variables: HS071 with x1 fixed at 1 (where its published optimum has
    it), and by hand, min (x1 - 1)^2 + (x2 - 2)^2 with x2 fixed at 3 and x1 + x2 >= 5:
    x = (2, 3), f = 2, and the constraint's multiplier y = -2 (stationarity in x1:
    2 (x1 - 1) + y = 0)."""
    alg = optsolve.InteriorPoint(tol=1e-10, linear_solver=linear_solver)
    fixed = hs071().replace(bounds=(1.0, jnp.array([1.0, 5.0, 5.0, 5.0])))
    sol = solve(fixed, alg)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.objective, 17.0140173, rtol=1e-7)
    np.testing.assert_allclose(sol.x, [1.0, 4.7429994, 3.8211503, 1.3794082], rtol=1e-6)
    assert float(sol.x[0]) == 1.0
    by_hand = OptimizationProblem(
        lambda x, p: (x[0] - 1) ** 2 + (x[1] - 2) ** 2,
        jnp.array([0.0, 3.0]),
        bounds=(jnp.array([-10.0, 3.0]), jnp.array([10.0, 3.0])),
        constraints=[Constraint(lambda x, p: x[0] + x[1], lower=5.0)],
    )
    sol = solve(by_hand, alg)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, [2.0, 3.0], rtol=1e-8)
    np.testing.assert_allclose(sol.objective, 2.0, rtol=1e-8)
    np.testing.assert_allclose(sol.multipliers[0], -2.0, rtol=1e-6)


def test_resume_continues_the_run_with_its_multipliers():
    prob = hs071()
    whole = solve(prob, IP, maxiters=6)
    first = solve(prob, IP, maxiters=3)
    second = solve(prob, IP, maxiters=3, resume=first)
    np.testing.assert_allclose(second.x, whole.x, rtol=1e-13)
    np.testing.assert_allclose(second.state.y, whole.state.y, rtol=1e-12)
    np.testing.assert_allclose(second.state.mu, whole.state.mu, rtol=1e-15)


def test_a_bad_hyperparameter_is_named():
    with pytest.raises(ValueError, match="InteriorPoint: `tau_min` must be in"):
        optsolve.InteriorPoint(tau_min=1.5)
    with pytest.raises(ValueError, match="InteriorPoint: `tol` must be > 0"):
        optsolve.InteriorPoint(tol=0.0)


def test_gradient_based_scaling_solves_a_badly_scaled_hs071():
    """IPOPT's gradient-based scaling (nlp_scaling_max_gradient = 100): HS071 with f times
    1e6 and the product constraint (with its bound) times 1e4. At x0 = (1, 5, 5, 1) the
    gradients by hand are 1e6 (12, 1, 2, 11) for f, 1e4 (25, 5, 5, 25) and (2, 10, 10, 2)
    for the rows: f is scaled by 100 / 1.2e7, the product row by 100 / 2.5e5, the sum of
    squares not at all. Scaled, the run is HS071's own (the published x*, f* times 1e6, and
    IPOPT's published multipliers (-0.5522937, 0.1614686) times 1e6 / 1e4 and 1e6, in the
    user's terms) in as many iterations as HS071 itself takes; unscaled it takes more (13
    against 8 when measured; it ended FAILURE before the inertia test read each pivot
    against its own row)."""

    def problem(k_f, k_c):
        cons = [
            Constraint(lambda x, p: k_c * hs071_product(x, p), lower=25.0 * k_c),
            Constraint(hs071_squares, lower=40.0, upper=40.0),
        ]
        return OptimizationProblem(
            lambda x, p: k_f * hs071_objective(x, p),
            jnp.array([1.0, 5.0, 5.0, 1.0]),
            bounds=(1.0, 5.0),
            constraints=cons,
        )

    sol = solve(problem(1e6, 1e4), IP)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.state.f_scale, 100 / 1.2e7, rtol=1e-12)
    np.testing.assert_allclose(sol.state.c_scale, [100 / 2.5e5, 1.0], rtol=1e-12)
    np.testing.assert_allclose(sol.x, [1.0, 4.7429994, 3.8211503, 1.3794082], rtol=1e-6)
    np.testing.assert_allclose(sol.objective, 1e6 * 17.0140173, rtol=1e-7)
    np.testing.assert_allclose(
        [sol.multipliers[0], sol.multipliers[1]], [-0.5522937 * 1e2, 0.1614686 * 1e6], rtol=1e-6
    )
    plain = solve(problem(1.0, 1.0), IP)
    np.testing.assert_allclose(plain.state.f_scale, 1.0)  # HS071's gradients are below 100
    assert int(sol.stats.iterations) == int(plain.stats.iterations)
    unscaled = solve(
        problem(1e6, 1e4), optsolve.InteriorPoint(tol=1e-8, nlp_scaling_max_gradient=jnp.inf)
    )
    np.testing.assert_allclose(unscaled.state.f_scale, 1.0)
    assert int(unscaled.stats.iterations) > int(plain.stats.iterations), unscaled.message


def test_relaxed_inequality_bounds_keep_the_interior_nonempty():
    """IPOPT's bound_relax_factor: min (x1 - 3)^2 + (x2 - 2)^2 s.t. x1 >= 1 and x1 <= 1 as
    two inequality rows, whose slacks have no interior (x* = (1, 2), f* = 4; stationarity
    by hand: y1 + y2 = 4 with y1 <= 0 <= y2, any such pair). Relaxed by 1e-8, the run
    converges with bounded multipliers at x1 within 1e-8 of 1; unrelaxed, the multipliers
    grow without bound as the slacks close on each other."""
    prob = OptimizationProblem(
        lambda x, p: (x[0] - 3) ** 2 + (x[1] - 2) ** 2,
        jnp.zeros(2),
        constraints=[
            Constraint(lambda x, p: x[0], lower=1.0),
            Constraint(lambda x, p: x[0], upper=1.0),
        ],
    )
    sol = solve(prob, IP)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, [1.0, 2.0], atol=2e-8)
    np.testing.assert_allclose(sol.objective, 4.0, atol=1e-7)
    y = np.array([sol.multipliers[0], sol.multipliers[1]])
    np.testing.assert_allclose(y.sum(), 4.0, rtol=1e-6)
    assert y[0] <= 0 <= y[1] and np.abs(y).max() < 10
    unrelaxed = solve(prob, optsolve.InteriorPoint(tol=1e-8, bound_relax_factor=0.0))
    assert np.abs([unrelaxed.multipliers[0], unrelaxed.multipliers[1]]).max() > 1e4
    with pytest.raises(ValueError, match="bound_relax_factor"):
        optsolve.InteriorPoint(bound_relax_factor=1e-5)


def _polygon_projection(sides):
    """min |x - (2, 0)|^2 over the regular polygon cos(t_k) x1 + sin(t_k) x2 <= 1, t_k =
    2 pi k / sides: by hand, x* = (1, 0) on the side k = 0, f* = 1, and that row's
    multiplier 2 (stationarity: 2 (x1 - 2) + y_0 = 0; the others 0)."""
    angles = 2 * jnp.pi * jnp.arange(sides) / sides
    normals = jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=1)
    return OptimizationProblem(
        lambda x, p: jnp.sum((x - jnp.array([2.0, 0.0])) ** 2),
        jnp.array([0.0, 0.5]),
        constraints=[Constraint(lambda x, p: normals @ x, upper=1.0)],
    )


def test_many_inequality_rows_reduce_the_newton_system_to_x():
    """n = 2, m = 300 inequality rows: "auto" picks the n x n primal Schur complement
    ("condensed"), which solves the polygon projection by hand; and the condensed step
    equals the full system's at the start of HS076 (three inequality rows)."""
    prob = _polygon_projection(300)
    assert optsolve.InteriorPoint().specialised_for(prob).linear_solver == "condensed"
    # tight: at IPOPT's tol the rows next to the active one keep multipliers mu / gap of
    # 1e-5, and y_0 differs from 2 by their sum
    sol = solve(prob, TIGHT)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, [1.0, 0.0], atol=1e-10)
    np.testing.assert_allclose(sol.objective, 1.0, rtol=1e-10)
    y = np.asarray(sol.multipliers[0])
    np.testing.assert_allclose(y[0], 2.0, rtol=1e-7)
    assert np.abs(y[1:]).max() < 1e-7

    _condensed_step_equals_the_full_systems(HS076)


def _condensed_step_equals_the_full_systems(problem):
    """The first Newton step of "condensed" (as solve specialises it for ``problem``)
    equals the full system's ("dense")."""
    from optsolve.backends.constrained import interior_point, newton_system
    from optsolve.backends.native.objective import Objective

    steps = []
    for kind in ("dense", "condensed"):
        alg = optsolve.InteriorPoint(linear_solver=kind).specialised_for(problem)
        solver = interior_point.InteriorPointSolver(alg, problem)
        objective = Objective.from_problem(problem)
        st = solver.init(objective, problem.x0, None, None)
        nlp = solver._nlp(objective, st)
        v = jnp.concatenate([st.x, st.s])
        fact = newton_system.factorise(
            nlp,
            nlp.lagrangian_hessian(st.x, st.y),
            st.jac,
            nlp.sigma(v, st.z_l, st.z_u),
            st.mu,
            st.delta_w,
        )
        steps.append(
            newton_system.direction(
                nlp,
                fact,
                nlp.barrier_grad(st.grad, v, st.mu),
                st.jac,
                st.y,
                nlp.residual(st.c, st.s),
            )
        )
    for full, condensed in zip(*steps):
        np.testing.assert_allclose(condensed, full, rtol=1e-10, atol=1e-12)


def test_condensed_keeps_the_equality_rows():
    """The polygon of 300 sides cut by the equality x2 = 1/2: "auto" condenses the
    inequality rows and keeps the equality's (n + m_E = 3 rows). By hand: x1* is the
    polygon's largest x1 at x2 = 1/2, min over the sides facing x1 > 0 of (1 - sin(t_k) /
    2) / cos(t_k), on side k; its multiplier y_k = 2 (2 - x1*) / cos(t_k) (stationarity in
    x1) and the equality's -(1 + y_k sin(t_k)) (in x2). And the step at HS071's start (an
    equality among two rows) equals the full system's."""
    sides = 300
    polygon = _polygon_projection(sides)
    prob = polygon.replace(
        constraints=list(polygon.constraints)
        + [Constraint(lambda x, p: x[1], lower=0.5, upper=0.5)]
    )
    alg = optsolve.InteriorPoint().specialised_for(prob)
    assert alg.linear_solver == "condensed" and alg._equality_rows == (sides,)
    # the algorithm's own field, not a hyperparameter: replace neither takes nor lists it
    with pytest.raises(
        TypeError,
        match=r"unknown hyperparameter\(s\) \['_equality_rows'\]; "
        r"valid: tol, .*, linear_solver\.$",
    ):
        alg.replace(_equality_rows=())
    angles = 2 * np.pi * np.arange(sides) / sides
    facing = np.cos(angles) > 1e-12
    widths = np.where(
        facing, (1 - 0.5 * np.sin(angles)) / np.where(facing, np.cos(angles), 1.0), np.inf
    )
    k = int(np.argmin(widths))
    x1 = widths[k]
    y_k = 2 * (2 - x1) / np.cos(angles[k])
    sol = solve(prob, TIGHT)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_allclose(sol.x, [x1, 0.5], atol=1e-10)
    np.testing.assert_allclose(sol.objective, (x1 - 2) ** 2 + 0.25, rtol=1e-10)
    y = np.asarray(sol.multipliers[0])
    np.testing.assert_allclose(y[k], y_k, rtol=1e-6)
    assert np.abs(np.delete(y, k)).max() < 1e-6
    np.testing.assert_allclose(sol.multipliers[1], -(1 + y_k * np.sin(angles[k])), rtol=1e-6)
    _condensed_step_equals_the_full_systems(hs071())

    # under a jit that traces the bounds, which rows are equalities is not known when the
    # program is built: "condensed" asked for anyway fails, never a silent step
    @jax.jit
    def traced(bound):
        on_line = Constraint(lambda x, p: x[1], lower=bound, upper=bound)
        return solve(
            polygon.replace(constraints=list(polygon.constraints) + [on_line]),
            optsolve.InteriorPoint(linear_solver="condensed"),
        ).retcode

    assert traced(0.5) == ReturnCode.FAILURE


def test_a_degenerate_root_is_not_called_infeasible():
    """FLT (R. Fletcher, S. Leyffer, Ph. L. Toint, SIAM J. Optim. 13 (2002) 44-59, "a
    troublesome problem for filter methods"): min (1 - x2)^2 s.t. x1^2 = 0, x1^3 = 0, from
    (1, 0); by hand x* = (0, 1), f* = 0, where no constraint qualification holds. The
    restoration's least-squares gradient vanishes as |x1|^3 before the violation x1^2 does:
    stationarity is that of the violation's norm, so the run reaches a feasible point
    (|x1| <= 1e-3: x1^2 <= 1e-6) instead of ending INFEASIBLE at x1 = -1.5e-3."""
    prob = OptimizationProblem(
        lambda x, p: (1 - x[1]) ** 2,
        jnp.array([1.0, 0.0]),
        constraints=[Constraint(lambda x, p: jnp.stack([x[0] ** 2, x[0] ** 3]), 0.0, 0.0)],
    )
    sol = solve(prob, IP)
    assert sol.retcode != ReturnCode.INFEASIBLE, sol.message
    assert abs(float(sol.x[0])) <= 1e-3
    np.testing.assert_allclose(sol.x[1], 1.0, atol=1e-8)
    assert float(sol.objective) <= 1e-12


def _hs116_constraints(x, p):
    x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13 = x
    return jnp.stack(
        [
            x3 - x2,
            x2 - x1,
            1 - 0.002 * x7 + 0.002 * x8,
            x11 + x12 + x13 - 50.0,
            x13 - 1.262626 * x10 + 1.231059 * x3 * x10,
            x5 - 0.03475 * x2 - 0.975 * x2 * x5 + 0.00975 * x2**2,
            x6 - 0.03475 * x3 - 0.975 * x3 * x6 + 0.00975 * x3**2,
            x5 * x7 - x1 * x8 - x4 * x7 + x4 * x8,
            1 - 0.002 * (x2 * x9 + x5 * x8 - x1 * x8 - x6 * x9) - x5 - x6,
            x2 * x9 - x3 * x10 - x6 * x9 - 500 * x2 + 500 * x6 + x2 * x10,
            x2 - 0.9 - 0.002 * (x2 * x10 - x3 * x10),
            x4 - 0.03475 * x1 - 0.975 * x1 * x4 + 0.00975 * x1**2,
            x11 - 1.262626 * x8 + 1.231059 * x1 * x8,
            x12 - 1.262626 * x9 + 1.231059 * x2 * x9,
        ]
    )


def test_hs116_published_minimum():
    """Hock & Schittkowski's problem 116 (a three-stage membrane separation: 13 variables,
    14 bilinear and quadratic inequalities, f = x11 + x12 + x13 <= 250 among them), from
    its published (infeasible) start: f* = 97.588409 at the published x*. Before each
    pivot of the inertia test was read against its own row, delta_w ran past 1e40 at every
    step from iteration 18 on, every constraint row's pivot reading as zero against it, and
    the run left the optimum it had reached and ended INFEASIBLE at f = 50."""
    lower = jnp.array([0.1, 0.1, 0.1, 1e-4, 0.1, 0.1, 0.1, 0.1, 500.0, 0.1, 1.0, 1e-4, 1e-4])
    upper = jnp.array(
        [1.0, 1.0, 1.0, 0.1, 0.9, 0.9, 1000.0, 1000.0, 1000.0, 500.0, 150.0, 150.0, 150.0]
    )
    x0 = jnp.array([0.5, 0.8, 0.9, 0.1, 0.14, 0.5, 489.0, 80.0, 650.0, 450.0, 150.0, 150.0, 150.0])
    upper_f = jnp.full(14, jnp.inf).at[3].set(200.0)  # 50 <= f <= 250
    prob = OptimizationProblem(
        lambda x, p: x[10] + x[11] + x[12],
        x0,
        bounds=(lower, upper),
        constraints=[Constraint(_hs116_constraints, 0.0, upper_f)],
    )
    sol = solve(prob, IP)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    # the published f* to the accuracy of its x* (this run's f is 9e-4 below it, feasible)
    np.testing.assert_allclose(sol.objective, 97.588409, rtol=2e-5)
    # x10* = 0.1, its lower bound: the table's 1.0 contradicts its own x13* = 0.00673
    # through the fifth constraint, x13 >= x10 (1.262626 - 1.231059 x3*) = 0.0673 x10
    np.testing.assert_allclose(
        sol.x,
        [
            0.8037703,
            0.8999860,
            0.9709724,
            0.09999952,
            0.1908154,
            0.4605717,
            574.0803,
            74.08043,
            500.0162,
            0.1,
            20.23413,
            77.34755,
            0.00673039,
        ],
        rtol=2e-3,
        atol=1e-4,
    )


def test_a_redundant_equality_keeps_the_run_at_its_local_minimum():
    """Hock & Schittkowski's problem 55: six linear equalities in six variables, one of them
    (x4 + x5 + x6 = 2) implied by the other five, so the Newton matrix's equality rows are
    rank-deficient at every iterate. By hand, with t = x1 in [0, 1] the feasible set is the
    segment x = (t, (t + 4)/3, (5 - 4t)/3, 1 - t, (2 - t)/3, (1 + 4t)/3), on which f(t) = t/3 +
    16/3 + exp(t - t^2) has f'(1) = -2/3: from the published start (1, 2, 0, 0, 0, 2) the
    nearest minimum is t = 1, x = (1, 5/3, 1/3, 0, 1/3, 5/3), f = 20/3 (the global one is t =
    0, f = 19/3). Read against its own row only, a rounding-sized pivot of an equality row
    passed as nonzero: the jitted run stopped at f = 20/3 + 3.4e-6 (sif2jax's HS55, also
    jitted, ended FAILURE with multipliers of 1e40); the inertia test now reads each pivot
    against the size of what its elimination subtracted as well."""

    def equalities(x, p):
        x1, x2, x3, x4, x5, x6 = x
        return jnp.stack(
            [
                x1 + 2 * x2 + 5 * x5 - 6,
                x1 + x2 + x3 - 3,
                x4 + x5 + x6 - 2,
                x1 + x4 - 1,
                x2 + x5 - 2,
                x3 + x6 - 2,
            ]
        )

    prob = OptimizationProblem(
        lambda x, p: x[0] + 2 * x[1] + 4 * x[4] + jnp.exp(x[0] * x[3]),
        jnp.array([1.0, 2.0, 0.0, 0.0, 0.0, 2.0]),
        bounds=(jnp.zeros(6), jnp.array([1.0, jnp.inf, jnp.inf, 1.0, jnp.inf, jnp.inf])),
        constraints=[Constraint(equalities, 0.0, 0.0)],
    )
    sol = jax.jit(lambda x0: solve(prob.replace(x0=x0), IP))(prob.x0)
    assert sol.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(sol.x, [1.0, 5 / 3, 1 / 3, 0.0, 1 / 3, 5 / 3], atol=1e-7)
    np.testing.assert_allclose(sol.objective, 20 / 3, rtol=1e-8)
