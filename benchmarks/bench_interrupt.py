"""How soon Ctrl-C stops a run on data (issue 35: the docs promise about 0.3 s).

Each runner trains the digits MLP (64-64-10, float32, batch 64) eagerly for far longer than
the measurement; a thread sends SIGINT 1.5 s after the run starts, and the latency is the
time from the signal to ``solve`` returning its INTERRUPTED Solution. Runners: in-memory
arrays with ``batch_size`` (the compiled chunks), a list of batches (joined into arrays), a
data loader (an iterable the host feeds, 32 batches a chunk), and each with a Python callback
at every step (a host call per step). The deterministic measure beside each: the steps the
run had taken, and the chunk length the host last chose (about 0.15 s of steps).

Run: ``python benchmarks/bench_interrupt.py``.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import jax
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))

import optsolve
from bench_data_compiled import BATCH, LR, setup
from common import machine_line, markdown_table

SIGNAL_AFTER = 1.5  # seconds into the run


def never_stop(k, x, f):
    """A callback at every step (a host call each) that lets the run go on."""
    return False


class Loader:
    """A data loader: iterable again at every epoch, not a list."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def interrupted_after(run) -> tuple[float, optsolve.Solution]:
    """(seconds from SIGINT to the return, the Solution) of ``run()``, signalled
    ``SIGNAL_AFTER`` seconds in."""
    sent: list[float] = []

    def interrupt():
        time.sleep(SIGNAL_AFTER)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    solution = run()
    returned = time.perf_counter()
    sender.join()
    return returned - sent[0], solution


def main(repeats: int = 5) -> str:
    x, y, params, loss = setup()
    prob = optsolve.OptimizationProblem(loss, params)
    key = jax.random.key(0)
    n = x.shape[0] // BATCH * BATCH
    batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, n, BATCH)]
    epochs = 100_000  # far beyond the measurement
    sources = {
        "in-memory arrays (batch_size, key)": dict(data=(x, y), batch_size=BATCH, key=key),
        "a list of batches": dict(data=batches),
        "a data loader (host-fed)": dict(data=Loader(batches)),
    }
    rows = []
    for name, source in sources.items():
        for with_callback in (False, True):
            options = dict(source, epochs=epochs)
            if with_callback:
                options["callback"] = never_stop

            def run():
                return optsolve.solve(prob, optsolve.Adam(LR), **options)  # noqa: B023  (called in this iteration)

            optsolve.solve(prob, optsolve.Adam(LR), **dict(options, epochs=1))  # compiled
            latencies, steps = [], []
            for _ in range(repeats):
                latency, solution = interrupted_after(run)
                assert solution.retcode == optsolve.ReturnCode.INTERRUPTED, solution.retcode
                latencies.append(latency)
                steps.append(solution.stats.iterations)
            rows.append(
                [
                    name + (", callback every step" if with_callback else ""),
                    f"{statistics.median(latencies):.3f}",
                    f"{min(latencies):.3f}-{max(latencies):.3f}",
                    str(int(statistics.median(steps))),
                ]
            )
    return "\n".join(
        [
            "### Ctrl-C on a run on data: seconds from the signal to the returned Solution",
            "",
            markdown_table(
                [
                    "runner",
                    "median latency (s)",
                    "min-max (s)",
                    f"steps taken by {SIGNAL_AFTER} s + latency",
                ],
                rows,
            ),
            "",
            f"{repeats} signals per runner, each {SIGNAL_AFTER} s into an eager run (the "
            "programs compiled before). Goal: about 0.3 s (two chunks of about 0.15 s in flight).",
        ]
    )


if __name__ == "__main__":
    with threadpool_limits(limits=1):
        print(machine_line())
        print(main())
