"""Save a Solution to disk and load it back, in a format whose loading runs no code.

The file is a numpy ``.npz`` archive (read with ``allow_pickle=False``) holding every array
leaf of the Solution and a JSON record of their key paths, shapes and dtypes. The tree
structure itself (optax state classes, ...) is not stored: loading takes a template
Solution of the same structure (``like``), for instance from a zero-iteration solve of the
same problem and algorithm, and checks every leaf against it. A file from elsewhere can
therefore only ever yield arrays, never execute anything.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution

_FORMAT = "optsolve-solution-v1"


def _dtype(leaf: Any) -> np.dtype:
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype


def _leaves_with_paths(solution: Solution) -> list[tuple[str, Any]]:
    return [(jax.tree_util.keystr(path), leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(solution)]


def save(path: str | os.PathLike, solution: Solution) -> None:
    """Write ``solution`` to ``path`` (an ``.npz`` file).

    Args:
      path: the file to write.
      solution: a concrete Solution (not a traced one); ``original`` objects that are not
        arrays (scipy's OptimizeResult) are not saved.
    """
    if not isinstance(solution, Solution):
        raise TypeError(f"save: `solution` must be a Solution, got {type(solution).__name__}.")
    arrays, record = {}, []
    for i, (key, leaf) in enumerate(_leaves_with_paths(solution)):
        if key.startswith(".original") and not isinstance(leaf, (np.ndarray, jax.Array)):
            continue
        if isinstance(leaf, jax.core.Tracer):
            raise ValueError("save: the solution is traced; save it outside jax.jit / vmap.")
        value = np.asarray(int(leaf) if isinstance(leaf, ReturnCode) else leaf)
        if value.dtype == object:
            raise TypeError(f"save: leaf {key} is not an array ({type(leaf).__name__}).")
        name = f"leaf_{i:05d}"
        arrays[name] = value
        record.append({"key": key, "name": name, "shape": list(value.shape),
                       "dtype": str(value.dtype)})
    meta = json.dumps({"format": _FORMAT, "leaves": record})
    with open(path, "wb") as fh:
        np.savez(fh, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **arrays)


def load(path: str | os.PathLike, like: Solution) -> Solution:
    """Read a Solution written by :func:`save`, with the structure of ``like``.

    Args:
      path: the ``.npz`` file.
      like: a Solution of the same structure (same problem shapes and algorithm), e.g.
        ``solve(problem, algorithm, maxiters=0)``; its values are not used.

    Returns:
      The saved Solution, ready for ``solve(..., resume=...)``.
    """
    with np.load(path, allow_pickle=False) as archive:
        meta = json.loads(bytes(archive["__meta__"]).decode())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"load: {path} is not an optsolve solution file.")
        saved = {entry["key"]: archive[entry["name"]] for entry in meta["leaves"]}
    template = _leaves_with_paths(like)
    treedef = jax.tree_util.tree_structure(like)
    leaves = []
    for key, leaf in template:
        if key not in saved:
            if key.startswith(".original"):
                leaves.append(None)
                continue
            raise ValueError(
                f"load: {path} has no leaf {key}; it was saved from a Solution of another "
                "structure (problem or algorithm)."
            )
        value = saved.pop(key)
        if np.shape(value) != np.shape(leaf) or value.dtype != _dtype(leaf):
            raise ValueError(
                f"load: leaf {key} is {value.dtype}{list(np.shape(value))} in {path} but "
                f"{_dtype(leaf)}{list(np.shape(leaf))} in `like`."
            )
        if isinstance(leaf, ReturnCode):
            leaves.append(ReturnCode(int(value)))
        elif isinstance(leaf, float):
            leaves.append(float(value))
        else:
            leaves.append(jax.numpy.asarray(value))
    extra = [k for k in saved if not k.startswith(".original")]
    if extra:
        raise ValueError(f"load: {path} has leaves {extra} that `like` does not have.")
    return jax.tree_util.tree_unflatten(treedef, leaves)
