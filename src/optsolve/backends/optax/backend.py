"""The optax family: every optax optimizer as an optsolve algorithm, and raw transformations.

One programmatic wrapper (:func:`make_optax_algorithm`) turns an optax factory such as
``optax.adam`` into an algorithm class with the factory's signature and docstring whose
numeric hyperparameters are pytree leaves: a jitted function taking ``Adam(lr)`` compiles
once for any ``lr``. Any numeric hyperparameter may be a schedule (a callable of the step
count); those optax does not schedule natively go through ``optax.inject_hyperparams``.

Transformations that need more than a gradient (line searches, ``optax.lbfgs``,
``optax.polyak_sgd``, ``optax.contrib.sophia``) get ``value``, ``grad``, ``value_fn`` or
``obj_fn`` from ``solve``: the first set of extra arguments the transformation accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from optsolve.backends.native.chunked import run_iterative
from optsolve.backends.native.in_memory import run_in_memory_compiled
from optsolve.backends.native.objective import Objective
from optsolve.backends.native.protocol import GradientStepSolver, Step, SteppingSolver, Update
from optsolve.backends.native.training import run_training
from optsolve.backends.optax.factory_arguments import (
    FactoryArguments,
    float_valued_names,
    is_number,
)
from optsolve.backends.optax.model_parameters import on_model_parameters
from optsolve.backends.optax.schedules import Schedule
from optsolve.solve_api.algorithm import Algorithm, check_replace
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.problem import OptimizationProblem
from optsolve.solve_api.registry import (
    register_adapter,
    register_algorithm,
    register_backend,
)
from optsolve.solve_api.solution import Solution

PyTree = Any


def _is_leaf_value(value: Any) -> bool:
    """Numbers that are pytree leaves: floats and arrays, and the pytree schedules (whose
    floats are leaves). Ints and bools fix structure."""
    return is_number(value) or isinstance(value, Schedule)


class OptaxFamily(Algorithm):
    """The capability traits every optax-family algorithm shares (its base class)."""

    family: ClassVar[str] = "optax"
    unrollable: ClassVar[bool] = True
    resumable: ClassVar[bool] = True
    records_history: ClassVar[bool] = True
    takes_data: ClassVar[bool] = True
    compiled_driver: ClassVar[bool] = True
    threads_model_state: ClassVar[bool] = True

    def unrolls_by_forward_passes(self) -> bool:
        """Where the transformation runs a line search: its while loop has no transpose
        (:mod:`~optsolve.solve_api.forward_passes`)."""
        return _linesearch_in(self.transformation())

    def init(self, params: PyTree) -> PyTree:
        """optax's ``init``, so that the algorithm works inside ``optax.chain`` (which
        makes the chain a static optax transformation)."""
        return self.transformation().init(params)

    def update(
        self, updates: PyTree, state: PyTree, params: PyTree = None, **extra_args: Any
    ) -> tuple[PyTree, PyTree]:
        """optax's ``update`` (see :meth:`init`)."""
        tx = optax.with_extra_args_support(self.transformation())
        return tx.update(updates, state, params, **extra_args)


class OptaxAlgorithm(FactoryArguments, OptaxFamily):
    """An optax optimizer as an optsolve algorithm (base of the generated classes).

    Hyperparameters are the optax factory's arguments, readable as attributes
    (``Adam(1e-3).learning_rate``); ``replace(**changes)`` returns a new algorithm.
    """

    factory: ClassVar[Callable[..., optax.GradientTransformation]]
    schedulable: ClassVar[frozenset[str]] = frozenset()
    native_schedules: ClassVar[frozenset[str]] = frozenset()
    is_leaf_value = staticmethod(_is_leaf_value)  # numbers and the pytree schedules

    @property
    def hyperparams(self) -> dict[str, Any]:
        """The factory's arguments, by name (a copy)."""
        return dict(self._arguments)

    def replace(self, **changes: Any) -> OptaxAlgorithm:
        """A copy with some hyperparameters changed."""
        check_replace(self, changes, self._arguments)
        return type(self)(**{**self._arguments, **changes})

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._arguments.items())
        return f"{type(self).__name__}({args})"

    def unrolling_hazards(self) -> list[str]:
        """``eps_root=0``: the step divides by sqrt(nu), whose derivative at nu = 0 (a
        gradient entry that has been exactly zero, a parameter f ignores) is infinite."""
        eps_root = self._arguments.get("eps_root")
        if (
            eps_root is None
            or isinstance(eps_root, jax.core.Tracer)
            or callable(eps_root)
            or float(eps_root) != 0.0
        ):
            return []
        return [
            f"{type(self).__name__} with eps_root=0 takes sqrt(nu), whose derivative is "
            "infinite where nu = 0 (a gradient entry that has stayed exactly zero), so "
            "unrolled derivatives can be NaN; pass eps_root > 0 (e.g. 1e-8)."
        ]

    def transformation(self) -> optax.GradientTransformation:
        """The optax transformation for the current hyperparameters (traced or concrete)."""
        hp = self._arguments
        injected = [
            name
            for name, value in hp.items()
            if callable(value) and name in self.schedulable and name not in self.native_schedules
        ]
        if not injected:
            return type(self).factory(**hp)
        # optax schedules only some arguments natively; inject_hyperparams schedules any.
        scheduled = {n for n, v in hp.items() if callable(v) and n in self.schedulable}
        static = tuple(n for n, v in hp.items() if not _is_leaf_value(v) and n not in scheduled)
        return optax.inject_hyperparams(type(self).factory, static_args=static)(**hp)


_NUMERIC_MARKERS = ("float", "numpy.number", "Numeric", "ScalarOrSchedule")


def _schedulable_names(factory: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str]]:
    """(arguments that are numbers and so may be scheduled, those optax schedules itself)."""
    schedulable, native = set(), set()
    for name, param in inspect.signature(factory).parameters.items():
        annotation = str(param.annotation)
        numeric_default = isinstance(param.default, float) or (
            isinstance(param.default, int) and not isinstance(param.default, bool)
        )
        if "mask" in name or "dtype" in name:
            continue
        if annotation in ("<class 'int'>", "int", "<class 'bool'>", "bool"):
            continue
        if numeric_default or any(m in annotation for m in _NUMERIC_MARKERS):
            schedulable.add(name)
            if "Callable" in annotation:
                native.add(name)
    return frozenset(schedulable), frozenset(native)


# Factories whose step-size estimates leave float16's range (6e-5 to 65504): their first
# estimate d ~ 1e-6 squared underflows, 0/0 makes the first step NaN. bfloat16 has float32's
# range and works.
_NOT_IN_FLOAT16 = frozenset({"dadapt_adamw", "prodigy"})


def make_optax_algorithm(
    factory: Callable[..., optax.GradientTransformation],
    name: str,
    source: str,
    base: type | None = None,
) -> type[OptaxAlgorithm]:
    """Generate the algorithm class for one optax factory (``source`` names it in docs),
    registered as an algorithm; with ``base`` (a subclass of OptaxAlgorithm), a class of
    that base that ``solve`` does not run by itself (a part of a chain)."""
    signature = inspect.signature(factory)
    schedulable, native = _schedulable_names(factory)

    def __init__(self, *args, **kwargs):
        OptaxAlgorithm.__init__(self, *args, **kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    __init__.__signature__ = signature.replace(
        parameters=params + list(signature.parameters.values()), return_annotation=None
    )
    header = (
        f"``{source}`` as an optsolve algorithm: an immutable pytree whose numeric "
        "hyperparameters are leaves (new values reuse compiled code); any numeric "
        "hyperparameter may be a schedule, a callable of the step count.\n\n"
        f"Example:\n  >>> sol = optsolve.solve(problem, optsolve.{name}(...), maxiters=100)\n\n"
        f"The arguments are those of ``{source}``, whose documentation follows.\n\n"
    )
    cls = type(
        name,
        (base or OptaxAlgorithm,),
        {
            "factory": staticmethod(factory),
            "schedulable": schedulable,
            "native_schedules": native,
            "float_valued": float_valued_names(factory),
            "float_dtypes": (
                ("bfloat16", "float32", "float64")
                if source.rsplit(".", 1)[-1] in _NOT_IN_FLOAT16
                else OptaxAlgorithm.float_dtypes
            ),
            "__init__": __init__,
            "__doc__": header + inspect.cleandoc(factory.__doc__ or ""),
            "__module__": "optsolve",
            "__qualname__": name,
        },
    )
    cls.__signature__ = signature
    __init__.__doc__ = cls.__doc__
    __init__.__qualname__ = f"{name}.__init__"
    __init__.__module__ = "optsolve"
    jax.tree_util.register_pytree_with_keys(
        cls, cls._tree_flatten_with_keys, cls._tree_unflatten, cls._tree_flatten
    )
    if base is None:
        register_algorithm(cls)
        register_backend(cls, solve_optax)
    return cls


class OptaxTransform(OptaxFamily):
    """A raw ``optax.GradientTransformation`` (chains, clipping, masks, line searches).

    The transformation is static: it is a closure, so a new transformation object means a
    new compilation. Prefer the generated classes (``optsolve.Adam``, ...) to sweep
    hyperparameters without recompiling.
    """

    def __init__(self, transformation: optax.GradientTransformation):
        if not isinstance(transformation, optax.GradientTransformation):
            raise TypeError(
                "OptaxTransform: `transformation` must be an optax.GradientTransformation, got "
                f"{type(transformation).__name__}."
            )
        object.__setattr__(self, "_transformation", transformation)

    def transformation(self) -> optax.GradientTransformation:
        return on_model_parameters(self._transformation)  # NNX masks as nnx.State

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"OptaxTransform is immutable; use .replace({name}=...).")

    def replace(self, **changes: Any) -> OptaxTransform:
        """A copy holding another ``transformation``."""
        check_replace(self, changes, ("transformation",))
        return OptaxTransform(changes.get("transformation", self._transformation))

    def unrolls_by_forward_passes(self) -> bool:
        return _has_linesearch(self._transformation)  # a static transformation: cached

    conditional_traits: ClassVar[dict[str, str]] = {
        "threads_model_state": "without a line search",
        "takes_data": "without a line search",
    }

    def capabilities(self) -> dict[str, Any]:
        """The family's traits; a transformation with a line search evaluates f at trial
        points within a step, so it does not carry a model's state (``trainable``), and
        needs one deterministic objective, so it does not train on data."""
        caps = super().capabilities()
        # a line search needs one deterministic objective: no minibatches either
        caps["threads_model_state"] = caps["takes_data"] = not _has_linesearch(self._transformation)
        return caps

    def __repr__(self) -> str:
        return f"OptaxTransform({self._transformation!r})"


jax.tree_util.register_pytree_node(
    OptaxTransform,
    lambda a: ((), a._transformation),
    lambda aux, _: OptaxTransform(aux),
)


# ----------------------------------------------------------------------------- the solver

_EXTRA_ARG_SETS = (
    ("value", "grad", "value_fn"),
    ("obj_fn",),
    ("value", "grad", "value_fn", "obj_fn"),
)
_LINESEARCH_STATES = (
    optax.ScaleByZoomLinesearchState,
    optax.ScaleByBacktrackingLinesearchState,
)


def _final_linesearch_state(state: PyTree):
    """The line-search state if it is the last transformation of a chain, else None.

    Only then are its stored value and gradient those at the new iterate.
    """
    while True:
        if isinstance(state, _LINESEARCH_STATES):
            return state
        if isinstance(state, optax.InjectHyperparamsState):
            state = state.inner_state
        elif isinstance(state, tuple) and not hasattr(state, "_fields") and state:
            state = state[-1]
        else:
            return None


def _met_nonfinite(ls) -> jax.Array:
    """Whether optax's line search ended on a non-finite value: its decrease error is then
    infinite, and the step it returns no longer comes from a sufficient decrease."""
    return ~jnp.isfinite(ls.info.decrease_error)


def _optax_promotion():
    """optax's own arithmetic under JAX's standard dtype promotion, whatever the user's
    setting: optax is not written for strict promotion (``b1 ** count`` with an int32 count,
    float32 constants beside float64 hyperparameters), which refuses it once optsolve makes
    its hyperparameters traced leaves. The user's f runs under the user's setting, except
    where optax's own line searches call it."""
    return jax.numpy_dtype_promotion("standard")


class _OptaxSolver:
    """What both shapes share: the transformation and the extra arguments it takes."""

    def __init__(self, transformation: optax.GradientTransformation):
        self.tx = transformation
        self.extra_names: tuple[str, ...] | None = None

    def _extra_args(self, objective: Objective, f, g, names) -> dict[str, Any]:
        available = {"value": f, "grad": g, "value_fn": objective.value, "obj_fn": objective.value}
        return {n: available[n] for n in names}

    def _choose_extra_names(self, objective: Objective, x, f, g, state) -> tuple[str, ...]:
        if not isinstance(self.tx, optax.GradientTransformationExtraArgs):
            return ()
        first_error = None
        for names in _EXTRA_ARG_SETS:
            kwargs = self._extra_args(objective, f, g, names)
            try:
                with _optax_promotion():
                    jax.eval_shape(
                        lambda gg, ss, xx: self.tx.update(gg, ss, xx, **kwargs),  # noqa: B023  (eval_shape traces it here)
                        g,
                        state,
                        x,
                    )
            except (TypeError, ValueError) as err:
                first_error = first_error or err
                continue
            return names
        raise first_error

    def _update(self, objective: Objective, x, f, g, state):
        if self.extra_names is None:
            self.extra_names = self._choose_extra_names(objective, x, f, g, state)
        kwargs = self._extra_args(objective, f, g, self.extra_names)
        with _optax_promotion():
            updates, new_state = self.tx.update(g, state, x, **kwargs)
            return optax.apply_updates(x, updates), new_state


class _OptaxUpdater(_OptaxSolver, GradientStepSolver):
    """Plain transformations: each update needs the gradient at the current iterate only."""

    def init(self, objective: Objective, x):
        with _optax_promotion():
            return self.tx.init(x)

    def update(self, objective: Objective, x, f, g, state):
        x_new, new_state = self._update(objective, x, f, g, state)
        trials = jnp.zeros((), jnp.int32)
        failed = jnp.zeros((), bool)
        ls = _final_linesearch_state(new_state)
        if ls is not None:  # a value-only line search (backtracking without store_grad)
            trials = jnp.asarray(ls.info.num_linesearch_steps, jnp.int32)
            failed = _met_nonfinite(ls)
        return Update(x_new, new_state, trials, jnp.zeros((), jnp.int32), failed)


class _OptaxStepper(_OptaxSolver, SteppingSolver):
    """Transformations ending in a line search that stores the value and gradient at the new
    iterate (zoom; backtracking with store_grad): they are reused, never recomputed."""

    def init(self, objective: Objective, x, f, g):
        with _optax_promotion():
            return self.tx.init(x)

    def step(self, objective: Objective, x, f, g, state) -> Step:
        x_new, new_state = self._update(objective, x, f, g, state)
        ls = _final_linesearch_state(new_state)
        trials = jnp.asarray(ls.info.num_linesearch_steps, jnp.int32)
        backtracking = isinstance(ls, optax.ScaleByBacktrackingLinesearchState)
        # zoom evaluates value and gradient at every trial; backtracking the value, then
        # the gradient once at the accepted point
        grad_evals = jnp.ones((), jnp.int32) if backtracking else trials
        nonfinite = _met_nonfinite(ls)
        return Step(
            x_new,
            ls.value,
            ls.grad,
            new_state,
            trials,
            grad_evals,
            nonfinite,
            nonfinite_trials=nonfinite,
        )


_LINESEARCH = BoundedCache(64)


def _linesearch_in(tx: optax.GradientTransformation) -> bool:
    """Whether ``tx``'s state holds a line search's (traces its init)."""
    try:
        state = jax.eval_shape(tx.init, jnp.zeros((1,)))
    except Exception:  # noqa: BLE001  (one that needs other params: assume none)
        return False
    return _final_linesearch_state(state) is not None


def _has_linesearch(tx: optax.GradientTransformation) -> bool:
    """:func:`_linesearch_in`, once per (static) transformation object."""
    return _LINESEARCH.get_or_make(tx, lambda: _linesearch_in(tx))


def _make_solver(
    algorithm: OptaxAlgorithm | OptaxTransform, problem: OptimizationProblem
) -> _OptaxSolver:
    tx = algorithm.transformation()
    ls = _final_linesearch_state(jax.eval_shape(tx.init, problem.x0))
    if ls is not None and ls.grad is not None:
        return _OptaxStepper(tx)
    return _OptaxUpdater(tx)


def solve_optax(
    problem: OptimizationProblem, algorithm: Algorithm, options: SolveOptions, loop: Any = None
) -> Solution:
    """Run an optax-family algorithm: one compiled loop (see
    :mod:`optsolve.backends.native.driver`) in the ``loop`` the adjoint chose, or, with
    ``data``, the training loop of :mod:`optsolve.backends.native.training` (eager), or
    of :mod:`optsolve.backends.native.in_memory` (inside the caller's trace)."""
    if options.in_memory is not None:
        return run_in_memory_compiled(_make_solver, problem, algorithm, options, loop)
    if options.data is not None:
        return run_training(_make_solver, problem, algorithm, options)
    return run_iterative(_make_solver, problem, algorithm, options, loop)


register_algorithm(OptaxTransform)
register_backend(OptaxTransform, solve_optax)
register_adapter(optax.GradientTransformation, OptaxTransform)
