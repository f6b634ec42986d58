"""Parameter groups: per-part algorithms and frozen parts, equal to optax.multi_transform."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optsolve
from compile_count import count_compilations
from optsolve import OptimizationProblem, solve

X0 = {
    "encoder": {"w": jnp.full((3, 2), 0.5), "b": jnp.zeros(2)},
    "head": {"w": jnp.ones(2)},
    "embedding": jnp.arange(4.0),
}


def loss(x, p):
    h = jnp.tanh(p @ x["encoder"]["w"] + x["encoder"]["b"])
    return jnp.sum((h @ x["head"]["w"] - 1.0) ** 2) + jnp.sum((x["embedding"] - 2.0) ** 2)


PROBLEM = OptimizationProblem(loss, X0, jnp.asarray([[1.0, -0.5, 0.3], [0.2, 0.8, -1.0]]))


def label(path: str) -> str:
    if path.startswith("['embedding']"):
        return "frozen"
    return "head" if path.startswith("['head']") else "body"


def test_groups_equal_hand_written_multi_transform_and_freeze():
    groups = optsolve.ParameterGroups(
        {"body": optsolve.Adam(1e-2), "head": optsolve.SGD(1e-1, momentum=0.9), "frozen": None},
        labels=label,
    )
    sol = solve(PROBLEM, groups, maxiters=30)
    labels = {"encoder": {"w": "body", "b": "body"}, "head": {"w": "head"}, "embedding": "frozen"}
    tx = optax.multi_transform(
        {
            "body": optax.adam(1e-2),
            "head": optax.sgd(1e-1, momentum=0.9),
            "frozen": optax.set_to_zero(),
        },
        labels,
    )
    x, state = X0, tx.init(X0)
    step = jax.jit(lambda x, s: tx.update(jax.grad(loss)(x, PROBLEM.p), s, x))
    for _ in range(30):
        updates, state = step(x, state)
        x = optax.apply_updates(x, updates)
    for a, b in zip(jax.tree_util.tree_leaves(sol.x), jax.tree_util.tree_leaves(x)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_array_equal(sol.x["embedding"], X0["embedding"])
    # a pytree of labels works the same
    same = solve(
        PROBLEM,
        optsolve.ParameterGroups(
            {"body": optsolve.Adam(1e-2), "head": optsolve.SGD(1e-1, momentum=0.9), "frozen": None},
            labels=labels,
        ),
        maxiters=30,
    )
    np.testing.assert_array_equal(same.x["head"]["w"], sol.x["head"]["w"])


def test_groups_are_pytrees_and_do_not_recompile():
    make = lambda lr_body, lr_head: optsolve.ParameterGroups(
        {"body": optsolve.Adam(lr_body), "head": optsolve.SGD(lr_head), "frozen": None},
        labels=label,
    )
    assert jax.tree_util.tree_leaves(make(1e-3, 1e-2))[:2] == [1e-3, 0.9]
    solve(PROBLEM, make(1e-3, 1e-2), maxiters=5)
    with count_compilations() as counter:
        results = [
            solve(PROBLEM, make(a, b), maxiters=5).x["head"]["w"]
            for a, b in ((1e-2, 1e-1), (3e-3, 0.5))
        ]
    assert counter.count == 0
    assert not np.allclose(results[0], results[1])


def test_unknown_label_and_bad_group():
    groups = optsolve.ParameterGroups({"body": optsolve.Adam(1e-2)}, labels=label)
    with pytest.raises(ValueError, match=r"label\(s\) \['frozen', 'head'\] have no group"):
        solve(PROBLEM, groups, maxiters=3)
    with pytest.raises(TypeError, match="group 'body' must be an optsolve optax algorithm"):
        optsolve.ParameterGroups({"body": "adam"}, labels=label)
