"""Test set-up: float64 available everywhere (float32 tests ask for it explicitly).
Warnings are errors (pyproject's filterwarnings).

JAX's strict dtype promotion is not enabled: optax computes ``b1 ** count`` with an int32
count, which strict mode refuses once b1 is a traced leaf, as optsolve makes it.
"""

import os
import shutil
import sys
from pathlib import Path

# The suite compiles with XLA's classic CPU emitters (which optsolve itself picks for small
# eager chunks) and LLVM's lowest optimisation level: the same computation, fused a little
# differently, into slower code, in about half the compile time (benchmarks/bench_suite.py).
# The five tests that compared numbers at the edge of their precision were rewritten to hold
# under XLA's defaults too; OPTSOLVE_TEST_XLA_DEFAULTS=1 runs the suite with those instead.
# Set before JAX starts its CPU client, which reads them once; the subprocesses tests start
# (and xdist's workers, which import this file again) inherit them: each is added once.
if not os.environ.get("OPTSOLVE_TEST_XLA_DEFAULTS"):
    _flags = os.environ.get("XLA_FLAGS", "").split()
    for _flag in ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0"):
        if _flag not in _flags:
            _flags.append(_flag)
    os.environ["XLA_FLAGS"] = " ".join(_flags)

import jax  # after XLA_FLAGS
import pytest

jax.config.update("jax_enable_x64", True)
# the shared problems and helpers (tests/support) import by their own names
sys.path.insert(0, str(Path(__file__).parent / "support"))

# XLA's compilation dominates the suite, and many tests build the same program from new
# closures (the contract matrix builds its problem anew for every rule): JAX's persistent
# cache compiles each distinct program once. A hit still counts as a compilation for
# tests/support/compile_count.py (the event wraps the cache's lookup). One directory per
# xdist worker, with no size bound: JAX shares a directory between processes safely only
# with a bound, which takes a file lock and scans every entry at each write; with the
# suite's thousands of programs that made the workers wait on each other (docs/benchmarks.md,
# "The test suite"). A directory past 1 GiB is emptied when its worker starts.
_CACHE = Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"
_WORKER_CACHE = _CACHE / os.environ.get("PYTEST_XDIST_WORKER", "main")
if (
    _WORKER_CACHE.is_dir()
    and sum(entry.stat().st_size for entry in _WORKER_CACHE.iterdir()) > 2**30
):
    shutil.rmtree(_WORKER_CACHE, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", str(_WORKER_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(scope="module")
def one_blas_thread():
    """BLAS pinned to one thread: OpenBLAS threads cost scipy's small dense kernels 5-10x on
    a busy 2-core machine (see shared/PEERS.md)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


_TESTS_RUN = [0]


@pytest.fixture(autouse=True)
def _bounded_compiled_code():
    """Drop JAX's compiled executables now and then. Each keeps memory maps of its machine
    code, and the suite compiles thousands of programs: past the kernel's limit on a
    process's maps (vm.max_map_count, 65530 by default) LLVM's next allocation crashes."""
    yield
    _TESTS_RUN[0] += 1
    if _TESTS_RUN[0] % 50 or not Path("/proc/self/maps").exists():
        return
    with open("/proc/self/maps") as maps:
        if sum(1 for _ in maps) > 25000:
            import gc

            jax.clear_caches()
            gc.collect()


def pytest_collection_modifyitems(config, items):
    """The contract matrix's rules for one algorithm class run on one xdist worker
    (``--dist loadgroup``): they share the class's compiled loops, which a worker compiles
    once where the rules of a class spread over workers compile them on each."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is not None
            and "cls" in callspec.params
            and item.module.__name__.startswith("test_contract")
        ):
            item.add_marker(pytest.mark.xdist_group(callspec.id.split("-")[0]))
