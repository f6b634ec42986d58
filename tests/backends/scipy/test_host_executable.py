"""Compiled functions run inline for host code (the scipy backend's evaluations).

The synchronous path (a private CPU client) and JAX's default device must give the same
numbers, host callbacks and PRNG keys included.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optsolve import Constraint, OptimizationProblem, ScipyMinimize, solve
from optsolve.backends.scipy import compiled as scipy_compiled
from optsolve.backends.scipy import host_executable
from optsolve.backends.scipy.host_executable import HostExecutable
from optsolve.solve_api.cache import BoundedCache

pytestmark = pytest.mark.usefixtures("one_blas_thread")

CPU = jax.default_backend() == "cpu"


def two_outputs(x, v, p):
    return jnp.sum(jnp.sin(x) * p["scale"]) + p["shift"], x * v * p["count"]


P = {"scale": jnp.asarray([1.0, 2.0, 3.0]), "shift": 0.5, "count": jnp.asarray(3, jnp.int32)}
SPECS = (jax.ShapeDtypeStruct((3,), jnp.float64), jax.ShapeDtypeStruct((3,), jnp.float64))


@pytest.mark.skipif(not CPU, reason="the synchronous path exists on a CPU backend only")
def test_synchronous_on_cpu_and_equal_to_jit():
    exe = HostExecutable(two_outputs, SPECS, P)
    assert exe.synchronous
    x, v = np.array([0.1, 0.2, 0.3]), np.array([1.0, -1.0, 2.0])
    value, product = exe.bind(P)(x, v)
    ref_value, ref_product = jax.jit(two_outputs)(x, v, P)
    assert isinstance(value, np.ndarray) and isinstance(product, np.ndarray)
    np.testing.assert_allclose(value, ref_value, rtol=1e-15)
    np.testing.assert_allclose(product, ref_product, rtol=1e-15)
    # p is bound per call site: another p, the same executable, no recompilation
    other = dict(P, shift=-2.0)
    np.testing.assert_allclose(exe.bind(other)(x, v)[0], float(ref_value) - 2.5, rtol=1e-15)


def test_host_callbacks_run():
    seen = []

    def noisy(x, p):
        jax.debug.callback(lambda s: seen.append(float(s)), jnp.sum(x))
        doubled = jax.pure_callback(
            lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct((2,), x.dtype), x
        )
        return jnp.sum(doubled * p)

    exe = HostExecutable(noisy, (jax.ShapeDtypeStruct((2,), jnp.float64),), 2.0)
    assert exe.synchronous == CPU
    np.testing.assert_allclose(exe.bind(2.0)(np.array([1.0, 2.0]))[0], 12.0)
    jax.effects_barrier()
    assert seen == [3.0]


def test_disabled_uses_jax_runtime(monkeypatch):
    monkeypatch.setattr(host_executable, "ENABLED", False)
    exe = HostExecutable(two_outputs, SPECS, P)
    assert not exe.synchronous
    value, product = exe.bind(P)(np.ones(3), np.ones(3))
    np.testing.assert_allclose(value, np.sum(np.sin(1.0) * np.array([1.0, 2.0, 3.0])) + 0.5)
    np.testing.assert_allclose(product, [3.0, 3.0, 3.0])


def hs071(x, p):
    return x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2] * p


HS071 = OptimizationProblem(
    hs071,
    jnp.asarray([1.0, 5.0, 5.0, 1.0]),
    1.0,
    bounds=(jnp.ones(4), 5 * jnp.ones(4)),
    constraints=[
        Constraint(lambda x, p: jnp.prod(x), lower=25.0),
        Constraint(lambda x, p: jnp.sum(x**2), lower=40.0, upper=40.0),
    ],
)


def rosen(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


ROSEN = OptimizationProblem(rosen, jnp.asarray([-1.2, 1.0, -1.2, 1.0]), 100.0)


@pytest.mark.parametrize(
    "problem, method",
    [
        (ROSEN, "L-BFGS-B"),
        (ROSEN, "trust-exact"),
        (ROSEN, "trust-ncg"),
        (ROSEN, "Nelder-Mead"),
        (HS071, "SLSQP"),
        (HS071, "trust-constr"),
        (HS071, "COBYLA"),
    ],
)
def test_scipy_solves_agree_on_both_paths(problem, method, monkeypatch):
    # every kind of evaluation: f, value-and-gradient, hessp, hess, constraints and their
    # Jacobians and Lagrangian Hessian products
    monkeypatch.setattr(scipy_compiled, "_CACHE", BoundedCache(256))
    fast = solve(problem, ScipyMinimize(method))
    assert all(exe.synchronous == CPU for exe in scipy_compiled._CACHE.values())
    monkeypatch.setattr(scipy_compiled, "_CACHE", BoundedCache(256))
    monkeypatch.setattr(host_executable, "ENABLED", False)
    plain = solve(problem, ScipyMinimize(method))
    assert not any(exe.synchronous for exe in scipy_compiled._CACHE.values())
    np.testing.assert_allclose(np.asarray(fast.x), np.asarray(plain.x), rtol=0, atol=1e-12)
    assert fast.stats.f_evals == plain.stats.f_evals
    assert fast.stats.iterations == plain.stats.iterations
    assert fast.retcode == plain.retcode


def test_a_key_in_p():
    key = jax.random.key(0)
    target = jax.random.normal(key, (3,))
    problem = OptimizationProblem(
        lambda x, p: jnp.sum((x - jax.random.normal(p, (3,))) ** 2), jnp.zeros(3), key
    )
    sol = solve(problem, ScipyMinimize("BFGS"))
    np.testing.assert_allclose(np.asarray(sol.x), np.asarray(target), atol=1e-8)
    under_jit = jax.jit(lambda k: solve(problem.replace(p=k), ScipyMinimize("BFGS")).x)(key)
    np.testing.assert_allclose(np.asarray(under_jit), np.asarray(target), atol=1e-8)


@pytest.mark.skipif(not CPU, reason="the synchronous path exists on a CPU backend only")
def test_data_in_p_is_copied_once_and_released():
    data = jnp.arange(6.0)
    problem = OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(6), data)
    first = solve(problem, ScipyMinimize("L-BFGS-B"))
    assert id(data) in host_executable._moved
    copy = host_executable._moved.peek(id(data))[1]
    second = solve(problem, ScipyMinimize("L-BFGS-B"))
    assert host_executable._moved.peek(id(data))[1] is copy  # the same private copy, reused
    np.testing.assert_allclose(np.asarray(first.x), np.arange(6.0), atol=1e-6)
    np.testing.assert_allclose(np.asarray(second.x), np.arange(6.0), atol=1e-6)
    # a new array with the same id must never see the old copy
    key = id(data)
    del data, problem, first, second
    import gc

    gc.collect()
    assert key not in host_executable._moved or host_executable._moved.peek(key)[0]() is not None
    other = jnp.arange(6.0) * 2
    sol = solve(
        OptimizationProblem(lambda x, p: jnp.sum((x - p) ** 2), jnp.zeros(6), other),
        ScipyMinimize("L-BFGS-B"),
    )
    np.testing.assert_allclose(np.asarray(sol.x), 2 * np.arange(6.0), atol=1e-6)


def test_bounded_cache_keeps_the_most_recently_used():
    cache = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)  # evicts b, the least recently used
    assert "b" not in cache and cache.peek("a") == 1 and cache.peek("c") == 3
    assert cache.peek("c") == 3 and cache.get_or_make("d", lambda: 4) == 4
    assert "a" not in cache  # peek did not count c as used, get_or_make evicted a
    cache.discard("c")
    assert len(cache) == 1 and cache.get("c", "missing") == "missing"
    assert cache.get_or_make([1], lambda: 5) == 5 and len(cache) == 1  # unhashable: not stored
