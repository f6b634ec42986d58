"""Composing optax-family algorithms, as pytrees: ``chain``, gradient accumulation
(``MultiSteps``), skipping non-finite updates (``ApplyIfFinite``), and optax's common
gradient transformations as parts of a chain (``ClipByGlobalNorm``, ``Clip``,
``AddDecayedWeights``, ``Scale``), their numbers leaves like every hyperparameter.

optax composes closures: ``optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))``
is static, so a sweep over ``lr`` and the clip norm compiles once per point. Composed here,
every number stays a leaf and the sweep compiles once::

    optsolve.chain(optsolve.ClipByGlobalNorm(1.0), optsolve.AdamW(1e-3, weight_decay=1e-4))
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from optsolve.backends.optax.backend import (
    OptaxAlgorithm,
    OptaxFamily,
    OptaxTransform,
    make_optax_algorithm,
    solve_optax,
)
from optsolve.backends.optax.model_parameters import on_model_parameters
from optsolve.solve_api.algorithm import check_replace
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.pytree import freeze, thaw
from optsolve.solve_api.registry import register_adapter, register_algorithm, register_backend

Member = OptaxFamily | optax.GradientTransformation | optax.MultiSteps

# optax's wrapper objects that are not GradientTransformations themselves but hold one
OPTAX_WRAPPERS = (optax.MultiSteps,)
_WRAPPED = BoundedCache(256)


def optax_transformation(obj: Any) -> Any:
    """The GradientTransformation of one of optax's wrapper objects (``optax.MultiSteps``),
    the same object for the same wrapper, so that solving with it twice compiles once;
    anything else unchanged."""
    if isinstance(obj, OPTAX_WRAPPERS):
        return _WRAPPED.get_or_make(obj, obj.gradient_transformation)
    return obj


def _check_member(owner: str, member: Any, where: str) -> None:
    if not isinstance(member, (OptaxFamily, optax.GradientTransformation) + OPTAX_WRAPPERS):
        raise TypeError(
            f"{owner}: {where} must be an optsolve optax-family algorithm or transformation "
            f"(optsolve.Adam(1e-3), optsolve.ClipByGlobalNorm(1.0), ...), an "
            f"optax.GradientTransformation or an optax.MultiSteps, got {type(member).__name__}."
        )


def _transformation(member: Member) -> optax.GradientTransformation:
    if isinstance(member, OptaxFamily):
        return member.transformation()
    return on_model_parameters(optax_transformation(member))


def _split(members: tuple) -> tuple[tuple, tuple]:
    """Pytree children (optsolve members) and frozen statics (raw optax members)."""
    children = tuple(m if isinstance(m, OptaxFamily) else None for m in members)
    statics = tuple(None if isinstance(m, OptaxFamily) else freeze(m) for m in members)
    return children, statics


def _merge(children: tuple, statics: tuple) -> tuple:
    return tuple(c if c is not None else thaw(s) for c, s in zip(children, statics))


class TransformPart(OptaxAlgorithm):
    """Base of optax's gradient transformations as parts of an algorithm: each makes no
    descent step of its own (``ClipByGlobalNorm`` alone would ascend), so ``solve`` runs it
    only inside a :class:`Chain`."""


def _refuse_part(problem, algorithm, options, loop=None):
    name = type(algorithm).__name__
    raise TypeError(
        f"solve: {name} is a part of an algorithm, not one: it transforms gradients but "
        f"makes no descent step of its own. Chain it with one, e.g. "
        f"optsolve.chain({name}(...), optsolve.Adam(1e-3))."
    )


def _part(factory, name: str, source: str) -> type:
    return make_optax_algorithm(factory, name, source, base=TransformPart)


register_backend(TransformPart, _refuse_part)


ClipByGlobalNorm = _part(optax.clip_by_global_norm, "ClipByGlobalNorm", "optax.clip_by_global_norm")
Clip = _part(optax.clip, "Clip", "optax.clip")
AddDecayedWeights = _part(
    optax.add_decayed_weights, "AddDecayedWeights", "optax.add_decayed_weights"
)
Scale = _part(optax.scale, "Scale", "optax.scale")
PARTS = (ClipByGlobalNorm, Clip, AddDecayedWeights, Scale)


class Chain(OptaxFamily):
    """Optax-family algorithms and transformations applied in turn (``optax.chain``), as a
    pytree: every number in every member is a leaf. Build it with :func:`chain`.

    Args:
      members: optsolve optax-family algorithms and parts (``optsolve.Adam(1e-3)``,
        ``optsolve.ClipByGlobalNorm(1.0)``, another chain), or raw optax transformations
        (static: a new one compiles anew).
    """

    def __init__(self, *members: Member):
        if not members:
            raise TypeError("chain: give at least one algorithm or transformation.")
        for i, member in enumerate(members):
            _check_member("chain", member, f"member {i}")
        object.__setattr__(self, "members", tuple(members))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Chain is immutable; use .replace(members=...).")

    def __repr__(self) -> str:
        return f"optsolve.chain({', '.join(map(repr, self.members))})"

    def replace(self, **changes: Any) -> Chain:
        """A copy with other ``members`` (a tuple)."""
        check_replace(self, changes, ("members",))
        return Chain(*changes.get("members", self.members))

    def transformation(self) -> optax.GradientTransformation:
        return optax.chain(*(_transformation(m) for m in self.members))


def chain(*members: Member) -> Chain:
    """``optax.chain`` of optsolve algorithms and transformations, as a pytree algorithm
    (see :class:`Chain`)."""
    return Chain(*members)


jax.tree_util.register_pytree_node(
    Chain,
    lambda c: (_split(c.members)[0], _split(c.members)[1]),
    lambda statics, children: _rebuilt(Chain, members=_merge(children, statics)),
)


def _rebuilt(cls, **fields):
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


class MultiSteps(OptaxFamily):
    """Gradient accumulation (``optax.MultiSteps``): the inner algorithm updates x once
    every ``every_k`` steps, with the mean of those steps' gradients; x stays put between.

    Args:
      inner: an optsolve optax-family algorithm (or a raw optax transformation).
      every_k: steps per update (an int: it fixes the structure).
    """

    def __init__(self, inner: Member, every_k: int):
        _check_member("MultiSteps", inner, "`inner`")
        if not isinstance(every_k, int) or isinstance(every_k, bool) or every_k < 1:
            raise TypeError(f"MultiSteps: `every_k` must be a positive int, got {every_k!r}.")
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "every_k", every_k)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("MultiSteps is immutable; use .replace(...).")

    def __repr__(self) -> str:
        return f"optsolve.MultiSteps({self.inner!r}, every_k={self.every_k})"

    def replace(self, **changes: Any) -> MultiSteps:
        """A copy with another ``inner`` or ``every_k``."""
        check_replace(self, changes, ("inner", "every_k"))
        return MultiSteps(changes.get("inner", self.inner), changes.get("every_k", self.every_k))

    def transformation(self) -> optax.GradientTransformation:
        return optax.MultiSteps(_transformation(self.inner), self.every_k).gradient_transformation()


class ApplyIfFinite(OptaxFamily):
    """Skip updates whose gradient is not finite (``optax.apply_if_finite``), up to
    ``max_consecutive_errors`` in a row. (On the full-batch path a non-finite gradient ends
    the run with FAILURE first; this serves data whose occasional batch overflows.)

    Args:
      inner: an optsolve optax-family algorithm (or a raw optax transformation).
      max_consecutive_errors: how many non-finite updates in a row are skipped.
    """

    def __init__(self, inner: Member, max_consecutive_errors: int):
        _check_member("ApplyIfFinite", inner, "`inner`")
        if not isinstance(max_consecutive_errors, int) or max_consecutive_errors < 0:
            raise TypeError(
                "ApplyIfFinite: `max_consecutive_errors` must be an int >= 0, got "
                f"{max_consecutive_errors!r}."
            )
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "max_consecutive_errors", max_consecutive_errors)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ApplyIfFinite is immutable; use .replace(...).")

    def __repr__(self) -> str:
        return (
            f"optsolve.ApplyIfFinite({self.inner!r}, "
            f"max_consecutive_errors={self.max_consecutive_errors})"
        )

    def replace(self, **changes: Any) -> ApplyIfFinite:
        """A copy with another ``inner`` or ``max_consecutive_errors``."""
        check_replace(self, changes, ("inner", "max_consecutive_errors"))
        return ApplyIfFinite(
            changes.get("inner", self.inner),
            changes.get("max_consecutive_errors", self.max_consecutive_errors),
        )

    def transformation(self) -> optax.GradientTransformation:
        return optax.apply_if_finite(_transformation(self.inner), self.max_consecutive_errors)


def _register_wrapper(cls, static_name: str) -> None:
    def flatten(obj):
        child, static = _split((obj.inner,))
        return (child[0],), (static[0], getattr(obj, static_name))

    def unflatten(aux, children):
        static, number = aux
        return _rebuilt(cls, inner=_merge(children, (static,))[0], **{static_name: number})

    jax.tree_util.register_pytree_node(cls, flatten, unflatten)


_register_wrapper(MultiSteps, "every_k")
_register_wrapper(ApplyIfFinite, "max_consecutive_errors")
for _cls in (Chain, MultiSteps, ApplyIfFinite):
    register_algorithm(_cls)
    register_backend(_cls, solve_optax)
# an optax.MultiSteps object runs as its transformation (optsolve.MultiSteps keeps every_k
# and the inner algorithm's numbers as leaves: a sweep over them compiles once)
register_adapter(optax.MultiSteps, lambda obj: OptaxTransform(optax_transformation(obj)))
