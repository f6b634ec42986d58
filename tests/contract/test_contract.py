"""The contract every algorithm keeps: every registered algorithm class x every shared rule.

The cases are data: one entry per registered class (how to build it, whether its problems
need a box). A registered class without a case fails ``test_every_registered_class_has_a_case``.
A rule applies where the algorithm's capabilities (``Algorithm.capabilities()``, the table
``solve`` checks) say it can; where they say it cannot, the rule checks the error instead.
References: the objective's value recomputed at the returned point, x0 itself, and for
resume the uninterrupted run (N then M steps equal N + M).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, ReturnCode, solve
from optsolve.solve_api import host
from optsolve.solve_api.registry import algorithm_classes


@dataclasses.dataclass(frozen=True)
class Case:
    """How the matrix builds one algorithm class and the problems it takes."""

    make: Callable[[], Any]
    box: bool = False  # its problems need finite bounds (scipy's global methods)
    iterations: int = 12  # a budget that leaves the test problem unconverged
    stop_at: int = 3  # the iteration a callback stops at (dual_annealing calls it
    # once per new best minimum, not once per iteration)
    least_squares: bool = False  # it solves residual problems: its problems are
    # LeastSquaresProblems with the same objective
    callback_per_evaluation: bool = False  # scipy calls it back per evaluation (COBYQA):
    # its k counts evaluations, not iterations
    roots: bool = False  # it solves RootProblems only, not this matrix's problem:
    # tests/contract/test_contract_roots.py runs its rules
    scalar: bool = False  # it minimises over one scalar (trait scalar_only): its
    # problems are the contract problem on the line through X0
    # along x[0] (x[1] = X0[1] = 1), x0 the 0-d array X0[0]


def _point(x):
    """The contract problem's point of ``x``: x itself, or for a scalar class's x (one
    number) the point (x, 1) on the line through X0."""
    if jnp.size(x) != 1:
        return x
    x = jnp.reshape(x, ())
    return jnp.stack([x, jnp.ones_like(x)])


def _rosenbrock(x, p):
    x = _point(x)
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def _objective(x, p):
    """Rosenbrock scaled by |p|; for p < 0 with a NaN region just ahead of x0 (x[0] beyond
    -1.2 + 1e-5), which any step towards the minimum enters. One objective for every rule,
    so that the rules share compiled loops; for a scalar class's x, on the line through X0."""
    x = _point(x)
    nan_ahead = (p < 0) & (x[0] > -1.2 + 1e-5)
    return jnp.where(nan_ahead, jnp.nan, _rosenbrock(x, jnp.abs(p)))


def _residuals(x, p):
    """Residuals whose half squared norm is :func:`_objective` (NaN region included)."""
    nan_ahead = (p < 0) & (x[0] > -1.2 + 1e-5)
    r = jnp.concatenate(
        [jnp.sqrt(2 * jnp.abs(p)) * (x[1:] - x[:-1] ** 2), jnp.sqrt(2.0) * (1 - x[:-1])]
    )
    return jnp.where(nan_ahead, jnp.nan, r)


X0 = jnp.array([-1.2, 1.0])
BOX = (-2.0, 2.0)


# Arguments some optax factories need beyond a learning rate.
_OPTAX_KWARGS = {"NoisySGD": {"key": jax.random.key(0)}}


def _optax_case(cls) -> Case:
    import inspect

    params = inspect.signature(cls.factory).parameters
    kwargs = {"learning_rate": 1e-3} if "learning_rate" in params else {}
    kwargs.update(_OPTAX_KWARGS.get(cls.__name__, {}))
    return Case(lambda: cls(**kwargs))


def _cases() -> dict[type, Case]:
    cases: dict[type, Case] = {}
    for cls in algorithm_classes():
        if issubclass(cls, optsolve.OptaxAlgorithm):
            cases[cls] = _optax_case(cls)
    cases[optsolve.OptaxTransform] = Case(
        lambda: optsolve.OptaxTransform(
            optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.scale(-1e-3))
        )
    )
    cases[optsolve.Chain] = Case(
        lambda: optsolve.chain(
            optsolve.ClipByGlobalNorm(1.0), optsolve.AdamW(1e-3, weight_decay=1e-4)
        )
    )
    cases[optsolve.MultiSteps] = Case(lambda: optsolve.MultiSteps(optsolve.Adam(1e-3), 2))
    cases[optsolve.ApplyIfFinite] = Case(lambda: optsolve.ApplyIfFinite(optsolve.Adam(1e-3), 2))
    cases[optsolve.ParameterGroups] = Case(
        lambda: optsolve.ParameterGroups(
            {"a": optsolve.Adam(1e-3), "b": optsolve.SGD(1e-3)}, labels=lambda path: "a"
        )
    )
    for cls in (
        optsolve.GradientDescent,
        optsolve.NonlinearCG,
        optsolve.LBFGS,
        optsolve.BFGS,
        optsolve.Newton,
        optsolve.TrustRegion,
    ):
        cases[cls] = Case(cls, iterations=3)
    for cls in (optsolve.Brent, optsolve.GoldenSection):  # the bracket is the box
        cases[cls] = Case(cls, box=True, iterations=3, scalar=True)
    for cls in algorithm_classes():
        if issubclass(cls, optsolve.ScipyMinimizeScalar):  # one class per method
            cases[cls] = Case(
                lambda method=cls.spec.key: optsolve.ScipyMinimizeScalar(method),
                box=cls.spec.takes_bounds,
                iterations=3,
                scalar=True,
                callback_per_evaluation=True,
            )
    cases[optsolve.AdaHessian] = Case(lambda: optsolve.AdaHessian(0.01))
    # 8 Sobol starts: one in each eighth of the box's first axis, so one starts left of
    # the NaN region of the non-finite rules
    cases[optsolve.Multistart] = Case(
        lambda: optsolve.Multistart(optsolve.LBFGS(), 8, jax.random.key(0)), box=True, iterations=3
    )
    for cls in (optsolve.GaussNewton, optsolve.LevenbergMarquardt):
        cases[cls] = Case(cls, iterations=3, least_squares=True)
    cases[optsolve.InteriorPoint] = Case(optsolve.InteriorPoint, iterations=3)
    # outer iterations of 5 inner steps: a run of a few of them is still on its way
    cases[optsolve.AugmentedLagrangian] = Case(
        lambda: optsolve.AugmentedLagrangian(inner_maxiters=5), iterations=3
    )
    for cls in (optsolve.NewtonRaphson, optsolve.Broyden, optsolve.Bisection, optsolve.Brentq):
        cases[cls] = Case(cls, roots=True)
    for cls in algorithm_classes():
        if issubclass(cls, optsolve.ScipyRoot):  # one class per method
            cases[cls] = Case(lambda method=cls.spec.key: optsolve.ScipyRoot(method), roots=True)
    for cls in algorithm_classes():
        if issubclass(cls, optsolve.ScipyLeastSquares):  # one class per method: trf, dogbox, lm
            cases[cls] = Case(
                lambda method=cls.spec.name: optsolve.ScipyLeastSquares(method),
                iterations=3,
                least_squares=True,
            )
    for cls in algorithm_classes():
        if issubclass(cls, (optsolve.ScipyMinimize, optsolve.ScipyGlobal)):
            method = cls.spec.name
            box = issubclass(cls, optsolve.ScipyGlobal) and method != "basinhopping"
            base = (
                optsolve.ScipyMinimize
                if issubclass(cls, optsolve.ScipyMinimize)
                else optsolve.ScipyGlobal
            )
            options = (
                {"rng": 0}
                if method in ("differential_evolution", "dual_annealing", "basinhopping")
                else {}
            )
            cases[cls] = Case(
                lambda base=base, method=method, options=options: base(method, **options),
                box=box,
                iterations=3,
                stop_at=1 if method == "dual_annealing" else 3,
                callback_per_evaluation=cls.spec.callback_per_evaluation,
            )
    return cases


CASES = _cases()
pytestmark = pytest.mark.filterwarnings(
    "ignore:`optimistic_adam` is deprecated:DeprecationWarning",
    "ignore:optsolve. .* eps_root=0:RuntimeWarning",
)
# the classes that take this matrix's problem (root finders take RootProblems only)
CLASSES = [cls for cls, case in CASES.items() if not case.roots]
ROOT_ONLY = [cls for cls, case in CASES.items() if case.roots]


class _Callback:
    """One callback object for the rules that need one (a callback is static: sharing it
    shares the compiled loop). ``behave(i)`` is set by each test."""

    def __init__(self):
        self.seen: list[int] = []
        self.behave: Callable[[int], Any] = lambda i: None

    def __call__(self, i, x, f):
        self.seen.append(i)
        return self.behave(i)

    def reset(self, behave):
        self.seen, self.behave = [], behave
        return self


CALLBACK = _Callback()
# The callback rules' maxtime (the Ctrl-C rule's bound should its signal be lost): one value
# for all of them, so that they share one compiled loop (maxiters and maxtime are leaves)
_MAXTIME = 60.0


def _id(cls) -> str:
    return cls.__name__


def problem_for(cls, f, residuals, x0, p, bounds=None) -> OptimizationProblem:
    """``f``'s problem, or for a least-squares class the residual problem of
    ``residuals`` (whose half squared norm is ``f``)."""
    if CASES[cls].least_squares:
        return optsolve.LeastSquaresProblem(residuals, x0, p, bounds=bounds)
    return OptimizationProblem(f, x0, p, bounds=bounds)


def _start(cls, x0=X0):
    """``x0`` as ``cls`` takes it: itself, or for a scalar class its first entry."""
    return jnp.asarray(x0)[0] if CASES[cls].scalar else x0


def _problem(cls, x0=X0, p=10.0, bounds=None) -> OptimizationProblem:
    if bounds is None and CASES[cls].box:
        bounds = BOX
    x0 = _start(cls, x0)
    return problem_for(cls, _objective, _residuals, x0, p, bounds)


def _caps(cls) -> dict:
    return CASES[cls].make().capabilities()


def _leaves(tree):
    def array(leaf):
        if jax.dtypes.issubdtype(jnp.result_type(leaf), jax.dtypes.extended):
            leaf = jax.random.key_data(leaf)  # a PRNG key in an optimizer's state
        return np.asarray(leaf)

    return [array(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def test_every_registered_class_has_a_case():
    missing = [c.__name__ for c in algorithm_classes() if c not in CASES]
    assert not missing, f"registered algorithm classes without a contract case: {missing}"


@pytest.mark.parametrize("cls", ROOT_ONLY, ids=_id)
def test_a_root_finder_refuses_this_matrix_problem_naming_the_minimisers(cls):
    """A class whose traits say it solves RootProblems only refuses the matrix's
    minimisation (and least-squares) problem before it runs, naming the minimisers."""
    assert CASES[cls].make().capabilities()["needs_residuals"]
    for prob in (
        OptimizationProblem(_objective, X0, 10.0),
        optsolve.LeastSquaresProblem(_residuals, X0, 10.0),
    ):
        with pytest.raises(
            TypeError,
            match=r"solves root problems only .*RootProblem.*"
            r"LBFGS",
        ):
            solve(prob, CASES[cls].make(), maxiters=3)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_solution_fields_and_eager_types(cls):
    prob = _problem(cls)
    sol = solve(prob, CASES[cls].make(), maxiters=CASES[cls].iterations)
    assert isinstance(sol.retcode, ReturnCode)
    assert isinstance(sol.stats.iterations, int) and isinstance(sol.stats.f_evals, int)
    assert sol.stats.grad_evals is None or isinstance(sol.stats.grad_evals, int)
    assert isinstance(sol.stats.time, float)
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(X0)
    np.testing.assert_allclose(sol.objective, _rosenbrock(sol.x, 10.0), rtol=1e-12, atol=1e-14)
    assert isinstance(sol.message, str) and sol.message.startswith(sol.retcode.message)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_maxiters_zero_returns_x0_unchanged(cls):
    sol = solve(_problem(cls), CASES[cls].make(), maxiters=0)
    assert sol.retcode == ReturnCode.MAXITERS
    np.testing.assert_array_equal(sol.x, _start(cls))
    np.testing.assert_allclose(sol.objective, _rosenbrock(X0, 10.0), rtol=1e-15)
    assert sol.stats.iterations == 0


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_a_maxiters_that_ends_the_run_is_maxiters(cls):
    # two iterations do not solve Rosenbrock from X0 on any method
    sol = solve(_problem(cls), CASES[cls].make(), maxiters=2)
    assert sol.retcode == ReturnCode.MAXITERS, sol.message
    assert sol.stats.iterations == 2


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_callback_stop_counts_completed_iterations(cls):
    stop_at = CASES[cls].stop_at
    callback = CALLBACK.reset(lambda i: i >= stop_at)
    alg = CASES[cls].make()
    sol = solve(
        _problem(cls), alg, maxiters=50, callback=callback, gtol=_gtol(alg), maxtime=_MAXTIME
    )
    assert sol.retcode == ReturnCode.TERMINATED, sol.message
    if CASES[cls].callback_per_evaluation:
        # the k-th callback is the k-th evaluation; the iterations are the method's own
        # count at that evaluation, as scipy reports it (docs/contract.md)
        assert sol.stats.f_evals == callback.seen[-1] == stop_at
        assert sol.stats.iterations == sol.original.nit
        return
    assert sol.stats.iterations == callback.seen[-1] == stop_at


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_exception_in_callback_propagates_unchanged(cls):
    class Boom(Exception):
        pass

    def behave(i):
        if i >= 2:
            raise Boom("raised by the user's callback")

    alg = CASES[cls].make()
    with pytest.raises(Boom, match="raised by the user's callback"):
        solve(
            _problem(cls),
            alg,
            maxiters=50,
            callback=CALLBACK.reset(behave),
            gtol=_gtol(alg),
            maxtime=_MAXTIME,
        )


def _into_the_nan_region(cls) -> int:
    """The budget of the rules whose runs step into the NaN region: 200 iterations for a
    local method; a global one samples the box, into the region, in its first iterations
    (scipy's shgo would spend 17 s of its own in 200)."""
    return 20 if issubclass(cls, optsolve.ScipyGlobal) else 200


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_nonfinite_values_fail_with_the_last_finite_iterate(cls):
    prob = _problem(cls, p=-10.0)
    alg = CASES[cls].make()
    if issubclass(cls, optsolve.OptaxAlgorithm) and "learning_rate" in alg.hyperparams:
        alg = alg.replace(learning_rate=0.5)  # big enough to step into the NaN region
    # (the default of the classes that can pass over a point is "reject": the next rule)
    nonfinite = "fail" if _caps(cls).get("rejects_nonfinite") else None
    sol = solve(prob, alg, maxiters=_into_the_nan_region(cls), nonfinite=nonfinite)
    assert sol.retcode in (ReturnCode.FAILURE, ReturnCode.STALLED), sol.message
    assert np.all(np.isfinite(np.asarray(sol.x))) and np.isfinite(sol.objective)
    np.testing.assert_allclose(sol.objective, _objective(sol.x, -10.0), rtol=1e-12)
    assert "finite" in sol.message, sol.message


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_a_failed_eager_run_returns_the_iterate_a_jitted_run_returns(cls):
    """The last finite iterate of a run into a NaN region is the same eager and jitted: an
    eager gradient-step run keeps no previous iterate (the host runs the failed chunk again
    up to it), a jitted one keeps it at every step."""
    alg = CASES[cls].make()
    if not alg.capabilities()["jittable"]:
        pytest.skip("not jittable: the previous rule covers its eager run")
    if issubclass(cls, optsolve.OptaxAlgorithm) and "learning_rate" in alg.hyperparams:
        alg = alg.replace(learning_rate=0.5)
    nonfinite = "fail" if _caps(cls).get("rejects_nonfinite") else None
    prob, budget = _problem(cls, p=-10.0), _into_the_nan_region(cls)
    eager = solve(prob, alg, maxiters=budget, nonfinite=nonfinite)
    jitted = jax.jit(lambda pr: solve(pr, alg, maxiters=budget, nonfinite=nonfinite))(prob)
    assert int(eager.retcode) == int(jitted.retcode), eager.message
    np.testing.assert_allclose(np.asarray(eager.x), np.asarray(jitted.x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(eager.objective, jitted.objective, rtol=1e-10)
    assert eager.stats.iterations == int(jitted.stats.iterations)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_nonfinite_reject_passes_over_the_points_or_is_refused(cls):
    """nonfinite='reject', the default where the capability table says the method can pass
    over a point (rejects_nonfinite), runs on through the NaN region: never FAILURE for
    it, never SUCCESS at a non-finite point, the points counted in the message. Elsewhere
    it is refused, naming the classes that can."""
    prob, alg = _problem(cls, p=-10.0), CASES[cls].make()
    if not _caps(cls).get("rejects_nonfinite"):
        with pytest.raises(
            ValueError,
            match=r"nonfinite='reject' passes over points .*"
            r"Nelder-Mead",
        ):
            solve(prob, alg, maxiters=20, nonfinite="reject")
        return
    sol = solve(prob, alg, maxiters=20)  # the default
    assert sol.retcode != ReturnCode.FAILURE, sol.message
    assert np.all(np.isfinite(np.asarray(sol.x))) and np.isfinite(sol.objective)
    np.testing.assert_allclose(sol.objective, _objective(sol.x, -10.0), rtol=1e-12)
    assert "was not finite at" in sol.message and "rejected" in sol.message, sol.message


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_x0_outside_the_bounds_is_projected(cls):
    prob = _problem(cls, x0=jnp.array([-3.0, 0.5]), bounds=BOX)
    alg = CASES[cls].make()
    if not alg.capabilities()["takes_bounds"]:
        with pytest.raises(ValueError, match="does not support bounds.*LBFGS"):
            solve(prob, alg, maxiters=5)
        return
    with pytest.warns(UserWarning, match="x0 lies outside the bounds"):
        sol = solve(prob, alg, maxiters=5)
    x = np.asarray(sol.x)
    assert np.all(x >= -2.0) and np.all(x <= 2.0)
    assert sol.retcode != ReturnCode.FAILURE, sol.message
    with pytest.warns(UserWarning, match="x0 lies outside the bounds"):
        start = solve(prob, alg, maxiters=0)
    np.testing.assert_array_equal(start.x, _start(cls, [-2.0, 0.5]))


def _assert_progress_reached(err: str, iterations: int, total: int) -> None:
    assert re.search(rf"\b{iterations}/{total}\b", err), err[-300:]


def _metrics(x, p):
    """Recorded at every iterate: f itself (so each entry can be checked against the
    objective recorded there) and the iterate."""
    return {"f": _rosenbrock(x, jnp.abs(p)), "x": x}


def _distance(x, p):
    """An evaluation: the squared distance to the minimiser (1, 1), with x as its aux."""
    return jnp.sum((x - 1.0) ** 2), x


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_history_records_every_iterate_and_the_bar_reaches_it(cls, capsys):
    """Three rules, one run (so one compilation): ``history=True`` records f and the
    gradient norm at every iterate, x0 first, with the metrics at every iterate and the
    evaluations at every ``eval_every``-th; ``progress=True`` advances the bar to the
    iterations."""
    prob, alg, budget = _problem(cls), CASES[cls].make(), CASES[cls].iterations
    if not alg.capabilities()["records_history"]:
        with pytest.raises(ValueError, match="does not record a history"):
            solve(prob, alg, maxiters=5, history=True)
        with pytest.raises(ValueError, match="does not follow its iterates, which evaluate"):
            solve(prob, alg, maxiters=5, evaluate=_distance, keep="best")
        sol = solve(prob, alg, maxiters=budget, progress=True)
        _assert_progress_reached(capsys.readouterr().err, sol.stats.iterations, budget)
        return
    sol = solve(
        prob,
        alg,
        maxiters=budget,
        history=True,
        progress=True,
        metrics=_metrics,
        evaluate=_distance,
        eval_every=2,
    )
    _assert_progress_reached(capsys.readouterr().err, sol.stats.iterations, budget)
    objective = np.asarray(sol.history.objective)
    grad_norm = np.asarray(sol.history.grad_norm)
    k = sol.stats.iterations
    assert objective.shape == grad_norm.shape and objective.shape[0] >= k + 1
    np.testing.assert_allclose(objective[0], _rosenbrock(X0, 10.0), rtol=1e-15)
    np.testing.assert_allclose(objective[k], sol.objective, rtol=1e-12)
    assert np.all(np.isfinite(objective[: k + 1]))
    assert np.all(np.isnan(objective[k + 1 :]))
    if _caps(cls)["needs_gradient"]:
        g = jax.grad(_rosenbrock)(X0, 10.0)
        if prob.bounds is not None:
            g = X0 - jnp.clip(X0 - g, *BOX)
        np.testing.assert_allclose(grad_norm[0], jnp.max(jnp.abs(g)), rtol=1e-12)
    # the metrics at the iterates the objective was recorded at, x0 first
    metrics = sol.history.metrics
    np.testing.assert_allclose(metrics["f"], objective, rtol=1e-12)
    np.testing.assert_array_equal(metrics["x"][0], _start(cls))
    np.testing.assert_allclose(metrics["x"][k], sol.x, rtol=1e-12)
    # the evaluations at iterates 0, 2, 4, ... (NaN between and past the last)
    score, x_seen = (np.asarray(v) for v in sol.history.evaluation)
    even = np.arange(score.shape[0]) % 2 == 0
    done = np.arange(score.shape[0]) <= k
    assert np.all(np.isfinite(score[even & done])) and np.all(np.isnan(score[~(even & done)]))
    np.testing.assert_allclose(score[0], 2.2**2, rtol=1e-12)  # |(-1.2, 1) - (1, 1)|^2
    np.testing.assert_allclose(x_seen[even & done], metrics["x"][even & done], rtol=1e-12)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_resume_continues_the_run(cls, monkeypatch):
    prob, alg = _problem(cls), CASES[cls].make()
    caps = alg.capabilities()
    if not caps["resumable"]:
        first = solve(prob, alg, maxiters=2)
        with pytest.raises(ValueError, match="cannot resume"):
            solve(prob, alg, maxiters=2, resume=first)
        return
    n, m = 2, CASES[cls].iterations
    first = solve(prob, alg, maxiters=n)
    second = solve(prob, alg, maxiters=m, resume=first)
    if caps["compiled_driver"]:
        whole = solve(prob, alg, maxiters=n + m)
        for a, b in zip(_leaves(whole.x), _leaves(second.x)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        for a, b in zip(_leaves(whole.state), _leaves(second.state)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        assert second.stats.iterations == whole.stats.iterations
        # a Ctrl-C seen between two compiled chunks (no host call in the loop) stops after
        # n iterations with x, its value and the state together: resuming is exact too
        from optsolve.backends.native import chunked

        monkeypatch.setattr(chunked, "_FIRST_BUDGET_SMALL", n)
        monkeypatch.setattr(chunked, "interrupt_requested", lambda: True)
        cut = solve(prob, alg, maxiters=n + m)
        monkeypatch.undo()
        assert cut.retcode == ReturnCode.INTERRUPTED and cut.stats.iterations == n
        np.testing.assert_allclose(cut.objective, prob.f(cut.x, prob.p), rtol=1e-12)
        after_cut = solve(prob, alg, maxiters=m, resume=cut)
        for a, b in zip(_leaves(whole.x), _leaves(after_cut.x)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
        assert after_cut.stats.iterations == whole.stats.iterations
    else:  # a warm start: scipy from first.x, the counts added
        again = solve(prob.replace(x0=first.x), alg, maxiters=m)
        np.testing.assert_allclose(second.x, again.x, rtol=1e-12)
        assert second.stats.iterations == first.stats.iterations + again.stats.iterations
        assert second.stats.f_evals == first.stats.f_evals + again.stats.f_evals


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_a_checkpoint_resumes_the_run_exactly(cls, tmp_path):
    """``checkpoint=`` writes the run so far every ``checkpoint_every`` iterations; a run
    resumed from the last one (as after a kill) equals the uninterrupted run."""
    prob, alg = _problem(cls), CASES[cls].make()
    path = tmp_path / "run.npz"
    if not alg.capabilities()["compiled_driver"]:
        with pytest.raises(ValueError, match="cannot write checkpoints"):
            solve(prob, alg, maxiters=4, checkpoint=path, checkpoint_every=2)
        return
    n, m = 2, CASES[cls].iterations
    whole = solve(prob, alg, maxiters=n + m)
    solve(prob, alg, maxiters=n + 1, checkpoint=path, checkpoint_every=n)
    saved = optsolve.load(path)
    assert saved.retcode == ReturnCode.INTERRUPTED and saved.stats.iterations == n
    resumed = solve(prob, alg, maxiters=m, resume=saved)
    for a, b in zip(_leaves(whole.x), _leaves(resumed.x)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(_leaves(whole.state), _leaves(resumed.state)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert resumed.stats.iterations == whole.stats.iterations
    assert resumed.retcode == whole.retcode


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_no_recompilation_for_new_numbers(cls):
    prob, alg = _problem(cls), CASES[cls].make()
    solve(prob, alg, maxiters=CASES[cls].iterations)
    # every real-valued hyperparameter (integer leaves, such as a PRNG key, are kept)
    scaled = jax.tree_util.tree_map(
        lambda v: v * 0.5 if jnp.issubdtype(jnp.result_type(v), jnp.floating) else v, alg
    )
    moved = _start(cls) + 0.1
    with count_compilations() as counter:
        solve(prob.replace(p=11.0, x0=moved), scaled, maxiters=CASES[cls].iterations - 1)
    assert counter.count == 0


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_a_planned_call_equals_the_staged_call_of_its_own_numbers(cls, monkeypatch):
    # the first call records a plan where the stages change nothing (solve_api/plans.py);
    # the next call of that structure, every number new, takes it, and must solve its own
    # numbers: everything equal to the same call made through the stages
    import importlib

    from optsolve.solve_api import plans

    solve_module = importlib.import_module("optsolve.solve_api.solve")
    entered, enter = [], solve_module.enter_stages
    monkeypatch.setattr(
        solve_module, "enter_stages", lambda stages, call: entered.append(1) or enter(stages, call)
    )
    prob, alg = _problem(cls), CASES[cls].make()
    k = CASES[cls].iterations
    plans._PLANS.clear()
    solve(prob, alg, maxiters=k)
    scaled = jax.tree_util.tree_map(
        lambda v: v * 0.5 if jnp.issubdtype(jnp.result_type(v), jnp.floating) else v, alg
    )
    moved = prob.replace(p=11.0, x0=_start(cls) + 0.1)
    planned = solve(moved, scaled, maxiters=k)
    # a third call takes the run the backend offered the plan, where it did (the compiled
    # driver's): every number new again
    again = solve(prob, alg, maxiters=k)
    assert len(entered) == (3 if prob.has_bounds else 1)
    ran = [plan.run is not None for plan in plans._PLANS._entries.values()]
    assert any(ran) == (type(alg).compiled_driver and not prob.has_bounds)
    plans._PLANS.clear()
    staged = solve(moved, scaled, maxiters=k)
    staged_again = solve(prob, alg, maxiters=k)
    for one, other in ((planned, staged), (again, staged_again)):
        np.testing.assert_array_equal(np.asarray(one.x), np.asarray(other.x))
        np.testing.assert_array_equal(np.asarray(one.objective), np.asarray(other.objective))
        assert (one.retcode, one.reason) == (other.retcode, other.reason)
        assert one.message == other.message  # the backend's own words (its finish) too
        for count in ("iterations", "f_evals", "grad_evals"):
            assert getattr(one.stats, count) == getattr(other.stats, count), count


def _negated_with_aux(x, p):
    """-_objective, with an auxiliary output: maximising it is minimising _objective."""
    return -_objective(x, p), {"x": x, "scaled": p * _point(x)[0]}


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_maximisation_and_aux_are_the_minimisation_in_the_users_terms(cls):
    """Maximising -f takes f's minimisation's iterates; the objective (and the callback's)
    is the user's -f, and aux is f's auxiliary output at the solution. Least-squares
    classes solve residual problems, which have neither."""
    alg, k = CASES[cls].make(), CASES[cls].iterations
    prob = OptimizationProblem(
        _negated_with_aux,
        _start(cls),
        10.0,
        sense="max",
        has_aux=True,
        bounds=BOX if CASES[cls].box else None,
    )
    if CASES[cls].least_squares:
        with pytest.raises(TypeError, match="works on residuals"):
            solve(prob, alg, maxiters=k)
        return
    seen = CALLBACK.reset(lambda i: None)
    minimised = solve(_problem(cls), alg, maxiters=k)
    if not alg.capabilities()["records_history"]:
        with pytest.raises(ValueError, match="does not follow its iterates, which keep='best'"):
            solve(prob, alg, maxiters=k, keep="best")
        sol = solve(prob, alg, maxiters=k, callback=seen)
        np.testing.assert_allclose(sol.x, minimised.x, rtol=1e-12, atol=1e-14)
    else:
        # with a history, aux is recorded at every iterate; keep="best" returns the iterate
        # of highest objective (the user's: this problem maximises)
        sol = solve(prob, alg, maxiters=k, callback=seen, history=True, keep="best")
        n = sol.stats.iterations
        assert n == minimised.stats.iterations
        user_f = np.asarray(sol.history.objective)[: n + 1]
        np.testing.assert_allclose(user_f[n], -minimised.objective, rtol=1e-12)
        np.testing.assert_allclose(sol.objective, np.max(user_f), rtol=1e-12)
        aux_x = np.asarray(sol.history.metrics["x"])[: n + 1]
        np.testing.assert_array_equal(aux_x[0], _start(cls))
        np.testing.assert_allclose(
            -jax.vmap(_rosenbrock, (0, None))(aux_x, 10.0), user_f, rtol=1e-12, atol=1e-20
        )
        np.testing.assert_allclose(
            sol.history.metrics["scaled"][: n + 1],
            10.0 * np.reshape(aux_x, (n + 1, -1))[:, 0],
            rtol=1e-15,
        )
        np.testing.assert_allclose(sol.x, aux_x[np.argmax(user_f)], rtol=1e-12)
    assert sol.retcode == minimised.retcode
    np.testing.assert_allclose(sol.objective, -_rosenbrock(sol.x, 10.0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sol.aux["x"], sol.x, rtol=1e-15)
    np.testing.assert_allclose(sol.aux["scaled"], 10.0 * np.ravel(sol.x)[0], rtol=1e-15)


def _flat(x):
    """The leaves of any x0 structure as one vector, in order."""
    return jnp.concatenate([jnp.ravel(jnp.asarray(leaf)) for leaf in jax.tree_util.tree_leaves(x)])


def _tree_objective(x, p):
    return _objective(_flat(x), p)


def _tree_residuals(x, p):
    return _residuals(_flat(x), p)


# a tuple holding a dict and a list: three containers in one compiled run. Their leaves are
# 1-element arrays: optax's SM3 fails on 0-d parameters (it indexes a leaf's first axis)
NESTED_X0 = ({"a": jnp.array([-1.2])}, [jnp.array([1.0])])


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_x0s_structure_is_kept(cls):
    """sol.x has x0's structure: a list of numbers (scipy's form, one array inside f) comes
    back a list, from the compiled program of the array x0; lists, tuples and dicts in a
    pytree x0 come back as they were given."""
    alg, k = CASES[cls].make(), CASES[cls].iterations
    array = solve(_problem(cls), alg, maxiters=k)
    if CASES[cls].scalar:
        # scipy's form of one scalar is a Python number; a pytree x0 holds one 0-d array
        number = solve(
            problem_for(cls, _objective, _residuals, -1.2, 10.0, BOX if CASES[cls].box else None),
            alg,
            maxiters=k,
        )
        np.testing.assert_allclose(number.x, array.x, rtol=1e-12, atol=1e-14)
        nested = OptimizationProblem(
            _tree_objective,
            ({"a": jnp.array(-1.2)}, []),
            10.0,
            bounds=BOX if CASES[cls].box else None,
        )
        sol = solve(nested, alg, maxiters=k)
        assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(nested.x0)
        np.testing.assert_allclose(sol.x[0]["a"], array.x, rtol=1e-12, atol=1e-14)
        return
    listed_problem = _problem(cls, x0=[-1.2, 1.0])
    listed_problem.x0_form.to_user(X0)  # the list's own (one-off) program, compiled first
    with count_compilations() as counter:
        listed = solve(listed_problem, alg, maxiters=k)
    assert counter.count == 0
    assert isinstance(listed.x, list) and len(listed.x) == 2, listed.x
    np.testing.assert_allclose(np.array(listed.x), array.x, rtol=1e-12, atol=1e-14)
    nested = problem_for(
        cls, _tree_objective, _tree_residuals, NESTED_X0, 10.0, BOX if CASES[cls].box else None
    )
    sol = solve(nested, alg, maxiters=k)
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(NESTED_X0)
    np.testing.assert_allclose(
        sol.objective, _rosenbrock(_flat(sol.x), 10.0), rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_float32_in_float32_out(cls):
    prob = _problem(cls, x0=X0.astype(jnp.float32), p=jnp.float32(10.0))
    sol = solve(prob, CASES[cls].make(), maxiters=CASES[cls].iterations)
    assert np.asarray(sol.x).dtype == np.float32
    assert np.isfinite(sol.objective)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_16_bit_floats_work_or_are_refused_before_the_run(cls):
    """A bfloat16 or float16 x0 (and p): the run ends in x0's dtype at a finite point with
    an honest return code (never a crash), or, where the capability table says the class
    cannot compute in that dtype (``float_dtypes``), solve refuses it before it runs."""
    alg, k = CASES[cls].make(), CASES[cls].iterations
    for dtype in (jnp.bfloat16, jnp.float16):
        prob = _problem(cls, x0=X0.astype(dtype), p=jnp.asarray(10.0, dtype))
        if jnp.dtype(dtype).name not in alg.capabilities()["float_dtypes"]:
            with pytest.raises(TypeError, match=f"cannot compute in {jnp.dtype(dtype).name}"):
                solve(prob, alg, maxiters=k)
            continue
        sol = solve(prob, alg, maxiters=k)
        assert sol.retcode in (ReturnCode.SUCCESS, ReturnCode.STALLED, ReturnCode.MAXITERS), (
            sol.message
        )
        if sol.retcode == ReturnCode.MAXITERS:
            assert sol.stats.iterations == k
        x = np.asarray(sol.x)
        assert x.dtype == jnp.dtype(dtype) and np.all(np.isfinite(x.astype(np.float32)))
        # f in 16 bits: a few units of its 8 (bfloat16) or 11 (float16) bits of mantissa
        np.testing.assert_allclose(
            np.float32(sol.objective), _rosenbrock(x.astype(np.float64), 10.0), rtol=0.05, atol=0.02
        )


# 8 variables: L-BFGS keeps its memory in the compact (2, m, n) form from this size on
WIDE_X0 = jnp.tile(X0, 4)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_jit_and_vmap_agree_with_eager_under_strict_promotion(cls):
    """Under ``jax.numpy_dtype_promotion("strict")`` and ``jax.numpy_rank_promotion("raise")``
    (optimistix's whole suite runs so) every class runs eagerly, and jitted and vmapped where
    it claims it, to the eager run's iterate: no implicit promotion or broadcast in
    optsolve's own code, and no difference between the eager and the traced programs. One
    rule, so that one jitted and vmapped compilation serves both checks."""
    alg, k = CASES[cls].make(), CASES[cls].iterations
    caps = alg.capabilities()
    prob = _problem(cls, x0=WIDE_X0)
    run = lambda p: solve(prob.replace(p=p), alg, maxiters=k).x
    ps = jnp.array([10.0, 10.0])
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        eager = solve(prob, alg, maxiters=k)
        assert eager.retcode != ReturnCode.FAILURE, eager.message
        if caps["jittable"] and caps["vmappable"]:  # both at once: one compilation
            xs = jax.jit(jax.vmap(run))(ps)
        elif caps["jittable"]:
            xs = jax.jit(run)(10.0)[None]
        elif caps["vmappable"]:
            xs = jax.vmap(run)(ps)
        else:
            xs = None
    assert np.asarray(eager.x).shape == np.shape(_start(cls, WIDE_X0))
    assert np.all(np.isfinite(np.asarray(eager.x)))
    if xs is not None:
        np.testing.assert_array_equal(xs[0], xs[-1])
        np.testing.assert_allclose(xs, np.stack([eager.x] * len(xs)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_keyboard_interrupt_returns_the_last_completed_iterate(cls):
    prob, alg = _problem(cls), CASES[cls].make()
    # every iteration reaches the host and sleeps there, so the run lasts
    slow_callback = CALLBACK.reset(lambda i: time.sleep(0.002))

    # compiled (and scipy's evaluations prepared) first: the signal must find the run itself
    solve(prob, alg, maxiters=2, callback=slow_callback, gtol=_gtol(alg), maxtime=_MAXTIME)
    done = threading.Event()
    sent: list[float] = []

    def interrupt():
        # Once the solve runs (a Ctrl-C outside it would stop the test session itself) and
        # has run 0.3 s: a one-shot timer could fire before a slow (loaded) machine enters
        # the solve, and the run below would then go on for hours.
        while not done.wait(0.01):
            if host._CATCHING[0] and time.perf_counter() - started >= 0.3:
                sent.append(time.perf_counter())
                os.kill(os.getpid(), signal.SIGINT)
                return

    sender = threading.Thread(target=interrupt, daemon=True)
    started = time.perf_counter()
    sender.start()
    try:
        # maxtime: should the signal be lost, the run ends instead of going on for hours
        sol = solve(
            prob, alg, maxiters=10**7, callback=slow_callback, gtol=_gtol(alg), maxtime=_MAXTIME
        )
    finally:
        done.set()
        sender.join()
    if sent:
        assert time.perf_counter() - sent[0] < 5.0
    if sol.retcode != ReturnCode.INTERRUPTED:
        # it ended by itself (before the signal, or within the chunk the signal came in):
        # never a stop that the interrupt caused but did not report
        assert sol.retcode not in (ReturnCode.TERMINATED, ReturnCode.MAXTIME), sol.message
        return
    # work was done (a global method's first hop may still be running: 0 iterations)
    assert sol.stats.f_evals >= 1
    assert np.all(np.isfinite(np.asarray(sol.x)))
    np.testing.assert_allclose(sol.objective, _rosenbrock(sol.x, 10.0), rtol=1e-12, atol=1e-14)


def _gtol(alg) -> float | None:
    """gtol=0 (no convergence by the gradient test), where the algorithm takes a gtol; the
    callback rules share it, and so one compiled loop."""
    if isinstance(alg, optsolve.ScipyMinimizeScalar):
        return None
    takes = not isinstance(alg, (optsolve.ScipyMinimize, optsolve.ScipyGlobal)) or (
        alg.spec.native_gtol
    )
    return 0.0 if takes else None


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_replace_returns_a_new_algorithm_and_names_the_valid_fields(cls):
    alg = CASES[cls].make()
    same = alg.replace()
    assert type(same) is type(alg) and same is not alg
    assert jax.tree_util.tree_structure(same) == jax.tree_util.tree_structure(alg)
    with pytest.raises(TypeError, match="not_a_hyperparameter"):
        alg.replace(not_a_hyperparameter=1.0)
    with pytest.raises(AttributeError, match="immutable|frozen|cannot assign"):
        alg.not_a_hyperparameter = 1.0


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_unrolled_adjoint_runs_exactly_where_the_catalog_says(cls):
    prob, alg = _problem(cls), CASES[cls].make()
    unrolled = optsolve.UnrolledAdjoint()
    if not alg.capabilities()["unrollable"]:
        with pytest.raises(ValueError, match="cannot be differentiated by unrolling"):
            solve(prob, alg, maxiters=3, adjoint=unrolled)
        return
    # the same iterates as the while loop (derivatives: tests/adjoint/test_adjoint.py)
    x = solve(prob, alg, maxiters=3, adjoint=unrolled).x
    np.testing.assert_allclose(x, solve(prob, alg, maxiters=3).x, rtol=1e-12, atol=1e-14)


def test_a_transformation_ending_in_a_line_search_unrolls_by_forward_passes():
    # its while loop has no transpose: UnrolledAdjoint takes its derivatives by forward
    # passes (tests/adjoint/test_unrolled.py checks them); the iterates are the plain run's
    with_search = optsolve.OptaxTransform(
        optax.chain(
            optax.sgd(1.0), optax.scale_by_backtracking_linesearch(max_backtracking_steps=5)
        )
    )
    assert with_search.capabilities()["unrollable"] and with_search.unrolls_by_forward_passes()
    assert optsolve.OptaxLBFGS().unrolls_by_forward_passes()
    assert not optsolve.Adam(0.1).unrolls_by_forward_passes()
    assert not optsolve.OptaxTransform(optax.adam(0.1)).unrolls_by_forward_passes()
    prob = _problem(optsolve.OptaxTransform)
    unrolled = solve(prob, with_search, maxiters=3, adjoint=optsolve.UnrolledAdjoint())
    np.testing.assert_allclose(
        unrolled.x, solve(prob, with_search, maxiters=3).x, rtol=1e-12, atol=1e-14
    )
