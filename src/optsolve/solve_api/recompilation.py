"""Recompilation made visible: warn when a solve compiles again only because an object of
its problem or algorithm was rebuilt (a raw optax transformation, an optax schedule, f or
the callback defined anew per call), and name the pytree forms that avoid it.

JAX compiles once per structure of ``(problem, algorithm)``: numbers are leaves, functions
and closures are structure, equal only to themselves. Two structures that print the same
once memory addresses are removed were built the same way from different objects: the
second compilation is the user's to avoid.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from optsolve.solve_api.cache import BoundedCache


class RecompilationWarning(UserWarning):
    """A solve compiled again because an object was rebuilt with the same structure."""


_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")
_OBJECT = re.compile(r"<(?:[^<>]|<[^<>]*>)*? at 0x[0-9a-fA-F]+>")  # <function f.<locals>.g at 0x..>
_SEEN = BoundedCache(64)          # structure -> its fingerprint (holds its objects alive,
_FINGERPRINTS = BoundedCache(64)  # so no new one takes an address); fingerprint -> first
_WARNED: set = set()


def note(leaves: list, treedef: Any, hooks: Any) -> None:
    """Record the structure of an eager solve (``(problem, algorithm)`` flattened); warn
    (once per fingerprint) where it is new but prints like an earlier one. ``hooks``: the
    options' functions (the callback, the metrics, ...), also structure."""
    # shapes and dtypes too: a new shape compiles anew whatever else changed
    shapes = tuple((getattr(leaf, "shape", None), getattr(leaf, "dtype", type(leaf)))
                   for leaf in leaves)
    structure = (treedef, shapes, hooks)
    try:
        if _SEEN.get(structure) is not None:
            return
    except TypeError:  # an unhashable static value: JAX itself would refuse it
        return
    printed = f"{treedef} {shapes} {hooks!r}"
    fingerprint = _ADDRESS.sub("", printed)
    _SEEN.get_or_make(structure, lambda: fingerprint)
    first = _FINGERPRINTS.get_or_make(fingerprint, lambda: printed)
    if first == printed or fingerprint in _WARNED:
        return
    _WARNED.add(fingerprint)
    rebuilt = sorted(set(_OBJECT.findall(printed)) - set(_OBJECT.findall(first)))
    shown = ", ".join(_ADDRESS.sub("", r) for r in rebuilt[:3]) or "one of its objects"
    warnings.warn(
        f"solve: this call compiles again because {shown} is a new object built like one "
        "an earlier call used (functions and closures are structure: each new one compiles "
        "anew). Build it once, outside the loop; or use the pytree forms, whose numbers are "
        "leaves: optsolve's algorithm classes (optsolve.OptaxLBFGS() for optax.lbfgs(), "
        "optsolve.Adam(...) for optax.adam(...)), optsolve.schedules for optax's schedules, "
        "and `p` for the numbers f closes over. (Shown once per structure.)",
        RecompilationWarning, stacklevel=3)
