"""The loops an adjoint hands the JAX-native driver to run its iterations in.

The driver builds a run as a first carry and a body; the adjoint decides how they loop:
:func:`while_loop` (no derivative through the iterations, which the implicit adjoint does
not need) or :class:`CheckpointedScan`, a bounded loop that reverse mode can differentiate
(for :class:`~optsolve.solve_api.adjoint.UnrolledAdjoint`). Loops inside one iteration (a
line search, conjugate gradients) call :func:`inner_while_loop`, which a checkpointed scan
turns into bounded scans too, so that reverse mode sees through the accepted steps.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
from jax import lax

Carry = Any
Loop = Callable[[Callable[[Carry], Any], Callable[[Carry], Carry], Carry], Carry]


# Set while a CheckpointedScan traces its body: a trace-time switch (the loops inside an
# iteration are built by the algorithms, which the adjoint does not reach otherwise).
_BOUNDED_INNER_LOOPS = contextvars.ContextVar("optsolve_bounded_inner_loops", default=False)


def inner_while_loop(
    cond: Callable[[Carry], Any], body: Callable[[Carry], Carry], carry: Carry, max_steps: int
) -> Carry:
    """A loop inside one iteration that runs at most ``max_steps`` bodies (static): a
    ``lax.while_loop``, or, while a :class:`CheckpointedScan` is traced, ``max_steps``
    guarded bodies as a ``lax.scan``, which reverse mode can differentiate."""
    if not _BOUNDED_INNER_LOOPS.get():
        return lax.while_loop(cond, body, carry)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise TypeError(f"inner_while_loop: `max_steps` must be a Python int, got {max_steps!r}.")

    def guarded(c, _):
        return lax.cond(cond(c), body, lambda same: same, c), None

    return lax.scan(guarded, carry, None, length=max(0, max_steps))[0]


@contextlib.contextmanager
def _bounded_inner_loops():
    token = _BOUNDED_INNER_LOOPS.set(True)
    try:
        yield
    finally:
        _BOUNDED_INNER_LOOPS.reset(token)


def while_loop(cond: Callable[[Carry], Any], body: Callable[[Carry], Carry], carry: Carry) -> Carry:
    """``while cond(carry): carry = body(carry)``, as one ``lax.while_loop``."""
    return lax.while_loop(cond, body, carry)


@dataclasses.dataclass(frozen=True)
class CheckpointedScan:
    """``steps`` guarded iterations (those after ``cond`` turns False change nothing) as a
    ``lax.scan`` of sqrt(steps) checkpointed chunks: reverse-mode differentiable with memory
    O(sqrt(steps)) carries (Griewank & Walther, "Evaluating Derivatives", 2008, ch. 12).

    Args:
      steps: the number of guarded iterations (static).
    """

    steps: int

    def __call__(
        self, cond: Callable[[Carry], Any], body: Callable[[Carry], Carry], carry: Carry
    ) -> Carry:
        def guarded(c, _):
            return lax.cond(cond(c), body, lambda same: same, c), None

        chunk = max(1, math.isqrt(self.steps))
        n_chunks = -(-self.steps // chunk)

        @jax.checkpoint
        def run_chunk(c, _):
            return lax.scan(guarded, c, None, length=chunk)[0], None

        with _bounded_inner_loops():
            return lax.scan(run_chunk, carry, None, length=n_chunks)[0]
