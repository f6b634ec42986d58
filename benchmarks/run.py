"""Run every benchmark side by side with its peers and write docs/benchmarks.md.

Usage: ``python benchmarks/run.py [name ...]`` (names: optax, classical, scipy, hypergradient, training); ``make bench``
runs them all. BLAS is pinned to one thread (threadpoolctl): OpenBLAS's default threads stall
small BLAS calls on 2-core VMs (see shared/PEERS.md); JAX's own threads are left alone.
"""

from __future__ import annotations

import datetime
import importlib
import sys
from pathlib import Path

from threadpoolctl import threadpool_limits

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from common import machine_line  # noqa: E402

BENCHMARKS = {"optax": "bench_optax", "classical": "bench_classical", "scipy": "bench_scipy",
              "hypergradient": "bench_hypergradient", "training": "bench_training"}


def main(names: list[str]) -> None:
    sections = []
    with threadpool_limits(limits=1):
        for name in names:
            module = importlib.import_module(BENCHMARKS[name])
            print(f"running {name} ...", flush=True)
            section = module.main()
            print(section, flush=True)
            sections.append(section)
    today = datetime.date.today().isoformat()
    text = "\n\n".join([
        "# Benchmarks",
        f"Measured {today} with `make bench` (`python benchmarks/run.py`) on: {machine_line()}.",
        "Every table comes from one run in which optsolve and its peers were measured side by "
        "side; compare ratios, not absolute times (these shared machines move up to 2x between "
        "runs). BLAS pinned to one thread with threadpoolctl.",
        *sections,
    ])
    out = HERE.parent / "docs" / "benchmarks.md"
    out.write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:] or [n for n in BENCHMARKS if (HERE / f"{BENCHMARKS[n]}.py").exists()])
