"""Root finding: scipy's own tests of ``root`` / ``fsolve`` (scipy/optimize/tests/
test_minpack.py's TestFSolve, TestRootHybr, TestRootLM; test_nonlin.py's problems F, F2,
F2_lucky, F3, F4_powell, F5, F6, TestNonlinOldTests, TestLinear; test__root.py's
test_tol_parameter), ported to RootProblem on the JAX-native root finders, each within the
test's own tolerance, in float64 and float32; derivatives against closed forms; the errors.
The rules every root-solving class keeps are in tests/contract/test_contract_roots.py."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optsolve
from optsolve import ReturnCode, RootProblem, solve

ALGORITHMS = {
    "NewtonRaphson": optsolve.NewtonRaphson,
    "Broyden": optsolve.Broyden,
    "LevenbergMarquardt": optsolve.LevenbergMarquardt,
}
DTYPES = ["float64", "float32"]


# ------------------------------------------------------------- scipy's problems, in JAX


def pressure_network(flow_rates, p):
    """scipy's test_minpack.pressure_network: n parallel pipes, P_i = k_i Q_i^2,
    f_i = P_i - P_0 (i >= 1), f_0 = sum(Q) - Qtot. p = (Qtot, k)."""
    Qtot, k = p
    P = k * flow_rates**2
    return jnp.concatenate([P[1:] - P[0], jnp.atleast_1d(flow_rates.sum() - Qtot)])


def nonlin_F(x, p):
    d = jnp.array([3.0, 2.0, 1.5, 1.0, 0.5], x.dtype)
    c = 0.01
    return -d * x - c * jnp.dot(x, x) * x


def nonlin_F2(x, p):
    return x


def nonlin_F3(x, p):
    A = jnp.array([[-2, 1, 0.0], [1, -2, 1], [0, 1, -2]], x.dtype)
    b = jnp.array([1, 2, 3.0], x.dtype)
    return A @ x - b


def nonlin_F4_powell(x, p):
    A = 1e4
    return jnp.stack([A * x[0] * x[1] - 1, jnp.exp(-x[0]) + jnp.exp(-x[1]) - (1 + 1 / A)])


def nonlin_F5(x, p):
    return pressure_network(x, (4.0, jnp.full(4, 0.5, x.dtype)))


def nonlin_F6(x, p):
    x1, x2 = x[0], x[1]
    J0 = jnp.array([[-4.256, 14.7], [0.8394989, 0.59964207]], x.dtype)
    v = jnp.stack([(x1 + 3) * (x2**5 - 7) + 3 * 6, jnp.sin(x2 * jnp.exp(x1) - 1)])
    return -jnp.linalg.solve(J0, v)


NONLIN = {  # test_nonlin.py's problems and starting points
    "F": (nonlin_F, [1, 1, 1, 1, 1]),
    "F2": (nonlin_F2, [1, 2, 3, 4, 5, 6]),
    "F2_lucky": (nonlin_F2, [0, 0, 0, 0, 0, 0]),
    "F3": (nonlin_F3, [1, 2, 3]),
    "F4_powell": (nonlin_F4_powell, [-1, -2]),
    "F5": (nonlin_F5, [2.0, 0, 2, 0]),
    "F6": (nonlin_F6, [-0.5, 1.4]),
}


def _max_abs(F, x, p=None):
    return float(np.max(np.abs(np.asarray(F(jnp.asarray(x), p), np.float64))))


# ------------------------------------------------------------ test_minpack.py: TestFSolve


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_pressure_network_equal_pipes_give_equal_flows(name, dtype):
    """TestFSolve / TestRootHybr / TestRootLM.test_pressure_network_*: from a start where
    the Jacobian is singular (two equal rows), the flows come out equal:
    assert_array_almost_equal(final_flows, ones(4)), i.e. within 1.5e-6."""
    k = jnp.full(4, 0.5, dtype)
    prob = RootProblem(
        pressure_network, jnp.array([2.0, 0.0, 2.0, 0.0], dtype), (jnp.asarray(4.0, dtype), k)
    )
    sol = solve(prob, ALGORITHMS[name]())
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert np.asarray(sol.x).dtype == np.dtype(dtype)
    np.testing.assert_array_almost_equal(sol.x, np.ones(4))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_float32(name):
    """TestFSolve.test_float32: a double root at (100, 1000), float32 throughout;
    assert_allclose(func(p), [0, 0], atol=1e-3)."""

    def func(x, p):
        return (x - jnp.array([100.0, 1000.0], jnp.float32)) ** 2

    sol = solve(RootProblem(func, jnp.array([1.0, 1.0], jnp.float32)), ALGORITHMS[name]())
    assert np.asarray(sol.x).dtype == np.float32
    np.testing.assert_allclose(func(sol.x, None), [0, 0], atol=1e-3)


def test_wrong_shape_of_F_is_a_type_error_naming_F():
    """TestFSolve.test_wrong_shape_func_*: F returning fewer equations than unknowns."""
    with pytest.raises(
        TypeError,
        match=r"RootProblem: `F\(x, p\)` must return an array "
        r"shaped like x: x0 has shape \(2,\), F returned "
        r"shape \(1,\)",
    ):
        solve(RootProblem(lambda x, p: jnp.ones(1), [1.5, 2.0]), optsolve.NewtonRaphson())
    with pytest.raises(TypeError, match=r"x0 has shape \(2,\), F returned shape \(3,\)"):
        solve(RootProblem(lambda x, p: (jnp.ones(3),), (jnp.ones(2),)), optsolve.Broyden())


def test_F_can_raise():
    """TestFSolve.test_func_can_raise: the user's exception reaches the caller unchanged."""

    def func(*args):
        raise ValueError("I raised")

    with pytest.raises(ValueError, match="I raised"):
        solve(RootProblem(func, [0.0]), optsolve.NewtonRaphson())


# --------------------------------------------------------------------- test_nonlin.py


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("problem", NONLIN)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_problem_nonlin(name, problem, dtype):
    """TestNonlin.test_problem_nonlin / test_problem_root: every problem, f_tol=1e-2,
    maxiter=200: np.absolute(f(x)).max() < f_tol (no KNOWN_BAD list here: each method
    solves each problem); and to the default tolerance, SUCCESS there too."""
    F, xin = NONLIN[problem]
    prob = RootProblem(F, jnp.asarray(xin, dtype))
    sol = solve(prob, ALGORITHMS[name](), ftol=1e-2, maxiters=200)
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert _max_abs(F, sol.x) < 1e-2
    if name == "LevenbergMarquardt":
        # it stops by its own tests (in float32 on F4_powell at max|F| = 2e-3, by its
        # trust radius): scipy's tolerance above is what it is held to
        return
    tight = solve(prob, ALGORITHMS[name](), maxiters=200)
    assert tight.retcode == ReturnCode.SUCCESS, tight.message
    assert _max_abs(F, tight.x) <= (1e-8 if dtype == "float64" else 1e-5)


@pytest.mark.parametrize("name", ["Broyden", "NewtonRaphson"])
def test_old_tests_broyden_on_F(name):
    """TestNonlinOldTests.test_broyden1 / test_root_broyden1: F from its xin in 12
    iterations, norm(x) < 1e-9 and norm(F(x)) < 1e-9."""
    F, xin = NONLIN["F"]
    sol = solve(
        RootProblem(F, jnp.asarray(xin, jnp.float64)), ALGORITHMS[name](), maxiters=12, ftol=1e-10
    )
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert np.linalg.norm(sol.x) < 1e-9 and np.linalg.norm(F(sol.x, None)) < 1e-9


def test_linear_systems_are_solved_in_few_steps():
    """TestLinear.test_broyden1: a random 20 x 20 linear system, f_tol 1e-6, within
    2N + 1 = 41 iterations: allclose(A sol, b, atol=1e-6). Broyden starts from the true
    Jacobian, so one step solves it."""
    rng = np.random.default_rng(123)
    A = jnp.asarray(rng.standard_normal((20, 20)))
    b = jnp.asarray(rng.standard_normal(20))
    for alg in (optsolve.Broyden(), optsolve.NewtonRaphson()):
        sol = solve(RootProblem(lambda x, p: A @ x - b, jnp.zeros(20)), alg, maxiters=41, ftol=1e-6)
        assert sol.retcode == ReturnCode.SUCCESS, sol.message
        np.testing.assert_allclose(A @ sol.x, b, atol=1e-6)
        assert sol.stats.iterations <= 2


# -------------------------------------------------------------------- test__root.py


@pytest.mark.parametrize("name", ALGORITHMS)
def test_tol_parameter(name):
    """TestRoot.test_tol_parameter: x^3 - 1 = 0 from 1.1; ftol=1e-4 ends nearer the root
    than ftol=0.5, and both succeed."""

    def func(z, p):
        return z**3 - 1

    prob = RootProblem(func, jnp.array([1.1, 1.1]))
    sol1 = solve(prob, ALGORITHMS[name](), ftol=1e-4)
    sol2 = solve(prob, ALGORITHMS[name](), ftol=0.5)
    assert sol1.success and sol2.success, (sol1.message, sol2.message)
    if name == "LevenbergMarquardt":  # its own tests stop it; ftol judges the result
        assert _max_abs(func, sol1.x) <= _max_abs(func, sol2.x)
    else:  # ftol stops the JAX-native root finders
        assert _max_abs(func, sol1.x) < _max_abs(func, sol2.x)
    assert _max_abs(func, sol1.x) <= 1e-4 and _max_abs(func, sol2.x) <= 0.5


# ---------------------------------------------------------------------- derivatives


@pytest.mark.parametrize("name", ALGORITHMS)
def test_derivative_matches_the_closed_form(name):
    """x^3 = p has the root x = p^(1/3), dx/dp = p^(-2/3) / 3: forward and reverse mode."""
    alg = ALGORITHMS[name]()
    x0 = jnp.array([1.0, 2.0])

    def root(p):
        return solve(RootProblem(lambda x, q: x**3 - q, x0, p), alg).x

    p = jnp.array([8.0, 27.0])
    closed = np.diag(p ** (-2 / 3) / 3)
    np.testing.assert_allclose(jax.jacfwd(root)(p), closed, rtol=1e-8)
    np.testing.assert_allclose(jax.jacrev(root)(p), closed, rtol=1e-8)
    # p a closed-over value of an enclosing grad rather than p
    closed_over = jax.grad(lambda c: jnp.sum(solve(RootProblem(lambda x, q: x**3 - c, x0), alg).x))(
        8.0
    )
    np.testing.assert_allclose(closed_over, 2 * 8.0 ** (-2 / 3) / 3, rtol=1e-8)


@pytest.mark.parametrize("name", ["NewtonRaphson", "Broyden"])
def test_second_derivative_matches_the_closed_form(name):
    """d^2/dp^2 p^(1/3) = -2/9 p^(-5/3): the rule differentiates itself again."""

    def root(p):
        return solve(RootProblem(lambda x, q: x**3 - q, jnp.ones(1), p), ALGORITHMS[name]()).x[0]

    np.testing.assert_allclose(jax.hessian(root)(8.0), -2 / 9 * 8.0 ** (-5 / 3), rtol=1e-7)
    np.testing.assert_allclose(jax.jacfwd(jax.grad(root))(8.0), -2 / 9 * 8.0 ** (-5 / 3), rtol=1e-7)


def test_derivative_of_the_pressure_network_matches_finite_differences():
    """Nonsymmetric Jacobian: reverse mode transposes it (not the symmetric rule of a
    minimiser's Hessian)."""

    def flows(k):
        prob = RootProblem(pressure_network, jnp.array([2.0, 0.0, 2.0, 0.0]), (4.0, k))
        return solve(prob, optsolve.NewtonRaphson()).x

    k = jnp.array([0.5, 1.0, 2.0, 4.0])
    fd = np.stack([(flows(k + h) - flows(k - h)) / 2e-6 for h in 1e-6 * np.eye(4)], axis=1)
    np.testing.assert_allclose(jax.jacfwd(flows)(k), fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(jax.jacrev(flows)(k), fd, rtol=1e-6, atol=1e-8)


def test_a_singular_jacobian_gets_the_minimum_norm_derivative_with_a_warning():
    """F = (x0 + x1 - p, 2 (x0 + x1 - p)): roots on a line, J singular. The derivative is
    the minimum-norm solution of J dx = -F_p dp, dx = (1/2, 1/2) dp, in both modes."""

    def F(x, p):
        s = x[0] + x[1] - p
        return jnp.stack([s, 2 * s])

    def root(p):
        return solve(RootProblem(F, jnp.array([0.0, 0.0]), p), optsolve.NewtonRaphson()).x

    with pytest.warns(RuntimeWarning, match="Jacobian dF/dx at the root is singular"):
        forward = jax.jacfwd(root)(1.0)
    with pytest.warns(RuntimeWarning, match="Jacobian dF/dx at the root is singular"):
        reverse = jax.jacrev(root)(1.0)
    np.testing.assert_allclose(forward, [0.5, 0.5], rtol=1e-10)
    np.testing.assert_allclose(reverse, [0.5, 0.5], rtol=1e-10)


# --------------------------------------------------------------- outcomes and errors


@pytest.mark.parametrize("name", ALGORITHMS)
def test_no_root_is_never_success(name):
    """x^2 + 1 has no real root: |F|^2 has a minimum at 0 that is not one."""
    sol = solve(
        RootProblem(lambda x, p: x**2 + 1, jnp.array([0.7])), ALGORITHMS[name](), maxiters=100
    )
    assert sol.retcode in (ReturnCode.STALLED, ReturnCode.FAILURE, ReturnCode.MAXITERS)
    assert re.search(r"max\|F\(x\)\| = 1(\.\d+)? > ftol = 1e-08", sol.message), sol.message


def test_a_root_solver_refuses_a_minimisation_problem():
    prob = optsolve.OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.ones(2))
    for alg in (optsolve.NewtonRaphson(), optsolve.Broyden()):
        with pytest.raises(
            TypeError,
            match=r"solves root problems only .*RootProblem\(F, "
            r"x0, p\).*LBFGS",
        ):
            solve(prob, alg)
    residuals = optsolve.LeastSquaresProblem(lambda x, p: x - 1, jnp.ones(2))
    with pytest.raises(TypeError, match="solves root problems only"):
        solve(residuals, optsolve.NewtonRaphson())


def test_a_minimiser_refuses_a_root_problem_naming_the_root_solvers():
    prob = RootProblem(lambda x, p: x - 1, jnp.zeros(2))
    with pytest.raises(
        TypeError,
        match=r"LBFGS does not solve root problems. Algorithms "
        r"that do: LevenbergMarquardt, NewtonRaphson, Broyden",
    ):
        solve(prob, optsolve.LBFGS())


def test_options_that_do_not_apply_are_refused():
    prob = RootProblem(lambda x, p: x - 1, jnp.zeros(2))
    with pytest.raises(ValueError, match=r"`gtol` is not an option .* max\|F\(x\)\| <= ftol"):
        solve(prob, optsolve.NewtonRaphson(), gtol=1e-6)
    with pytest.raises(ValueError, match="`batch_size` is not an option"):
        solve(prob, optsolve.NewtonRaphson(), batch_size=2)
    with pytest.raises(TypeError, match="does not take the option.*'xtol'"):
        solve(prob, optsolve.NewtonRaphson(), xtol=1e-6)


def test_construction_errors_name_the_argument():
    with pytest.raises(TypeError, match="RootProblem: `F` must be a callable"):
        RootProblem(3.0, jnp.zeros(2))
    with pytest.raises(TypeError, match=r"RootProblem: `x0` must hold real floating-point"):
        RootProblem(lambda x, p: x, jnp.zeros(2, jnp.int32))
    with pytest.raises(TypeError, match=r"RootProblem: `F` must be F\(x, p\)"):
        RootProblem(lambda x: x, jnp.zeros(2))
    with pytest.raises(TypeError, match="real floating-point values"):
        solve(RootProblem(lambda x, p: x > 0, jnp.zeros(2)), optsolve.NewtonRaphson())
    with pytest.raises(TypeError, match="unknown field"):
        RootProblem(lambda x, p: x, jnp.zeros(2)).replace(f=None)


def test_pytree_x_and_replace():
    """x a dict; prob.replace(p=...) gives the same compiled run a new p."""

    def F(x, p):
        return {"a": x["a"] ** 2 - p, "b": x["b"] - x["a"]}

    prob = RootProblem(F, {"a": jnp.array([1.0]), "b": jnp.array([0.0])}, 4.0)
    sol = solve(prob, optsolve.NewtonRaphson())
    np.testing.assert_allclose(sol.x["a"], [2.0]) and np.testing.assert_allclose(sol.x["b"], [2.0])
    sol = solve(prob.replace(p=9.0), optsolve.Broyden())
    np.testing.assert_allclose(sol.x["b"], [3.0], rtol=1e-8)


# ------------------------------------------------------------------ ScipyRoot's methods

SCIPY_KNOWN_BAD = {  # test_nonlin.py's KNOWN_BAD: scipy's own methods that fail there
    "F2": ("linearmixing", "excitingmixing"),
    "F4_powell": ("linearmixing", "excitingmixing", "diagbroyden"),
    "F5": ("excitingmixing", "linearmixing", "diagbroyden"),
    "F6": ("excitingmixing", "linearmixing", "diagbroyden"),
}
NONLIN_METHODS = [
    "anderson",
    "diagbroyden",
    "linearmixing",
    "excitingmixing",
    "broyden1",
    "broyden2",
    "krylov",
]


@pytest.mark.parametrize("method", ["hybr", "lm"])
def test_scipy_root_pressure_network(method):
    """TestRootHybr / TestRootLM.test_pressure_network_no_gradient (here with JAX's
    Jacobian): assert_array_almost_equal(final_flows, ones(4))."""
    prob = RootProblem(pressure_network, jnp.array([2.0, 0.0, 2.0, 0.0]), (4.0, jnp.full(4, 0.5)))
    sol = solve(prob, optsolve.ScipyRoot(method))
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_array_almost_equal(sol.x, np.ones(4))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # diagbroyden divides by zero inside
@pytest.mark.parametrize("method", NONLIN_METHODS)
def test_scipy_root_problem_root(method):
    """TestNonlin.test_problem_root: each of test_nonlin's problems with each nonlin method
    (but its KNOWN_BAD), ftol 1e-2, maxiter 200: max|F(x)| < 1e-2."""
    for problem, (F, xin) in NONLIN.items():
        if method in SCIPY_KNOWN_BAD.get(problem, ()):
            continue
        sol = solve(
            RootProblem(F, jnp.asarray(xin, jnp.float64)),
            optsolve.ScipyRoot(method),
            ftol=1e-2,
            maxiters=200,
        )
        assert sol.retcode == ReturnCode.SUCCESS, (problem, sol.message)
        assert _max_abs(F, sol.x) < 1e-2, problem


def test_scipy_krylov_breakdown_is_failure_not_an_exception():
    """A constant F (J = 0): scipy's Newton-Krylov raises ValueError("Jacobian inversion
    yielded zero vector ...") inside its solve; the Solution is FAILURE with scipy's words,
    x the last point where F was finite (a finite-difference probe next to x0). A ValueError
    raised by F itself still reaches the caller (test_F_can_raise)."""
    sol = solve(
        RootProblem(lambda x, p: jnp.ones(2), jnp.array([0.7, -0.3])),
        optsolve.ScipyRoot("krylov"),
        maxiters=50,
    )
    assert sol.retcode == ReturnCode.FAILURE
    assert "Jacobian inversion yielded zero vector" in sol.message
    np.testing.assert_allclose(sol.x, [0.7, -0.3], rtol=1e-6)


def test_scipy_root_options_solve_owns_are_refused():
    with pytest.raises(TypeError, match="`xtol` is not an option here"):
        optsolve.ScipyRoot("hybr", xtol=1e-3)
    with pytest.raises(ValueError, match="`method` must be one of 'hybr'"):
        optsolve.ScipyRoot("newton")
    assert (
        repr(optsolve.ScipyRoot("anderson", jac_options={"M": 3}))
        == "ScipyRoot(method='anderson', jac_options={'M': 3})"
    )


@pytest.mark.parametrize("name", ["NewtonRaphson", "Broyden"])
def test_vmap_over_singular_and_regular_starts_equals_a_loop(name):
    """Under vmap the steps take the SVD only where some element's Jacobian needs it (a
    singular start here, a regular one beside it): each element as its own solve."""
    p = (4.0, jnp.array([0.5, 1.0, 2.0, 4.0]))
    starts = jnp.array([[2.0, 0.0, 2.0, 0.0], [1.5, 1.0, 0.8, 0.7], [1.0, 1.0, 1.0, 1.0]])
    alg = ALGORITHMS[name]()
    batched = jax.vmap(lambda x0: solve(RootProblem(pressure_network, x0, p), alg).x)(starts)
    for x0, x in zip(starts, batched):
        alone = solve(RootProblem(pressure_network, x0, p), alg)
        assert alone.retcode == ReturnCode.SUCCESS, alone.message
        np.testing.assert_allclose(x, alone.x, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------- matrix-free Newton-Raphson

KRYLOV = ["bicgstab", "gmres"]


def broyden_tridiagonal(x, p):
    """Moré, Garbow & Hillstrom's Broyden tridiagonal function (ACM TOMS 7, 1981, problem
    30), with p in place of its 2: F_i = (3 - p x_i) x_i - x_{i-1} - 2 x_{i+1} + 1, x0 = -1."""
    left = jnp.concatenate([jnp.zeros(1, x.dtype), x[:-1]])
    right = jnp.concatenate([x[1:], jnp.zeros(1, x.dtype)])
    return (3 - p * x) * x - left - 2 * right + 1


def bratu(u, lam):
    """The 1-D Bratu problem -u'' = lam exp(u) on (0, 1), u(0) = u(1) = 0, by central
    differences on n interior points (Jacobian condition number of order n^2)."""
    h = 1.0 / (u.size + 1)
    left = jnp.concatenate([jnp.zeros(1, u.dtype), u[:-1]])
    right = jnp.concatenate([u[1:], jnp.zeros(1, u.dtype)])
    return (2 * u - left - right) / h**2 - lam * jnp.exp(u)


@pytest.mark.parametrize("problem", NONLIN)
@pytest.mark.parametrize("krylov", KRYLOV)
def test_matrix_free_problem_nonlin(krylov, problem):
    """test_nonlin.py's problems on Jacobian products only, to the default tolerance."""
    F, xin = NONLIN[problem]
    sol = solve(
        RootProblem(F, jnp.asarray(xin, jnp.float64)),
        optsolve.NewtonRaphson(linear_solver=krylov),
        maxiters=200,
    )
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert _max_abs(F, sol.x) <= 1e-8


@pytest.mark.parametrize("krylov", KRYLOV)
def test_matrix_free_pressure_network_from_a_singular_start(krylov):
    """The singular start (two equal rows of J): the Krylov step is no use there, the damped
    step by CG on J^T J + lambda I takes over; the flows come out equal (TestFSolve)."""
    prob = RootProblem(pressure_network, jnp.array([2.0, 0.0, 2.0, 0.0]), (4.0, jnp.full(4, 0.5)))
    sol = solve(prob, optsolve.NewtonRaphson(linear_solver=krylov))
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    np.testing.assert_array_almost_equal(sol.x, np.ones(4))


@pytest.mark.parametrize("krylov", KRYLOV)
def test_matrix_free_no_root_is_never_success(krylov):
    sol = solve(
        RootProblem(lambda x, p: x**2 + 1, jnp.array([0.7, -0.3])),
        optsolve.NewtonRaphson(linear_solver=krylov),
        maxiters=100,
    )
    assert sol.retcode in (ReturnCode.STALLED, ReturnCode.FAILURE, ReturnCode.MAXITERS)


def _shapes_in(jaxpr) -> set[tuple[int, ...]]:
    shapes = set()
    for eqn in jaxpr.eqns:
        shapes.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for value in eqn.params.values():  # the sub-programs: loop bodies, branches
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    shapes |= _shapes_in(sub)
    return shapes


def test_above_the_threshold_no_jacobian_is_formed_and_the_root_is_the_dense_ones():
    """n = 1000 > 256: "auto" is matrix-free. The compiled solve holds no n x n array (the
    dense one does), and its root equals the dense Newton's to the tolerance, in as many
    iterations (quadratic convergence kept by the inexact steps)."""
    n = 1000
    prob = RootProblem(broyden_tridiagonal, -jnp.ones(n), 2.0)
    free = jax.make_jaxpr(lambda p: solve(prob.replace(p=p), optsolve.NewtonRaphson()).x)(2.0)
    dense = jax.make_jaxpr(
        lambda p: solve(prob.replace(p=p), optsolve.NewtonRaphson(linear_solver="dense")).x
    )(2.0)
    assert (n, n) not in _shapes_in(free.jaxpr)
    assert (n, n) in _shapes_in(dense.jaxpr)
    sol = solve(prob, optsolve.NewtonRaphson())
    reference = solve(prob, optsolve.NewtonRaphson(linear_solver="dense"))
    assert sol.retcode == reference.retcode == ReturnCode.SUCCESS, sol.message
    assert _max_abs(broyden_tridiagonal, sol.x, 2.0) <= 1e-8
    np.testing.assert_allclose(sol.x, reference.x, atol=1e-8)
    assert sol.stats.iterations <= reference.stats.iterations + 1


def test_matrix_free_bratu_and_its_derivative_equal_the_dense_implicit_one():
    """Bratu, n = 300 (> 256, condition number 4e4): BiCGStab converges where GMRES(50)
    stagnates; dx*/dlam, matrix-free in both modes, equals -J^-1 dF/dlam formed densely."""
    n, lam = 300, 1.0

    def root(lam):
        return solve(RootProblem(bratu, jnp.zeros(n), lam), optsolve.NewtonRaphson()).x

    x = root(lam)
    assert _max_abs(bratu, x, lam) <= 1e-8
    J = jax.jacfwd(bratu)(x, lam)
    exact = -np.linalg.solve(np.asarray(J), np.asarray(jax.jacfwd(bratu, argnums=1)(x, lam)))
    np.testing.assert_allclose(jax.jacfwd(root)(lam), exact, rtol=1e-7)
    np.testing.assert_allclose(
        jax.grad(lambda lam: jnp.sum(root(lam)))(lam), exact.sum(), rtol=1e-7
    )


def test_matrix_free_under_vmap_equals_each_solve():
    n = 300
    ps = jnp.array([1.5, 2.0, 2.5])
    batched = jax.vmap(
        lambda p: (
            solve(RootProblem(broyden_tridiagonal, -jnp.ones(n), p), optsolve.NewtonRaphson()).x
        )
    )(ps)
    for p, x in zip(ps, batched):
        alone = solve(RootProblem(broyden_tridiagonal, -jnp.ones(n), p), optsolve.NewtonRaphson())
        assert alone.retcode == ReturnCode.SUCCESS, alone.message
        np.testing.assert_allclose(x, alone.x, rtol=1e-10, atol=1e-12)


def test_matrix_free_float32():
    sol = solve(
        RootProblem(broyden_tridiagonal, -jnp.ones(500, jnp.float32), 2.0), optsolve.NewtonRaphson()
    )
    assert sol.retcode == ReturnCode.SUCCESS, sol.message
    assert np.asarray(sol.x).dtype == np.float32
    assert _max_abs(broyden_tridiagonal, sol.x, 2.0) <= 1e-5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"linear_solver": "lu"},
            r"`linear_solver` must be one of 'auto', 'dense', 'bicgstab', "
            r"'gmres', got 'lu'",
        ),
        ({"krylov_restart": 0}, r"`krylov_restart` must be an integer >= 1, got 0"),
        ({"krylov_maxiter": 2.5}, r"`krylov_maxiter` must be an integer >= 1, got 2.5"),
        ({"krylov_rtol": -1.0}, r"krylov_rtol"),
    ],
)
def test_matrix_free_construction_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        optsolve.NewtonRaphson(**kwargs)
