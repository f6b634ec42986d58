"""Fits in JAX's default float32 (x64 off, in a fresh interpreter: the suite turns x64 on)
against NIST's certified values and scipy in float64 on the same data.

Before: Misra1a's standard errors came back as [9.6e-13, 3.6e-7] (certified [2.707,
7.27e-6]: float32's SVD cutoff dropped the weak direction), and the fits raised "no further
progress was possible" at points right to float32's precision (1e-8 tolerances are below
its rounding).
"""

from __future__ import annotations

import json

from fresh_interpreter import run_without_x64

_PRELUDE = """
import json, sys, warnings
sys.path.insert(0, "tests/support")
warnings.simplefilter("error")
import jax, jax.numpy as jnp, numpy as np, optsolve
assert not jax.config.jax_enable_x64
from nist import load
"""


def _run(body: str) -> dict:
    return json.loads(run_without_x64(_PRELUDE + body).strip().splitlines()[-1])


def test_misra1a_in_float32_gives_the_certified_values_and_standard_errors():
    out = _run("""
P = load("Misra1a")
x, y = P.x.astype(np.float32), P.y.astype(np.float32)
model = lambda x, b1, b2: b1 * (1 - jnp.exp(-b2 * x))
res = {}
for start in ("start1", "start2"):
    popt, pcov, info, mesg, ier = optsolve.curve_fit(
        model, x, y, getattr(P, start).astype(np.float32), full_output=True)
    res[start] = dict(dtype=str(popt.dtype), retcode=int(info["retcode"]), ier=ier,
                      popt=(np.abs(np.asarray(popt, float) - P.certified) / P.certified).tolist(),
                      se=(np.abs(np.sqrt(np.diag(np.asarray(pcov, float))) - P.certified_sd)
                          / P.certified_sd).tolist())
print(json.dumps(res))
""")
    for start, r in out.items():
        assert r["dtype"] == "float32" and r["retcode"] == 0 and r["ier"] in (1, 2, 3, 4), (
            start,
            r,
        )
        assert max(r["popt"]) < 1e-5, (start, r)  # float32 resolves 6e-8 relative
        assert max(r["se"]) < 1e-3, (start, r)  # was 1 - 9.6e-13 / 2.707 ~ 1


def test_michaelis_menten_in_micromolar_matches_scipy_in_float64():
    out = _run("""
import scipy.optimize as so
s = np.array([2., 5, 10, 20, 50, 100, 200, 500, 1000], np.float32)
rng = np.random.default_rng(0)
v = (1.7 * s / (35.0 + s) * (1 + 0.02 * rng.standard_normal(s.size))).astype(np.float32)
popt, pcov, info, mesg, ier = optsolve.curve_fit(lambda s, vmax, km: vmax * s / (km + s), s, v,
                                                 np.array([1.0, 10.0], np.float32),
                                                 full_output=True)
ref, ref_cov = so.curve_fit(lambda s, a, b: a * s / (b + s), s.astype(float), v.astype(float),
                            [1.0, 10.0], ftol=1e-12, xtol=1e-12)
print(json.dumps(dict(retcode=int(info["retcode"]),
      popt=(np.abs(np.asarray(popt, float) - ref) / ref).tolist(),
      se=(np.abs(np.sqrt(np.diag(np.asarray(pcov, float))) - np.sqrt(np.diag(ref_cov)))
          / np.sqrt(np.diag(ref_cov))).tolist())))
""")
    assert out["retcode"] == 0, out
    assert max(out["popt"]) < 1e-4 and max(out["se"]) < 1e-3, out


def test_covariance_of_a_float32_solve_is_factorised_in_float64():
    out = _run("""
P = load("Misra1a")
prob = optsolve.curve_fit_problem(lambda x, b1, b2: b1 * (1 - jnp.exp(-b2 * x)),
                                  jnp.asarray(P.x, jnp.float32), jnp.asarray(P.y, jnp.float32),
                                  jnp.asarray(P.certified, jnp.float32))
cov = optsolve.covariance(optsolve.solve(prob, optsolve.LevenbergMarquardt()))
se = np.sqrt(np.diag(np.asarray(cov, float)))
print(json.dumps(dict(dtype=str(cov.dtype),
                      se=(np.abs(se - P.certified_sd) / P.certified_sd).tolist())))
""")
    assert out["dtype"] == "float32" and max(out["se"]) < 1e-3, out


def test_float64_numpy_data_cast_to_float32_warn_once():
    out = _run("""
x = np.linspace(0.0, 1.0, 20)
y = 2.0 * np.exp(-1.5 * x)
model = lambda x, a, k: a * jnp.exp(-k * x)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        popt, _ = optsolve.curve_fit(model, x, y, [1.0, 1.0])
messages = [str(w.message) for w in caught]
print(json.dumps(dict(messages=messages, dtype=str(popt.dtype))))
""")
    assert out["dtype"] == "float32"
    assert len(out["messages"]) == 1, out
    assert "float64" in out["messages"][0] and "float32" in out["messages"][0]
    assert "jax_enable_x64" in out["messages"][0]
