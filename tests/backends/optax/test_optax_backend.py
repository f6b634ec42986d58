"""The optax family through solve: equality with hand-written optax loops, pytrees that do not
recompile, schedules on any hyperparameter, transforms that need value/value_fn, vmap, jit,
callbacks, stopping rules and numerical failure."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, ReturnCode, solve
from optsolve.backends.optax.algorithms import ALGORITHMS

# A smooth, non-quadratic objective over a nested pytree (like a params dict): a small
# L2-regularised logistic regression with the regularisation strength as p.
_rng = np.random.default_rng(0)
_A = _rng.normal(size=(40, 5))
_y = (_A @ np.array([1.0, -2.0, 0.5, 0.0, 1.5]) + 0.3 * _rng.normal(size=40) > 0).astype(float)


def logistic(params, p):
    z = jnp.asarray(_A, params["w"].dtype) @ params["w"] + params["b"]["c"][0]
    y = jnp.asarray(_y, z.dtype)
    loss = jnp.mean(jnp.logaddexp(0.0, z) - y * z)
    return loss + p * jnp.sum(params["w"] ** 2)


def make_problem(dtype=jnp.float64, p=0.01):
    # b is a 1-vector, not a scalar: optax.sm3 cannot handle 0-d parameters.
    x0 = {"w": jnp.full((5,), 0.1, dtype), "b": {"c": jnp.full((1,), -0.2, dtype)}}
    return OptimizationProblem(logistic, x0, jnp.asarray(p, dtype))


def hand_loop(tx, prob, steps, extra=None):
    """The loop an optax user writes: N jitted steps, each taking the gradient."""
    value_fn = lambda x: prob.f(x, prob.p)

    @jax.jit
    def step(x, state):
        value, grad = jax.value_and_grad(value_fn)(x)
        kwargs = extra(value, grad, value_fn) if extra else {}
        updates, state = tx.update(grad, state, x, **kwargs)
        return optax.apply_updates(x, updates), state

    x, state = prob.x0, tx.init(prob.x0)
    for _ in range(steps):
        x, state = step(x, state)
    return x


def assert_tree_close(a, b, rtol, atol=0.0):
    for la, lb in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(la), np.asarray(lb), rtol=rtol, atol=atol)


# Hyperparameters for each generated class in the equality test; the learning rate is
# small enough that every method stays finite for 25 steps on the logistic problem.
def _kwargs_for(cls):
    params = inspect.signature(cls.factory).parameters
    kwargs = {}
    if "learning_rate" in params:
        kwargs["learning_rate"] = 0.05
    if cls.__name__ == "OptaxLBFGS":
        kwargs = {}
    if cls.__name__ == "NoisySGD":
        kwargs["key"] = jax.random.key(0)
    return kwargs


def _extra_for(cls):
    name = cls.__name__
    if name in ("OptaxLBFGS", "PolyakSGD", "Momo", "MomoAdam"):
        return lambda value, grad, value_fn: {"value": value, "grad": grad, "value_fn": value_fn}
    if name == "Sophia":
        return lambda value, grad, value_fn: {"obj_fn": value_fn}
    return None


@pytest.mark.filterwarnings("ignore:`optimistic_adam` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_optax_algorithm_equals_hand_written_loop_float64(name):
    cls = ALGORITHMS[name]
    kwargs = _kwargs_for(cls)
    prob = make_problem()
    steps = 25
    sol = solve(prob, cls(**kwargs), maxiters=steps)
    expected = hand_loop(cls.factory(**kwargs), prob, steps, _extra_for(cls))
    assert sol.stats.iterations == steps
    assert sol.retcode == ReturnCode.MAXITERS
    # One compiled loop may contract multiply-adds differently from jitted steps (~1e-16).
    assert_tree_close(sol.x, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sol.objective, logistic(sol.x, prob.p), rtol=1e-14)


@pytest.mark.parametrize("name", ["Adam", "SGD", "Lion", "RMSProp", "OptaxLBFGS", "Adafactor"])
def test_float32_runs_stay_float32_and_match_hand_loop(name):
    cls = ALGORITHMS[name]
    kwargs = _kwargs_for(cls)
    prob = make_problem(jnp.float32, p=0.01)
    sol = solve(prob, cls(**kwargs), maxiters=25)
    expected = hand_loop(cls.factory(**kwargs), prob, 25, _extra_for(cls))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(sol.x))
    assert sol.objective.dtype == jnp.float32
    assert_tree_close(sol.x, expected, rtol=2e-5, atol=1e-6)


def test_raw_chain_equals_hand_loop():
    tx = optax.chain(
        optax.clip_by_global_norm(0.5),
        optax.scale_by_adam(b1=0.8),
        optax.add_decayed_weights(1e-3),
        optax.scale(-0.03),
    )
    prob = make_problem()
    sol = solve(prob, tx, maxiters=40)
    assert_tree_close(sol.x, hand_loop(tx, prob, 40), rtol=1e-12, atol=1e-14)
    masked = optax.masked(optax.sgd(0.1, momentum=0.9), {"w": True, "b": {"c": False}})
    sol = solve(prob, masked, maxiters=15)
    assert_tree_close(sol.x, hand_loop(masked, prob, 15), rtol=1e-12, atol=1e-14)


def test_algorithm_is_a_pytree_with_numeric_leaves():
    alg = optsolve.Adam(1e-3, b1=0.8, nesterov=True)
    leaves, treedef = jax.tree_util.tree_flatten(alg)
    assert leaves == [1e-3, 0.8, 0.999, 1e-8, 0.0]  # learning_rate, b1, b2, eps, eps_root
    rebuilt = jax.tree_util.tree_unflatten(treedef, [0.5, 0.7, 0.9, 1e-6, 0.0])
    assert isinstance(rebuilt, optsolve.Adam) and rebuilt.learning_rate == 0.5 and rebuilt.nesterov
    assert alg.replace(b1=0.5).b1 == 0.5 and alg.b1 == 0.8
    with pytest.raises(AttributeError, match="immutable"):
        alg.b1 = 0.3
    # ints fix structure (shapes), so they are static
    assert jax.tree_util.tree_leaves(optsolve.OptaxLBFGS(memory_size=5)) == []
    assert "b1" in str(inspect.signature(optsolve.Adam)) and "optax.adam" in optsolve.Adam.__doc__


def test_jitted_function_taking_algorithm_compiles_once():
    f = lambda x, p: jnp.sum((x - p) ** 2) + 0.1 * jnp.sum(x**4)

    @jax.jit
    def run(alg, p):
        return solve(OptimizationProblem(f, jnp.zeros(3), p), alg, maxiters=30).x

    run(optsolve.Adam(0.01), jnp.asarray(1.0))  # warm-up compile
    results = {}
    with count_compilations() as counter:
        for lr in (0.01, 0.02, 0.05, 0.1, 0.2):
            for p in (0.5, 1.0, 2.0):
                results[lr, p] = run(optsolve.Adam(lr), jnp.asarray(p))
    assert counter.count == 0
    # and the values differ as they should: each equals its own hand-written loop
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.asarray(2.0))
    assert_tree_close(results[0.2, 2.0], hand_loop(optax.adam(0.2), prob, 30), rtol=1e-12)


def test_solve_outside_jit_does_not_recompile_for_new_hyperparameters_or_p():
    f = lambda x, p: jnp.sum((x - p) ** 2)
    solve(
        OptimizationProblem(f, jnp.zeros(4), jnp.asarray(0.0)),
        optsolve.SGD(0.1, momentum=0.5),
        maxiters=10,
    )
    with count_compilations() as counter:
        for lr, mom, p, n in ((0.2, 0.9, 1.0, 20), (0.05, 0.1, 3.0, 7), (0.3, 0.0, -1.0, 50)):
            solve(
                OptimizationProblem(f, jnp.zeros(4), jnp.asarray(p)),
                optsolve.SGD(lr, momentum=mom),
                maxiters=n,
            )
    assert counter.count == 0


def test_python_ints_and_floats_in_hyperparameters_compile_to_the_same_code():
    """weight_decay=0 is 0.0 (a leaf), learning_rate=1 is 1.0; counts (Muon's ns_steps)
    stay ints, which fix structure."""
    f = lambda x, p: jnp.sum((x - p) ** 2)
    prob = OptimizationProblem(f, jnp.zeros(4), jnp.asarray(1.0))
    reference = solve(prob, optsolve.AdamW(0.1, weight_decay=0.0), maxiters=10)
    with count_compilations() as counter:
        ints = solve(prob, optsolve.AdamW(0.1, weight_decay=0), maxiters=10)
        solve(prob, optsolve.AdamW(1, weight_decay=2), maxiters=10)
    assert counter.count == 0
    assert_tree_close(ints.x, reference.x, rtol=0)
    assert optsolve.AdamW(1, weight_decay=0).weight_decay == 0.0
    assert isinstance(optsolve.Muon(0.1, ns_steps=3).ns_steps, int)


def test_closure_approach_recompiles_for_comparison():
    # What optsolve avoids: an optax transform as a static argument of a jitted function.
    f = lambda x: jnp.sum((x - 1.0) ** 2)

    def train(tx, x):
        state = tx.init(x)

        def body(_, carry):
            x, state = carry
            updates, state = tx.update(jax.grad(f)(x), state, x)
            return optax.apply_updates(x, updates), state

        return jax.lax.fori_loop(0, 10, body, (x, state))[0]

    train_jit = jax.jit(train, static_argnums=0)
    x0 = jnp.zeros(3)
    train_jit(optax.adam(0.05), x0)  # the small programs of a first call (zeros) compiled
    with count_compilations() as counter:
        for lr in (0.1, 0.2, 0.3):
            train_jit(optax.adam(lr), x0)
    assert counter.count == 3


def _numpy_adam_with_b1_schedule(grad_fn, x0, lr, b1_of, b2, eps, steps):
    """Adam (Kingma & Ba, 2015) as optax.scale_by_adam computes it, with b1 varying by step."""
    x = np.array(x0, float)
    mu, nu = np.zeros_like(x), np.zeros_like(x)
    for t in range(steps):
        b1 = b1_of(t)
        g = grad_fn(x)
        mu = b1 * mu + (1 - b1) * g
        nu = b2 * nu + (1 - b2) * g**2
        count = t + 1
        mu_hat = mu / (1 - b1**count)
        nu_hat = nu / (1 - b2**count)
        x = x - lr * mu_hat / (np.sqrt(nu_hat) + eps)
    return x


def test_schedule_on_b1_equals_hand_written_schedule():
    # b1 rises linearly from 0.5 to 0.95 over 20 steps, computed in float64
    b1_schedule = lambda count: 0.5 + 0.45 * jnp.minimum(count, 20).astype(jnp.float64) / 20.0
    center = np.array([1.0, -2.0, 3.0])
    f = lambda x, p: jnp.sum((x - p) ** 2 * jnp.arange(1.0, 4.0))
    prob = OptimizationProblem(f, jnp.zeros(3), jnp.asarray(center))
    sol = solve(prob, optsolve.Adam(0.1, b1=b1_schedule), maxiters=30)
    reference = _numpy_adam_with_b1_schedule(
        lambda x: 2 * (x - center) * np.arange(1.0, 4.0),
        np.zeros(3),
        0.1,
        lambda t: 0.5 + 0.45 * min(t, 20) / 20.0,
        0.999,
        1e-8,
        30,
    )
    np.testing.assert_allclose(sol.x, reference, rtol=1e-12)
    injected = optax.inject_hyperparams(optax.adam)(learning_rate=0.1, b1=b1_schedule)
    assert_tree_close(sol.x, hand_loop(injected, prob, 30), rtol=1e-12)
    # and the schedule really mattered
    constant = solve(prob, optsolve.Adam(0.1, b1=0.5), maxiters=30)
    assert np.max(np.abs(np.asarray(constant.x) - reference)) > 1e-3


def test_schedule_on_learning_rate_and_weight_decay():
    lr = optax.exponential_decay(0.1, transition_steps=5, decay_rate=0.5)
    wd = optax.linear_schedule(0.0, 0.1, 10)
    prob = make_problem()
    sol = solve(prob, optsolve.AdamW(lr, weight_decay=wd), maxiters=20)
    assert_tree_close(sol.x, hand_loop(optax.adamw(lr, weight_decay=wd), prob, 20), rtol=1e-12)


def rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


@pytest.mark.parametrize(
    "algorithm",
    [
        optax.lbfgs(),
        optsolve.OptaxLBFGS(),
        optax.chain(optax.sgd(1.0), optax.scale_by_zoom_linesearch(max_linesearch_steps=30)),
    ],
    ids=["optax.lbfgs", "OptaxLBFGS", "sgd+zoom"],
)
def test_line_search_transforms_reach_rosenbrock_minimum(algorithm):
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]))
    sol = solve(prob, algorithm, maxiters=20000, gtol=1e-9)
    assert sol.retcode == ReturnCode.SUCCESS
    np.testing.assert_allclose(sol.x, [1.0, 1.0], rtol=1e-8)
    assert np.max(np.abs(jax.grad(rosenbrock)(sol.x, None))) <= 1e-9
    # every line-search trial evaluates f and the gradient: more evaluations than iterations
    assert sol.stats.f_evals > sol.stats.iterations
    assert sol.stats.grad_evals == sol.stats.f_evals  # zoom evaluates both at every trial


def test_lbfgs_through_solve_equals_optax_documented_loop():
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0, 0.5, -0.3]))
    tx = optax.lbfgs()
    fn = lambda x: rosenbrock(x, None)
    value_and_grad = optax.value_and_grad_from_state(fn)

    @jax.jit
    def step(x, state):
        value, grad = value_and_grad(x, state=state)
        updates, state = tx.update(grad, state, x, value=value, grad=grad, value_fn=fn)
        return optax.apply_updates(x, updates), state

    x, state = prob.x0, tx.init(prob.x0)
    trials = 0
    for _ in range(10):
        x, state = step(x, state)
        trials += int(optax.tree.get(state, "num_linesearch_steps"))
    # The same numbers as the loop's up to rounding: XLA may fuse the loop and the solve
    # differently (an eager solve of a problem this small is compiled with the classic
    # emitters, compile_options.py). 10 iterations, so that Rosenbrock's valley (which
    # amplifies a rounding to 1e-7 relative by iteration 25) has not amplified it yet.
    jitted = jax.jit(lambda x0: solve(OptimizationProblem(rosenbrock, x0), tx, maxiters=10))
    for sol in (jitted(prob.x0), solve(prob, tx, maxiters=10)):
        np.testing.assert_allclose(sol.x, x, rtol=1e-12)
        # value and gradient are reused from the line search: x0 plus one per trial
        assert int(sol.stats.f_evals) == int(sol.stats.grad_evals) == 1 + trials


def test_backtracking_line_search_counts_value_only_trials():
    tx = optax.chain(optax.sgd(1.0), optax.scale_by_backtracking_linesearch(30))
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]))
    sol = solve(prob, tx, maxiters=50)
    assert sol.stats.iterations == 50
    assert sol.stats.grad_evals == 51  # one per step, at the new iterate, plus x0
    assert sol.stats.f_evals > sol.stats.grad_evals  # trials evaluate the value only


def test_sophia_gets_obj_fn_and_polyak_gets_value():
    prob = make_problem()
    for alg in (optsolve.Sophia(0.05), optsolve.PolyakSGD(max_learning_rate=0.5)):
        sol = solve(prob, alg, maxiters=200)
        assert sol.retcode == ReturnCode.MAXITERS
        assert sol.objective < logistic(prob.x0, prob.p) - 0.05


def test_vmap_over_starting_points_equals_python_loop():
    prob = OptimizationProblem(rosenbrock, jnp.array([-1.2, 1.0]))
    x0s = jnp.asarray(np.random.default_rng(1).uniform(-2, 2, size=(8, 2)))
    alg = optsolve.OptaxLBFGS()
    batched = jax.vmap(lambda x0: solve(prob.replace(x0=x0), alg, maxiters=40, gtol=1e-6))(x0s)
    for i in range(8):
        single = solve(prob.replace(x0=x0s[i]), alg, maxiters=40, gtol=1e-6)
        np.testing.assert_allclose(batched.x[i], single.x, rtol=1e-12)
        assert int(batched.retcode[i]) == single.retcode
        assert int(batched.stats.iterations[i]) == int(single.stats.iterations)
    # the runs stop at different iterations: some converge, some hit maxiters
    assert len(set(np.asarray(batched.stats.iterations).tolist())) > 1


def test_vmap_over_p_and_over_hyperparameters():
    f = lambda x, p: jnp.sum((x - p) ** 2)
    prob = OptimizationProblem(f, jnp.zeros(2), jnp.asarray(0.0))
    ps = jnp.linspace(-1.0, 2.0, 5)
    sols = jax.vmap(
        lambda p: solve(prob.replace(p=p), optsolve.Adam(0.1), maxiters=500, gtol=1e-8)
    )(ps)
    np.testing.assert_allclose(sols.x, np.repeat(np.asarray(ps)[:, None], 2, axis=1), atol=1e-7)
    lrs = jnp.array([0.01, 0.1])
    xs = jax.vmap(
        lambda lr: solve(prob.replace(p=jnp.asarray(1.0)), optsolve.SGD(lr), maxiters=3).x
    )(lrs)
    for lr, x in zip((0.01, 0.1), xs):
        np.testing.assert_allclose(x, 1.0 - (1.0 - 2 * lr) ** 3, rtol=1e-12)  # closed form


def test_solution_leaves_jit_as_a_pytree():
    prob = make_problem()
    sol = jax.jit(lambda prob: solve(prob, optsolve.Adam(0.05), maxiters=10))(prob)
    assert isinstance(sol, optsolve.Solution)
    assert sol.retcode.dtype == jnp.int32 and int(sol.retcode) == ReturnCode.MAXITERS
    assert sol.stats.time is None  # cannot be timed inside a trace
    eager = solve(prob, optsolve.Adam(0.05), maxiters=10)
    assert eager.stats.time > 0
    assert_tree_close(sol.x, eager.x, rtol=1e-14)


def test_callback_sees_every_iteration_and_stops_the_run():
    prob = make_problem()
    seen = []

    def callback(iteration, x, objective):
        seen.append((iteration, float(objective)))
        return iteration == 7

    sol = solve(prob, optsolve.Adam(0.05), maxiters=100, callback=callback)
    assert sol.retcode == ReturnCode.TERMINATED and int(sol.stats.iterations) == 7
    assert [i for i, _ in seen] == list(range(1, 8))
    assert_tree_close(sol.x, hand_loop(optax.adam(0.05), prob, 7), rtol=1e-12)
    np.testing.assert_allclose(seen[-1][1], logistic(sol.x, prob.p), rtol=1e-12)


def test_callback_every_k_and_under_jit():
    prob = make_problem()
    seen = []
    run = jax.jit(
        lambda prob: solve(
            prob,
            optsolve.SGD(0.1),
            maxiters=20,
            callback=lambda i, x, f: seen.append(i),
            callback_every=5,
        )
    )
    sol = run(prob)
    assert seen == [5, 10, 15, 20] and int(sol.retcode) == ReturnCode.MAXITERS


def test_gtol_and_ftol_stop_with_success():
    prob = make_problem()
    sol = solve(prob, optsolve.Adam(0.05), maxiters=20000, gtol=1e-6)
    assert sol.retcode == ReturnCode.SUCCESS and sol.success
    grad = jax.grad(logistic)(sol.x, prob.p)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grad)) <= 1e-6
    sol_f = solve(prob, optsolve.SGD(0.5), maxiters=20000, ftol=1e-10)
    assert sol_f.retcode == ReturnCode.SUCCESS
    previous = hand_loop(optax.sgd(0.5), prob, int(sol_f.stats.iterations) - 1)
    f_prev, f_last = logistic(previous, prob.p), sol_f.objective
    assert abs(f_prev - f_last) <= 1e-10 * max(abs(f_prev), abs(f_last), 1.0)
    sol_max = solve(prob, optsolve.Adam(0.05), maxiters=5, gtol=1e-12)
    assert sol_max.retcode == ReturnCode.MAXITERS and not sol_max.success


def test_maxtime_stops_a_long_run():
    prob = make_problem()
    sol = solve(prob, optsolve.SGD(1e-4), maxiters=10**8, maxtime=0.3)
    assert sol.retcode == ReturnCode.MAXTIME
    assert 0.3 <= sol.stats.time < 5.0
    assert 0 < int(sol.stats.iterations) < 10**8


def test_nan_mid_run_gives_failure_with_last_finite_iterate():
    # f is finite for x < 2 and NaN beyond; SGD from 0 towards the minimum at 3 crosses 2.
    f = lambda x, p: jnp.where(jnp.all(x < 2.0), jnp.sum((x - 3.0) ** 2), jnp.nan)
    prob = OptimizationProblem(f, jnp.zeros(2))
    sol = solve(prob, optsolve.SGD(0.1), maxiters=100)
    assert sol.retcode == ReturnCode.FAILURE and not sol.success
    assert "last finite iterate" in sol.message
    k = int(sol.stats.iterations)
    # closed form of SGD on (x-3)^2: x_k = 3 - 3 * 0.8**k; the first k with x_k >= 2 fails
    expected_k = int(np.ceil(np.log(1 / 3) / np.log(0.8))) - 1
    assert k == expected_k
    np.testing.assert_allclose(sol.x, 3 - 3 * 0.8**k, rtol=1e-12)
    assert np.isfinite(sol.objective)


def test_nan_at_start_gives_failure_at_x0():
    prob = OptimizationProblem(lambda x, p: jnp.sum(jnp.log(x)), jnp.array([-1.0, 2.0]))
    sol = solve(prob, optsolve.Adam(0.1), maxiters=10)
    assert sol.retcode == ReturnCode.FAILURE and int(sol.stats.iterations) == 0
    np.testing.assert_array_equal(sol.x, prob.x0)


def test_exception_inside_f_propagates():
    def f(x, p):
        raise RuntimeError("boom in the objective")

    with pytest.raises(RuntimeError, match="boom in the objective"):
        solve(OptimizationProblem(f, jnp.zeros(2)), optsolve.Adam(0.1), maxiters=3)


def test_tuple_and_list_pytrees_round_trip():
    f = lambda x, p: jnp.sum((x[0] - 1.0) ** 2) + jnp.sum((x[1][0] + 2.0) ** 2)
    x0 = (jnp.zeros((2, 3)), [jnp.zeros(4, jnp.float32)])
    sol = solve(OptimizationProblem(f, x0), optsolve.Adam(0.1), maxiters=400)
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(x0)
    assert sol.x[1][0].dtype == jnp.float32 and sol.x[0].shape == (2, 3)
    np.testing.assert_allclose(sol.x[0], 1.0, atol=1e-3)
    np.testing.assert_allclose(sol.x[1][0], -2.0, atol=1e-3)
