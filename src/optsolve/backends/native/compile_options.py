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
import math
from collections.abc import Iterator
from typing import Any

import jax

# within it: L-BFGS's memory (2 x 10 x n) up to n = 12, BFGS's model up to n = 16
SMALL_ARRAY = 256

CLASSIC_EMITTERS = {"xla_cpu_use_fusion_emitters": False}

_unsupported: set[str] = set()  # options this XLA refused (a later version may drop one)


def largest_array(jaxpr: Any) -> int:
    """The most elements of any value of ``jaxpr`` (a ClosedJaxpr or Jaxpr): its constants,
    inputs and every intermediate, in the programs nested in it too."""
    largest, todo = 0, [getattr(jaxpr, "jaxpr", jaxpr)]  # a ClosedJaxpr's own
    while todo:
        program = todo.pop()
        values = [*program.constvars, *program.invars]
        values.extend(var for eqn in program.eqns for var in eqn.outvars)
        largest = max([largest, *(math.prod(getattr(v.aval, "shape", ())) for v in values)])
        todo.extend(_nested(program))
    return largest


def _nested(program: Any) -> Iterator[Any]:
    """The programs in ``program``'s equations' parameters (a loop's body, a conditional's
    branches, a nested jit), not descending into them."""
    # jax.extend.core.subjaxprs does this, but importing jax.extend loads Pallas, which
    # `import optsolve` has no use for (tests/solve_api/test_import_cost.py)
    for eqn in program.eqns:
        for param in eqn.params.values():
            for value in param if isinstance(param, tuple) else (param,):
                value = getattr(value, "jaxpr", value)  # a ClosedJaxpr's own
                if hasattr(value, "eqns"):
                    yield value


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
