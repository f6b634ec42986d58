"""The loops an adjoint hands the JAX-native driver to run its iterations in.

The driver builds a run as a first carry and a body; the adjoint decides how they loop:
:func:`while_loop` (no derivative through the iterations, which the implicit adjoint does
not need) or :class:`CheckpointedScan`, a bounded loop that reverse mode can differentiate
(for :class:`~optsolve.solve_api.adjoint.UnrolledAdjoint`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
from jax import lax

Carry = Any
Loop = Callable[[Callable[[Carry], Any], Callable[[Carry], Carry], Carry], Carry]


def while_loop(cond: Callable[[Carry], Any], body: Callable[[Carry], Carry],
               carry: Carry) -> Carry:
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

    def __call__(self, cond: Callable[[Carry], Any], body: Callable[[Carry], Carry],
                 carry: Carry) -> Carry:
        def guarded(c, _):
            return lax.cond(cond(c), body, lambda same: same, c), None

        chunk = max(1, math.isqrt(self.steps))
        n_chunks = -(-self.steps // chunk)

        @jax.checkpoint
        def run_chunk(c, _):
            return lax.scan(guarded, c, None, length=chunk)[0], None

        return lax.scan(run_chunk, carry, None, length=n_chunks)[0]
