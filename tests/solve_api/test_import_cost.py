"""What ``import optsolve`` costs and what carries over between processes: the optional
families' dependencies load on first use, and JAX's persistent compilation cache, turned
on by ``optsolve.enable_compilation_cache``, hands a second process what the first one
compiled. Each test runs fresh interpreters (this one has imported everything)."""

from __future__ import annotations

import json

from fresh_interpreter import run_without_x64

LAZY = ("scipy", "flax", "equinox", "tqdm", "matplotlib")


def test_import_loads_no_optional_dependency():
    out = run_without_x64(
        f"import sys, optsolve\nprint([m for m in sys.modules if m.split('.')[0] in {LAZY!r}])\n"
    )
    assert out.strip() == "[]"


def test_import_loads_no_jax_extension_module():
    """jax.extend (which loads Pallas) is not needed to import optsolve: after jax and optax,
    the modules the import loads are its own and a few of jax's."""
    out = run_without_x64(
        "import json, sys, jax, optax\n"
        "before = set(sys.modules)\n"
        "import optsolve\n"
        "print(json.dumps(sorted(m for m in set(sys.modules) - before if m.startswith('jax'))))\n"
    )
    loaded = json.loads(out.strip().splitlines()[-1])
    assert not [m for m in loaded if m.startswith("jax.extend") or "pallas" in m], loaded


def test_scipy_solve_after_the_import():
    """scipy loads when a scipy method first runs, and the run is scipy's own."""
    out = run_without_x64("""
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
import optsolve

def f(x, p):
    return jnp.sum((x - 1.0) ** 2) + x[0] ** 4 + x[0] * x[1]

imported = "scipy" in sys.modules
prob = optsolve.OptimizationProblem(f, jnp.array([0.5, -1.0, 2.0]))
sol = optsolve.solve(prob, optsolve.ScipyMinimize("BFGS"))

import scipy.optimize
value_and_grad = jax.jit(jax.value_and_grad(f))
ref = scipy.optimize.minimize(
    lambda x: tuple(np.asarray(v, float) for v in value_and_grad(x, None)),
    np.array([0.5, -1.0, 2.0]), jac=True, method="BFGS")
print(json.dumps({"imported": imported, "success": bool(sol.success),
                  "x": np.asarray(sol.x).tolist(), "ref": ref.x.tolist()}))
""")
    result = json.loads(out.strip().splitlines()[-1])
    assert not result["imported"]
    assert result["success"]
    assert max(abs(a - b) for a, b in zip(result["x"], result["ref"])) <= 1e-8


_CACHED_SOLVE = """
import json
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import optsolve

directory = optsolve.enable_compilation_cache(CACHE)
events = {"/jax/compilation_cache/cache_hits": 0, "/jax/compilation_cache/cache_misses": 0}

def count(event, **kwargs):
    if event in events:
        events[event] += 1

jax.monitoring.register_event_listener(count)

def rosenbrock(x, p):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

sol = optsolve.solve(optsolve.OptimizationProblem(rosenbrock, jnp.tile(jnp.array([-1.2, 1.0]), 5)),
                     optsolve.LBFGS())
assert sol.success, sol.message
print(json.dumps({"dir": str(directory), "entries": sorted(p.name for p in directory.iterdir()),
                  "hits": events["/jax/compilation_cache/cache_hits"],
                  "misses": events["/jax/compilation_cache/cache_misses"]}))
"""


def test_compilation_cache_serves_a_second_process(tmp_path):
    """The first process writes its programs to the directory; the second finds every one
    of them there and compiles nothing new."""
    cache = tmp_path / "jax-cache"
    runs = []
    for _ in range(2):
        out = run_without_x64(f"CACHE = {str(cache)!r}\n" + _CACHED_SOLVE)
        runs.append(json.loads(out.strip().splitlines()[-1]))
    first, second = runs
    assert first["dir"] == str(cache.resolve())
    assert first["entries"] and first["misses"] > 0
    assert second["hits"] > 0 and second["misses"] == 0
    assert second["entries"] == first["entries"]
