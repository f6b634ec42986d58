"""Recompilation made visible: warn when a solve compiles again only because an object of
its problem or algorithm was rebuilt (a raw optax transformation, an optax schedule, f or
the callback defined anew per call), and name the pytree forms that avoid it.

JAX compiles once per structure of ``(problem, algorithm)``: numbers are leaves, functions
and closures are structure, equal only to themselves. Two structures that print the same
once memory addresses are removed were built the same way from different objects: the
second compilation is the user's to avoid. A function prints as its name only, so its
fingerprint also describes what it closes over: ``optax.chain(sgd, zoom)`` and
``optax.lbfgs()`` are both ``chain.<locals>.init_fn``, around different functions.
"""

from __future__ import annotations

import functools
import re
import types
import warnings
from typing import Any

from optsolve.solve_api.cache import BoundedCache


class RecompilationWarning(UserWarning):
    """A solve compiled again because an object was rebuilt with the same structure."""


_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")
_OBJECT = re.compile(r"<(?:[^<>]|<[^<>]*>)*? at 0x[0-9a-fA-F]+>")  # <function f.<locals>.g at 0x..>
_SEEN = BoundedCache(64)  # structure -> its fingerprint (holds its objects alive,
_FINGERPRINTS = BoundedCache(64)  # so no new one takes an address); fingerprint -> first
_WARNED: set = set()


def _node_data(treedef: Any) -> list:
    """The static data of every node of ``treedef`` (where functions and options live)."""
    data = treedef.node_data()
    return ([] if data is None else [data[1]]) + [
        item for child in treedef.children() for item in _node_data(child)
    ]


_DEPTH = 8  # closures nest (optax.chain of chains); deeper than this is taken as equal
_ITEMS = 32  # a longer sequence is described by its type and length


def _built(obj: Any, depth: int) -> str:
    """How ``obj`` was built, without its numbers' values (those are what a rebuilt object
    changes): a function by its code and, recursively, the objects it closes over. Never
    raises: a value it cannot describe (its attributes, iteration or printing raise) is
    described by its type's name."""
    try:
        return _describe(obj, depth)
    except Exception:  # noqa: BLE001  (any user object may raise anywhere; the check only warns)
        try:
            return type(obj).__qualname__
        except Exception:  # noqa: BLE001  (likewise)
            return "?"


def _describe(obj: Any, depth: int) -> str:
    """:func:`_built`'s description, which may raise where ``obj`` misbehaves."""
    if depth > _DEPTH:
        return "..."
    if obj is None or isinstance(obj, (bool, str)):
        return repr(obj)
    if isinstance(obj, (int, float, complex)):
        return type(obj).__name__
    # before the array test: a module or a class may have `shape` and `dtype` attributes
    # that are functions (jax.numpy has both)
    if isinstance(obj, types.ModuleType):
        return f"module({obj.__name__})"
    if isinstance(obj, type):
        return f"class({obj.__module__}.{obj.__qualname__})"
    shape = getattr(obj, "shape", None)
    if isinstance(shape, tuple) and hasattr(obj, "dtype"):
        return f"{obj.dtype}{shape}"
    if isinstance(obj, functools.partial):
        return f"partial({_built((obj.func, obj.args, obj.keywords), depth + 1)})"
    if isinstance(obj, types.MethodType):
        return f"method({_built(obj.__func__, depth + 1)})"
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        cells = []
        for cell in obj.__closure__ or ():
            try:
                cells.append(_built(cell.cell_contents, depth + 1))
            except ValueError:  # a cell not yet filled
                cells.append("<empty>")
        return f"{obj.__qualname__}@{code.co_filename}:{code.co_firstlineno}[{', '.join(cells)}]"
    if isinstance(obj, (tuple, list, dict)):  # named tuples too (optax's transformations)
        if len(obj) > _ITEMS:
            return f"{type(obj).__name__}[{len(obj)}]"
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        return (
            f"{type(obj).__name__}("
            + ", ".join(f"{key!r}: {_built(value, depth + 1)}" for key, value in items)
            + ")"
        )
    return type(obj).__qualname__


def note(leaves: list, treedef: Any, hooks: Any) -> None:
    """Record the structure of an eager solve (``(problem, algorithm)`` flattened); warn
    (once per fingerprint) where it is new but prints like an earlier one. ``hooks``: the
    options' functions (the callback, the metrics, ...), also structure. Never raises
    (other than the warning itself, where warnings are errors): a structure whose objects
    cannot be hashed, compared or printed is not checked."""
    try:
        message = _check(leaves, treedef, hooks)
    except Exception:  # noqa: BLE001  (the user's objects may raise anywhere; the check only warns)
        return
    if message is not None:
        warnings.warn(message, RecompilationWarning, stacklevel=3)


def _check(leaves: list, treedef: Any, hooks: Any) -> str | None:
    """:func:`note`'s work: the warning's message, or None where there is nothing to say."""
    # shapes and dtypes too: a new shape compiles anew whatever else changed
    shapes = tuple(
        (getattr(leaf, "shape", None), getattr(leaf, "dtype", type(leaf))) for leaf in leaves
    )
    structure = (treedef, shapes, hooks)
    try:
        if _SEEN.get(structure) is not None:
            return None
    except TypeError:  # an unhashable static value: JAX itself would refuse it
        return None
    printed = f"{treedef} {shapes} {hooks!r}"
    static = [leaf for leaf in leaves if not hasattr(leaf, "dtype")]
    fingerprint = _ADDRESS.sub("", printed) + " " + _built((static, _node_data(treedef), hooks), 0)
    _SEEN.get_or_make(structure, lambda: fingerprint)
    first = _FINGERPRINTS.get_or_make(fingerprint, lambda: printed)
    if first == printed or fingerprint in _WARNED:
        return None
    _WARNED.add(fingerprint)
    rebuilt = sorted(set(_OBJECT.findall(printed)) - set(_OBJECT.findall(first)))
    shown = ", ".join(_ADDRESS.sub("", r) for r in rebuilt[:3]) or "one of its objects"
    return (
        f"solve: this call compiles again because {shown} is a new object built like one "
        "an earlier call used (functions and closures are structure: each new one compiles "
        "anew). Build it once, outside the loop; or use the pytree forms, whose numbers are "
        "leaves: optsolve's algorithm classes (optsolve.OptaxLBFGS() for optax.lbfgs(), "
        "optsolve.Adam(...) for optax.adam(...)), optsolve.schedules for optax's schedules, "
        "and `p` for the numbers f closes over. (Shown once per structure.)"
    )
