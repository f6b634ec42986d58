"""Bad input to the scipy backend: each case gets an error that names the argument, what
was expected and what was given, and (where it applies) which methods can do it."""

from __future__ import annotations

import re

import jax.numpy as jnp
import pytest

from optsolve import Constraint, OptimizationProblem, ScipyGlobal, ScipyMinimize, solve


def quadratic(x, p):
    return jnp.sum((x - 1.0) ** 2)


PLAIN = OptimizationProblem(quadratic, jnp.zeros(2))
BOXED = OptimizationProblem(quadratic, jnp.zeros(2), bounds=(-5.0, 5.0))
CONSTRAINED = OptimizationProblem(
    quadratic, jnp.zeros(2), constraints=[Constraint(lambda x, p: x[0] + x[1], lower=1.0)]
)


@pytest.mark.parametrize(
    "make, error, pattern",
    [
        (
            lambda: ScipyMinimize("Newton"),
            ValueError,
            r"ScipyMinimize: `method` must be one of Nelder-Mead, Powell, CG, BFGS, "
            r".*trust-krylov; "
            r"got 'Newton'\.",
        ),
        (lambda: ScipyMinimize("shgo"), ValueError, r"'shgo' is a method of ScipyGlobal"),
        (
            lambda: ScipyGlobal("BFGS"),
            ValueError,
            r"ScipyGlobal: `method` must be one of differential_evolution, .*; got 'BFGS'\. "
            r"'BFGS' is a method of ScipyMinimize",
        ),
        (
            lambda: ScipyMinimize(),
            TypeError,
            r"ScipyMinimize: `method` is required; one of 'Nelder-Mead'",
        ),
        (
            lambda: ScipyMinimize("L-BFGS-B", maxcorr=5),
            TypeError,
            r"ScipyMinimize\(method='L-BFGS-B'\) does not take the option `maxcorr` "
            r"\(got maxcorr=5\)\. "
            r"Valid options: maxcor, maxfun, maxls; common options go to solve",
        ),
        (
            lambda: ScipyMinimize("BFGS", maxiter=10),
            TypeError,
            r"`maxiter` is set through solve's common option: solve\(\.\.\., maxiters=10\)",
        ),
        (
            lambda: ScipyMinimize("BFGS", gtol=1e-3),
            TypeError,
            r"`gtol` is set through solve's common option: solve\(\.\.\., gtol=0\.001\)",
        ),
        (
            lambda: ScipyMinimize("BFGS", eps=1e-8),
            TypeError,
            r"`eps` only tunes scipy's finite differences, which optsolve never uses "
            r"\(JAX supplies "
            r"exact derivatives\), so scipy would ignore it; got eps=1e-08",
        ),
        (
            lambda: ScipyMinimize("trust-constr", finite_diff_rel_step=1e-6),
            TypeError,
            r"`finite_diff_rel_step` only tunes scipy's finite differences",
        ),
        (
            lambda: ScipyMinimize("BFGS", jac="3-point"),
            TypeError,
            r"`jac` is not an option here: derivatives come from JAX; got jac='3-point'",
        ),
        (
            lambda: ScipyMinimize("Nelder-Mead", bounds=[(0, 1)]),
            TypeError,
            r"`bounds` is not an option here: bounds are set on the problem: "
            r"OptimizationProblem\(\.\.\., bounds=\(lower, upper\)\)",
        ),
        (
            lambda: ScipyMinimize("SLSQP", constraints=[]),
            TypeError,
            r"`constraints` is not an option here: constraints are set on the problem",
        ),
        (
            lambda: ScipyMinimize("TNC", tol=1e-6),
            TypeError,
            r"`tol` is not an option here: use solve's tolerances, solve\(\.\.\., gtol=\.\.\., "
            r"ftol=\.\.\.\); got tol=1e-06",
        ),
        (
            lambda: ScipyMinimize("L-BFGS-B", iprint=1),
            TypeError,
            r"`iprint` is deprecated by scipy and would only warn; got iprint=1",
        ),
        (
            lambda: ScipyMinimize("Nelder-Mead", workers=2),
            TypeError,
            r"`workers` is not supported .*; got workers=2",
        ),
        (
            lambda: ScipyMinimize("trust-ncg", subproblem_maxiter=3),
            TypeError,
            r"ScipyMinimize\(method='trust-ncg'\) does not take the option `subproblem_maxiter`",
        ),
        (
            lambda: ScipyMinimize("BFGS", callback=print),
            TypeError,
            r"`callback` is not an option here: pass it to solve: solve\(\.\.\., callback=fn\)",
        ),
        # (the global methods' own iteration budgets, maxiter / niter / iters, are accepted:
        # tests/backends/scipy/test_scipy_budgets.py; where maxiter counts iterations, minimize
        # refuses it)
        (
            lambda: ScipyMinimize("COBYQA", maxiter=3),
            TypeError,
            r"ScipyMinimize\(method='COBYQA'\): `maxiter` is set through solve's common option: "
            r"solve\(\.\.\., maxiters=3\)",
        ),
        (
            lambda: ScipyGlobal("dual_annealing", minimizer_kwargs={}),
            TypeError,
            r"`minimizer_kwargs` is not an option here: local searches get JAX derivatives",
        ),
        (
            lambda: ScipyGlobal("differential_evolution", vectorized=True, updating="immediate"),
            TypeError,
            r"vectorized=True .* needs updating='deferred'.*got updating='immediate'",
        ),
        (
            lambda: ScipyGlobal("dual_annealing", vectorized=True),
            TypeError,
            r"`vectorized` is not an option here: of scipy's methods only differential_evolution",
        ),
        (
            lambda: ScipyGlobal("basinhopping", local=3),
            TypeError,
            r"`local` must be a ScipyMinimize or a scipy.optimize.minimize method name, got 3",
        ),
        (
            lambda: ScipyGlobal("basinhopping", local="Newton"),
            ValueError,
            r"ScipyMinimize: `method` must be one of",
        ),
    ],
)
def test_construction_errors(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


def test_bounds_to_a_method_without_them_names_those_with_them():
    with pytest.raises(ValueError) as info:
        solve(BOXED, ScipyMinimize("BFGS"))
    message = str(info.value)
    assert message.startswith("solve: ScipyMinimize(method='BFGS') does not support bounds.")
    for method in (
        "Nelder-Mead",
        "Powell",
        "L-BFGS-B",
        "TNC",
        "COBYLA",
        "COBYQA",
        "SLSQP",
        "trust-constr",
    ):
        assert f"ScipyMinimize(method='{method}')" in message
    assert "ScipyMinimize(method='CG')" not in message


def test_constraints_to_a_method_without_them_names_those_with_them():
    with pytest.raises(ValueError) as info:
        solve(CONSTRAINED, ScipyMinimize("L-BFGS-B"))
    message = str(info.value)
    assert "ScipyMinimize(method='L-BFGS-B') does not support constraints" in message
    found = re.findall(r"ScipyMinimize\(method='([^']+)'\)", message.split("takes them:")[1])
    assert found == ["COBYLA", "COBYQA", "SLSQP", "trust-constr"]


def test_gtol_to_a_derivative_free_method():
    with pytest.raises(
        ValueError,
        match=(
            r"solve: ScipyMinimize\(method='Nelder-Mead'\) does not take `gtol` \(got "
            r"gtol=0\.001\): it uses no gradient\. Remove it \(use ftol or maxiters\), or use a "
            r"method that tests the gradient: CG, BFGS, L-BFGS-B, TNC, trust-constr, "
        ),
    ):
        solve(PLAIN, ScipyMinimize("Nelder-Mead"), gtol=1e-3)


def test_gtol_to_slsqp():
    with pytest.raises(
        ValueError,
        match=r"ScipyMinimize\(method='SLSQP'\) does not take `gtol`"
        r" \(got gtol=0\.1\): it has no gradient test",
    ):
        solve(PLAIN, ScipyMinimize("SLSQP"), gtol=0.1)


def test_method_option_given_to_solve_points_to_the_valid_ones():
    with pytest.raises(
        TypeError,
        match=r"solve: ScipyMinimize\(method='L-BFGS-B'\) does not take "
        r"the option\(s\) 'maxcor'\. Valid options: maxiters",
    ):
        solve(PLAIN, ScipyMinimize("L-BFGS-B"), maxcor=3)


@pytest.mark.parametrize("method", ["differential_evolution", "dual_annealing", "shgo", "direct"])
def test_global_methods_that_need_bounds_say_so(method):
    with pytest.raises(
        ValueError,
        match=(
            rf"solve: ScipyGlobal\(method='{method}'\) searches a box, so it needs finite "
            r"`bounds` on every variable; got bounds=None\. Give them, e\.g\. "
            r"OptimizationProblem\(f, x0, bounds=\(-5\.0, 5\.0\)\), or use "
            r"ScipyGlobal\(method='basinhopping'\), which needs none\."
        ),
    ):
        solve(PLAIN, ScipyGlobal(method))


def test_global_methods_need_finite_bounds():
    half_open = OptimizationProblem(quadratic, jnp.zeros(2), bounds=(-5.0, None))
    with pytest.raises(
        ValueError,
        match=r"needs finite `bounds` on every variable; got bounds "
        r"with infinite entries",
    ):
        solve(half_open, ScipyGlobal("direct"))


def test_basinhopping_local_method_must_take_the_bounds():
    # basinhopping's traits are its local method's (ScipyGlobal.capabilities), checked
    # centrally like every algorithm's.
    assert not ScipyGlobal("basinhopping", local="BFGS").capabilities()["takes_bounds"]
    assert ScipyGlobal("basinhopping").capabilities()["takes_bounds"]
    with pytest.raises(
        ValueError,
        match=(
            r"solve: ScipyGlobal\(method='basinhopping'\) does not support bounds\. Either "
            r"remove `bounds` from the problem or use an algorithm that takes them: .*"
            r"ScipyMinimize\(method='L-BFGS-B'\)"
        ),
    ) as raised:
        solve(BOXED, ScipyGlobal("basinhopping", local="BFGS"))
    # the list names basinhopping only with the condition under which it takes bounds
    assert "ScipyGlobal(method='basinhopping') (with a `local` method that takes bounds)" in str(
        raised.value
    )
    assert "ScipyGlobal(method='basinhopping')," not in str(raised.value)


def test_basinhopping_local_method_must_take_the_constraints():
    assert ScipyGlobal("basinhopping", local="SLSQP").capabilities()["takes_constraints"]
    with pytest.raises(
        ValueError,
        match=r"solve: ScipyGlobal\(method='basinhopping'\) does "
        r"not support constraints\.",
    ):
        solve(CONSTRAINED, ScipyGlobal("basinhopping", local="L-BFGS-B"))


def test_algorithm_class_instead_of_instance():
    with pytest.raises(TypeError, match=r"must be an instance, got the class ScipyMinimize"):
        solve(PLAIN, ScipyMinimize)


def test_dense_matrices_that_cannot_fit_are_refused_before_scipy_allocates_them(monkeypatch):
    import jax

    from optsolve.backends.scipy import memory

    big = OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.zeros(100_000))
    # BFGS's n x n matrices at n = 1e5: about 400 GB (five of 80 GB), on any machine here
    with pytest.raises(
        MemoryError, match=r"dense 100000 x 100000 float64 matrices.*optsolve.LBFGS"
    ):
        solve(big, ScipyMinimize("BFGS"))
    with pytest.raises(MemoryError, match="L-BFGS-B"):
        jax.jit(lambda p: solve(big.replace(p=p), ScipyMinimize("SLSQP")).x)(0.0)
    # the rule follows the machine's memory: three 200 x 200 matrices (0.9 MiB) exceed 0.5 MiB
    monkeypatch.setattr(memory, "physical_memory", lambda: 2**19)
    small = OptimizationProblem(lambda x, p: jnp.sum((x - 1.0) ** 2), jnp.zeros(200))
    with pytest.raises(MemoryError, match="about 0 GiB for n = 200"):
        solve(small, ScipyMinimize("trust-exact"))
    assert float(solve(small, ScipyMinimize("L-BFGS-B")).objective) < 1e-10
