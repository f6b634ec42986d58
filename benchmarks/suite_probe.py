"""A pytest plugin for bench_suite.py: counts the XLA compilations of a test run and sums
JAX's compile events, in a cold compilation cache of its own.

Use: ``PYTHONPATH=benchmarks SUITE_PROBE_OUT=out.json SUITE_PROBE_CACHE=DIR python -m pytest
-p suite_probe ...``.
"""

from __future__ import annotations

import collections
import json
import os
import time

import jax
import jax.monitoring

_SECONDS: collections.Counter = collections.Counter()
_COUNTS: collections.Counter = collections.Counter()
_STARTED = [0.0]


def _listen(event: str, duration: float, **_: object) -> None:
    _SECONDS[event] += duration
    _COUNTS[event] += 1


jax.monitoring.register_event_duration_secs_listener(_listen)


def pytest_sessionstart(session) -> None:
    # after tests/conftest.py, which points the persistent cache at .pytest_cache/jax
    jax.config.update("jax_compilation_cache_dir", os.environ["SUITE_PROBE_CACHE"])
    _STARTED[0] = time.perf_counter()


def pytest_sessionfinish(session, exitstatus) -> None:
    record = {
        "exit": int(exitstatus),
        "wall": time.perf_counter() - _STARTED[0],
        "compilations": _COUNTS["/jax/core/compile/backend_compile_duration"],
        "backend_compile": _SECONDS["/jax/core/compile/backend_compile_duration"],
        "trace_and_lower": _SECONDS["/jax/core/compile/jaxpr_trace_duration"]
        + _SECONDS["/jax/core/compile/jaxpr_to_mlir_module_duration"],
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    with open(os.environ["SUITE_PROBE_OUT"], "w") as out:
        json.dump(record, out)
