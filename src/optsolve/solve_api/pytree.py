"""Immutable dataclasses that are JAX pytrees: numeric fields are leaves, the rest is static.

Unflattening bypasses ``__init__`` so validation in ``__post_init__`` only runs on user
construction, never on the placeholder leaves JAX passes around inside transformations.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np

T = TypeVar("T")

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    # what replace copies: a dataclass (every pytree_dataclass is one)
    D = TypeVar("D", bound=DataclassInstance)

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # the marker only informs type checkers, which read it from 3.11's typing

    def dataclass_transform(**_: Any) -> Callable[[T], T]:
        return lambda decorator: decorator


def static_field(**kwargs: Any) -> Any:
    """A dataclass field that is part of the pytree structure (aux data), not a leaf."""
    metadata = dict(kwargs.pop("metadata", {}) or {})
    metadata["static"] = True
    return dataclasses.field(metadata=metadata, **kwargs)


# declared a dataclass transform: type checkers then know the constructor of every class
# it makes (its fields, in order, with their defaults) and that its instances are frozen
@dataclass_transform(
    frozen_default=True, eq_default=False, field_specifiers=(dataclasses.field, static_field)
)
def pytree_dataclass(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen dataclass registered as a pytree (with key paths)."""
    own_init = "__init__" in cls.__dict__  # kept by dataclass: a construction that checks
    # eq=False: fields hold arrays, whose == is elementwise; identity is the only sound equality.
    cls = dataclasses.dataclass(frozen=True, eq=False)(cls)
    fields = dataclasses.fields(cast(Any, cls))  # a dataclass now, which T does not say
    data_names = tuple(f.name for f in fields if not f.metadata.get("static", False))
    meta_names = tuple(f.name for f in fields if f.metadata.get("static", False))

    def flatten_with_keys(obj):
        children = [(jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in data_names]
        return children, tuple(getattr(obj, n) for n in meta_names)

    def flatten(obj):
        return [getattr(obj, n) for n in data_names], tuple(getattr(obj, n) for n in meta_names)

    def unflatten(meta, children):
        obj = object.__new__(cls)
        for name, value in zip(meta_names, meta):
            object.__setattr__(obj, name, value)
        for name, value in zip(data_names, children):
            object.__setattr__(obj, name, value)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    if not own_init and not hasattr(cls, "__post_init__") and all(f.init for f in fields):
        _UNCHECKED[cls] = (data_names + meta_names, frozenset(data_names + meta_names))
    return cls


# pytree dataclasses with no validation of their own: (field names, as a set)
_UNCHECKED: dict[type, tuple[tuple[str, ...], frozenset]] = {}


def replace(obj: D, **changes: Any) -> D:
    """A copy of a pytree dataclass with ``changes``, validated like a fresh construction."""
    unchecked = _UNCHECKED.get(type(obj))
    if unchecked is None or not changes.keys() <= unchecked[1]:
        return dataclasses.replace(obj, **changes)
    # a class with nothing to validate: its fields copied, without dataclasses' generic
    # construction (results on every eager call's path are replaced several times)
    new = object.__new__(type(obj))
    values, fresh = obj.__dict__, new.__dict__
    for name in unchecked[0]:
        fresh[name] = changes[name] if name in changes else values[name]
    return new


class Frozen:
    """Holds an unhashable static value (a mask pytree, an array option) as pytree aux data;
    equal only to itself, so a new value means a new compilation, never a wrong cache hit."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def freeze(value: Any) -> Any:
    """``value`` if hashable, else wrapped in :class:`Frozen` (usable as aux data)."""
    try:
        hash(value)
    except TypeError:
        return Frozen(value)
    return value


def thaw(value: Any) -> Any:
    """The value :func:`freeze` wrapped."""
    return value.value if isinstance(value, Frozen) else value


class FlatInputs:
    """One flatten of each of a call's inputs (a solve's problem, algorithm and options),
    which the layers below reuse within :meth:`reused` instead of flattening them again (a
    model's flattening runs in Python, at every ask)."""

    def __init__(self, *objects: Any, known: FlatInputs | None = None):
        """``known``: flattens made before, reused for the very objects they hold."""
        self.objects = objects
        self.flat = [
            jax.tree_util.tree_flatten(obj) if known is None else known.flat_of(obj)
            for obj in objects
        ]
        self.traced = any(
            isinstance(leaf, jax.core.Tracer) for leaves, _ in self.flat for leaf in leaves
        )

    def including(self, obj: Any, flat: tuple[list, Any]) -> FlatInputs:
        """These flattens and ``obj``'s, ``flat`` (``tree_flatten(obj)``, made before)."""
        more = object.__new__(FlatInputs)
        more.objects, more.flat = self.objects + (obj,), self.flat + [flat]
        more.traced = self.traced or any(isinstance(leaf, jax.core.Tracer) for leaf in flat[0])
        return more

    def flat_of(self, obj: Any) -> tuple[list, Any]:
        """``tree_flatten(obj)``: this object's own where it holds that very object."""
        flat = next((f for k, f in zip(self.objects, self.flat) if k is obj), None)
        return jax.tree_util.tree_flatten(obj) if flat is None else flat

    def first(self, n: int) -> tuple[list, Any]:
        """``tree_flatten`` of the tuple of the first ``n`` objects."""
        return (
            [leaf for leaves, _ in self.flat[:n] for leaf in leaves],
            jax.tree_util.treedef_tuple([treedef for _, treedef in self.flat[:n]]),
        )

    def reused(self) -> _Reused:
        """A context within which the layers below reuse these flattens."""
        return _Reused(self)


class _Reused:
    """:meth:`FlatInputs.reused`'s context (a class: a generator's context costs more, on a
    path every eager call takes)."""

    def __init__(self, inputs: FlatInputs):
        self.inputs = inputs

    def __enter__(self) -> None:
        self.token = _REUSED.set(self.inputs)

    def __exit__(self, *exc: Any) -> None:
        _REUSED.reset(self.token)


_REUSED: contextvars.ContextVar[FlatInputs | None] = contextvars.ContextVar("reused", default=None)


def flatten_inputs(*objects: Any) -> tuple[list, Any]:
    """``tree_flatten(objects)``, each object's own flatten reused from :class:`FlatInputs`
    where it holds that very object."""
    known = _REUSED.get()
    if known is None:
        return jax.tree_util.tree_flatten(objects)
    leaves, treedefs = [], []
    for obj in objects:
        obj_leaves, treedef = known.flat_of(obj)
        leaves += obj_leaves
        treedefs.append(treedef)
    return leaves, jax.tree_util.treedef_tuple(treedefs)


def is_traced(*trees: Any) -> bool:
    """Whether any leaf of ``trees`` is a JAX tracer (inside jit, vmap, grad, ...)."""
    known = _REUSED.get()
    if (
        known is not None
        and not known.traced
        and all(any(tree is k for k in known.objects) for tree in trees)
    ):
        return False
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


_PYTHON_SCALARS = (bool, int, float, complex)
_SCALAR_SPECS = {t: ("python", t.__name__) for t in _PYTHON_SCALARS}
# concrete array types met so far (JAX's own), whose shape, dtype and weak_type are read as
# they are: learnt here, as JAX exports no name for its concrete array type
_ARRAY_TYPES: set = set()


def leaf_spec(leaf: Any) -> tuple:
    """A hashable description of one leaf: ``(shape, dtype, weak_type)`` for arrays (and
    ``jax.ShapeDtypeStruct``), ``("python", type name)`` for Python scalars.

    Read from attributes, without ``jnp.result_type`` (dearer per leaf): it keys the caches
    that every solve consults.
    """
    kind = type(leaf)
    spec = _SCALAR_SPECS.get(kind)
    if spec is not None:
        return spec
    if kind in _ARRAY_TYPES:
        return (leaf.shape, leaf.dtype, leaf.weak_type)
    if isinstance(leaf, _PYTHON_SCALARS):
        # the builtin it derives from (JAX's typed literals subclass float and int)
        return ("python", next(t.__name__ for t in _PYTHON_SCALARS if isinstance(leaf, t)))
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        dtype = jnp.result_type(leaf)
    elif not isinstance(dtype, np.dtype):  # numpy's scalar types; JAX's extended dtypes (keys)
        dtype = dtype if jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else np.dtype(dtype)
    array_spec = (tuple(np.shape(leaf)), dtype, bool(getattr(leaf, "weak_type", False)))
    if (
        isinstance(leaf, jax.Array)
        and not isinstance(leaf, jax.core.Tracer)
        and isinstance(dtype, np.dtype)
        and array_spec == (leaf.shape, leaf.dtype, leaf.weak_type)
    ):
        _ARRAY_TYPES.add(kind)
    return array_spec


def tree_spec(tree: Any) -> tuple:
    """``(treedef, leaf specs)`` of ``tree``: equal for trees that trace alike."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple(leaf_spec(leaf) for leaf in leaves)
