"""optax's schedules as pytrees: their numbers are leaves, so a new value reuses compiled code.

An optax schedule is a closure: ``optax.cosine_decay_schedule(0.1, 1000)`` made anew, even
with the same numbers, is a new static object and compiles again. The classes here take
the same arguments and give the same values (``optsolve.schedules.cosine_decay_schedule(0.1,
1000)(step)``), but are pytrees: floats are leaves, step counts (ints) and flags are
structure. Any hyperparameter of an optsolve optax algorithm may be one::

    optsolve.AdamW(optsolve.schedules.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 1000))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from optsolve.backends.optax.factory_arguments import FactoryArguments, float_valued_names

PyTree = Any


class Schedule(FactoryArguments):
    """Base of the pytree schedules: ``schedule(step)`` is the value at ``step``, as the
    optax factory of the same name and arguments gives it.

    Attributes:
      factory: what builds the schedule: optax's factory, or a traceable equivalent.
      source: optax's factory of the same name and arguments.
      static_names: float arguments the factory branches on in Python (``decay_rate`` of
        the exponential schedules): structure, so a new value compiles anew.
    """

    factory: ClassVar[Callable[..., Callable[[Any], Any]]]
    source: ClassVar[Callable[..., Callable[[Any], Any]]]  # optax's factory of the same name
    static_names: ClassVar[frozenset[str]] = frozenset()

    def replace(self, **changes: Any) -> Schedule:
        """A copy with some arguments changed."""
        unknown = sorted(set(changes) - set(self._arguments))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.replace: unknown argument(s) {unknown}; "
                f"valid: {', '.join(self._arguments)}."
            )
        return type(self)(**{**self._arguments, **changes})

    def schedule(self) -> Callable[[Any], Any]:
        """The optax schedule of the current (possibly traced) values."""
        return type(self).factory(**self._arguments)

    def __call__(self, count: Any) -> Any:
        return self.schedule()(count)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._arguments.items())
        return f"optsolve.schedules.{type(self).__name__}({args})"


def _warmup_cosine_decay(
    init_value, peak_value, warmup_steps, decay_steps, end_value=0.0, exponent=1.0
):
    # optax's own tests `peak_value == 0.0` in Python, which a traced value cannot answer
    safe_peak = jnp.where(peak_value == 0.0, 1.0, peak_value)
    alpha = jnp.where(peak_value == 0.0, 0.0, end_value / safe_peak)
    return optax.join_schedules(
        [
            optax.linear_schedule(init_value, peak_value, warmup_steps),
            optax.cosine_decay_schedule(
                peak_value, decay_steps - warmup_steps, alpha=alpha, exponent=exponent
            ),
        ],
        [warmup_steps],
    )


def _make(
    name: str,
    factory: Callable[..., Any],
    static: tuple[str, ...] = (),
    build: Callable[..., Any] | None = None,
) -> type[Schedule]:
    source = f"optax.schedules.{factory.__name__}"
    cls = type(
        name,
        (Schedule,),
        {
            "factory": staticmethod(factory if build is None else _with_signature(build, factory)),
            "source": staticmethod(factory),
            "static_names": frozenset(static),
            "float_valued": float_valued_names(factory),
            "__doc__": (
                f"``{source}`` as a pytree: its float arguments are leaves"
                + (f" (but {', '.join(static)}, on which it branches)" if static else "")
                + ", so new values reuse compiled code.\n\n"
                + inspect.cleandoc(factory.__doc__ or "")
            ),
            "__module__": "optsolve.schedules",
            "__qualname__": name,
        },
    )
    jax.tree_util.register_pytree_with_keys(
        cls, cls._tree_flatten_with_keys, cls._tree_unflatten, cls._tree_flatten
    )
    return cls


def _with_signature(build: Callable[..., Any], like: Callable[..., Any]) -> Callable[..., Any]:
    build.__signature__ = inspect.signature(like)
    return build


_S = optax.schedules
ConstantSchedule = _make("ConstantSchedule", _S.constant_schedule)
LinearSchedule = _make("LinearSchedule", _S.linear_schedule)
CosineDecaySchedule = _make("CosineDecaySchedule", _S.cosine_decay_schedule)
PolynomialSchedule = _make("PolynomialSchedule", _S.polynomial_schedule)
PiecewiseConstantSchedule = _make("PiecewiseConstantSchedule", _S.piecewise_constant_schedule)
WarmupConstantSchedule = _make("WarmupConstantSchedule", _S.warmup_constant_schedule)
WarmupCosineDecaySchedule = _make(
    "WarmupCosineDecaySchedule", _S.warmup_cosine_decay_schedule, build=_warmup_cosine_decay
)
CosineOnecycleSchedule = _make(
    "CosineOnecycleSchedule",
    _S.cosine_onecycle_schedule,
    static=("pct_start", "div_factor", "final_div_factor"),
)
LinearOnecycleSchedule = _make(
    "LinearOnecycleSchedule",
    _S.linear_onecycle_schedule,
    static=("pct_start", "pct_final", "div_factor", "final_div_factor"),
)
ExponentialDecay = _make("ExponentialDecay", _S.exponential_decay, static=("decay_rate",))
WarmupExponentialDecaySchedule = _make(
    "WarmupExponentialDecaySchedule", _S.warmup_exponential_decay_schedule, static=("decay_rate",)
)

# optax's names, for a change of prefix: optax.cosine_decay_schedule -> optsolve.schedules....
constant_schedule = ConstantSchedule
linear_schedule = LinearSchedule
cosine_decay_schedule = CosineDecaySchedule
polynomial_schedule = PolynomialSchedule
piecewise_constant_schedule = PiecewiseConstantSchedule
warmup_constant_schedule = WarmupConstantSchedule
warmup_cosine_decay_schedule = WarmupCosineDecaySchedule
cosine_onecycle_schedule = CosineOnecycleSchedule
linear_onecycle_schedule = LinearOnecycleSchedule
exponential_decay = ExponentialDecay
warmup_exponential_decay_schedule = WarmupExponentialDecaySchedule

SCHEDULES: tuple[type[Schedule], ...] = (
    ConstantSchedule,
    LinearSchedule,
    CosineDecaySchedule,
    PolynomialSchedule,
    PiecewiseConstantSchedule,
    WarmupConstantSchedule,
    WarmupCosineDecaySchedule,
    CosineOnecycleSchedule,
    LinearOnecycleSchedule,
    ExponentialDecay,
    WarmupExponentialDecaySchedule,
)
