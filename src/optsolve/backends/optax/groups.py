"""Parameter groups: different optax algorithms (or none: frozen) for parts of x.

Built on ``optax.multi_transform``; the groups' algorithms stay pytree leaves, so changing a
group's learning rate does not recompile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax

from optsolve.backends.optax.backend import OptaxFamily, solve_optax
from optsolve.backends.optax.compose import OPTAX_WRAPPERS, optax_transformation
from optsolve.solve_api.algorithm import check_replace
from optsolve.solve_api.pytree import freeze, thaw
from optsolve.solve_api.registry import register_algorithm, register_backend
from optsolve.solve_api.trainable import fit_to

PyTree = Any
Group = OptaxFamily | optax.GradientTransformation | optax.MultiSteps | None


def _is_label_function(labels: Any) -> bool:
    # a model (an NNX or equinox module) is callable too, but it is a pytree with leaves
    return callable(labels) and jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(labels))


class ParameterGroups(OptaxFamily):
    """Route each part of ``x`` to its own algorithm, by a label per leaf.

    Args:
      groups: label -> algorithm: an optsolve optax algorithm (``optsolve.Adam(1e-4)``), a raw
        ``optax.GradientTransformation``, or None to freeze that part (zero updates).
      labels: either a pytree of labels with the structure of ``x`` (or a prefix of it; for
        a model trained with ``trainable``, the whole model's structure, e.g. a module with
        a label per leaf, or its trained leaves', for NNX an ``nnx.State`` such as
        ``jax.tree.map(label_of, nnx.state(model, nnx.Param))``), or a function of a
        leaf's path string (``jax.tree_util.keystr``, e.g. ``"['encoder']['w']"``)
        returning its label.

    Example:
      >>> groups = optsolve.ParameterGroups(
      ...     {"body": optsolve.Adam(1e-4), "head": optsolve.SGD(1e-2), "frozen": None},
      ...     labels=lambda path: "head" if "head" in path else "body")
    """

    def __init__(self, groups: Mapping[str, Group], labels: Callable[[str], str] | PyTree):
        if not isinstance(groups, Mapping) or not groups:
            raise TypeError(
                "ParameterGroups: `groups` must be a non-empty mapping label -> algorithm, got "
                f"{groups!r}."
            )
        for name, alg in groups.items():
            if alg is not None and not isinstance(
                alg, (OptaxFamily, optax.GradientTransformation) + OPTAX_WRAPPERS
            ):
                raise TypeError(
                    f"ParameterGroups: group {name!r} must be an optsolve optax algorithm, an "
                    "optax.GradientTransformation, an optax.MultiSteps or None (frozen), got "
                    f"{type(alg).__name__}."
                )
        object.__setattr__(self, "groups", dict(groups))
        object.__setattr__(self, "labels", labels)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ParameterGroups is immutable; build a new one.")

    def __repr__(self) -> str:
        return f"ParameterGroups({self.groups!r}, labels={self.labels!r})"

    def replace(self, **changes: Any) -> ParameterGroups:
        """A copy with other ``groups`` or ``labels``."""
        check_replace(self, changes, ("groups", "labels"))
        return ParameterGroups(
            changes.get("groups", self.groups), changes.get("labels", self.labels)
        )

    def _label_tree(self, x: PyTree) -> PyTree:
        if _is_label_function(self.labels):
            labels = jax.tree_util.tree_map_with_path(
                lambda path, _: self.labels(jax.tree_util.keystr(path)), x
            )
        else:
            labels = fit_to(self.labels, x, "ParameterGroups: `labels`")
        unknown = set(jax.tree_util.tree_leaves(labels)) - set(self.groups)
        if unknown:
            raise ValueError(
                f"ParameterGroups: label(s) {sorted(map(str, unknown))} have no group; groups "
                f"are {sorted(self.groups)}."
            )
        return labels

    def transformation(self) -> optax.GradientTransformation:
        """``optax.multi_transform`` of the groups' transformations."""
        transforms = {}
        for name, alg in self.groups.items():
            if alg is None:
                transforms[name] = optax.set_to_zero()
            elif isinstance(alg, OptaxFamily):
                transforms[name] = alg.transformation()
            else:
                transforms[name] = optax_transformation(alg)
        return optax.multi_transform(transforms, self._label_tree)


def _flatten(groups: ParameterGroups):
    names = tuple(groups.groups)
    children = tuple(
        alg if isinstance(alg, OptaxFamily) else None for alg in groups.groups.values()
    )
    statics = tuple(None if isinstance(alg, OptaxFamily) else alg for alg in groups.groups.values())
    return children, (names, tuple(freeze(s) for s in statics), freeze(groups.labels))


def _unflatten(aux, children) -> ParameterGroups:
    names, statics, labels = aux
    obj = object.__new__(ParameterGroups)
    merged = {n: c if c is not None else thaw(s) for n, c, s in zip(names, children, statics)}
    object.__setattr__(obj, "groups", merged)
    object.__setattr__(obj, "labels", thaw(labels))
    return obj


jax.tree_util.register_pytree_node(ParameterGroups, _flatten, _unflatten)
register_algorithm(ParameterGroups)
register_backend(ParameterGroups, solve_optax)
