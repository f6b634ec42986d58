"""Models as x: train some leaves of x0 (a flax NNX module, an equinox module, any pytree),
carry the others, and thread the state f mutates (BatchNorm statistics, RNG counters).

``OptimizationProblem(f, model, trainable=...)`` declares which leaves are trained. Each leaf
of the model then has one role:

- *trained*: selected by the filter (it must be floating point);
- *carried*: an array outside the filter (BatchNorm statistics, RNG keys and counters, a
  frozen layer); it rides along in ``p`` and is never optimised;
- *static*: anything else outside the filter (an equinox activation function), part of the
  problem's structure.

``solve`` hands the backends the problem over the trained leaves alone (:func:`inner`): x is
the model with ``None`` in place of every other leaf (equinox's ``partition`` convention),
``p`` is :class:`ModelArgs` of the user's p and the carried leaves, and f is
:class:`ModelObjective`, which rebuilds the model around x before calling the user's f.
Where f changes carried leaves in place (an NNX BatchNorm in train mode, an NNX Dropout's
RNG counter), or returns them in equinox's idiom (x0 = ``(model, state)`` from
``eqx.nn.make_with_state``, f returning ``(loss, new_state)``), the JAX-native driver reads
them back after each step's evaluation and carries them to the next
(:meth:`ModelObjective.with_state`); the run's final carried leaves come back in
``Solution.model_state`` and :func:`outer` rebuilds the whole model.

Masks and labels over a model (an optax mask, ``ParameterGroups`` labels) may be given in
the structure the model library's users build: the whole model, the trained leaves, or for
NNX an ``nnx.State`` (:func:`fit_to`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.host import wants_grad_norm
from optsolve.solve_api.pytree import pytree_dataclass, replace, thaw, tree_spec

PyTree = Any
TRAIN, CARRY, STATIC = "train", "carry", "static"


def _nnx() -> Any:
    # flax is optional: a model can only be an NNX one where flax.nnx is already imported
    return sys.modules.get("flax.nnx")


def _eqx_state_type() -> type | None:
    # equinox is optional too: x0 can only hold an eqx.nn.State where equinox is imported
    module = sys.modules.get("equinox.nn")
    return getattr(module, "State", None)


def _is_eqx_state(node: Any) -> bool:
    state_type = _eqx_state_type()
    return state_type is not None and isinstance(node, state_type)


def _state_leaf_flags(x0: PyTree) -> list[bool]:
    """Whether each leaf of ``x0`` lies inside an ``eqx.nn.State``."""
    flags = []
    for node in jax.tree_util.tree_leaves(x0, is_leaf=_is_eqx_state):
        flags += [True] * len(jax.tree_util.tree_leaves(node)) if _is_eqx_state(node) else [False]
    return flags


def _holds_nnx_variables(x0: PyTree) -> bool:
    nnx = _nnx()
    if nnx is None:
        return False
    leaves = jax.tree_util.tree_leaves(x0, is_leaf=lambda n: isinstance(n, nnx.Variable))
    return any(isinstance(leaf, nnx.Variable) for leaf in leaves)


def _key_name(key: Any) -> Any:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return str(key)


def _is_array(leaf: Any) -> bool:
    return (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) or isinstance(
        leaf, (bool, int, float, complex)
    )


def _is_array_object(leaf: Any) -> bool:
    # a Python bool, int or float outside the filter is configuration (equinox's
    # BatchNorm(inference=False), read with `if`), so it stays structure, not a traced array
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


def _is_float(leaf: Any) -> bool:
    return _is_array(leaf) and jnp.issubdtype(jnp.result_type(leaf), jnp.floating)


def _selected(x0: PyTree, trainable: Any) -> list[bool]:
    """Whether ``trainable`` selects each leaf of ``x0`` (in ``tree_leaves`` order)."""
    if _holds_nnx_variables(x0):
        nnx = _nnx()
        predicate = nnx.filterlib.to_predicate(trainable)
        is_var = lambda n: isinstance(n, nnx.Variable)
        selected = []
        for path, node in jax.tree_util.tree_flatten_with_path(x0, is_leaf=is_var)[0]:
            chosen = bool(predicate(tuple(_key_name(k) for k in path), node))
            selected += [chosen] * len(jax.tree_util.tree_leaves(node))
        return selected
    if callable(trainable):
        # an eqx.nn.State holds what the forward pass updates (BatchNorm statistics): it is
        # carried, never trained, whatever the predicate says of its arrays
        return [
            bool(trainable(leaf)) and not in_state
            for leaf, in_state in zip(jax.tree_util.tree_leaves(x0), _state_leaf_flags(x0))
        ]
    mask_leaves, mask_def = jax.tree_util.tree_flatten(trainable)
    try:
        subtrees = mask_def.flatten_up_to(x0)
    except (ValueError, TypeError) as err:
        raise ValueError(
            "OptimizationProblem: `trainable` must be a filter (an nnx filter such as "
            "nnx.Param for a flax NNX model, or a predicate leaf -> bool such as "
            "eqx.is_inexact_array) or a pytree of bools with x0's structure (or a prefix of "
            f"it); got a pytree of structure {mask_def}."
        ) from err
    selected = []
    for flag, sub in zip(mask_leaves, subtrees):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"OptimizationProblem: a `trainable` mask holds bools, got {flag!r}.")
        selected += [bool(flag)] * len(jax.tree_util.tree_leaves(sub))
    return selected


def _names(path: tuple) -> tuple:
    return tuple(_key_name(k) for k in path)


def _nodes(tree: PyTree) -> list[tuple[tuple, Any]]:
    """``tree``'s NNX variables (whole) and other leaves, None included, by their path's
    names: a module's ``.hidden.kernel`` and an ``nnx.State``'s ``['hidden']['kernel']``
    are both ``('hidden', 'kernel')``."""
    nnx = _nnx()
    is_node = lambda n: n is None or (nnx is not None and isinstance(n, nnx.Variable))
    return [
        (_names(path), node)
        for path, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_node)[0]
    ]


def fit_to(tree: PyTree, x: PyTree, what: str) -> PyTree:
    """``tree`` (a mask, labels, updates) in the structure of ``x`` (the trained leaves of
    a model, None elsewhere, or any pytree), matched leaf by leaf.

    Args:
      tree: x's structure or a prefix of it; a tree with more leaves than x (the whole
        model, where x has None for the leaves it does not train); or another structure
        with the same names (an ``nnx.State`` of a module, a dict): matched by path, a
        value for a subtree (``{'hidden': False}``) covering every leaf under it.
      x: the tree whose structure is wanted.
      what: the argument's name, for errors.

    Returns:
      ``tree``'s values in x's structure (None where x has None); a prefix of x unchanged.
    """
    slots, treedef = jax.tree_util.tree_flatten(x, is_leaf=lambda n: n is None)
    try:
        per_slot = treedef.flatten_up_to(tree)
    except (ValueError, TypeError):
        per_slot = None
    if per_slot is not None:
        if not any(slot is None for slot in slots):
            return tree
        return treedef.unflatten(
            [None if slot is None else value for slot, value in zip(slots, per_slot)]
        )
    if jax.tree_util.tree_structure(x).num_leaves and jax.tree_util.tree_structure(
        tree
    ) == jax.tree_util.tree_structure(True):
        return tree  # one value for everything: a prefix optax broadcasts
    entries = dict(_nodes(tree))
    fitted = []
    for names, node in _nodes(x):
        node_leaves, node_def = jax.tree_util.tree_flatten(node)
        if not node_leaves:
            fitted.append(node)
            continue
        key = next((names[:i] for i in range(len(names), -1, -1) if names[:i] in entries), None)
        if key is None:
            raise ValueError(
                f"{what} has no entry for x0.{'.'.join(map(str, names))}, which is trained; "
                "give it the structure of the model, of the trained leaves, or (NNX) of "
                f"nnx.state(model, filter). Its entries: {sorted(map(str, entries))[:4]}..."
            )
        values = jax.tree_util.tree_leaves(entries[key])
        if len(values) == 1 and len(node_leaves) > 1:
            values = values * len(node_leaves)
        if len(values) != len(node_leaves):
            raise ValueError(
                f"{what}: its entry for x0.{'.'.join(map(str, names))} holds {len(values)} "
                f"values where the model has {len(node_leaves)} arrays."
            )
        fitted.append(node_def.unflatten(values))
    is_node = lambda n: n is None or (_nnx() is not None and isinstance(n, _nnx().Variable))
    return jax.tree_util.tree_structure(x, is_leaf=is_node).unflatten(fitted)


def as_nnx_state(x: PyTree) -> PyTree:
    """The trained leaves of an NNX model (the module with None elsewhere) as the
    ``nnx.State`` that ``nnx.Optimizer`` hands optax (``nnx.state(model, wrt)``)."""
    nnx = _nnx()
    return nnx.state(x, lambda path, variable: bool(jax.tree_util.tree_leaves(variable)))


def holds_nnx_variables(x: PyTree) -> bool:
    """Whether ``x`` is (or holds) a flax NNX module's variables."""
    return _holds_nnx_variables(x)


class Split(NamedTuple):
    """The roles of a model's leaves (hashable: it keys compiled code). ``statics`` holds
    the static leaves' values, in order."""

    treedef: Any
    roles: tuple[str, ...]
    statics: tuple
    state: tuple[int, int, Any] | None = None
    """Where x0 holds an ``eqx.nn.State``: the span of its leaves among the carried ones
    (start, stop) and its structure, which f's returned state must have."""

    def trained(self, model: PyTree, leaves: list | None = None) -> PyTree:
        """The model with None in place of every leaf that is not trained (``leaves``: the
        model's, where already flattened)."""
        leaves = self.treedef.flatten_up_to(model) if leaves is None else leaves
        return self.treedef.unflatten(
            [leaf if role == TRAIN else None for leaf, role in zip(leaves, self.roles)]
        )

    def carried(self, model: PyTree, leaves: list | None = None) -> tuple:
        """The carried leaves of ``model`` (``leaves``: its leaves, where already flattened)."""
        leaves = self.treedef.flatten_up_to(model) if leaves is None else leaves
        return tuple(
            jnp.asarray(leaf) if isinstance(leaf, (bool, int, float)) else leaf
            for leaf, role in zip(leaves, self.roles)
            if role == CARRY
        )

    def combine(self, trained: PyTree, carried: tuple) -> PyTree:
        """The whole model from its trained leaves (as :meth:`trained` gives them) and its
        carried ones."""
        trained_leaves = iter(self.treedef.flatten_up_to(trained))
        carried_leaves, static_leaves = iter(carried), iter(self.statics)
        leaves = []
        for role in self.roles:
            leaf = next(trained_leaves)
            leaves.append(
                leaf
                if role == TRAIN
                else next(carried_leaves)
                if role == CARRY
                else next(static_leaves)
            )
        return self.treedef.unflatten(leaves)

    @property
    def carries(self) -> bool:
        return CARRY in self.roles

    def value_and_state(self, out: Any, carried: tuple) -> tuple[Any, tuple]:
        """f's value alone, and ``carried`` with the state f returned (equinox's idiom:
        ``(value, new_state)`` for an x0 that holds an ``eqx.nn.State``) put in place."""
        if self.state is None or not (
            isinstance(out, tuple) and len(out) == 2 and _is_eqx_state(out[1])
        ):
            return out, carried
        start, stop, structure = self.state
        leaves, treedef = jax.tree_util.tree_flatten(out[1])
        if treedef != structure:
            raise ValueError(
                "solve: f returned an eqx.nn.State of another structure than x0's "
                f"({treedef} against {structure}); return the state the model's layers "
                "gave back for the state f received."
            )
        return out[0], carried[:start] + tuple(leaves) + carried[stop:]


def _leaf_names(x0: PyTree) -> list[str]:
    return [
        "x0" + jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(x0)[0]
    ]


def split_of(x0: PyTree, trainable: Any) -> Split:
    """The roles of ``x0``'s leaves under the filter ``trainable`` (a ``Frozen`` mask is
    unwrapped), with a clear error for a selected leaf that cannot be trained."""
    trainable = thaw(trainable)
    leaves, treedef = jax.tree_util.tree_flatten(x0)
    selected = _selected(x0, trainable)
    roles, statics = [], []
    for name, leaf, chosen in zip(_leaf_names(x0), leaves, selected):
        if chosen and not _is_float(leaf):
            kind = str(jnp.result_type(leaf)) if _is_array(leaf) else type(leaf).__name__
            raise TypeError(
                f"OptimizationProblem: `trainable`={trainable!r} selects leaf {name}, which "
                f"is {kind}; only floating-point arrays can be trained. Narrow the filter "
                "(e.g. nnx.Param for a flax NNX model, eqx.is_inexact_array for equinox)."
            )
        roles.append(TRAIN if chosen else CARRY if _is_array_object(leaf) else STATIC)
        if roles[-1] == STATIC:
            statics.append(leaf)
    if TRAIN not in roles:
        raise ValueError(
            f"OptimizationProblem: `trainable`={trainable!r} selects no leaf of x0; nothing "
            "would be trained."
        )
    return Split(treedef, tuple(roles), tuple(statics), _state_span(x0, roles))


def _state_span(x0: PyTree, roles: list[str]) -> tuple[int, int, Any] | None:
    """Where the one ``eqx.nn.State`` of ``x0`` lies among its carried leaves."""
    states = [
        node for node in jax.tree_util.tree_leaves(x0, is_leaf=_is_eqx_state) if _is_eqx_state(node)
    ]
    if not states:
        return None
    if len(states) > 1:
        raise ValueError(
            f"OptimizationProblem: x0 holds {len(states)} eqx.nn.State objects; give one, "
            "as eqx.nn.make_with_state makes it: x0 = (model, state)."
        )
    flags = _state_leaf_flags(x0)
    carried_flags = [flag for flag, role in zip(flags, roles) if role == CARRY]
    if sum(carried_flags) != sum(flags):
        raise ValueError(
            "OptimizationProblem: `trainable` selects leaves of the eqx.nn.State in x0; its "
            "arrays are updated by the forward pass, not by gradients: leave them out."
        )
    if not any(carried_flags):
        return None
    start = carried_flags.index(True)
    return start, start + sum(carried_flags), jax.tree_util.tree_structure(states[0])


def untrainable_hint(x0: PyTree) -> str | None:
    """Without a ``trainable`` filter: a message naming the leaves of ``x0`` that should not
    be trained (NNX variables other than ``nnx.Param``: BatchNorm statistics, RNG state; an
    ``eqx.nn.State``), or None."""
    if any(_state_leaf_flags(x0)):
        return (
            "OptimizationProblem: x0 holds an eqx.nn.State (BatchNorm statistics), which "
            "the forward pass updates, not gradients; declare what is trained with "
            "trainable=eqx.is_inexact_array: the state is then carried, and f returns "
            "(loss, new_state) to update it."
        )
    if not _holds_nnx_variables(x0):
        return None
    nnx = _nnx()
    is_var = lambda n: isinstance(n, nnx.Variable)
    others = [
        f"x0{jax.tree_util.keystr(path)} ({type(node).__name__})"
        for path, node in jax.tree_util.tree_flatten_with_path(x0, is_leaf=is_var)[0]
        if is_var(node) and not isinstance(node, nnx.Param) and jax.tree_util.tree_leaves(node)
    ]  # a trained part's None: not there
    if not others:
        return None
    shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
    return (
        f"OptimizationProblem: x0 holds NNX variables that are not parameters: {shown}. "
        "Training them as parameters would be silently wrong (BatchNorm statistics are "
        "updated by the forward pass, not by gradients); declare what is trained with "
        "trainable=nnx.Param (they are then carried, and updated where f updates them), "
        "or trainable=nnx.Variable to train every variable."
    )


@pytree_dataclass
class ModelArgs:
    """The ``p`` of a problem over a model's trained leaves: the user's p and the model's
    carried leaves."""

    p: PyTree
    carried: tuple


class ModelObjective:
    """The user's ``f(model, p[, batch])`` as a function of the trained leaves and
    :class:`ModelArgs`. Equal to another one of the same ``f`` and split, so that repeated
    solves share compiled code."""

    def __init__(self, f: Callable[..., Any], split: Split):
        self.f, self.split = f, split

    def __call__(self, trained: PyTree, args: ModelArgs, *batch: Any) -> Any:
        out = self.f(self.split.combine(trained, args.carried), args.p, *batch)
        return self.split.value_and_state(out, args.carried)[0]

    def with_state(self, trained: PyTree, args: ModelArgs, *batch: Any) -> tuple[Any, tuple]:
        """f's value and the carried leaves as f left them (changed in place by an NNX
        module's forward pass, or returned beside the value as an ``eqx.nn.State``)."""
        model = self.split.combine(trained, args.carried)
        out = self.f(model, args.p, *batch)
        return self.split.value_and_state(out, self.split.carried(model))

    def mutates(self, trained: PyTree, args: ModelArgs, *batch: Any) -> bool:
        """Whether f changes a carried leaf (decided at trace time: a leaf read back after f
        is another object than the one passed in)."""
        if not self.split.carries:
            return False
        changed = []

        def probe(trained, args, *batch):
            _, after = self.with_state(trained, args, *batch)
            changed.append(any(a is not b for a, b in zip(after, args.carried)))
            return 0.0

        jax.eval_shape(probe, trained, args, *batch)
        return changed[0]

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ModelObjective) and other.f == self.f and other.split == self.split

    def __hash__(self) -> int:
        return hash((ModelObjective, self.f, self.split))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"ModelObjective({self.f!r})"


class ModelCallback:
    """The user's callback, given the whole model: the trained leaves at the iterate with
    the carried ones the run holds there (:class:`ModelPoint`), or the start's."""

    def __init__(self, callback: Callable[..., Any], split: Split, carried: tuple):
        self.callback, self.split, self.carried = callback, split, carried
        self.with_norm = wants_grad_norm(callback)

    def __call__(self, iteration, x, objective, *grad_norm):
        model = (
            self.split.combine(x.trained, x.carried)
            if isinstance(x, ModelPoint)
            else self.split.combine(x, self.carried)
        )
        return self.callback(iteration, model, objective, *(grad_norm if self.with_norm else ()))

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, ModelCallback)
            and other.callback == self.callback
            and other.split == self.split
            and all(a is b for a, b in zip(other.carried, self.carried))
        )

    def __hash__(self) -> int:
        return hash((ModelCallback, self.callback, self.split))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"ModelCallback({self.callback!r})"


class ModelPoint(NamedTuple):
    """An iterate of a run that carries model state: the trained leaves and the carried
    ones that go with them (what the driver hands the callback)."""

    trained: PyTree
    carried: tuple


def state_mutation_error(name: str) -> ValueError:
    """The error for a model whose f changes its carried leaves, given to an algorithm that
    cannot carry them from step to step (``name`` says which)."""
    from optsolve.solve_api.registry import algorithm_classes

    able_classes = [c for c in algorithm_classes() if c.threads_model_state]
    families = sorted({c.family for c in able_classes})
    examples = ", ".join(c.__name__ for c in able_classes[:4])
    able = f"the {' and '.join(families)} family (e.g. {examples}, ...)"
    return ValueError(
        f"solve: f changes the model's state in place (BatchNorm statistics in train mode, "
        f"a Dropout's RNG counter), and {name} cannot carry it from step to step: it "
        "evaluates f more than once per step. Evaluate the model in eval mode inside f "
        "(deterministic, e.g. nnx.BatchNorm(use_running_average=True), nnx.Dropout("
        f"deterministic=True)), or use an algorithm that evaluates f once per step: {able} "
        "(without a line search)."
    )


_SPLITS = BoundedCache(256)


def cached_split(x0: PyTree, trainable: Any, flat: tuple | None = None) -> Split:
    """:func:`split_of`, once per (structure, leaf dtypes, filter); ``flat``: x0's
    ``(leaves, treedef)``, where already flattened."""
    leaves, treedef = jax.tree_util.tree_flatten(x0) if flat is None else flat
    key = (treedef, tuple(map(_leaf_key, leaves)), trainable)
    return _SPLITS.get_or_make(key, lambda: split_of(x0, trainable))


def _leaf_key(leaf: Any) -> Any:
    # an array by its dtype; anything else may be a static leaf, whose value the split
    # holds, so by its value (an unhashable one never matches)
    if _is_array_object(leaf):
        return leaf.dtype
    try:
        hash(leaf)
    except TypeError:
        return object()
    return type(leaf), leaf


def inner(problem: Any, resume: Any = None) -> tuple[Any, Split | None, Any]:
    """The problem over the trained leaves of ``problem`` (itself where it has no
    ``trainable``), its split, and ``resume`` (a Solution of the whole model) as a resume
    point of the inner problem, whose carried leaves start the run."""
    if problem.trainable is None:
        return problem, None, resume
    leaves, treedef = jax.tree_util.tree_flatten(problem.x0)  # once: a model's runs in Python
    split = cached_split(problem.x0, problem.trainable, (leaves, treedef))
    try:
        carried = split.carried(problem.x0, leaves) if resume is None else split.carried(resume.x)
    except (ValueError, TypeError) as err:
        raise ValueError(
            "solve: `resume` holds a model of another structure than the problem's x0 (a "
            "module switched to eval mode in place changes its structure: evaluate a copy, "
            "nnx.clone(sol.x)); resume a run of the same problem."
        ) from err
    args = ModelArgs(problem.p, carried)
    if resume is not None:
        resume = replace(resume, x=split.trained(resume.x))
    model_problem = problem.derived(
        f=ModelObjective(problem.f, split),
        x0=split.trained(problem.x0, leaves),
        p=args,
        trainable=None,
    )
    return model_problem, split, resume


_MUTATES = BoundedCache(256)


def mutates(problem: Any) -> bool:
    """Whether the objective of :func:`inner`'s problem changes the model's carried leaves
    (traces f abstractly, once per objective and shapes)."""
    key = (problem.f, tree_spec((problem.x0, problem.p)))
    return _MUTATES.get_or_make(key, lambda: problem.f.mutates(problem.x0, problem.p))


def outer(split: Split | None, problem: Any, solution: Any) -> Any:
    """The inner problem's ``solution`` as a Solution of the whole model: x rebuilt with
    the carried leaves the run ended with (the start's where f changes none)."""
    if split is None:
        return solution
    carried = solution.model_state
    if carried is None:
        carried = problem.p.carried
    return replace(solution, x=split.combine(solution.x, carried), model_state=None)
