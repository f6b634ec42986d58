"""An optax factory's arguments as an immutable pytree: what the generated algorithm classes
(``optsolve.Adam``) and the pytree schedules (``optsolve.schedules``) share.

Floats and arrays are leaves, so new values reuse compiled code; ints, bools, strings and
callables are structure (ints fix shapes and loop counts). A Python int given where the
factory takes a real number (``weight_decay=0``) is that float.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import numpy as np

from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.pytree import freeze, thaw
from optsolve.solve_api.trainable import fit_to

_SIGNATURES = BoundedCache(1024)  # one per optax factory: a few hundred at most


def factory_signature(factory: Callable[..., Any]) -> inspect.Signature:
    # inspect.signature is slow, and algorithms are built and unflattened on every solve
    return _SIGNATURES.get_or_make(factory, lambda: inspect.signature(factory))


def is_number(value: Any) -> bool:
    """A float or an array (ints and bools are structure)."""
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return False
    return isinstance(value, (float, np.floating, np.ndarray, jax.Array))


def float_valued_names(factory: Callable[..., Any]) -> frozenset[str]:
    """The arguments that take real values: a float default, or none and a scalar
    annotation (``learning_rate``); not counts such as ``ns_steps`` (an int default)."""
    names = set()
    for name, param in inspect.signature(factory).parameters.items():
        if isinstance(param.default, bool) or "mask" in name or "dtype" in name:
            continue
        annotation = str(param.annotation)
        if annotation in ("<class 'int'>", "int"):
            continue
        if isinstance(param.default, float) or (
            param.default is inspect.Parameter.empty
            and any(m in annotation for m in ("float", "ScalarOrSchedule"))
        ):
            names.add(name)
    return frozenset(names)


class ModelMask:
    """A mask pytree given to an optax factory (``AdamW(mask=...)``), as the function of
    the parameters optax also takes: it fits the mask to them (:func:`fit_to`), so that a
    model's mask may be given as the whole model, its trained leaves or an ``nnx.State``.
    Equal to a ModelMask of an equal hashable mask, else of the same mask object (a new
    unhashable mask compiles anew)."""

    def __init__(self, mask: Any, name: str):
        self.mask, self.name = mask, name
        try:
            self.key = hash(mask), mask
        except TypeError:
            self.key = id(mask), None

    def __call__(self, params: Any) -> Any:
        return fit_to(self.mask, params, f"`{self.name}`")

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, ModelMask):
            return False
        return other.mask is self.mask or (self.key[1] is not None and other.key == self.key)

    def __hash__(self) -> int:
        return hash((ModelMask, self.key[0]))

    def __repr__(self) -> str:
        return repr(self.mask)


def _is_mask_tree(name: str, value: Any) -> bool:
    # a function of the parameters is optax's other form; a module is callable, but a tree
    return (
        "mask" in name
        and value is not None
        and not isinstance(value, ModelMask)
        and not (
            callable(value) and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value))
        )
    )


class FactoryArguments:
    """Base of immutable pytrees holding the arguments of ``factory``.

    Attributes:
      factory: the function whose arguments these are.
      float_valued: the arguments a Python int is converted to float for.
      static_names: number arguments kept as structure all the same (the factory branches
        on them in Python).
    """

    factory: ClassVar[Callable[..., Any]]
    float_valued: ClassVar[frozenset[str]] = frozenset()
    static_names: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any):
        signature = factory_signature(type(self).factory)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{type(self).__name__}{signature}: {err}") from None
        bound.apply_defaults()
        arguments = {
            name: float(value)
            if name in self.float_valued
            and isinstance(value, (int, np.integer))
            and not isinstance(value, (bool, np.bool_))
            else ModelMask(value, name)
            if _is_mask_tree(name, value)
            else value
            for name, value in bound.arguments.items()
        }
        object.__setattr__(self, "_arguments", arguments)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use .replace({name}=...).")

    def __getattr__(self, name: str) -> Any:
        arguments = self.__dict__.get("_arguments", {})
        if name in arguments:
            value = arguments[name]
            return value.mask if isinstance(value, ModelMask) else value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @classmethod
    def is_leaf_value(cls, value: Any) -> bool:
        """Whether an argument's value is a pytree child (else structure)."""
        return is_number(value)

    # pytree protocol (registered per generated class)
    def _aux(self) -> tuple:
        """``(leaf names, static (name, value) pairs)``, found once per (immutable) object:
        every solve flattens its algorithm several times."""
        aux = self.__dict__.get("_aux_data")
        if aux is None:
            leaf_names = tuple(
                n
                for n, v in self._arguments.items()
                if self.is_leaf_value(v) and n not in self.static_names
            )
            statics = tuple(
                (n, freeze(v)) for n, v in self._arguments.items() if n not in leaf_names
            )
            aux = (leaf_names, statics)
            object.__setattr__(self, "_aux_data", aux)
        return aux

    def _tree_flatten(self):
        aux = self._aux()
        return [self._arguments[n] for n in aux[0]], aux

    def _tree_flatten_with_keys(self):
        aux = self._aux()
        return [(jax.tree_util.GetAttrKey(n), self._arguments[n]) for n in aux[0]], aux

    @classmethod
    def _tree_unflatten(cls, aux, children):
        leaf_names, statics = aux
        obj = object.__new__(cls)
        values = dict(zip(leaf_names, children))
        values.update({n: thaw(v) for n, v in statics})
        order = list(factory_signature(cls.factory).parameters)
        object.__setattr__(obj, "_arguments", {n: values[n] for n in order if n in values})
        return obj
