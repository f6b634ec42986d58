"""The JAX-native classical methods beyond the MGH set: bounds against scipy's L-BFGS-B,
float32, jit/vmap and no recompilation, user gradients and Hessian products, AdaHessian,
the line searches' conditions checked directly, numerical failure, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, ReturnCode, solve
from optsolve.backends.classical.descent import default_gtol
from optsolve.backends.classical.linesearch import Backtracking, Zoom

FAST_COMPILE = {"xla_llvm_disable_expensive_passes": True}

ALL = {
    "GradientDescent": optsolve.GradientDescent(),
    "LBFGS": optsolve.LBFGS(),
    "BFGS": optsolve.BFGS(),
    "NonlinearCG": optsolve.NonlinearCG(),
    "Newton": optsolve.Newton(),
    "TrustRegion": optsolve.TrustRegion(),
}


def rosenbrock(x, p=None):
    return jnp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def check_success(sol, f, gtol, bounds=None):
    """SUCCESS only where the (projected) gradient inf-norm is within gtol."""
    x = jnp.asarray(sol.x)
    g = jax.grad(f)(x, None)
    if bounds is not None:
        g = x - jnp.clip(x - g, bounds[0], bounds[1])
    if np.all(np.asarray(sol.retcode) == ReturnCode.SUCCESS):
        assert float(jnp.max(jnp.abs(g))) <= gtol * (1 + 1e-6)


# ------------------------------------------------------------------------------ bounds

_n = 6
_A = (
    np.diag(np.full(_n, 3.0))
    + np.diag(np.full(_n - 1, -1.0), 1)
    + np.diag(np.full(_n - 1, -1.0), -1)
)
_b = np.array([4.0, -3.0, 2.5, -1.0, 6.0, 0.5])
LOWER, UPPER = np.zeros(_n), np.full(_n, 1.0)


def bounded_objective(x, p=None):
    """Strictly convex, non-quadratic; its unconstrained minimiser leaves the box [0, 1]^6."""
    A, b = jnp.asarray(_A, x.dtype), jnp.asarray(_b, x.dtype)
    return 0.5 * x @ A @ x - b @ x + 0.1 * jnp.sum(x**4)


def test_bounds_match_scipy_lbfgsb():
    ref = scipy.optimize.minimize(
        lambda x: float(bounded_objective(jnp.asarray(x))),
        np.full(_n, 0.5),
        jac=lambda x: np.asarray(jax.grad(bounded_objective)(jnp.asarray(x))),
        method="L-BFGS-B",
        bounds=list(zip(LOWER, UPPER)),
        options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 10000},
    )
    active = (ref.x <= 1e-12) | (ref.x >= 1 - 1e-12)
    assert active.any() and not active.all(), "the solution must lie on the boundary"
    prob = OptimizationProblem(
        bounded_objective, jnp.full(_n, 0.5), bounds=(jnp.asarray(LOWER), jnp.asarray(UPPER))
    )
    for alg in (
        optsolve.GradientDescent(),
        optsolve.LBFGS(),
        optsolve.LBFGS(linesearch=Backtracking()),
    ):
        sol = solve(prob, alg)
        assert sol.retcode == ReturnCode.SUCCESS, (alg, sol)
        np.testing.assert_allclose(np.asarray(sol.x), ref.x, atol=1e-8)
        assert np.all(np.asarray(sol.x) >= LOWER) and np.all(np.asarray(sol.x) <= UPPER)
        check_success(sol, bounded_objective, default_gtol(jnp.float64), (LOWER, UPPER))


def test_bounded_rosenbrock_lbfgs_matches_scipy():
    bounds = (jnp.array([-2.0, -2.0]), jnp.array([0.5, 2.0]))
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]), bounds=bounds)
    sol = solve(prob, optsolve.LBFGS())
    ref = scipy.optimize.minimize(
        lambda x: float(rosenbrock(jnp.asarray(x))),
        [-1.2, 1.0],
        jac=lambda x: np.asarray(jax.grad(rosenbrock)(jnp.asarray(x))),
        method="L-BFGS-B",
        bounds=[(-2, 0.5), (-2, 2)],
        options={"ftol": 1e-16, "gtol": 1e-13},
    )
    assert sol.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(np.asarray(sol.x), ref.x, atol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.x), [0.5, 0.25], atol=1e-8)


def test_bounds_refused_by_unbounded_algorithms():
    prob = OptimizationProblem(rosenbrock, jnp.zeros(2), bounds=(0.0, 1.0))
    for alg in (optsolve.BFGS(), optsolve.Newton(), optsolve.NonlinearCG(), optsolve.TrustRegion()):
        with pytest.raises(ValueError, match=r"does not support bounds.*GradientDescent.*LBFGS"):
            solve(prob, alg)


# ------------------------------------------------------- float32, jit, vmap, recompiles


def test_float32_all_algorithms():
    """Every method solves Rosenbrock in float32 to float32 accuracy, in float32 throughout."""
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0], jnp.float32))
    sols = jax.jit(
        lambda pr: {k: solve(pr, a) for k, a in ALL.items()}, compiler_options=FAST_COMPILE
    )(prob)
    for name, sol in sols.items():
        assert sol.x.dtype == jnp.float32 and sol.objective.dtype == jnp.float32, name
        check_success(sol, rosenbrock, default_gtol(jnp.float32))
        # Steepest descent crawls along the valley: 10000 iterations end it short of gtol.
        done = (ReturnCode.SUCCESS, ReturnCode.STALLED) + (
            (ReturnCode.MAXITERS,) if name == "GradientDescent" else ()
        )
        assert int(sol.retcode) in done, (name, sol)
        np.testing.assert_allclose(np.asarray(sol.x), [1.0, 1.0], atol=2e-3, err_msg=name)


def quadratic(x, p):
    """Minimiser p (a vector), Hessian diag(1..n) + coupling: a vmappable family."""
    n = x.shape[0]
    d = jnp.arange(1, n + 1, dtype=x.dtype)
    r = x - p
    return 0.5 * jnp.sum(d * r * r) + 0.25 * jnp.sum(r[1:] * r[:-1]) + 0.1 * jnp.sum(r**4)


def test_vmap_and_jit_all_algorithms():
    ps = jnp.stack([jnp.linspace(-1.0, 1.0, 4) * s for s in (0.5, 1.0, 2.0)])
    prob = OptimizationProblem(quadratic, jnp.zeros(4), ps[0])
    algs = dict(ALL, AdaHessian=optsolve.AdaHessian(learning_rate=0.5))

    def run(ps):
        out = {}
        for name, alg in algs.items():
            kw = {"maxiters": 300} if name == "AdaHessian" else {}
            out[name] = jax.vmap(lambda p: solve(prob.replace(p=p), alg, **kw))(ps)  # noqa: B023  (called in this iteration)
        return out

    sols = jax.jit(run, compiler_options=FAST_COMPILE)(ps)
    for name, sol in sols.items():
        atol = 1e-3 if name == "AdaHessian" else 1e-7
        np.testing.assert_allclose(np.asarray(sol.x), np.asarray(ps), atol=atol, err_msg=name)
        if name != "AdaHessian":
            assert np.all(np.asarray(sol.retcode) == ReturnCode.SUCCESS), name
        for i in range(ps.shape[0]):
            one = jax.tree_util.tree_map(lambda a: a[i], sol)  # noqa: B023  (called in this iteration)
            check_success(one, lambda x, _: quadratic(x, ps[i]), default_gtol(jnp.float64))  # noqa: B023  (called in this iteration)


def test_new_hyperparameters_do_not_recompile():
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]))
    run = jax.jit(lambda alg, x0: solve(prob.replace(x0=x0), alg).x)
    x0 = jnp.array([-1.2, 1.0])
    run(optsolve.LBFGS(linesearch=Zoom(c1=1e-4, c2=0.9)), x0)
    run(optsolve.TrustRegion(initial_radius=1.0), x0)
    x1 = jnp.array([-1.0, 1.2])
    with count_compilations() as c:
        a = run(optsolve.LBFGS(linesearch=Zoom(c1=1e-3, c2=0.5)), x0)
        b = run(optsolve.TrustRegion(initial_radius=0.3, eta=0.1), x1)
    assert c.count == 0
    np.testing.assert_allclose(np.asarray(a), [1, 1], atol=1e-6)
    np.testing.assert_allclose(np.asarray(b), [1, 1], atol=1e-6)
    # And through solve itself (not jitted by the caller): a second call reuses the compile.
    solve(prob, optsolve.GradientDescent(learning_rate=0.5), maxiters=5)
    with count_compilations() as c:
        solve(prob, optsolve.GradientDescent(learning_rate=0.25), maxiters=5)
    assert c.count == 0


# --------------------------------------------------- user gradient and Hessian products


def test_user_grad_and_hvp_replace_autodiff():
    """f, grad and hvp computed on the host (pure_callback, so JAX cannot differentiate f):
    the methods run on the user's functions alone."""
    A = np.array([[3.0, 1.0, 0.0], [1.0, 4.0, 0.5], [0.0, 0.5, 2.0]])
    b = np.array([1.0, -2.0, 0.5])
    spec = jax.ShapeDtypeStruct((), jnp.float64)
    vec = jax.ShapeDtypeStruct((3,), jnp.float64)

    def f(x, p):
        return jax.pure_callback(lambda x: np.asarray(0.5 * x @ A @ x - b @ x), spec, x)

    def grad(x, p):
        return jax.pure_callback(lambda x: A @ x - b, vec, x)

    def hvp(x, v, p):
        return jax.pure_callback(lambda v: A @ v, vec, v)

    expected = np.linalg.solve(A, b)
    prob = OptimizationProblem(f, jnp.zeros(3), grad=grad, hvp=hvp)
    for alg in (
        optsolve.LBFGS(),
        optsolve.Newton(),
        optsolve.TrustRegion(),
        optsolve.AdaHessian(learning_rate=0.5),
    ):
        kw = {"maxiters": 300} if isinstance(alg, optsolve.AdaHessian) else {}
        sol = solve(prob, alg, **kw)
        np.testing.assert_allclose(np.asarray(sol.x), expected, atol=1e-6, err_msg=repr(alg))
    # The optax family uses the user's gradient too.
    sol = solve(prob, optsolve.SGD(0.2), maxiters=500)
    np.testing.assert_allclose(np.asarray(sol.x), expected, atol=1e-6)
    with pytest.raises(TypeError, match="`grad` must be None or a callable"):
        OptimizationProblem(rosenbrock, jnp.zeros(2), grad=1.0)
    with pytest.raises(TypeError, match="`hvp` must be None or a callable"):
        OptimizationProblem(rosenbrock, jnp.zeros(2), hvp="no")


def test_adahessian_hutchinson_diagonal():
    """For a diagonal Hessian the Hutchinson estimate is exact, so AdaHessian's first step
    (bias-corrected) is lr * g / |diag H|: a Newton step scaled by lr."""
    d = jnp.array([1.0, 10.0, 100.0])
    f = lambda x, p: 0.5 * jnp.sum(d * (x - 1.0) ** 2)
    prob = OptimizationProblem(f, jnp.zeros(3))
    sol = solve(prob, optsolve.AdaHessian(learning_rate=0.5, eps=0.0), maxiters=1)
    np.testing.assert_allclose(np.asarray(sol.x), [0.5, 0.5, 0.5], rtol=1e-12)
    with pytest.raises(ValueError, match="maxiters"):
        solve(prob, optsolve.AdaHessian())


# -------------------------------------------------------------------------- line search


def _line_problem():
    x = jnp.array([-1.2, 1.0])
    fun = jax.value_and_grad(rosenbrock)
    f0, g0 = fun(x)
    return fun, x, f0, g0, -g0


@pytest.mark.parametrize("c1,c2,alpha0", [(1e-4, 0.9, 1.0), (1e-4, 0.1, 1e-3), (0.3, 0.5, 10.0)])
def test_zoom_strong_wolfe(c1, c2, alpha0):
    fun, x, f0, g0, d = _line_problem()
    res = jax.jit(lambda a: Zoom(c1=c1, c2=c2).search(fun, x, f0, g0, d, a))(alpha0)
    a = float(res.alpha)
    assert a > 0 and bool(res.decreased)
    fa, ga = fun(x + a * d)
    assert float(fa) <= float(f0 + c1 * a * jnp.vdot(g0, d))  # Armijo
    assert abs(float(jnp.vdot(ga, d))) <= c2 * abs(float(jnp.vdot(g0, d)))  # curvature
    np.testing.assert_allclose(float(res.f), float(fa), rtol=1e-12)
    assert int(res.evals) >= 1


@pytest.mark.parametrize("alpha0", [1.0, 1e-4])
def test_backtracking_armijo(alpha0):
    fun, x, f0, g0, d = _line_problem()
    ls = Backtracking(c1=1e-4, shrink=0.5)
    res = ls.search(fun, x, f0, g0, d, alpha0)
    a = float(res.alpha)
    assert 0 < a <= alpha0
    assert float(fun(x + a * d)[0]) <= float(f0 + 1e-4 * a * jnp.vdot(g0, d))
    if a < alpha0:  # the previous, longer trial failed Armijo
        assert float(fun(x + 2 * a * d)[0]) > float(f0 + 1e-4 * 2 * a * jnp.vdot(g0, d))


def test_failure_linesearch_ascent_direction():
    fun, x, f0, g0, d = _line_problem()
    for ls in (Zoom(), Backtracking()):
        res = ls.search(fun, x, f0, g0, -d, 1.0)
        assert not bool(res.decreased) and float(res.alpha) == 0.0
        if isinstance(ls, Zoom):
            np.testing.assert_array_equal(np.asarray(res.x), np.asarray(x))
        else:  # backtracking's x is its last trial (halved each time): the caller keeps x
            last = x + 0.5 ** (int(res.evals) - 1) * -d
            np.testing.assert_allclose(np.asarray(res.x), np.asarray(last), rtol=1e-12)
            np.testing.assert_allclose(float(res.f), float(fun(last)[0]), rtol=1e-12)


@pytest.mark.parametrize("search", [Backtracking(), Zoom()], ids=["backtracking", "zoom"])
def test_line_searches_accept_finite_points_only(search):
    """A step that overflows x is not accepted even where f and its gradient are finite
    there and the approximate Armijo test holds (an infinite slope): the methods' steps
    (DescentSolver.keeps_point) rely on an accepted point being finite. Here every trial
    from 1e308 on overflows x to -inf, where f is -1, below f0 = 0.5."""

    @jax.custom_jvp
    def f(x):
        return jnp.sum(jnp.where(jnp.isfinite(x), 0.5 * x**2, -1.0))

    @f.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), jnp.vdot(jnp.where(jnp.isfinite(x), x, 1.0), t)

    fun = jax.value_and_grad(f)
    x = jnp.array([1.0])
    f0, g0 = fun(x)
    assert search.finite_points(False)
    res = search.search(fun, x, f0, g0, jnp.array([-1e10]), 1e308)
    assert bool(jnp.all(jnp.isfinite(res.x))) or not bool(res.decreased)
    if bool(res.decreased):  # an accepted point is a finite one with a lower value
        assert float(res.f) < float(f0) and float(res.f) == float(fun(res.x)[0])


@pytest.mark.parametrize(
    "dphi0, curvature, expected",
    [
        (-1e-6, 1e3, True),  # a steep valley: the quadratic's best decrease is 2.5e-16
        (-1e-3, 1.0, False),  # best decrease 2.5e-7, above rounding
        (-1e-3, -1.0, True),  # below the tangent line: a decrease, within "not higher"
        (-1e-3, 2e-3, False),  # a trial above f0 by 1e-3; best decrease 1.25e-4
    ],
)
def test_stall_test_is_the_quadratics_best_decrease(dphi0, curvature, expected):
    """A search stalls where the quadratic through f0, the slope at 0 and the trial's value
    predicts a best decrease dphi0^2 / (4 c) below 64 eps |f0| (or the trial is within that
    of f0): the closed form, on phi(a) = f0 + dphi0 a + c a^2 at a = 1."""
    from optsolve.backends.classical.linesearch import _is_flat

    f0, a = 1.0, 1.0
    fa = f0 + dphi0 * a + curvature * a * a
    noise = 64 * np.finfo(np.float64).eps * abs(f0)
    best = dphi0**2 / (4 * curvature) if curvature > 0 else np.inf
    assert ((fa - f0 <= noise) or best <= noise) == expected
    flat = _is_flat(jnp.asarray(f0), jnp.asarray(dphi0 * a), jnp.asarray(fa))
    assert bool(flat) == expected
    assert not bool(_is_flat(jnp.asarray(f0), jnp.asarray(dphi0 * a), jnp.asarray(jnp.nan)))


# -------------------------------------------------------------------- numerical failure


def test_failure_nan_at_start():
    prob = OptimizationProblem(lambda x, p: jnp.sum(x**2) * jnp.nan, jnp.ones(2))
    for name, alg in ALL.items():
        sol = solve(prob, alg)
        assert sol.retcode == ReturnCode.FAILURE, name
        assert int(sol.stats.iterations) == 0
        np.testing.assert_array_equal(np.asarray(sol.x), [1.0, 1.0])


def test_failure_nan_everywhere_but_the_last_good_iterate():
    """Finite only near the start: methods end in FAILURE (or STALLED where no decrease
    is possible) holding a finite iterate, never NaN."""
    x_start = jnp.array([1.0, 2.0])

    def f(x, p):
        inside = jnp.all(jnp.abs(x - x_start) <= 1e-3)
        return jnp.where(inside, jnp.sum(x**2), jnp.nan)

    prob = OptimizationProblem(f, x_start)
    for name, alg in ALL.items():
        sol = solve(prob, alg)
        assert sol.retcode in (ReturnCode.FAILURE, ReturnCode.STALLED), (name, sol)
        assert np.all(np.isfinite(np.asarray(sol.x))) and np.isfinite(float(sol.objective))
        assert float(jnp.max(jnp.abs(sol.x - x_start))) <= 1e-3, name
        assert "last finite iterate" in ReturnCode.FAILURE.message


def test_maxiters_and_stopping_options():
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]))
    sol = solve(prob, optsolve.GradientDescent(), maxiters=3)
    assert sol.retcode == ReturnCode.MAXITERS and int(sol.stats.iterations) == 3
    loose = solve(prob, optsolve.LBFGS(), gtol=1e-2)
    tight = solve(prob, optsolve.LBFGS())
    assert loose.retcode == tight.retcode == ReturnCode.SUCCESS
    assert int(loose.stats.iterations) < int(tight.stats.iterations)
    check_success(loose, rosenbrock, 1e-2)
    sol = solve(prob, optsolve.BFGS(), xtol=1e-3)
    assert sol.retcode == ReturnCode.SUCCESS
    sol = solve(prob, optsolve.NonlinearCG(), ftol=1e-3)
    assert sol.retcode == ReturnCode.SUCCESS


# ---------------------------------------------------------------------------- bad input


def test_bad_input_errors():
    with pytest.raises(ValueError, match="LBFGS: `memory_size` must be an integer >= 1, got 0"):
        optsolve.LBFGS(memory_size=0)
    with pytest.raises(
        ValueError, match="NonlinearCG: `method` must be one of .*'dai-yuan'.*got 'fr'"
    ):
        optsolve.NonlinearCG(method="fr")
    with pytest.raises(ValueError, match=r"Zoom: `c2` must be in \(0, 1\), got 1.5"):
        Zoom(c2=1.5)
    with pytest.raises(ValueError, match="Zoom: `c1` must be < `c2`"):
        Zoom(c1=0.5, c2=0.4)
    with pytest.raises(ValueError, match=r"Backtracking: `shrink` must be in \(0, 1\)"):
        Backtracking(shrink=1.0)
    with pytest.raises(TypeError, match="LBFGS: `linesearch` must be optsolve.Backtracking"):
        optsolve.LBFGS(linesearch="wolfe")
    with pytest.raises(ValueError, match=r"TrustRegion: `eta` must be in \[0, 0.25\)"):
        optsolve.TrustRegion(eta=0.5)
    with pytest.raises(ValueError, match="GradientDescent: `learning_rate` must be > 0"):
        optsolve.GradientDescent(learning_rate=-1.0)
    with pytest.raises(ValueError, match="Newton: `cg_maxiter` must be None or an integer"):
        optsolve.Newton(cg_maxiter=0)
    prob = OptimizationProblem(rosenbrock, jnp.zeros(2))
    with pytest.raises(TypeError, match=r"does not take the option\(s\) 'memory'.*xtol"):
        solve(prob, optsolve.LBFGS(), memory=3)


def test_traits_and_registration():
    for name, alg in ALL.items():
        traits = type(alg).traits()
        assert traits["family"] == "classical" and traits["stops_by_itself"], name
        assert getattr(optsolve, name) is type(alg)
    assert optsolve.LBFGS.takes_bounds and optsolve.GradientDescent.takes_bounds
    assert not optsolve.BFGS.takes_bounds
    assert optsolve.Newton.needs_hessian and optsolve.TrustRegion.needs_hessian
    assert optsolve.OptaxLBFGS is not optsolve.LBFGS
    leaves = jax.tree_util.tree_leaves(optsolve.LBFGS(linesearch=Zoom(c1=1e-3)))
    assert [float(v) for v in leaves] == [1e-3, 0.9]  # numbers are leaves; memory is static
    assert default_gtol(jnp.float64) == 1e-8 and default_gtol(jnp.float32) == 1e-5


def test_quasi_newton_state_after_a_failure_is_finite():
    """L-BFGS and BFGS keep a failed step's own state (their model reset), not the previous
    one: it must hold no NaN, and its model must be the reset one."""

    def finite_only_at_start(x, p):  # every line-search trial from 0 is NaN
        return jnp.where(jnp.all(x == 0.0), jnp.sum((x - 1.0) ** 2), jnp.nan)

    prob = OptimizationProblem(finite_only_at_start, jnp.zeros(2))
    for alg in (optsolve.LBFGS(), optsolve.BFGS()):
        sol = solve(prob, alg)
        assert sol.retcode == ReturnCode.FAILURE, sol.retcode
        np.testing.assert_array_equal(np.asarray(sol.x), [0.0, 0.0])
        leaves = jax.tree_util.tree_leaves(sol.state)
        assert all(
            bool(jnp.all(jnp.isfinite(leaf)))
            for leaf in leaves
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        )
        assert int(sol.state.model.count) == 0


def test_lbfgs_two_loop_and_compact_memories_agree():
    """Below XLA's 512-byte sequential-execution limit L-BFGS keeps its memory as (m, n)
    arrays for the two-loop recursion, above it in compact form: the same inverse-Hessian
    products (to rounding) and the same run."""
    from optsolve.backends.classical import quasi_newton as qn

    n, m = 6, 4
    prob = OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.zeros(n))
    two_loop = qn._TwoLoopLBFGSSolver(optsolve.LBFGS(memory_size=m), prob)
    compact = qn._LBFGSSolver(optsolve.LBFGS(memory_size=m), prob)
    rng = np.random.default_rng(0)
    A = rng.normal(size=(n, n))
    A = A @ A.T + n * np.eye(n)
    solvers = (two_loop, compact)
    # one compiled call per operation, not one per eager op
    updates = [
        jax.jit(lambda m, s, y, solver=solver: solver.update_model(m, s, y, y, jnp.asarray(True)))
        for solver in solvers
    ]
    inverses = [jax.jit(solver._apply_inverse) for solver in solvers]
    models = [solver.init_model(None, None) for solver in solvers]
    for k in range(7):  # overfills the memory; one pair without curvature is skipped
        s = jnp.asarray(rng.normal(size=n))
        y = -s if k == 3 else jnp.asarray(A) @ s
        models = [update(model, s, y) for update, model in zip(updates, models)]
        q = jnp.asarray(rng.normal(size=n))
        np.testing.assert_allclose(
            inverses[0](models[0], q), inverses[1](models[1], q), rtol=1e-11, atol=1e-13
        )
    assert int(models[0].count) == int(models[1].count) == m

    # The layout follows the memory's size in bytes; both solve alike.
    rosen = lambda x, p: jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)
    small = OptimizationProblem(rosen, jnp.asarray([-1.2, 1.0] * 3))
    assert type(optsolve.LBFGS().make_solver(small)) is qn._TwoLoopLBFGSSolver  # 6*10*8 B
    assert type(optsolve.LBFGS(memory_size=11).make_solver(small)) is qn._LBFGSSolver
    assert (
        type(optsolve.LBFGS().make_solver(small.replace(x0=small.x0.astype(jnp.float32))))
        is qn._TwoLoopLBFGSSolver
    )
    runs = {}
    for name, limit in (("two-loop", 10**9), ("compact", -1)):
        original, qn._SEQUENTIAL_BUFFER_BYTES = qn._SEQUENTIAL_BUFFER_BYTES, limit
        try:
            # a new objective is traced afresh (the layout is picked at trace time), without
            # clearing the compiled code that every later test would compile again
            fresh = small.replace(f=lambda x, p: rosen(x, p))
            runs[name] = solve(fresh, optsolve.LBFGS(memory_size=5))
            layout = qn.TwoLoopModel if name == "two-loop" else qn.LBFGSModel
            assert isinstance(runs[name].state.model, layout)
        finally:
            qn._SEQUENTIAL_BUFFER_BYTES = original
    for sol in runs.values():
        assert sol.retcode == ReturnCode.SUCCESS
        np.testing.assert_allclose(sol.x, np.ones(6), atol=1e-7)
    assert abs(int(runs["two-loop"].stats.iterations) - int(runs["compact"].stats.iterations)) <= 2


@pytest.mark.parametrize("make", [optsolve.LBFGS, optsolve.BFGS, optsolve.NonlinearCG])
def test_zoom_makes_the_same_trials_with_its_first_trial_apart(make, monkeypatch):
    # Below 256 variables Zoom is one loop from the first trial; from 256 on the first
    # trial is made apart and the loop carries the next one. Both must search alike.
    from optsolve.backends.classical import linesearch

    x0 = jnp.tile(jnp.array([-1.2, 1.0]), 5)
    prob = OptimizationProblem(rosenbrock, x0)
    one_loop = solve(prob, make(), gtol=1e-8)
    monkeypatch.setattr(linesearch, "_FIRST_TRIAL_APART_FROM", 0)
    jax.clear_caches()  # traced anew, at the threshold now in force
    apart = solve(prob, make(), gtol=1e-8)
    jax.clear_caches()
    for sol in (one_loop, apart):
        assert sol.retcode == ReturnCode.SUCCESS
        np.testing.assert_allclose(sol.x, np.ones(10), atol=1e-6)  # the minimiser
    assert (apart.stats.iterations, apart.stats.f_evals) == (
        one_loop.stats.iterations,
        one_loop.stats.f_evals,
    )
    np.testing.assert_allclose(apart.x, one_loop.x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "bounds"])
@pytest.mark.parametrize("case", ["finite", "nan_g", "inf_x", "tiny_step"])
def test_one_reduction_gives_the_step_measures_of_the_separate_ones(case, bounded):
    """The line-search methods hand the driver the gradient norm and the finiteness of g
    and x from one reduction (descent._measures): each equals its own definition, the
    projected inf-norm (_grad_norm), every entry finite, and tiny_step."""
    from optsolve.backends.classical.descent import _grad_norm, _measures, tiny_step

    x_prev = jnp.array([1.0, -2.0, 3.0, 0.5])
    s = jnp.array([1e-3, -2e-3, 0.0, 4e-3])
    g = jnp.array([0.5, -1.5, 2.0, -0.25])
    if case == "nan_g":
        g = g.at[2].set(jnp.nan)
    if case == "tiny_step":
        s = 2 * jnp.finfo(jnp.float64).eps * x_prev
    x = x_prev + s
    if case == "inf_x":
        x = x.at[1].set(-jnp.inf)
    bounds = (jnp.full(4, -1.5), jnp.full(4, 1.0)) if bounded else None
    g_norm, g_finite, x_finite, tiny = _measures(x, g, s, x_prev, bounds)
    expected = _grad_norm(x, g, bounds)
    assert (bool(jnp.isnan(g_norm)) and bool(jnp.isnan(expected))) or float(g_norm) == float(
        expected
    )
    assert bool(g_finite) == bool(jnp.all(jnp.isfinite(g)))
    assert bool(x_finite) == bool(jnp.all(jnp.isfinite(x)))
    assert bool(tiny) == bool(tiny_step(s, x_prev))
    assert bool(tiny) == (case == "tiny_step")
