"""optsolve.backends.native.batch_cond.cond against jax.lax.cond, and InteriorPoint's
batched solves (which use it) against the members' own solves.

References: lax.cond's results (batched by jax.vmap, and unbatched) on the same branches and
operands; single InteriorPoint solves of each member; the Wächter-Biegler example (Math.
Programming 88 (2000), 565-574), on which an interior-point line search without
feasibility restoration fails, as the family whose members restore from some starts and
not from others, and whose solution is x* = (1, 0, 1/2).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import optsolve
from constrained_problems import hs071, wachter_biegler
from optsolve import ReturnCode, solve
from optsolve.backends.native import batch_cond

jax.config.update("jax_enable_x64", True)

CASES = {
    "none": [False, False, False, False],
    "all": [True, True, True, True],
    "mixed": [True, False, False, True],
}


def _branches(scale, shift):
    """Two branches of pytree operands, closing over a batched float, a batched int and an
    unbatched array."""
    table = jnp.array([0.5, -2.0])

    def on_true(x, pair):
        return {"u": jnp.sin(x["v"]) * scale + shift, "w": (pair[0] * table, pair[1] + shift)}

    def on_false(x, pair):
        return {"u": jnp.cos(x["v"]) - shift * scale, "w": (pair[0] - table, pair[1] * 2)}

    return on_true, on_false


def _with(cond):
    def f(pred, scale, shift, v):
        on_true, on_false = _branches(scale, shift)
        return cond(pred, on_true, on_false, {"v": v}, (v * jnp.ones(2), shift))

    return f


OURS, THEIRS = _with(batch_cond.cond), _with(lax.cond)
SCALE = jnp.array([0.5, 1.0, 1.5, 2.0])
SHIFT = jnp.arange(4)
V = jnp.linspace(-1.0, 1.0, 4)


def _assert_equal(ours, theirs):
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", list(CASES))
def test_equals_lax_cond_under_vmap_and_jit(case):
    pred = jnp.array(CASES[case])
    for transform in (jax.vmap, lambda f: jax.jit(jax.vmap(f))):
        _assert_equal(
            transform(OURS)(pred, SCALE, SHIFT, V), transform(THEIRS)(pred, SCALE, SHIFT, V)
        )
    # predicates batched, operands and closed-over values not; and the reverse
    unbatched = (0, None, None, None)
    _assert_equal(
        jax.vmap(OURS, unbatched)(pred, 1.5, 2, 0.3), jax.vmap(THEIRS, unbatched)(pred, 1.5, 2, 0.3)
    )
    _assert_equal(
        jax.vmap(OURS, (None, 0, 0, 0))(pred[0], SCALE, SHIFT, V),
        jax.vmap(THEIRS, (None, 0, 0, 0))(pred[0], SCALE, SHIFT, V),
    )


@pytest.mark.parametrize("pred", [True, False])
def test_unbatched_it_is_lax_cond(pred):
    _assert_equal(OURS(pred, 1.5, 2, 0.3), THEIRS(pred, 1.5, 2, 0.3))
    _assert_equal(jax.jit(OURS)(pred, 1.5, 2, 0.3), jax.jit(THEIRS)(pred, 1.5, 2, 0.3))
    assert "cond[" in str(jax.make_jaxpr(OURS)(pred, 1.5, 2, 0.3))


def test_nested_vmap():
    pred = jnp.array([CASES["none"][:2], CASES["mixed"][:2], CASES["all"][:2]])
    scale, shift, v = (a[:2] * jnp.ones((3, 1), a.dtype) for a in (SCALE, SHIFT, V))
    nested = lambda f: jax.jit(jax.vmap(jax.vmap(f)))
    _assert_equal(nested(OURS)(pred, scale, shift, v), nested(THEIRS)(pred, scale, shift, v))


@pytest.mark.parametrize("case", list(CASES))
def test_a_branch_no_member_takes_does_not_run(case):
    """A host callback in each branch counts the members it runs for."""
    pred = jnp.array(CASES[case])
    runs = {"true": 0, "false": 0}

    def count(name):
        def note(x):
            runs[name] += int(np.size(x))

        return note

    def f(p, x):
        def on_true(x):
            jax.debug.callback(count("true"), x)
            return x + 1.0

        def on_false(x):
            jax.debug.callback(count("false"), x)
            return x - 1.0

        return batch_cond.cond(p, on_true, on_false, x)

    out = jax.block_until_ready(jax.jit(jax.vmap(f))(pred, V))
    jax.effects_barrier()
    np.testing.assert_array_equal(out, jnp.where(pred, V + 1.0, V - 1.0))
    assert (runs["true"] > 0) == bool(jnp.any(pred))
    assert (runs["false"] > 0) == bool(not jnp.all(pred))


def test_derivatives_equal_lax_cond_s():
    """Forward and reverse mode, batched inside and outside, against lax.cond's; a branch
    not taken whose derivative is infinite there (sqrt at 0 and below) sends back none."""

    def ours(x):
        return batch_cond.cond(x > 0, jnp.sqrt, lambda v: -v * x, x)

    def theirs(x):
        return lax.cond(x > 0, jnp.sqrt, lambda v: -v * x, x)

    xs = jnp.array([-1.0, 0.0, 4.0, 9.0])
    for transform in (
        lambda f: jax.grad(lambda x: jax.vmap(f)(x).sum()),
        lambda f: jax.vmap(jax.grad(f)),
        lambda f: jax.jacfwd(jax.vmap(f)),
        lambda f: jax.jacrev(jax.vmap(f)),
    ):
        ours_d, theirs_d = transform(ours)(xs), transform(theirs)(xs)
        assert np.all(np.isfinite(ours_d))
        np.testing.assert_array_equal(ours_d, theirs_d)
    np.testing.assert_array_equal(jax.grad(ours)(4.0), jax.grad(theirs)(4.0))


def test_misuse_is_refused():
    with pytest.raises(TypeError, match="boolean scalar"):
        batch_cond.cond(jnp.array([True, False]), jnp.sin, jnp.cos, 1.0)
    with pytest.raises(TypeError, match="boolean scalar"):
        batch_cond.cond(1, jnp.sin, jnp.cos, 1.0)
    with pytest.raises(TypeError, match="same structure"):
        batch_cond.cond(True, lambda x: x, lambda x: (x, x), 1.0)


# ------------------------------------------------------- InteriorPoint under vmap

IP = optsolve.InteriorPoint(tol=1e-8)


def _run(x0, p):
    sol = solve(wachter_biegler(x0, p), IP)
    return sol.x, sol.objective, sol.retcode, sol.stats.iterations, sol.state.resto_theta


def test_vmap_where_some_members_restore_equals_their_own_solves():
    """Three starts: two restore (the example's own start among them) and one never does;
    all reach the example's solution x* = (1, 0, 1/2). IPState.resto_theta stays 0 until a
    restoration begins."""
    x0 = jnp.array([[0.5, 1.0, 1.0], [2.0, 1.0, 1.0], [-2.0, 1.0, 1.0]])
    p = jnp.array([[-1.0, 0.5]] * 3)
    xs, fs, codes, its, resto = jax.jit(jax.vmap(_run))(x0, p)
    own = [jax.jit(_run)(x0[i], p[i]) for i in range(3)]
    restored = [bool(o[4] > 0) for o in own]
    assert restored == [True, False, True]
    assert [int(o[2]) for o in own] == [int(ReturnCode.SUCCESS)] * 3
    for i, (x, f, code, it, theta) in enumerate(own):
        np.testing.assert_allclose(x, [1.0, 0.0, 0.5], atol=1e-7)
        np.testing.assert_allclose(xs[i], x, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(fs[i], f, rtol=1e-10, atol=1e-10)
        assert int(codes[i]) == int(code) and int(its[i]) == int(it)
        np.testing.assert_allclose(resto[i], theta, rtol=1e-10, atol=1e-12)


def test_derivatives_of_a_vmapped_solve_never_differentiate_its_loop(monkeypatch):
    """jax.grad and jax.jacfwd of a vmapped solve (and of each member's own) equal: the KKT
    adjoint differentiates the solution, never the loop, so batch_cond's JVP rule is not
    called."""

    def loop_differentiated(*args):
        raise AssertionError("batch_cond's JVP rule was called")

    monkeypatch.setattr(batch_cond._cond, "jvp", loop_differentiated)
    f_of = lambda b: solve(hs071(b), IP).objective
    bs = jnp.array([24.0, 25.0, 26.5])
    grad_of = jax.jit(jax.grad(f_of))  # one compilation for the three members' own
    own = np.array([float(grad_of(b)) for b in bs])
    np.testing.assert_allclose(own[1], 0.55229366, rtol=1e-6)  # -lambda_1 of HS071
    np.testing.assert_allclose(jax.grad(lambda b: jax.vmap(f_of)(b).sum())(bs), own, rtol=1e-10)
    np.testing.assert_allclose(jnp.diagonal(jax.jacfwd(jax.vmap(f_of))(bs)), own, rtol=1e-10)
