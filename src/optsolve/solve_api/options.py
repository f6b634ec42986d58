"""The one vocabulary of stopping and monitoring options that every algorithm accepts."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.pytree import pytree_dataclass, static_field
from optsolve.solve_api.solve_signature import solve_keyword_defaults


@dataclasses.dataclass(frozen=True, eq=False)
class DataSpec:
    """How ``solve`` feeds data (see ``solve``'s ``data``, ``batch_size``, ``key``, ``epochs``)."""

    source: Any
    batch_size: int | None = None
    key: Any = None
    epochs: int | None = None

    @property
    def in_memory(self) -> bool:
        return self.batch_size is not None


@pytree_dataclass
class InMemoryData:
    """In-memory data consumed inside the compiled loop: each epoch a permutation of the
    samples under ``fold_in(key, epoch)`` (in order without a key) cut into batches of
    ``batch_size``, the remainder dropped; the arrays and the key are leaves, so they may be
    traced (``jax.vmap`` over keys or over the data).

    Attributes:
      arrays: a pytree of arrays sharing a leading (sample) dimension.
      key: a ``jax.random`` key, or None for batches in order.
      batch_size: samples per batch (static).
      steps: the steps of the run (static): ``epochs`` passes from where it starts, cut at
        ``maxiters``.
      epochs: the passes over the data the run may span (static; one more where a resumed
        run starts inside an epoch).
      sharding: the arrays' sharding over a device mesh where they were given sharded over
        their sample axis (a ``NamedSharding``, static), which each batch keeps: the steps
        then run data-parallel (parameters replicated, gradients reduced by XLA). None
        otherwise.
    """

    arrays: Any
    key: Any = None
    batch_size: int = static_field(default=1)
    steps: int = static_field(default=0)
    epochs: int = static_field(default=1)
    sharding: Any = static_field(default=None)

    @property
    def batches_per_epoch(self) -> int:
        return jax.tree_util.tree_leaves(self.arrays)[0].shape[0] // self.batch_size


COMMON_OPTIONS = ("maxiters", "maxtime", "gtol", "ftol", "callback", "callback_every")


def solve_keywords() -> tuple[str, ...]:
    """Every keyword ``solve`` takes, the common options first: read from its signature,
    so that the errors listing them stay in step with it."""
    named = solve_keyword_defaults()
    return COMMON_OPTIONS + tuple(name for name in named if name not in COMMON_OPTIONS)


def nearest(name: str, valid: Any) -> str:
    """``"; did you mean 'x'?"`` for the valid name closest to a misspelled ``name``, or
    ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class ScipyCallback:
    """A callback in scipy's form, ``callback(xk)`` or ``callback(intermediate_result)``,
    called as solve's ``callback(iteration, x, objective)``. As in scipy, raising
    StopIteration stops the run (TERMINATED), and so does returning True.

    Equal to another one wrapping the same function, so that repeated solves share compiled
    code (a callback is static)."""

    def __init__(self, fn: Callable[..., Any], result: bool):
        self.fn, self.result = fn, result

    def __call__(self, iteration: Any, x: Any, objective: Any) -> Any:
        try:
            if self.result:
                # imported here: `import optsolve` does not import scipy
                from scipy.optimize import OptimizeResult

                return self.fn(OptimizeResult(x=x, fun=objective, nit=iteration))
            return self.fn(x)
        except StopIteration:
            return True

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ScipyCallback) and (other.fn, other.result) == (
            self.fn,
            self.result,
        )

    def __hash__(self) -> int:
        return hash((ScipyCallback, self.fn, self.result))

    def __repr__(self) -> str:
        # names what it wraps: the recompilation warning compares printed structures
        return f"ScipyCallback({self.fn!r})"


def as_callback(callback: Any) -> Any:
    """``callback`` as solve calls it, ``callback(iteration, x, objective[, grad_norm])``:
    itself when it takes those, a :class:`ScipyCallback` for scipy's one-argument forms.

    Raises:
      TypeError: for a callback that takes another number of positional arguments.
    """
    if callback is None or not callable(callback):
        return callback  # make_options says what a callback must be
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return callback
    params = list(signature.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return callback
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = sum(p.default is inspect.Parameter.empty for p in positional)
    if any(required <= n <= len(positional) for n in (3, 4)):
        return callback
    if required <= 1 <= len(positional):
        return ScipyCallback(callback, [p.name for p in params] == ["intermediate_result"])
    name = getattr(callback, "__name__", type(callback).__name__)
    raise TypeError(
        f"solve: `callback` must be callback(iteration, x, objective) (a fourth argument "
        f"gets the gradient norm) or scipy's callback(xk) or callback(intermediate_result); "
        f"got {name}{signature}. E.g. callback=lambda i, x, f: print(i, f)."
    )


def check_key(key: Any) -> None:
    """Raise a clear error unless ``key`` is None or a JAX PRNG key (a typed key from
    ``jax.random.key`` or a raw uint32 one from ``jax.random.PRNGKey``)."""
    if key is None:
        return
    dtype = getattr(key, "dtype", None)
    if dtype is not None and (
        jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
        or (dtype == np.uint32 and np.ndim(key) >= 1)
    ):
        return
    given = f"{key!r}" if len(repr(key)) < 40 else type(key).__name__
    raise TypeError(
        f"solve: `key` (which shuffles in-memory data) must be a jax.random key, e.g. "
        f"jax.random.key(0); got {given}."
    )


@pytree_dataclass
class SolveOptions:
    """Validated options of one ``solve`` call.

    Numbers are leaves (changing ``maxiters`` or ``gtol`` does not recompile); None means
    "not set". ``callback``, ``callback_every`` and backend-specific ``extra`` are static.

    Attributes:
      maxiters: the most iterations (accepted steps) to take.
      maxtime: the most wall-clock seconds to run.
      gtol: stop with SUCCESS once the gradient's infinity norm is <= gtol.
      ftol: stop with SUCCESS once |f_k - f_{k+1}| <= ftol * max(|f_k|, |f_{k+1}|, 1).
      xtol: the step-size test of the algorithms that take one (``extra_options``); a
        leaf like gtol and ftol, so a new value does not recompile.
      callback: ``callback(iteration, x, objective[, grad_norm]) -> bool | None``; True
        stops the run. The gradient's infinity norm is passed when the callback takes a
        fourth argument.
      callback_every: call the callback every k-th iteration (default 1).
      extra: backend-specific options, as a tuple of (name, value) pairs.
      resume: a :class:`~optsolve.solve_api.solution.Solution` to continue from (its x,
        state and counters), or None.
      history: the length of the per-iterate record (maxiters + 1), 0 for none, -1 for one
        of unknown length (training on data).
      progress: show a tqdm progress bar with the loss (the ``progress`` extra).
      progress_every: iterations between the bar's updates from inside a compiled loop
        with no ``maxiters`` (every one; tqdm's ``mininterval`` throttles the drawing). On
        the data path the host moves the bar between chunks instead.
      data: a :class:`DataSpec` for training on data, or None.
      in_memory: an :class:`InMemoryData` consumed inside the compiled loop (a run on
        in-memory data under jax.jit, jax.vmap or jax.grad): its arrays and key are leaves.
      nonfinite: what a non-finite f or gradient does: ``"fail"`` ends the run with
        FAILURE; ``"reject"`` (scipy's derivative-free and global methods, their default)
        passes over the point, handed to the method as f = +inf; on data, ``"skip"`` skips
        the step's update. ``solve`` resolves its default None to the method's.
      max_consecutive_skips: with ``nonfinite="skip"``, the run ends with FAILURE at the
        step that would skip more than this many updates in a row.
      replay: on the data path, a bool array, True while the host replays a chunk of steps
        up to a stopped step (the callback and progress bar stay silent); None elsewhere.
      metrics: ``metrics(x, p[, batch]) -> pytree`` recorded in the history at every
        iterate (the backends' terms: over the trained leaves of a model), or None.
      evaluate: ``evaluate(x, p) -> score | (score, aux)`` run every ``eval_every``-th
        iterate, recorded in the history and ranking iterates for ``keep="best"``, or None.
      eval_every: iterations between evaluations.
      keep: ``"last"`` (the run's last iterate) or ``"best"`` (the one of lowest score:
        evaluate's, else the objective).
      checkpoint: a host hook ``checkpoint(solution)`` an eager run calls every
        ``checkpoint.every`` iterations with the Solution so far, or None.
    """

    maxiters: Any = None
    maxtime: Any = None
    gtol: Any = None
    ftol: Any = None
    xtol: Any = None
    callback: Callable[..., Any] | None = static_field(default=None)
    callback_every: int = static_field(default=1)
    extra: tuple[tuple[str, Any], ...] = static_field(default=())
    resume: Any = None
    history: int = static_field(default=0)
    progress: bool = static_field(default=False)
    progress_every: int = static_field(default=1)
    data: Any = static_field(default=None)
    in_memory: Any = None
    nonfinite: str = static_field(default="fail")
    max_consecutive_skips: Any = None
    replay: Any = None
    metrics: Callable[..., Any] | None = static_field(default=None)
    evaluate: Callable[..., Any] | None = static_field(default=None)
    eval_every: int = static_field(default=1)
    keep: str = static_field(default="last")
    checkpoint: Any = static_field(default=None)

    def get(self, name: str, default: Any = None) -> Any:
        """A backend-specific option's value (``xtol`` included), or ``default`` when not
        given."""
        if name == "xtol":
            return default if self.xtol is None else self.xtol
        return dict(self.extra).get(name, default)


def _check_number(name: str, value: Any, *, integer: bool = False, positive: bool = False):
    if value is None:
        return
    if isinstance(value, jax.core.Tracer):
        return
    arr = np.asarray(value)
    ok = arr.ndim == 0 and (
        np.issubdtype(arr.dtype, np.integer)
        if integer
        else np.issubdtype(arr.dtype, np.number) and not np.iscomplexobj(arr)
    )
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a real number"
        raise TypeError(f"solve: `{name}` must be {kind}, got {value!r}.")
    if (positive and arr <= 0) or arr < 0:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"solve: `{name}` must be {bound}, got {value!r}.")


def _check_every(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"solve: `{name}` must be an integer >= 1, got {value!r}.")


def _check_tracking(history: bool, metrics, evaluate, eval_every, keep) -> None:
    """The options of what a run records and keeps (metrics, evaluations, the best iterate)."""
    for name, fn in (("metrics", metrics), ("evaluate", evaluate)):
        if fn is not None and not callable(fn):
            raise TypeError(f"solve: `{name}` must be a function of (x, p), got {fn!r}.")
    if keep not in ("last", "best"):
        raise ValueError(f"solve: `keep` must be 'last' or 'best', got {keep!r}.")
    if evaluate is not None and not history and keep != "best":
        raise ValueError(
            "solve: `evaluate`'s values are recorded in `sol.history` (pass "
            "history=True) or rank the iterates for keep='best'; neither is on."
        )
    _check_every("eval_every", eval_every)
    if eval_every != 1 and evaluate is None:
        raise ValueError("solve: `eval_every` is how often `evaluate` runs; pass `evaluate` too.")


def make_options(
    algorithm: Algorithm,
    *,
    maxiters=None,
    maxtime=None,
    gtol=None,
    ftol=None,
    callback=None,
    callback_every: int = 1,
    resume=None,
    history: bool = False,
    progress: bool = False,
    metrics=None,
    evaluate=None,
    eval_every: int = 1,
    keep: str = "last",
    checkpoint=None,
    **extra: Any,
) -> SolveOptions:
    """Validate ``solve``'s keyword options for ``algorithm`` and bundle them."""
    valid_extra = tuple(type(algorithm).extra_options)
    unknown = sorted(set(extra) - set(valid_extra))
    if unknown:
        valid = solve_keywords() + valid_extra
        raise TypeError(
            f"solve: {type(algorithm).__name__} does not take the option(s) "
            f"{', '.join(repr(u) for u in unknown)}. Valid options: {', '.join(valid)}"
            f"{nearest(unknown[0], valid) or '.'}"
        )
    _check_number("maxiters", maxiters, integer=True)
    _check_number("maxtime", maxtime, positive=True)
    _check_number("gtol", gtol)
    _check_number("ftol", ftol)
    xtol = extra.pop("xtol", None)
    _check_number("xtol", xtol)
    if callback is not None and not callable(callback):
        raise TypeError(
            f"solve: `callback` must be callable as callback(iteration, x, objective), got "
            f"{callback!r}."
        )
    _check_every("callback_every", callback_every)
    history = history or metrics is not None  # metrics are recorded in the history
    _check_tracking(history, metrics, evaluate, eval_every, keep)
    # -1: a history without a known length, which only a training loop on data can record
    length = -1 if maxiters is None or isinstance(maxiters, jax.core.Tracer) else int(maxiters) + 1
    return SolveOptions(
        maxiters=maxiters,
        maxtime=maxtime,
        gtol=gtol,
        ftol=ftol,
        xtol=xtol,
        callback=callback,
        callback_every=int(callback_every),
        extra=tuple(sorted(extra.items())),
        resume=resume,
        history=length if history else 0,
        progress=bool(progress),
        metrics=metrics,
        evaluate=evaluate,
        eval_every=int(eval_every),
        keep=keep,
        checkpoint=checkpoint,
    )
