"""The XLA options an eager run's compiled chunk is built with.

XLA's CPU backend emits its fused kernels with its MLIR fusion emitters by default. XLA's
classic emitters take about half the compile time, which is most of a small solve's first
call, but vectorise less: their kernels run slower on arrays of a few hundred elements or
more. On a program whose arrays are all tiny, each kernel's launch outweighs its arithmetic
and the two run alike. So an eager chunk whose program holds no array of more than
:data:`SMALL_ARRAY` elements is built with the classic emitters; any other program, every
program on another backend, and every solve inside the caller's own ``jax.jit`` (whose
compilation is the caller's) keep XLA's defaults. docs/benchmarks.md has the measurements.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

# within it: L-BFGS's memory (2 x 10 x n) up to n = 12, BFGS's model up to n = 16
SMALL_ARRAY = 256

CLASSIC_EMITTERS = {"xla_cpu_use_fusion_emitters": False}

_unsupported: set[str] = set()  # options this XLA refused (a later version may drop one)


def largest_array(jaxpr: Any) -> int:
    """The most elements of any value of ``jaxpr`` (a ClosedJaxpr or Jaxpr): its constants,
    inputs and every intermediate, in the programs nested in it too."""
    largest, todo, seen = 0, [jaxpr], set()
    while todo:
        program = todo.pop()
        program = getattr(program, "jaxpr", program)  # a ClosedJaxpr's own
        if id(program) in seen:
            continue
        seen.add(id(program))
        values = [*program.constvars, *program.invars]
        for eqn in program.eqns:
            values.extend(eqn.outvars)
            todo.extend(_programs_in(eqn.params.values()))
        for value in values:
            largest = max(largest, int(np.prod(getattr(value.aval, "shape", ()))))
    return largest


def _programs_in(params: Any) -> list:
    found = []
    for param in params:
        if hasattr(param, "eqns") or hasattr(getattr(param, "jaxpr", None), "eqns"):
            found.append(param)
        elif isinstance(param, (tuple, list)):
            found.extend(_programs_in(param))
    return found


def is_small(jaxpr: Any) -> bool:
    """Whether every array of ``jaxpr`` (an eager run's first iterate's program: the
    objective and the solver's set-up at x0) holds at most :data:`SMALL_ARRAY` elements."""
    return largest_array(jaxpr) <= SMALL_ARRAY


def chunk_options(small: bool) -> dict | None:
    """The compiler options of an eager chunk (``small``: see :func:`is_small`): the classic
    emitters for a small program on the CPU, else None (XLA's defaults)."""
    if not small or _unsupported or not _on_cpu():
        return None
    return dict(CLASSIC_EMITTERS)


@functools.cache
def _on_cpu() -> bool:  # the default backend, fixed once JAX has started
    return jax.default_backend() == "cpu"


def refused(error: Exception, options: dict | None) -> bool:
    """Whether ``error`` is XLA refusing ``options`` (an XLA without one of them); if so,
    they are not asked for again in this process."""
    if not options or "compile option" not in str(error):
        return False
    _unsupported.update(options)
    return True
