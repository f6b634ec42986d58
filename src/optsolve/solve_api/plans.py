"""What ``solve``'s stages make of a plain call, cached on the call's structure.

The stages (:mod:`~optsolve.solve_api.stages`) check a call and turn it into the backends'
terms. For a plain call (no resume, hooks, data, checkpoint or adjoint given; a problem with
no bounds, constraints, aux, maximisation, scipy form or trained subset) every stage returns
the problem and the algorithm unchanged, and what they make, the options, the adjoint and the
run's length, depends only on the call's structure: the problem's and the algorithm's pytree
structure and leaf shapes and dtypes, and solve's keyword values. A later call of that
structure takes the recorded plan instead of running the stages again (an eager call's
Python before dispatch). Each plan is recorded only after the stages have checked the call
and returned it unchanged, so a hit never skips a check the stages would make.

A backend may also hand a plan its *run* (:func:`offer`): the structure-only work below the
stages (the compiled program, its first carry), which a later call of the structure calls
with the inputs' leaves, skipping the layers between ``solve`` and that program.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax

from optsolve.solve_api import host, sense
from optsolve.solve_api.cache import BoundedCache
from optsolve.solve_api.options import SolveOptions
from optsolve.solve_api.pytree import FlatInputs, leaf_spec
from optsolve.solve_api.stages import Call

_PLANS = BoundedCache(64)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the stages made of a plain call: its options, adjoint and run length."""

    options: SolveOptions
    adjoint: Any
    steps: int | None
    options_flat: tuple  # tree_flatten(options), which every call of the plan reuses
    # [the run a backend offered] (a slot filled once, see offer): ``run(leaves, problem,
    # algorithm)``, leaves those of (problem, algorithm, options); None where it cannot
    # run the call (the host takes the layers' path then)
    runs: list = dataclasses.field(default_factory=list)

    @property
    def run(self) -> Callable[[list, Any, Any], Any] | None:
        return self.runs[0] if self.runs else None

    def call(self, problem: Any, algorithm: Any) -> Call:
        """The call the backends take for ``problem`` and ``algorithm``."""
        return Call(
            problem,
            algorithm=algorithm,
            options=self.options,
            adjoint=self.adjoint,
            steps=self.steps,
        )


def may_stand_for(problem: Any) -> bool:
    """Whether the stages may leave ``problem`` unchanged, read from its static fields alone
    (a problem they change, or check by value, is never planned: its key's flatten would be
    wasted)."""
    return (
        getattr(problem, "trainable", None) is None
        and sense.is_plain(problem)
        and not problem.has_bounds
        and not problem.constraints
        and getattr(problem, "x0_form", None) is None
    )


def key(inputs: FlatInputs, given: dict[str, Any]) -> tuple | None:
    """The plan's key for a call of ``inputs`` (its problem, one :func:`may_stand_for`
    accepts, and its algorithm, flattened) and solve's keyword values ``given``; None where
    the call is not one a plan may stand for (traced, under a trace, or a value that cannot
    be hashed)."""
    if inputs.traced or host.under_a_trace():
        return None
    (problem_leaves, problem_def), (algorithm_leaves, algorithm_def) = inputs.flat
    try:
        # the type too: True == 1 == 1.0 hash alike, and only some of them are valid
        values = tuple((name, type(value), value) for name, value in given.items())
        specs = tuple(leaf_spec(leaf) for leaf in problem_leaves + algorithm_leaves)
        # jax's Config declares its flags at run time, not as attributes
        x64 = jax.config.jax_enable_x64  # type: ignore[attr-defined]
        found = (problem_def, algorithm_def, specs, values, x64)
        hash(found)
    except (TypeError, ValueError):
        return None
    return found


def lookup(found: tuple | None) -> Plan | None:
    """The plan recorded for ``found``, or None."""
    return None if found is None else _PLANS.get(found)


def record(found: tuple | None, call: Call, problem: Any, algorithm: Any) -> None:
    """Record ``call`` (after the stages) as the plan of ``found`` where the stages left the
    problem and the algorithm as given and added nothing of the call's own."""
    if found is None or call.problem is not problem or call.algorithm is not algorithm:
        return
    if (
        any(
            part is not None
            for part in (
                call.resume,
                call.callback,
                call.metrics,
                call.evaluate,
                call.options.checkpoint,
            )
        )
        or call.trains_model
    ):
        return
    _PLANS.put(
        found,
        Plan(call.options, call.adjoint, call.steps, jax.tree_util.tree_flatten(call.options)),
    )


# the call whose run a backend may offer: (its plan, problem, algorithm)
_RECORDING: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("recording", default=None)


@contextlib.contextmanager
def recording(plan: Plan, problem: Any, algorithm: Any) -> Iterator[None]:
    """Within it, a backend's :func:`offer` for this very call fills ``plan``'s run."""
    token = _RECORDING.set((plan, problem, algorithm))
    try:
        yield
    finally:
        _RECORDING.reset(token)


def offer(run: Callable[[list, Any, Any], Any], problem: Any, algorithm: Any, options: Any) -> None:
    """From a backend: ``run``, which runs a call of this structure from the leaves of
    (problem, algorithm, options), for later calls of the plan being recorded. Taken only
    where the backend runs the recorded call itself (the same problem, algorithm and
    options objects: no layer between changed them), and only once."""
    recorded = _RECORDING.get()
    if recorded is None:
        return
    plan, planned_problem, planned_algorithm = recorded
    if (
        problem is planned_problem
        and algorithm is planned_algorithm
        and options is plan.options
        and not plan.runs
    ):
        plan.runs.append(run)
