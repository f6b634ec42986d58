"""Multi-device: solve on sharded inputs (4 host CPU devices, in a subprocess since the device
count is fixed when JAX starts) keeps the shardings and matches the single-device result."""

import os
import subprocess
import sys
from pathlib import Path


def test_sharded_solves_match_single_device():
    script = Path(__file__).parents[2] / "support" / "scripts" / "sharded_training.py"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("OK")
