"""Run a script in a fresh Python interpreter with JAX's default float32 (the suite enables
x64 process-wide, so behaviour under x64 off needs its own process)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_without_x64(script: str) -> str:
    """The script's stdout; its failure (a non-zero exit) fails the calling test."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
