"""Host calls from inside compiled loops: the user's callback and the wall clock.

They use ``jax.pure_callback`` with ``vmap_method="sequential"``: io_callback's effects are
refused inside a ``while_loop`` whose predicate is batched, so it cannot serve ``jax.vmap``.
Under vmap a batched loop runs its body for finished elements too, so every call carries a
``due`` flag and the host skips the user's function where it is False.
"""

from __future__ import annotations

import _signal  # signal.signal's enum conversions cost more than a small solve's setup
import inspect
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def under_a_trace() -> bool:
    """Whether this call runs inside a JAX transformation (jit, vmap, grad, ...), where the
    host cannot read values, even when none of its own inputs is traced (a jitted function
    of no arguments whose problem is a constant)."""
    try:
        from jax._src.core import trace_state_clean  # no public equivalent in JAX
    except ImportError:  # pragma: no cover - a JAX without it: the inputs decide
        return False
    return not trace_state_clean()


# Times are offsets from import so that float32 keeps millisecond resolution for days.
_T0 = time.perf_counter()


def clock(token: jax.Array) -> jax.Array:
    """Seconds since import, read on the host; ``token`` orders the read after its producer."""
    dtype = jnp.result_type(float)

    def host(_token):
        try:
            if _INTERRUPTED[0]:
                return np.asarray(np.inf, dtype=dtype)  # out of time: the loop stops
            return np.asarray(time.perf_counter() - _T0, dtype=dtype)
        except KeyboardInterrupt:
            if not _CATCHING[0]:
                raise
            _INTERRUPTED[0] = True
            return np.asarray(np.inf, dtype=dtype)  # out of time: the loop stops

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), dtype), token, vmap_method="sequential")


def wants_grad_norm(callback: Callable[..., Any]) -> bool:
    """Whether ``callback`` takes a fourth argument, the gradient norm: four positional
    parameters without defaults, or ``*args`` (a defaulted fourth one, as in
    ``lambda i, x, f, store=store: ...``, is the caller's own)."""
    try:
        params = inspect.signature(callback).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required) >= 4 or any(p.kind == p.VAR_POSITIONAL for p in params)


# What user code raised in host calls during an eager solve. Raised inside a host callback,
# an exception reaches the caller as XLA's "CpuCallback error", and a Ctrl-C (whose handler
# runs in the thread that runs the compiled loop's callbacks) would abort the run; instead
# the host call stops the run, and ``solve`` re-raises the user's own exception, or returns
# INTERRUPTED, afterwards.
_RAISED: list[BaseException] = []
_INTERRUPTED = [False]
_CATCHING = [0]  # eager solves running now (inside jit nobody could re-raise it: raise there)


def interrupt_requested() -> bool:
    """Whether a Ctrl-C arrived during the eager solve running now."""
    return _INTERRUPTED[0]


def raise_if_interrupted() -> None:
    """From host code between a host loop's steps (scipy's evaluations and callbacks):
    raise KeyboardInterrupt here, in optsolve's own code, when a Ctrl-C arrived.

    Python runs a signal handler wherever the main thread happens to be; a KeyboardInterrupt
    raised there inside a garbage-collection callback (JAX registers one) is printed as
    "Exception ignored" and lost, so the handler only sets a flag and this raises it.
    """
    if _INTERRUPTED[0]:
        raise KeyboardInterrupt


def _run_callback(callback, *args) -> bool:
    if _INTERRUPTED[0]:
        return True
    try:
        stop = callback(*args)
    except KeyboardInterrupt:
        if not _CATCHING[0]:
            raise
        _INTERRUPTED[0] = True
        return True
    except Exception as err:  # re-raised by solve, unchanged
        if not _CATCHING[0]:
            raise
        _RAISED.append(err)
        return True
    return _INTERRUPTED[0] or (bool(stop) if stop is not None else False)


class HostCalls:
    """Context of an eager solve: a user callback's exception stops the run and is
    re-raised, unchanged, when the context exits; ``interrupted`` tells whether a Ctrl-C
    stopped the run.

    While the run lasts, a Ctrl-C only sets a flag that the host calls, the loop between
    compiled chunks and scipy's evaluations read (raised where the signal lands, a
    KeyboardInterrupt would abort a compiled run inside JAX's callback machinery, or be lost
    inside a garbage-collection callback); a second Ctrl-C raises as usual. Only in the main
    thread, where Python runs signal handlers.
    """

    def __init__(self):
        self.intercept = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        _CATCHING[0] += 1
        self.depth = len(_RAISED)
        self.was_interrupted, _INTERRUPTED[0] = _INTERRUPTED[0], False
        self.interrupted = False
        if self.intercept:
            self.previous = _signal.signal(signal.SIGINT, _on_interrupt)
        return self

    def __exit__(self, kind, value, traceback):
        if self.intercept:
            _signal.signal(signal.SIGINT, self.previous)
        _CATCHING[0] -= 1
        self.interrupted = _INTERRUPTED[0]
        _INTERRUPTED[0] = self.was_interrupted
        if len(_RAISED) > self.depth:
            err = _RAISED[self.depth]
            del _RAISED[self.depth :]
            if kind is None:
                raise err
        return False


def _on_interrupt(signum, frame) -> None:
    if _INTERRUPTED[0]:  # the second Ctrl-C: stop now
        raise KeyboardInterrupt
    _INTERRUPTED[0] = True


def call_user_callback(
    callback: Callable[..., Any],
    due: jax.Array,
    iteration: jax.Array,
    x: Any,
    objective: jax.Array,
    grad_norm: jax.Array | None = None,
) -> jax.Array:
    """Where ``due``, run ``callback(iteration, x, objective[, grad_norm])`` on the host.

    Returns a bool array, True where the callback asked to stop.
    """

    def host(is_due, it, xx, ff, *gg):
        if not bool(is_due):
            return np.asarray(False)
        if not _RAISED:
            return np.asarray(_run_callback(callback, int(it), xx, ff, *gg))
        return np.asarray(True)  # an earlier call raised: stop at once

    extra = () if grad_norm is None else (grad_norm,)
    return jax.pure_callback(
        host,
        jax.ShapeDtypeStruct((), jnp.bool_),
        due,
        iteration,
        x,
        objective,
        *extra,
        vmap_method="sequential",
    )


# The progress bars of the solves running now, innermost last (solve inside solve nests).
PROGRESS_BARS: list = []


def progress_every(total: int | None) -> int:
    """How many iterations apart a run with ``total`` iterations updates its bar (about
    100 updates a run; every iteration when the total is unknown, where tqdm's own
    ``mininterval`` throttles the drawing)."""
    return 1 if not total else max(int(total) // 100, 1)


def advance_progress(iteration: int, objective: float, grad_norm: float | None = None) -> None:
    """From host code (the scipy monitor, the training loop): move the innermost progress
    bar to ``iteration``, showing the objective and, where known, the gradient norm."""
    if PROGRESS_BARS:
        _show(PROGRESS_BARS[-1], iteration, objective, grad_norm)


def _show(bar, iteration, objective, grad_norm) -> None:
    bar.update(max(0, int(iteration) - bar.n))
    # the bar keeps the last gradient norm shown when this update brings none
    postfix = getattr(bar, "optsolve_postfix", {})
    postfix["loss"] = f"{float(objective):.6g}"
    if grad_norm is not None and np.isfinite(grad_norm):
        postfix["grad_norm"] = f"{float(grad_norm):.2e}"
    bar.optsolve_postfix = postfix
    bar.set_postfix(postfix, refresh=False)


def report_progress(
    due: jax.Array, iteration: jax.Array, objective: jax.Array, grad_norm: jax.Array
) -> jax.Array:
    """Where ``due``, move the innermost progress bar to ``iteration``; returns False (True
    after a Ctrl-C, which stops the run)."""

    def host(is_due, it, ff, gg):
        try:
            if bool(is_due) and PROGRESS_BARS:
                _show(PROGRESS_BARS[-1], it, ff, gg)
            if _INTERRUPTED[0]:
                return np.asarray(True)
        except KeyboardInterrupt:
            if not _CATCHING[0]:
                raise
            _INTERRUPTED[0] = True
            return np.asarray(True)
        return np.asarray(False)

    return jax.pure_callback(
        host,
        jax.ShapeDtypeStruct((), jnp.bool_),
        due,
        iteration,
        objective,
        grad_norm,
        vmap_method="sequential",
    )
