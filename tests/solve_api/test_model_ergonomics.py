"""Models as x, the ergonomics of issue 35: masks and labels given as ``nnx.State``, optax's
wrapper objects (``optax.MultiSteps``), ``optsolve.load(path, like=model)``, and equinox's
stateful layers (``eqx.nn.make_with_state``, ``eqx.nn.BatchNorm``). References: hand-written
``nnx.Optimizer`` loops and equinox + optax loops, in float64."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import optsolve
from optsolve import OptimizationProblem, solve

_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(64, 6)))
Y = jnp.asarray(np.sin(_rng.normal(size=(64, 3))))


class Net(nnx.Module):
    """A float64 MLP with BatchNorm (carried statistics) and Dropout (a carried counter)."""

    def __init__(self, rngs: nnx.Rngs, dropout: float = 0.0):
        f64 = dict(param_dtype=jnp.float64, dtype=jnp.float64)
        self.hidden = nnx.Linear(6, 8, rngs=rngs, **f64)
        self.norm = nnx.BatchNorm(8, rngs=rngs, **f64)
        # nnx.BatchNorm keeps its statistics in float32 whatever the dtypes: float64 here
        self.norm.mean = nnx.BatchStat(jnp.zeros(8))
        self.norm.var = nnx.BatchStat(jnp.ones(8))
        self.drop = nnx.Dropout(dropout, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs, **f64)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x)))))


def nnx_loss(model, p, batch=(X, Y)):
    x, y = batch
    return jnp.mean((model(x) - y) ** 2)


def nnx_reference(tx, steps, dropout=0.0):
    """A jitted nnx.Optimizer step in a Python loop, full batch."""
    model = Net(nnx.Rngs(0), dropout)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        optimizer.update(model, nnx.grad(lambda m: nnx_loss(m, None))(model))

    for _ in range(steps):
        step(model, optimizer)
    return model


def assert_trees_close(a, b, atol=1e-10):
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for la, lb in zip(leaves_a, leaves_b):
        if jax.dtypes.issubdtype(jnp.result_type(la), jax.dtypes.prng_key):
            la, lb = jax.random.key_data(la), jax.random.key_data(lb)
        np.testing.assert_allclose(la, lb, rtol=0, atol=atol)


# ----------------------------------------------------------------- masks as nnx.State


def decay_mask(model, pure=False):
    """What an NNX user builds: the parameters' state mapped to bools (decay the kernels),
    as a State of Params, or of plain values (``nnx.as_pure``: the form nnx.Optimizer's
    update hands optax, so the one its masks must have)."""
    mask = jax.tree.map(lambda v: v.ndim > 1, nnx.state(model, nnx.Param))
    return nnx.as_pure(mask) if pure else mask


def group_labels(model, pure=False):
    labels = jax.tree.map(lambda v: "decay" if v.ndim > 1 else "plain", nnx.state(model, nnx.Param))
    return nnx.as_pure(labels) if pure else labels


def _mask_case(case, pure):
    """(the algorithm given to solve, with a mask of form ``pure``; the transformation of
    the reference nnx.Optimizer loop, with the pure form)."""

    def build(pure):
        mask, labels = decay_mask(Net(nnx.Rngs(0)), pure), group_labels(Net(nnx.Rngs(0)), pure)
        masked_decay = optax.masked(optax.add_decayed_weights(0.5), mask)
        multi = optax.multi_transform(
            {"decay": optax.adamw(1e-2, weight_decay=0.5), "plain": optax.sgd(1e-2)}, labels
        )
        return {
            "AdamW(mask=)": (
                optsolve.AdamW(1e-2, weight_decay=0.5, mask=mask),
                optax.adamw(1e-2, weight_decay=0.5, mask=mask),
            ),
            "optax.adamw(mask=)": (optax.adamw(1e-2, weight_decay=0.5, mask=mask),) * 2,
            "optax.masked": (optax.chain(masked_decay, optax.adam(1e-2)),) * 2,
            "optsolve.chain(optax.masked, ...)": (
                optsolve.chain(masked_decay, optsolve.Adam(1e-2)),
                optax.chain(masked_decay, optax.adam(1e-2)),
            ),
            "optax.multi_transform": (multi, multi),
            "ParameterGroups(labels=)": (
                optsolve.ParameterGroups(
                    {"decay": optsolve.AdamW(1e-2, weight_decay=0.5), "plain": optsolve.SGD(1e-2)},
                    labels=labels,
                ),
                multi,
            ),
        }[case]

    return build(pure)[0], build(True)[1]


MASK_CASES = [
    "AdamW(mask=)",
    "optax.adamw(mask=)",
    "optax.masked",
    "optsolve.chain(optax.masked, ...)",
    "optax.multi_transform",
    "ParameterGroups(labels=)",
]


@pytest.mark.parametrize("pure", [False, True], ids=["State of Params", "pure State"])
@pytest.mark.parametrize("case", MASK_CASES)
def test_masks_and_labels_given_as_nnx_state_equal_nnx_optimizer_with_the_same_mask(case, pure):
    algorithm, reference_tx = _mask_case(case, pure)
    prob = OptimizationProblem(nnx_loss, Net(nnx.Rngs(0)), trainable=nnx.Param)
    sol = solve(prob, algorithm, maxiters=5)
    reference = nnx_reference(reference_tx, 5)
    assert_trees_close(nnx.state(sol.x), nnx.state(reference))


def test_a_state_mask_equals_the_same_mask_shaped_like_the_model():
    model = Net(nnx.Rngs(0))
    prob = OptimizationProblem(nnx_loss, model, trainable=nnx.Param)
    module_mask = jax.tree.map(lambda v: v.ndim > 1, model)  # a bool per leaf of the module
    by_state = solve(
        prob, optsolve.AdamW(1e-2, weight_decay=0.5, mask=decay_mask(model)), maxiters=5
    )
    by_module = solve(prob, optsolve.AdamW(1e-2, weight_decay=0.5, mask=module_mask), maxiters=5)
    assert_trees_close(nnx.state(by_state.x), nnx.state(by_module.x), atol=0)
    no_decay = solve(prob, optsolve.Adam(1e-2), maxiters=5)
    assert not np.allclose(by_state.x.hidden.kernel[...], no_decay.x.hidden.kernel[...])
    np.testing.assert_array_equal(
        by_state.x.hidden.bias[...] != 0, no_decay.x.hidden.bias[...] != 0
    )


def test_a_mask_missing_a_trained_leaf_is_refused_naming_it():
    model = Net(nnx.Rngs(0))
    partial = nnx.state(model, nnx.Param)
    del partial["out"]
    mask = jax.tree.map(lambda v: v.ndim > 1, partial)
    prob = OptimizationProblem(nnx_loss, model, trainable=nnx.Param)
    with pytest.raises(ValueError, match=r"mask.*out.*kernel"):
        solve(prob, optsolve.AdamW(1e-2, weight_decay=0.5, mask=mask), maxiters=2)


def test_an_equinox_mask_shaped_like_the_trained_leaves():
    model = eqx.nn.MLP(6, 3, width_size=8, depth=1, key=jax.random.key(0), dtype=jnp.float64)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    mask = jax.tree.map(lambda leaf: leaf.ndim > 1, params)
    tx = optax.adamw(1e-2, weight_decay=0.5, mask=mask)

    def loss(model, p):
        return jnp.mean((jax.vmap(model)(X) - Y) ** 2)

    sol = solve(
        OptimizationProblem(loss, model, trainable=eqx.is_inexact_array),
        optsolve.AdamW(1e-2, weight_decay=0.5, mask=mask),
        maxiters=5,
    )
    state = tx.init(params)
    for _ in range(5):
        grads = jax.grad(lambda q: loss(eqx.combine(q, static), None))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    assert_trees_close(eqx.filter(sol.x, eqx.is_inexact_array), params)


# ----------------------------------------------------------------- optax's wrapper objects


def _quadratic(w, p):
    return jnp.sum((w - jnp.arange(3.0)) ** 2 * jnp.array([1.0, 3.0, 10.0]))


def _optax_loop(tx, steps, w=jnp.zeros(3)):  # noqa: B008  (a jax array is immutable: sharing one is safe)
    state = tx.init(w)
    for _ in range(steps):
        updates, state = tx.update(jax.grad(_quadratic)(w, None), state, w)
        w = optax.apply_updates(w, updates)
    return w


def test_an_optax_multisteps_object_is_accepted_where_a_transformation_is():
    accumulate = optax.MultiSteps(optax.adam(0.1), every_k_schedule=3)
    reference = _optax_loop(accumulate.gradient_transformation(), 9)
    prob = OptimizationProblem(_quadratic, jnp.zeros(3))
    for algorithm in (
        accumulate,
        optsolve.chain(optsolve.ClipByGlobalNorm(1e3), accumulate),
        optsolve.MultiSteps(optax.MultiSteps(optax.adam(0.1), 1), every_k=3),
    ):
        np.testing.assert_allclose(
            solve(prob, algorithm, maxiters=9).x, reference, rtol=0, atol=1e-14
        )
    groups = optsolve.ParameterGroups({"all": accumulate}, labels=lambda path: "all")
    np.testing.assert_allclose(solve(prob, groups, maxiters=9).x, reference, rtol=0, atol=1e-14)
    # the same object twice reuses the compiled program (it is not a new transformation)
    from compile_count import count_compilations

    with count_compilations() as counter:
        solve(prob, accumulate, maxiters=9)
    assert counter.count == 0


def test_optax_wrappers_that_are_transformations_work_as_they_are():
    """inject_hyperparams and optax.contrib's wrappers return GradientTransformations."""
    prob = OptimizationProblem(_quadratic, jnp.zeros(3))
    for tx in (
        optax.inject_hyperparams(optax.adam)(learning_rate=0.1),
        optax.contrib.schedule_free(optax.sgd(0.1), learning_rate=0.1),
        optax.contrib.mechanize(optax.sgd(0.1)),
    ):
        np.testing.assert_allclose(
            solve(prob, tx, maxiters=7).x, _optax_loop(tx, 7), rtol=0, atol=1e-14
        )


# ----------------------------------------------------------------- load(path, like=model)


def test_load_like_an_nnx_model_restores_it_and_resumes_exactly(tmp_path):
    path = tmp_path / "run.npz"
    prob = OptimizationProblem(nnx_loss, Net(nnx.Rngs(0), dropout=0.2), trainable=nnx.Param)
    data = dict(data=(X, Y), batch_size=16, key=jax.random.key(3), epochs=5)
    whole = solve(prob, optsolve.Adam(1e-2), maxiters=10, **data)
    first = solve(
        prob, optsolve.Adam(1e-2), maxiters=6, checkpoint=path, checkpoint_every=3, **data
    )
    loaded = optsolve.load(path, like=Net(nnx.Rngs(1), dropout=0.2))
    assert isinstance(loaded.x, Net)
    assert_trees_close(nnx.state(loaded.x), nnx.state(first.x), atol=0)
    assert loaded.stats.iterations == 6
    resumed = solve(prob, optsolve.Adam(1e-2), maxiters=4, resume=loaded, **data)
    assert resumed.stats.iterations == 10 == int(resumed.x.drop.rngs.count[...])
    assert_trees_close(nnx.state(resumed.x), nnx.state(whole.x), atol=0)
    with pytest.raises(ValueError, match="like"):
        optsolve.load(path, like=eqx.nn.MLP(6, 3, 8, 1, key=jax.random.key(0)))


def test_load_like_an_equinox_model_restores_it_and_resumes_exactly(tmp_path):
    path = tmp_path / "run.npz"
    model = eqx.nn.MLP(6, 3, width_size=8, depth=1, key=jax.random.key(0), dtype=jnp.float64)

    def loss(model, p):
        return jnp.mean((jax.vmap(model)(X) - Y) ** 2)

    prob = OptimizationProblem(loss, model, trainable=eqx.is_inexact_array)
    whole = solve(prob, optsolve.Adam(1e-2), maxiters=8)
    solve(prob, optsolve.Adam(1e-2), maxiters=5, checkpoint=path, checkpoint_every=5)
    loaded = optsolve.load(path, like=model)
    assert isinstance(loaded.x, eqx.nn.MLP) and loaded.x.activation is model.activation
    resumed = solve(prob, optsolve.Adam(1e-2), maxiters=3, resume=loaded)
    assert_trees_close(
        eqx.filter(resumed.x, eqx.is_array), eqx.filter(whole.x, eqx.is_array), atol=0
    )


# ----------------------------------------------------------------- equinox stateful layers


class EqxNet(eqx.Module):
    """An equinox MLP with BatchNorm, called as ``model(x, state) -> (out, state)``."""

    hidden: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    out: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(6, 8, key=k1, dtype=jnp.float64)
        self.norm = eqx.nn.BatchNorm(8, axis_name="batch", mode="batch", dtype=jnp.float64)
        self.out = eqx.nn.Linear(8, 3, key=k2, dtype=jnp.float64)

    def __call__(self, x, state):
        h, state = self.norm(self.hidden(x), state)
        return self.out(jax.nn.relu(h)), state


def eqx_loss(model_and_state, p, batch=(X, Y)):
    """equinox's idiom: the batch through a vmap named like the BatchNorm's axis, the new
    state returned beside the loss."""
    model, state = model_and_state
    x, y = batch
    out, state = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
    return jnp.mean((out - y) ** 2), state


def eqx_reference(tx, batches):
    """The hand-written equinox + optax loop of equinox's make_with_state example."""
    model, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, state, opt_state, batch):
        (_, state), grads = jax.value_and_grad(
            lambda q: eqx_loss((eqx.combine(q, static), state), None, batch), has_aux=True
        )(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state

    for batch in batches:
        params, state, opt_state = step(params, state, opt_state, batch)
    return eqx.combine(params, static), state


def test_equinox_batchnorm_full_batch_equals_a_hand_written_equinox_loop():
    x0 = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    prob = OptimizationProblem(eqx_loss, x0, trainable=eqx.is_inexact_array)
    sol = solve(prob, optsolve.Adam(1e-2), maxiters=6)
    model, state = sol.x
    assert isinstance(model, EqxNet) and isinstance(state, eqx.nn.State)
    ref_model, ref_state = eqx_reference(optax.adam(1e-2), [(X, Y)] * 6)
    assert_trees_close(eqx.filter(model, eqx.is_array), eqx.filter(ref_model, eqx.is_array))
    assert_trees_close(state, ref_state)
    # the statistics moved: the state was threaded, not left at its start
    assert not np.allclose(jax.tree_util.tree_leaves(state)[-2], 0.0)


def test_equinox_batchnorm_on_data_equals_a_hand_written_equinox_loop():
    x0 = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    prob = OptimizationProblem(eqx_loss, x0, trainable=eqx.is_inexact_array)
    sol = solve(prob, optsolve.Adam(1e-2), data=(X, Y), batch_size=16, epochs=2)
    batches = [(X[i : i + 16], Y[i : i + 16]) for i in range(0, 64, 16)] * 2
    ref_model, ref_state = eqx_reference(optax.adam(1e-2), batches)
    assert sol.stats.iterations == 8
    assert_trees_close(eqx.filter(sol.x[0], eqx.is_array), eqx.filter(ref_model, eqx.is_array))
    assert_trees_close(sol.x[1], ref_state)
    # a list of batches (host-fed) threads it the same way
    listed = solve(prob, optsolve.Adam(1e-2), data=batches)
    assert_trees_close(eqx.filter(listed.x, eqx.is_array), eqx.filter(sol.x, eqx.is_array))


def test_equinox_state_is_carried_never_trained_and_eval_mode_needs_no_state_back():
    x0 = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    _model, state = x0

    def eval_loss(model_and_state, p):  # inference: the state is read, not changed
        model, state = model_and_state
        model = eqx.nn.inference_mode(model)
        out, _ = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(X, state)
        return jnp.mean((out - Y) ** 2)

    sol = solve(
        OptimizationProblem(eval_loss, x0, trainable=eqx.is_inexact_array),
        optsolve.LBFGS(),
        maxiters=5,
    )
    assert_trees_close(sol.x[1], state, atol=0)
    assert sol.objective < eval_loss(x0, None)
