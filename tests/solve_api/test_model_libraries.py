"""x0 may be a model library's parameter pytree: flax linen params, flax nnx state, equinox."""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import optsolve
from optsolve import OptimizationProblem, solve

_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(32, 3)), jnp.float32)
Y = jnp.asarray(np.sin(_rng.normal(size=(32, 2))), jnp.float32)


def hand_loop(tx, f, x0, steps):
    state = tx.init(x0)
    step = jax.jit(lambda x, s: tx.update(jax.grad(f)(x, None), s, x))
    x = x0
    for _ in range(steps):
        updates, state = step(x, state)
        x = optax.apply_updates(x, updates)
    return x


def assert_trees_close(a, b):
    for la, lb in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(la, lb, rtol=2e-6, atol=1e-7)


def check(f, x0):
    sol = solve(OptimizationProblem(f, x0), optsolve.Adam(0.01), maxiters=40)
    assert jax.tree_util.tree_structure(sol.x) == jax.tree_util.tree_structure(x0)
    assert sol.objective < f(x0, None)
    # float32 parameters: agreement to float32 rounding
    assert_trees_close(sol.x, hand_loop(optax.adam(0.01), f, x0, 40))
    return sol


def test_flax_linen_params():
    model = nn.Dense(2)
    params = model.init(jax.random.key(0), X)
    check(lambda w, p: jnp.mean((model.apply(w, X) - Y) ** 2), params)


def test_flax_nnx_state():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def f(state, p):
        return jnp.mean((nnx.merge(graphdef, state)(X) - Y) ** 2)

    sol = check(f, state)
    trained = nnx.merge(graphdef, sol.x)
    assert isinstance(trained, nnx.Linear)


def test_equinox_params():
    model = eqx.nn.MLP(3, 2, width_size=8, depth=1, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)

    def f(params, p):
        return jnp.mean((jax.vmap(eqx.combine(params, static))(X) - Y) ** 2)

    sol = check(f, params)
    assert isinstance(eqx.combine(sol.x, static), eqx.nn.MLP)
