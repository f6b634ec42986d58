"""Save a Solution to disk and load it back, in a format whose loading runs no code.

The file is a numpy ``.npz`` archive (read with ``allow_pickle=False``) holding every array
leaf of the Solution and a JSON record of their key paths, shapes and dtypes. The tree
structure itself (optax state classes, a model's modules, ...) is not stored: loading takes
a template Solution of the same structure (``like``), for instance from a zero-iteration
solve of the same problem and algorithm, and checks every leaf against it; or, to resume a
run, no template: ``x`` and ``state`` then hold the leaves alone, and ``solve(...,
resume=...)`` rebuilds their structure from the problem and the algorithm (checking every
leaf); or the model (``like=model``), which rebuilds ``x`` alone. A file from elsewhere can
therefore only ever yield arrays, never execute anything. A model's leaves that are not
arrays (an equinox module's activation functions, its configuration strings) are structure:
they are not saved, and come back from the template.

:class:`Checkpoint` is what ``solve(..., checkpoint=path, checkpoint_every=k)`` writes
with: the Solution so far, every k iterations of an eager run.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api.pytree import replace
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution, Stats

_FORMAT = "optsolve-solution-v1"


def _dtype(leaf: Any) -> Any:
    # the leaf's own dtype: a typed PRNG key's is not a numpy one
    return leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype


def _is_saved(leaf: Any) -> bool:
    """Whether a leaf is data that a file holds (an array, a number), not structure."""
    return hasattr(leaf, "dtype") or isinstance(leaf, (bool, int, float, complex))


def _restored(saved: Any, leaf: Any) -> Any:
    """A saved value in the form of the template's ``leaf``: a Python number stays one (a
    model's configuration, such as equinox's ``BatchNorm(inference=False)``, read with
    ``if``), anything else is an array."""
    if isinstance(leaf, (bool, int, float, complex)) and not isinstance(leaf, ReturnCode):
        return type(leaf)(np.asarray(saved).item())
    return jnp.asarray(saved)


def _leaves_with_paths(solution: Solution) -> list[tuple[str, Any]]:
    return [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(solution)
    ]


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
        if key.startswith(".x") and not _is_saved(leaf):
            continue  # a model's structure (a function, a string): `like` gives it back
        if isinstance(leaf, jax.core.Tracer):
            raise ValueError("save: the solution is traced; save it outside jax.jit / vmap.")
        entry = {"key": key}
        if _is_prng_key(leaf):  # a model's RNG state (Dropout): its data and its impl
            entry["key_impl"] = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        value = np.asarray(int(leaf) if isinstance(leaf, ReturnCode) else leaf)
        if value.dtype == object:
            raise TypeError(f"save: leaf {key} is not an array ({type(leaf).__name__}).")
        name = f"leaf_{i:05d}"
        arrays[name] = value
        record.append(entry | {"name": name, "shape": list(value.shape), "dtype": str(value.dtype)})
    meta = json.dumps({"format": _FORMAT, "leaves": record})
    with open(path, "wb") as fh:
        # numpy's stub reads **arrays as possibly naming its allow_pickle flag; every name
        # here is a leaf_NNNNN
        np.savez(fh, __meta__=np.frombuffer(meta.encode(), dtype=np.uint8), **arrays)  # type: ignore[arg-type]


@jax.tree_util.register_pytree_node_class
class SavedLeaves:
    """The leaves of a saved pytree (``x`` or ``state``) without its structure, which
    ``solve(..., resume=...)`` takes from the problem and the algorithm (:meth:`like`)."""

    def __init__(self, leaves: list, keys: tuple[str, ...], field: str):
        self.leaves, self.keys, self.field = list(leaves), tuple(keys), field

    def tree_flatten(self):
        return self.leaves, (self.keys, self.field)

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        return cls(leaves, *aux)

    def like(self, template: Any, who: str = "solve") -> Any:
        """These leaves in the structure of ``template`` (arrays or shape structs), each
        checked against its leaf's shape and dtype; the template's leaves that are not data
        (an equinox module's functions) are kept as they are. ``who`` names the caller in
        errors: ``"solve"`` (a resume) or ``"load"`` (``like=model``)."""
        leaves, treedef = jax.tree_util.tree_flatten(template)
        data = [leaf for leaf in leaves if _is_saved(leaf)]
        fix = (
            "resume with the problem and algorithm that wrote it"
            if who == "solve"
            else "give as `like` a model of the structure the run trained"
        )
        theirs = "this problem and algorithm's" if who == "solve" else "`like`'s"
        if len(data) != len(self.leaves):
            raise ValueError(
                f"{who}: the checkpoint's {self.field} has {len(self.leaves)} arrays, but "
                f"{theirs} has {len(data)}; {fix}."
            )
        for key, saved, leaf in zip(self.keys, self.leaves, data):
            if jnp.shape(saved) != jnp.shape(leaf) or jnp.result_type(saved) != jnp.result_type(
                leaf
            ):
                raise ValueError(
                    f"{who}: the checkpoint's {key} is {jnp.result_type(saved)}"
                    f"{list(jnp.shape(saved))}, but {theirs} is "
                    f"{jnp.result_type(leaf)}{list(jnp.shape(leaf))}; {fix}."
                )
        saved = iter(self.leaves)
        return jax.tree_util.tree_unflatten(
            treedef, [_restored(next(saved), leaf) if _is_saved(leaf) else leaf for leaf in leaves]
        )


def _is_prng_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _read(path: str | os.PathLike) -> dict[str, Any]:
    """The saved leaves by key path (numpy arrays; typed PRNG keys rebuilt as JAX keys)."""
    with np.load(path, allow_pickle=False) as archive:
        meta = json.loads(bytes(archive["__meta__"]).decode())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"load: {path} is not an optsolve solution file.")
        return {
            entry["key"]: archive[entry["name"]]
            if "key_impl" not in entry
            else jax.random.wrap_key_data(archive[entry["name"]], impl=entry["key_impl"])
            for entry in meta["leaves"]
        }


_FIELD = re.compile(r"^\.(\w+)")


def _resume_point(path, saved: dict[str, np.ndarray]) -> Solution:
    """The saved Solution without a template: what ``resume=`` needs."""
    fields: dict[str, list[tuple[str, np.ndarray]]] = {}
    for key, value in saved.items():
        field = _FIELD.match(key)
        if field is None:
            raise ValueError(f"load: {path} holds a leaf {key!r} of no Solution field.")
        fields.setdefault(field.group(1), []).append((key, value))
    if "x" not in fields or "retcode" not in fields:
        raise ValueError(f"load: {path} holds no Solution's x.")
    leaves = lambda name: SavedLeaves(
        [jnp.asarray(v) for _, v in fields[name]], tuple(k for k, _ in fields[name]), name
    )
    number = lambda key: saved[key].item() if key in saved else None
    return Solution(
        x=leaves("x"),
        objective=jnp.asarray(saved[".objective"]),
        retcode=ReturnCode(int(saved[".retcode"])),
        stats=Stats(
            iterations=number(".stats.iterations"),
            f_evals=number(".stats.f_evals"),
            grad_evals=number(".stats.grad_evals"),
            time=number(".stats.time"),
        ),
        state=leaves("state") if "state" in fields else None,
    )


def load(path: str | os.PathLike, like: Any = None) -> Solution:
    """Read a Solution written by :func:`save` (or a checkpoint).

    Args:
      path: the ``.npz`` file.
      like: a Solution of the same structure (same problem shapes and algorithm), e.g.
        ``solve(problem, algorithm, maxiters=0)``, whose values are not used; or a model
        (or any pytree) of the structure of the saved ``x``, e.g. a freshly built model of
        the same architecture: ``x`` is then that model with the saved values; or None.
        Without a Solution as template, ``state`` (and ``x`` where ``like`` is None) hold
        the saved leaves alone, which ``solve(problem, algorithm, resume=...)`` puts in the
        structure of that problem and algorithm (checking each one).

    Returns:
      The saved Solution, ready for ``solve(..., resume=...)``.
    """
    saved = _read(path)
    if like is None:
        return _resume_point(path, saved)
    if not isinstance(like, Solution):
        point = _resume_point(path, saved)
        return replace(point, x=point.x.like(like, who="load"))
    return _like(path, saved, like)


def _like(path, saved: dict[str, Any], like: Solution) -> Solution:
    template = _leaves_with_paths(like)
    treedef = jax.tree_util.tree_structure(like)
    leaves = []
    for key, leaf in template:
        if key.startswith(".x") and not _is_saved(leaf):
            leaves.append(leaf)  # structure, not saved
            continue
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


class Checkpoint:
    """Where and how often an eager run writes its Solution so far: every ``every``
    iterations, to ``path`` (replaced atomically, so that a run killed while writing
    leaves the previous checkpoint whole). ``to_user`` turns the run's Solution into the
    user's (the whole model, the user's objective).

    Resume a killed run with ``solve(..., resume=optsolve.load(path))``: the x and the
    optimizer state continue exactly (on in-memory data, at the same epoch and batch)."""

    def __init__(
        self, path: str | os.PathLike, every: int, to_user: Callable[[Solution], Solution]
    ):
        self.path, self.every, self.to_user = os.fspath(path), every, to_user

    def steps_to_next(self, iterations: int) -> int:
        """Iterations from ``iterations`` (this run's) to the next checkpoint."""
        return self.every - iterations % self.every

    def due(self, iterations: int) -> bool:
        return iterations > 0 and iterations % self.every == 0

    def write(self, solution: Solution) -> None:
        """Save ``solution`` (the backend's, of a run still going) as the checkpoint."""
        solution = self.to_user(solution)
        temporary = self.path + ".partial"
        save(temporary, solution)
        os.replace(temporary, self.path)
