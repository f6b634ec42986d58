"""Reader for the NIST StRD nonlinear regression files in tests/support/data/nist/.

The files are NIST's own (public domain), vendored verbatim: a header with the model, a
table of starting values and certified values, the certified residual sum of squares,
residual standard deviation and degrees of freedom, and the data columns ``y x``
(https://www.itl.nist.gov/div898/strd/nls/nls_main.shtml).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).parent / "data" / "nist"

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# "  b1 =   500   250   2.3894212918E+02  2.7070075241E+00": start 1, start 2, value, sd
_PARAMETER = re.compile(
    rf"^\s*b(\d+)\s*=\s*({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})\s*$"
)
_SCALARS = {
    "ssr": re.compile(rf"^Residual Sum of Squares:\s+({_NUMBER})\s*$"),
    "residual_sd": re.compile(rf"^Residual Standard Deviation:\s+({_NUMBER})\s*$"),
    "dof": re.compile(r"^Degrees of Freedom:\s+(\d+)\s*$"),
    "n_obs": re.compile(r"^Number of Observations:\s+(\d+)\s*$"),
}


@dataclass(frozen=True)
class NistProblem:
    name: str
    difficulty: str  # "Lower", "Average" or "Higher"
    model: str  # the model's formula as the file writes it (``y = ... + e``)
    start1: np.ndarray
    start2: np.ndarray
    certified: np.ndarray  # certified parameter values
    certified_sd: np.ndarray  # their certified standard deviations
    ssr: float  # certified residual sum of squares
    residual_sd: float
    dof: int
    x: np.ndarray
    y: np.ndarray


def load(name: str, directory: Path = DATA_DIR) -> NistProblem:
    """Parse ``<directory>/<name>.dat``; raise ValueError on anything unexpected."""
    lines = (directory / f"{name}.dat").read_text().splitlines()
    header = re.match(r"^Dataset Name:\s+(\S+)", lines[1])
    if lines[0].strip() != "NIST/ITL StRD" or not header:
        raise ValueError(f"{name}: not a NIST StRD file")
    params: dict[int, tuple[float, ...]] = {}
    scalars: dict[str, str] = {}
    model: list[str] = []
    difficulty = None
    data_at = None
    for i, line in enumerate(lines):
        m = re.search(r"(Lower|Average|Higher) Level of Difficulty", line)
        if m:
            difficulty = m.group(1)
        if line.startswith("Model:"):
            # the formula: from the line that starts "y =" to the one that ends "+  e"
            j = next(k for k in range(i, len(lines)) if lines[k].strip().startswith("y ="))
            while True:
                model.append(lines[j].strip())
                if lines[j].rstrip().endswith("e"):
                    break
                j += 1
        m = _PARAMETER.match(line)
        if m and data_at is None:
            params[int(m.group(1))] = tuple(float(v) for v in m.groups()[1:])
        for key, pattern in _SCALARS.items():
            m = pattern.match(line)
            if m:
                scalars[key] = m.group(1)
        if re.match(r"^Data:\s+y\s+x\s*$", line):
            data_at = i + 1
    if data_at is None or set(scalars) != set(_SCALARS) or not params or difficulty is None:
        raise ValueError(f"{name}: incomplete file")
    if sorted(params) != list(range(1, len(params) + 1)):
        raise ValueError(f"{name}: parameters {sorted(params)}")
    rows = [line.split() for line in lines[data_at:] if line.strip()]
    if any(len(row) != 2 for row in rows):
        raise ValueError(f"{name}: the data block has rows that are not `y x`")
    data = np.array(rows, dtype=float)
    table = np.array([params[k] for k in sorted(params)])
    n_obs, dof = int(scalars["n_obs"]), int(scalars["dof"])
    # the degrees of freedom are as stated; Rat43's file states 9 for 15 - 4 (its residual
    # standard deviation is sqrt(SSR / 11)), so they are not checked against n - p here
    if data.shape[0] != n_obs:
        raise ValueError(f"{name}: {data.shape[0]} observations, {n_obs} stated")
    return NistProblem(
        name=header.group(1),
        difficulty=difficulty,
        model=" ".join(model),
        start1=table[:, 0],
        start2=table[:, 1],
        certified=table[:, 2],
        certified_sd=table[:, 3],
        ssr=float(scalars["ssr"]),
        residual_sd=float(scalars["residual_sd"]),
        dof=dof,
        x=data[:, 1],
        y=data[:, 0],
    )
