"""Models as x (``OptimizationProblem(f, model, trainable=...)``): flax NNX modules with
BatchNorm and Dropout, equinox modules, pytree masks. References: hand-written
``nnx.Optimizer`` loops and optax loops over ``eqx.partition``'s parameters, and the same
problem declared over the trained leaves by hand."""

from __future__ import annotations

import re
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from sklearn.datasets import load_digits

import optsolve
from optsolve import OptimizationProblem, solve

_digits = load_digits()
_X = jnp.asarray(_digits.data / 16.0, jnp.float32)
_Y = jnp.asarray(_digits.target)
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = _X[:1200], _Y[:1200], _X[1200:], _Y[1200:]


class Net(nnx.Module):
    """An MLP with BatchNorm and Dropout (no bias before the BatchNorm, which removes it)."""

    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(64, 32, use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(32, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x)))))


def loss(model, p, batch=(X_TRAIN, Y_TRAIN)):
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def float_leaves(tree):
    return [
        leaf
        for leaf in jax.tree_util.tree_leaves(tree)
        if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)
    ]


def assert_models_close(a, b, atol=2e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for la, lb in zip(float_leaves(a), float_leaves(b), strict=True):
        np.testing.assert_allclose(la, lb, rtol=1e-4, atol=atol)


def accuracy(model):
    model.eval()
    return float(jnp.mean(jnp.argmax(model(X_TEST), -1) == Y_TEST))


def hand_nnx_loop(tx, batches):
    """The reference: a jitted nnx.Optimizer step in a Python loop."""
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, batch):
        grads = nnx.grad(lambda m: loss(m, None, batch))(model)
        optimizer.update(model, grads)

    for batch in batches:
        step(model, optimizer, batch)
    return model


def test_batchnorm_and_dropout_full_batch_equal_a_hand_written_nnx_optimizer_loop():
    prob = OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    sol = solve(prob, optsolve.AdamW(1e-2, weight_decay=1e-3), maxiters=40)
    reference = hand_nnx_loop(optax.adamw(1e-2, weight_decay=1e-3), [(X_TRAIN, Y_TRAIN)] * 40)
    assert isinstance(sol.x, Net)
    # the running statistics moved (they would stay at 0 and 1 if they were trained)
    assert float(jnp.max(jnp.abs(sol.x.norm.mean[...]))) > 0.05
    assert int(sol.x.drop.rngs.count[...]) == 40 == int(reference.drop.rngs.count[...])
    assert_models_close(sol.x, reference)
    assert accuracy(sol.x) == accuracy(reference) > 0.85
    # the problem's own model is not changed by the run
    assert int(prob.x0.drop.rngs.count[...]) == 0
    assert float(jnp.max(jnp.abs(prob.x0.norm.mean[...]))) == 0.0


def test_batchnorm_and_dropout_on_data_equal_a_hand_written_nnx_optimizer_loop():
    batches = [(X_TRAIN[i : i + 150], Y_TRAIN[i : i + 150]) for i in range(0, 1200, 150)] * 2
    prob = OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    sol = solve(prob, optsolve.Adam(1e-2), data=batches)
    reference = hand_nnx_loop(optax.adam(1e-2), batches)
    assert sol.stats.iterations == 16 == int(sol.x.drop.rngs.count[...])
    assert_models_close(sol.x, reference)
    assert accuracy(sol.x) == accuracy(reference)


def test_resume_continues_the_model_state_exactly():
    prob = OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    whole = solve(prob, optsolve.Adam(1e-2), maxiters=6)
    first = solve(prob, optsolve.Adam(1e-2), maxiters=4)
    resumed = solve(prob, optsolve.Adam(1e-2), maxiters=2, resume=first)
    assert resumed.stats.iterations == 6
    for a, b in zip(float_leaves(whole.x), float_leaves(resumed.x), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(resumed.x.drop.rngs.count[...]) == 6
    first.x.eval()  # in place: the module's structure (its flags) changes
    with pytest.raises(ValueError, match="`resume` holds a model of another structure"):
        solve(prob, optsolve.Adam(1e-2), maxiters=2, resume=first)


def test_the_callback_gets_the_model_with_its_state_at_the_iterate():
    seen = []

    def callback(i, model, value):
        seen.append((i, int(model.drop.rngs.count[...]), isinstance(model, Net)))

    prob = OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    solve(prob, optsolve.Adam(1e-2), maxiters=3, callback=callback)
    # the model at iterate i has seen i forward passes
    assert seen == [(1, 1, True), (2, 2, True), (3, 3, True)]


def test_under_jit_the_model_trains_as_eagerly():
    eager = solve(
        OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param),
        optsolve.Adam(1e-2),
        maxiters=5,
    ).x
    traced = jax.jit(
        lambda model: (
            solve(
                OptimizationProblem(loss, model, trainable=nnx.Param),
                optsolve.Adam(1e-2),
                maxiters=5,
            ).x
        )
    )(Net(nnx.Rngs(0)))
    assert_models_close(eager, traced, atol=1e-6)


def test_an_eval_mode_model_trains_with_every_kind_of_algorithm():
    """A model whose f changes no state (BatchNorm on running averages, Dropout off) is
    solved by classical and scipy algorithms too; the trained leaves equal the problem
    declared over them by hand."""
    model = Net(nnx.Rngs(0))
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def by_hand(p, _):
        return loss(nnx.merge(graphdef, p, rest), None)

    for alg in (optsolve.LBFGS(), optsolve.ScipyMinimize("L-BFGS-B")):
        sol = solve(OptimizationProblem(loss, model, trainable=nnx.Param), alg, maxiters=15)
        reference = solve(OptimizationProblem(by_hand, params), alg, maxiters=15)
        _, trained, carried = nnx.split(sol.x, nnx.Param, ...)
        # float32: the two problems compile to different programs, whose rounding differs
        # between machines (1.8e-6 seen on one after 15 L-BFGS iterations; CI's passed 1e-6)
        for a, b in zip(
            jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(reference.x), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        for a, b in zip(
            jax.tree_util.tree_leaves(carried), jax.tree_util.tree_leaves(rest), strict=True
        ):
            np.testing.assert_array_equal(
                np.asarray(
                    jax.random.key_data(a)
                    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
                    else a
                ),
                np.asarray(
                    jax.random.key_data(b)
                    if jax.dtypes.issubdtype(b.dtype, jax.dtypes.extended)
                    else b
                ),
            )


def test_equinox_mlp_with_a_filter_equals_an_optax_loop_over_its_partition():
    X = X_TRAIN[:200]
    target = jnp.sin(X[:, :2])
    mlp = eqx.nn.MLP(64, 2, width_size=16, depth=1, key=jax.random.key(0))

    def f(model, p):
        return jnp.mean((jax.vmap(model)(X) - target) ** 2)

    sol = solve(
        OptimizationProblem(f, mlp, trainable=eqx.is_inexact_array),
        optsolve.Adam(1e-2),
        maxiters=30,
    )
    params, static = eqx.partition(mlp, eqx.is_inexact_array)
    tx = optax.adam(1e-2)
    state = tx.init(params)

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda q: f(eqx.combine(q, static), None))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(30):
        params, state = step(params, state)
    assert isinstance(sol.x, eqx.nn.MLP)
    assert sol.x.activation is mlp.activation
    for a, b in zip(
        jax.tree_util.tree_leaves(eqx.filter(sol.x, eqx.is_inexact_array)),
        jax.tree_util.tree_leaves(params),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_pytree_mask_trains_only_the_selected_leaves():
    x0 = {"w": jnp.zeros(3), "frozen": jnp.ones(2), "step": jnp.int32(7)}
    f = lambda x, p: jnp.sum((x["w"] - x["frozen"][0] * 2.0) ** 2) + jnp.sum(x["frozen"])
    mask = {"w": True, "frozen": False, "step": False}
    sol = solve(OptimizationProblem(f, x0, trainable=mask), optsolve.LBFGS(), gtol=1e-8)
    np.testing.assert_allclose(sol.x["w"], 2.0 * np.ones(3), rtol=1e-6)  # closed form
    np.testing.assert_array_equal(sol.x["frozen"], np.ones(2))
    assert int(sol.x["step"]) == 7
    # bounds are shaped like the trained leaves (or scalars): the box's corner, 1.5
    for alg in (optsolve.LBFGS(), optsolve.ScipyMinimize("L-BFGS-B")):
        bounded = OptimizationProblem(f, x0, trainable=mask, bounds=(-1.0, 1.5))
        sol = solve(bounded, alg, gtol=1e-8)
        np.testing.assert_allclose(sol.x["w"], 1.5 * np.ones(3), rtol=1e-7)
        np.testing.assert_array_equal(sol.x["frozen"], np.ones(2))


def test_clear_errors_name_the_leaf_and_the_fix():
    model = Net(nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"x0\.norm\.mean \(BatchStat\).*trainable=nnx\.Param"):
        OptimizationProblem(loss, model)
    with pytest.raises(TypeError, match=r"x0\.drop\.rngs\.count.*uint32.*Narrow the filter"):
        OptimizationProblem(loss, model, trainable=nnx.Variable)
    mlp = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"x0\.activation.*eqx\.is_inexact_array"):
        OptimizationProblem(lambda m, p: jnp.sum(m(jnp.ones(2))), mlp)
    with pytest.raises(ValueError, match="selects no leaf"):
        OptimizationProblem(loss, model, trainable=nnx.Intermediate)
    with pytest.raises(ValueError, match="`constraints` cannot be combined with `trainable`"):
        OptimizationProblem(
            loss, model, trainable=nnx.Param, constraints=[optsolve.Constraint(lambda m, p: 0.0)]
        )


@pytest.mark.parametrize(
    "alg",
    [optsolve.LBFGS(), optsolve.OptaxLBFGS(), optsolve.ScipyMinimize("BFGS")],
    ids=lambda a: type(a).__name__,
)
def test_state_changed_in_place_is_refused_where_it_cannot_be_carried(alg):
    prob = OptimizationProblem(loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    name = re.escape(type(alg).__name__)
    with pytest.raises(
        ValueError,
        match=f"changes the model's state in place.*{name} cannot carry it.*optax family",
    ):
        solve(prob, alg, maxiters=3)


def test_parameter_groups_take_labels_shaped_like_the_model():
    """Labels given as a module (a label per leaf of the whole model) route the trained
    leaves: SGD on the output layer, frozen elsewhere; the reference is optax's
    multi_transform over the same labels on the hand-split parameters."""
    model = Net(nnx.Rngs(0))
    labels = jax.tree_util.tree_map_with_path(
        lambda path, _: "head" if "out" in jax.tree_util.keystr(path) else "body", model
    )
    groups = optsolve.ParameterGroups({"head": optsolve.SGD(0.1), "body": None}, labels=labels)
    sol = solve(OptimizationProblem(loss, model, trainable=nnx.Param), groups, maxiters=3)
    reference = hand_nnx_loop(
        optax.multi_transform(
            {"head": optax.sgd(0.1), "body": optax.set_to_zero()},
            lambda params: jax.tree_util.tree_map_with_path(
                lambda path, _: "head" if "out" in jax.tree_util.keystr(path) else "body", params
            ),
        ),
        [(X_TRAIN, Y_TRAIN)] * 3,
    )
    assert_models_close(sol.x, reference, atol=1e-6)
    np.testing.assert_array_equal(sol.x.hidden.kernel[...], model.hidden.kernel[...])
    assert not np.array_equal(sol.x.out.kernel[...], model.out.kernel[...])


def test_implicit_derivatives_of_a_model_and_their_limits():
    """d w*/d lam of a ridge model (a pytree model whose mask trains w and carries a
    frozen offset): the closed form w* = X^T y / (|x|^2 + lam) for one feature; a model
    whose f changes its state has no implicit derivative (a clear error)."""
    x = jnp.linspace(-1.0, 1.0, 9)
    y = 3.0 * x + 0.5
    model = {"w": jnp.zeros(()), "offset": jnp.asarray(0.5)}

    def ridge(m, lam):
        return 0.5 * jnp.sum((m["w"] * x + m["offset"] - y) ** 2) + 0.5 * lam * m["w"] ** 2

    prob = OptimizationProblem(ridge, model, 1.0, trainable={"w": True, "offset": False})
    grad = jax.grad(lambda lam: solve(prob.replace(p=lam), optsolve.LBFGS(), gtol=1e-10).x["w"])(
        1.0
    )
    sxx, sxy = float(jnp.sum(x * x)), float(jnp.sum(x * (y - 0.5)))
    np.testing.assert_allclose(grad, -sxy / (sxx + 1.0) ** 2, rtol=1e-5)
    prob = OptimizationProblem(
        lambda m, lam: loss(m, None) + lam * jnp.sum(m.out.kernel**2),
        Net(nnx.Rngs(0)),
        0.1,
        trainable=nnx.Param,
    )
    with pytest.raises(ValueError, match="has no implicit derivative"):
        jax.grad(
            lambda lam: jnp.sum(
                solve(prob.replace(p=lam), optsolve.Adam(1e-2), maxiters=2).x.out.kernel[...]
            )
        )(0.1)


class CountedNet(Net):
    """Net counting how often its (Python-level) pytree flattening runs."""

    counts: ClassVar[dict[str, int]] = {"flatten": 0, "unflatten": 0}

    def _pytree__flatten(self):
        CountedNet.counts["flatten"] += 1
        return super()._pytree__flatten()

    @classmethod
    def _pytree__unflatten(cls, *args):
        CountedNet.counts["unflatten"] += 1
        return super()._pytree__unflatten(*args)


@pytest.mark.parametrize("on_data", [False, True])
def test_an_eager_solve_flattens_the_model_a_few_times_not_at_every_layer(on_data):
    # A module's flattening runs in Python; each layer of solve that flattened the problem
    # anew (validation, cache keys, dispatch) once cost a solve 17 flattens and 9 rebuilds.
    prob = OptimizationProblem(loss, CountedNet(nnx.Rngs(0)), trainable=nnx.Param)
    kwargs = (
        dict(data=(X_TRAIN, Y_TRAIN), batch_size=100, key=jax.random.key(0))
        if on_data
        else dict(maxiters=3)
    )
    solve(prob, optsolve.Adam(1e-3), **kwargs)  # compiles
    CountedNet.counts.update(flatten=0, unflatten=0)
    sol = solve(prob, optsolve.Adam(1e-3), **kwargs)
    assert isinstance(sol.x, CountedNet)
    # the problem's x0 split (1), the objective check's cache key (1, full batch only), the
    # inputs (1), the whole model rebuilt around x (1); rebuilt: the trained leaves (1), x
    # and Adam's two moments (3), the whole model (1)
    assert CountedNet.counts["flatten"] <= 4
    assert CountedNet.counts["unflatten"] <= 5


class Net64(nnx.Module):
    """An MLP in float64 with Dropout, whose RNG counter is carried through the run (nnx's
    BatchNorm keeps float32 statistics whatever its dtype, which a float64 run would cast)."""

    def __init__(self, rngs: nnx.Rngs):
        f64 = dict(dtype=jnp.float64, param_dtype=jnp.float64)
        self.hidden = nnx.Linear(64, 16, rngs=rngs, **f64)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(16, 10, rngs=rngs, **f64)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.hidden(x))))


def test_an_nnx_model_on_data_under_jit_equals_the_eager_run():
    data = dict(
        data=(X_TRAIN[:480].astype(jnp.float64), Y_TRAIN[:480]),
        batch_size=96,
        key=jax.random.key(5),
        epochs=2,
    )
    eager = solve(
        OptimizationProblem(loss, Net64(nnx.Rngs(0)), trainable=nnx.Param),
        optsolve.Adam(1e-2),
        **data,
    )
    traced = jax.jit(
        lambda model: solve(
            OptimizationProblem(loss, model, trainable=nnx.Param), optsolve.Adam(1e-2), **data
        )
    )(Net64(nnx.Rngs(0)))
    assert eager.stats.iterations == int(traced.stats.iterations) == 10

    # the trained parameters and the carried state (the RNG counter)
    def numbers(leaf):
        is_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(leaf) if is_key else leaf)

    for a, b in zip(
        jax.tree_util.tree_leaves(nnx.state(eager.x)),
        jax.tree_util.tree_leaves(nnx.state(traced.x)),
        strict=True,
    ):
        np.testing.assert_allclose(numbers(a), numbers(b), rtol=1e-12, atol=1e-14)
    assert int(traced.x.drop.rngs.count[...]) == 10
    # and the run moved the model: not the start
    start = Net64(nnx.Rngs(0))
    assert not np.allclose(np.asarray(traced.x.out.kernel[...]), np.asarray(start.out.kernel[...]))
