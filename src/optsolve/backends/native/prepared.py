"""Compiled calls over a run's fixed inputs flattened once, and the carry passed between
them as its leaves: what the host side of an eager run (full batch in chunks, or training
on data) dispatches at every call.

A model's structure (nnx modules in x and in the optimizer's state) is a pytree whose
flattening and rebuilding run in Python; flattened once per run, each call passes lists of
arrays, whose flattening is JAX's own.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.pytree import flatten_inputs


@jax.tree_util.register_pytree_node_class
class FlatCarry:
    """The driver's carry as its leaves, its structure static: what the host passes between
    compiled calls."""

    def __init__(self, leaves: list, treedef: Any):
        self.leaves, self.treedef = list(leaves), treedef

    def tree_flatten(self):
        return self.leaves, self.treedef

    @classmethod
    def tree_unflatten(cls, treedef, leaves):
        return cls(leaves, treedef)

    @classmethod
    def of(cls, carry: Any) -> FlatCarry:
        return cls(*jax.tree_util.tree_flatten(carry))

    def unpack(self) -> Any:
        """The carry (inside a compiled call; on the host only where a run stopped)."""
        return jax.tree_util.tree_unflatten(self.treedef, self.leaves)


@jax.tree_util.register_pytree_node_class
class SharingLeaves:
    """A tree whose leaves that are some carry's own (the same traced values: a Solution's x
    and optimizer state are the carry's) are left out of a compiled call's outputs, which
    would copy each into a buffer of its own; the host takes them from the carry.

    ``where[i]`` is the carry leaf that is the tree's leaf i, or -1 for one of its own."""

    def __init__(self, own: list, static: tuple):
        self.own, self.static = list(own), static

    def tree_flatten(self):
        return self.own, self.static

    @classmethod
    def tree_unflatten(cls, static, own):
        return cls(own, static)

    @classmethod
    def of(cls, tree: Any, carry: FlatCarry) -> SharingLeaves:
        """``tree`` with its leaves that are ``carry``'s own shared (inside a compiled call)."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        index = {id(leaf): i for i, leaf in enumerate(carry.leaves)}
        where = tuple(index.get(id(leaf), -1) for leaf in leaves)
        return cls([leaf for leaf, w in zip(leaves, where) if w < 0], (treedef, where))

    def unpack(self, carry: FlatCarry) -> Any:
        """The tree, its shared leaves taken from ``carry`` (the call's carry output)."""
        treedef, where = self.static
        own = iter(self.own)
        return jax.tree_util.tree_unflatten(
            treedef, [next(own) if w < 0 else carry.leaves[w] for w in where]
        )


def zeros_of(spec: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros of ``spec``'s shape and dtype (a typed PRNG key included), placed once."""
    if jax.dtypes.issubdtype(spec.dtype, jax.dtypes.extended):  # typed PRNG keys
        return (
            jax.random.key(0, impl=spec.dtype._impl)
            if spec.shape == ()
            else jax.random.split(jax.random.key(0, impl=spec.dtype._impl), spec.shape[0])
        )
    # numpy's zeros, placed once: jnp.zeros would compile a kernel per new shape
    return jax.device_put(np.zeros(spec.shape, spec.dtype))


_PREPARED = BoundedCache(64)  # each entry holds compiled code


class Prepared:
    """The run's fixed arguments (problem, algorithm, options), flattened once per run, not
    once per call, which keeps each dispatch cheap."""

    def __init__(self, make_solver, problem, algorithm, options):
        self.make_solver = make_solver
        self.leaves, self.treedef = flatten_inputs(problem, algorithm, options)

    def __call__(self, body, *static, compiler_options: dict | None = None):
        """``body(solver, problem, options, *static, *args)`` compiled (with XLA's
        ``compiler_options`` where given), with the fixed arguments bound: a function of
        ``*args``. Compiled functions are cached by the fixed arguments' structure."""
        treedef, make_solver = self.treedef, self.make_solver
        key = (
            body,
            make_solver,
            treedef,
            static,
            None if compiler_options is None else tuple(sorted(compiler_options.items())),
        )

        def compile_run():
            def run(leaves, *args):
                problem, algorithm, options = jax.tree_util.tree_unflatten(treedef, leaves)
                solver = make_solver(algorithm, problem)
                return body(solver, problem, options, *static, *args)

            return jax.jit(run, compiler_options=compiler_options)

        return functools.partial(_PREPARED.get_or_make(key, compile_run), self.leaves)
