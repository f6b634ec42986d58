"""The test suite's compile options: parts of the suite run with XLA's defaults
(OPTSOLVE_TEST_XLA_DEFAULTS=1) and with the options tests/conftest.py sets by default (XLA's
classic CPU emitters, LLVM's lowest optimisation level).

Each run is a fresh ``pytest`` process with a cold persistent compilation cache of its own
(benchmarks/suite_probe.py), the two settings interleaved. Reported: the XLA compilations of
the run (the same count both ways: the same programs are compiled), the seconds in XLA's
backend compile and in JAX's tracing and lowering, and the run's wall time; medians over the
repeats with [min-max], the ratio of the medians.

Run: ``python benchmarks/bench_suite.py [--repeats 3]`` or ``python benchmarks/run.py suite``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine_line

ROOT = Path(__file__).resolve().parent.parent

# what each part runs: the contract's rules for one quasi-Newton class (many small programs),
# and InteriorPoint under vmap (a few large ones)
PARTS = {
    "contract rules of LBFGS (tests/contract/test_contract.py)": [
        "tests/contract/test_contract.py",
        "-k",
        "LBFGS and not OptaxLBFGS",
    ],
    "vmapped InteriorPoint (test_batch_cond.py, restoration)": [
        "tests/backends/native/test_batch_cond.py"
        "::test_vmap_where_some_members_restore_equals_their_own_solves"
    ],
}


def _run(args: list[str], defaults: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out_dir:
        out = Path(out_dir) / "probe.json"
        env = {k: v for k, v in os.environ.items() if k != "OPTSOLVE_TEST_XLA_DEFAULTS"}
        env.update(
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")])
            ),
            SUITE_PROBE_OUT=str(out),
            SUITE_PROBE_CACHE=cache,
        )
        if defaults:
            env["OPTSOLVE_TEST_XLA_DEFAULTS"] = "1"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "suite_probe",
                *args,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"pytest {args} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return json.loads(out.read_text())


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def measure(repeats: int) -> list[str]:
    rows = []
    for name, args in PARTS.items():
        runs: dict[bool, list[dict]] = {True: [], False: []}
        for _ in range(repeats):
            for defaults in (True, False):
                runs[defaults].append(_run(args, defaults))
        counts = {d: sorted({r["compilations"] for r in runs[d]}) for d in runs}
        cells = [name, f"{counts[True]} / {counts[False]}"]
        for key in ("backend_compile", "trace_and_lower", "wall"):
            ours = [r[key] for r in runs[False]]
            theirs = [r[key] for r in runs[True]]
            ratio = statistics.median(ours) / statistics.median(theirs)
            cells += [_cell(theirs), _cell(ours), f"{ratio:.2f}x"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(repeats: int = 3) -> str:
    header = (
        "| part | XLA compilations (defaults / fast) | backend compile, defaults (s) | "
        "fast (s) | ratio | tracing + lowering, defaults (s) | fast (s) | ratio | "
        "wall, defaults (s) | fast (s) | ratio |\n|" + "---|" * 11
    )
    rows = measure(repeats)
    return (
        "### The test suite: XLA's compile options (the suite's, and "
        "XLA's defaults: OPTSOLVE_TEST_XLA_DEFAULTS=1)\n\n"
        f"{machine_line()}; one pytest process per run, a cold compilation cache each, "
        f"{repeats} runs of each setting interleaved; medians [min-max].\n\n"
        + header
        + "\n"
        + "\n".join(rows)
        + "\n\n"
        "Command: `python benchmarks/bench_suite.py` (`python benchmarks/run.py suite`)."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    print(main(parser.parse_args().repeats))
