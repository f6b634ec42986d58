"""The contract's rule for models as x (``trainable``), over every registered algorithm
class: the trained leaves follow the run of the same problem over them alone, the carried
leaves come back as f leaves them, and state f changes in place is carried from step to
step by the algorithms whose capabilities say so, and refused, naming them, elsewhere."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_contract import (  # noqa: F401
    BOX,
    CASES,
    CLASSES,
    _id,
    _objective,
    _problem,
    _start,
    pytestmark,
)

from optsolve import OptimizationProblem, solve


class Counting:
    """A model that counts its evaluations in place, as an NNX module's Dropout counts its
    RNG draws: a mutable pytree node."""

    def __init__(self, w, scale, count):
        self.w, self.scale, self.count = w, scale, count

    def __call__(self, p):
        self.count = self.count + 1
        return _objective(self.w, p * self.scale)


jax.tree_util.register_pytree_node(
    Counting, lambda m: ((m.w, m.scale, m.count), None), lambda _, leaves: Counting(*leaves)
)


def _trained(leaf) -> bool:
    return isinstance(leaf, jax.Array) and leaf.ndim == 1


def _trained_scalar(leaf) -> bool:
    """A scalar class's model trains its one 0-d float64 leaf (its scale is float32)."""
    return isinstance(leaf, jax.Array) and leaf.ndim == 0 and leaf.dtype == jnp.float64


def _model_problem(cls, f):
    scalar = CASES[cls].scalar
    scale = jnp.asarray(1.0, jnp.float32 if scalar else None)
    model = Counting(_start(cls), scale, jnp.zeros((), jnp.int32))
    bounds = BOX if CASES[cls].box else None
    trainable = _trained_scalar if scalar else _trained
    return OptimizationProblem(f, model, 10.0, trainable=trainable, bounds=bounds)


@pytest.mark.parametrize("cls", CLASSES, ids=_id)
def test_a_model_trains_its_selected_leaves_and_carries_its_state(cls):
    alg, k = CASES[cls].make(), CASES[cls].iterations
    if CASES[cls].least_squares:
        with pytest.raises(TypeError, match="works on residuals"):
            solve(_model_problem(cls, lambda m, p: _objective(m.w, p * m.scale)), alg, maxiters=k)
        return
    plain = solve(_problem(cls), alg, maxiters=k)
    counting = _model_problem(cls, lambda m, p: m(p))
    if alg.capabilities()["threads_model_state"]:
        # f changes a carried leaf in place: one evaluation per completed step carries it
        sol = solve(counting, alg, maxiters=k)
        assert int(sol.x.count) == sol.stats.iterations == plain.stats.iterations
    else:
        with pytest.raises(ValueError, match="changes the model's state in place"):
            solve(counting, alg, maxiters=k)
        # f reads the carried leaves and changes none of them
        sol = solve(_model_problem(cls, lambda m, p: _objective(m.w, p * m.scale)), alg, maxiters=k)
        assert int(sol.x.count) == 0
    assert isinstance(sol.x, Counting)
    np.testing.assert_allclose(sol.x.w, plain.x, rtol=1e-12, atol=1e-14)
    assert sol.retcode == plain.retcode and sol.stats.iterations == plain.stats.iterations
    assert float(sol.x.scale) == 1.0
