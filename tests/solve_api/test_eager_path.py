"""``replace`` of the pytree dataclasses that check nothing of their own: a copy of the fields
without dataclasses' generic construction (several per eager solve), the same result."""

import dataclasses

import jax.numpy as jnp
import pytest

import optsolve
from optsolve.solve_api.pytree import replace
from optsolve.solve_api.solution import Solution, Stats


def test_replace_of_a_class_without_checks_equals_dataclasses_replace():
    solution = Solution(
        x=jnp.zeros(3),
        objective=jnp.float32(1.0),
        retcode=0,
        stats=Stats(1, 2, 3),
        reason=4,
        detail="why",
    )
    object.__setattr__(solution, "problem", "held by this object only")
    fast = replace(solution, retcode=2, stats=replace(solution.stats, iterations=9))
    slow = dataclasses.replace(
        solution, retcode=2, stats=dataclasses.replace(solution.stats, iterations=9)
    )
    for field in dataclasses.fields(Solution):
        a, b = getattr(fast, field.name), getattr(slow, field.name)
        if field.name == "stats":
            assert dataclasses.astuple(a) == dataclasses.astuple(b)
        else:
            assert a is b, field.name
    # the per-object attribute is not a field: neither copy holds it
    assert fast.problem is None and slow.problem is None
    assert solution.retcode == 0 and solution.stats.iterations == 1  # the original unchanged
    with pytest.raises(TypeError, match="unexpected keyword argument 'nonsense'"):
        replace(solution, nonsense=1)


def test_replace_of_a_class_that_checks_still_checks():
    problem = optsolve.OptimizationProblem(lambda x, p: jnp.sum(x**2), jnp.zeros(2))
    with pytest.raises(ValueError, match="`sense` must be 'min' or 'max'"):
        replace(problem, sense="sideways")
    with pytest.raises(ValueError, match="GradientDescent: `learning_rate` must be > 0"):
        replace(optsolve.GradientDescent(), learning_rate=-1.0)


def test_leaf_spec_reads_a_jax_array_as_its_first_reading_did():
    import jax
    import numpy as np

    from optsolve.solve_api import pytree

    leaves = [
        jnp.zeros((2, 3), jnp.float32),
        jnp.asarray(1.5),
        jnp.int32(4),
        jax.random.key(0),
        np.zeros(3),
        2.0,
        True,
        np.float32(1.0),
    ]
    pytree._ARRAY_TYPES.clear()
    first = [pytree.leaf_spec(leaf) for leaf in leaves]  # learns JAX's array type
    assert pytree._ARRAY_TYPES  # the later readings take the attributes directly
    assert [pytree.leaf_spec(leaf) for leaf in leaves] == first
    assert first[:3] == [
        ((2, 3), np.dtype("float32"), False),
        ((), leaves[1].dtype, True),
        ((), np.dtype("int32"), False),
    ]
    assert first[5:7] == [("python", "float"), ("python", "bool")]
    assert first[7] == ((), np.dtype("float32"), False)
