"""Compiled functions run inline for host code (the scipy backend's evaluations).

The synchronous path (a private CPU client) and JAX's own ahead-of-time executable must give
the same numbers; functions that need JAX's runtime (host callbacks) take the latter.
"""

from __future__ import annotations

from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optsolve import Constraint, OptimizationProblem, ScipyMinimize, solve
from optsolve.backends import host_executable, scipy_compiled
from optsolve.backends.host_executable import HostExecutable

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


def test_host_callbacks_use_jax_runtime():
    seen = []

    def noisy(x, p):
        jax.debug.callback(lambda s: seen.append(float(s)), jnp.sum(x))
        return jnp.sum(x * p)

    exe = HostExecutable(noisy, (jax.ShapeDtypeStruct((2,), jnp.float64),), 2.0)
    assert not exe.synchronous
    np.testing.assert_allclose(exe.bind(2.0)(np.array([1.0, 2.0]))[0], 6.0)
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
    hs071, jnp.asarray([1.0, 5.0, 5.0, 1.0]), 1.0, bounds=(jnp.ones(4), 5 * jnp.ones(4)),
    constraints=[Constraint(lambda x, p: jnp.prod(x), lower=25.0),
                 Constraint(lambda x, p: jnp.sum(x ** 2), lower=40.0, upper=40.0)])


def rosen(x, p):
    return jnp.sum(p * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


ROSEN = OptimizationProblem(rosen, jnp.asarray([-1.2, 1.0, -1.2, 1.0]), 100.0)


@pytest.mark.parametrize("problem, method", [
    (ROSEN, "L-BFGS-B"), (ROSEN, "trust-exact"), (ROSEN, "trust-ncg"), (ROSEN, "Nelder-Mead"),
    (HS071, "SLSQP"), (HS071, "trust-constr"), (HS071, "COBYLA"),
])
def test_scipy_solves_agree_on_both_paths(problem, method, monkeypatch):
    # every kind of evaluation: f, value-and-gradient, hessp, hess, constraints and their
    # Jacobians and Lagrangian Hessian products
    monkeypatch.setattr(scipy_compiled, "_CACHE", OrderedDict())
    fast = solve(problem, ScipyMinimize(method))
    assert all(exe.synchronous == CPU for exe in scipy_compiled._CACHE.values())
    monkeypatch.setattr(scipy_compiled, "_CACHE", OrderedDict())
    monkeypatch.setattr(host_executable, "ENABLED", False)
    plain = solve(problem, ScipyMinimize(method))
    assert not any(exe.synchronous for exe in scipy_compiled._CACHE.values())
    np.testing.assert_allclose(np.asarray(fast.x), np.asarray(plain.x), rtol=0, atol=1e-12)
    assert fast.stats.f_evals == plain.stats.f_evals
    assert fast.stats.iterations == plain.stats.iterations
    assert fast.retcode == plain.retcode


def test_a_key_in_p_takes_jax_runtime_and_solves():
    # extended dtypes (PRNG keys) have no numpy buffer: JAX's executable takes them
    key = jax.random.key(0)
    target = jax.random.normal(key, (3,))
    problem = OptimizationProblem(lambda x, p: jnp.sum((x - jax.random.normal(p, (3,))) ** 2),
                                  jnp.zeros(3), key)
    sol = solve(problem, ScipyMinimize("BFGS"))
    np.testing.assert_allclose(np.asarray(sol.x), np.asarray(target), atol=1e-8)
    under_jit = jax.jit(lambda k: solve(problem.replace(p=k), ScipyMinimize("BFGS")).x)(key)
    np.testing.assert_allclose(np.asarray(under_jit), np.asarray(target), atol=1e-8)
