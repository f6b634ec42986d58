"""The solver protocol of the JAX-native driver: what a backend implements (an abstract
base class with explicit methods and fields), and what a step returns."""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple

import jax

from optsolve.backends.native.objective import Objective

PyTree = Any


class Step(NamedTuple):
    """One solver step: the new iterate with its value and gradient, and what it cost."""

    x: PyTree
    f: jax.Array
    g: PyTree
    state: PyTree
    f_evals: jax.Array
    grad_evals: jax.Array
    failed: jax.Array  # the solver's own failure (e.g. a failed line search)
    # The solver's own "no further progress is possible" (e.g. a line search that finds no
    # decrease at rounding level); None means never.
    stalled: jax.Array | None = None
    # Whether the step's trial points (a line search's, a rejected trust-region step) met
    # non-finite values, so that a failure or a stall names them; None means never.
    nonfinite_trials: jax.Array | None = None
    # The solver's own convergence tests (for solvers with ``tests_tolerances``): the
    # relative-reduction test and the trust-radius test of Moré's Levenberg-Marquardt;
    # None means never.
    reduction_converged: jax.Array | None = None
    radius_converged: jax.Array | None = None
    # The largest violation of the bounds and constraints at the new x, relative to
    # max(1, |bound|), for the history (``History.violation``): set by the solvers whose
    # ``violation`` method reports one (then on every step of a run with a history), else
    # None. Last in the tuple, so that positional constructions keep working.
    violation: jax.Array | None = None
    # The driver's own measures at the new x, where the solver computed them in one of its
    # kernels: the gradient's (projected) inf-norm, as gtol and the history take it, and
    # whether every entry of g and of x is finite; None: the driver computes them (a
    # reduction over the iterate each).
    grad_norm: jax.Array | None = None
    g_finite: jax.Array | None = None
    x_finite: jax.Array | None = None


class NativeSolver(abc.ABC):  # noqa: B024  (its subclasses declare the abstract steps)
    """What every JAX-native solver tells the driver, beyond its methods.

    Attributes:
      detect_stall: report STALLED when a step leaves x unchanged (False for ML
        optimizers, where a zero step is legitimate: a warm-up schedule at 0).
      select_state: on a failed step, keep the previous state (True), or the step's own
        state when it is itself fit to keep (finite, its model reset), which spares a
        select over large states (quasi-Newton memories) every iteration.
      default_gtol: the gtol used when ``solve`` got none (None: no gradient test).
      default_maxiters: likewise for maxiters (None: no limit).
      keeps_point: a step's x, f and g are the previous ones wherever the driver fails it
        (its failure; a non-finite x, f or g only where the previous one was), so the
        driver does not select them: with the solver's own select that would be a second
        kernel per carried value.
      evaluates_together: every evaluation the solver makes is of the value and the
        gradient together (a step's ``f_evals`` and ``grad_evals`` are always equal), so
        the driver counts them once: one counter less to write at every step.
      tests_tolerances: the solver tests ``ftol`` and ``xtol`` itself, in its own terms
        (reported through ``Step.reduction_converged`` / ``radius_converged``), in place of
        the driver's tests; it reads them from the options :meth:`bind_options` hands it.
    """

    detect_stall: ClassVar[bool] = False
    select_state: ClassVar[bool] = True
    keeps_point: ClassVar[bool] = False
    evaluates_together: ClassVar[bool] = False
    tests_tolerances: ClassVar[bool] = False
    default_gtol: float | None = None
    default_maxiters: int | None = None

    def bind_options(self, options: Any) -> None:  # noqa: B027  (optional hook: no-op)
        """Called once by the driver, before ``init``, with the run's ``SolveOptions``."""


class SteppingSolver(NativeSolver):
    """A solver whose step returns the new iterate's value and gradient.

    A constrained method reports the constraint violation for the history
    (``History.violation``) in two places: :meth:`violation` at the first iterate, and
    ``Step.violation`` at every new one. Both measure the largest violation of the bounds
    and constraints, relative to max(1, |bound|). Solvers that report none leave both
    alone (the defaults, None), and their program has nothing added.
    """

    @abc.abstractmethod
    def init(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree) -> PyTree:
        """The state at the first iterate ``x`` (value ``f``, gradient ``g``)."""

    @abc.abstractmethod
    def step(self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree, state: PyTree) -> Step:
        """One iteration from ``x``."""

    def violation(self, objective: Objective, x: PyTree, state: PyTree) -> jax.Array | None:
        """The largest violation of the bounds and constraints at the first iterate ``x``
        (``state``: the solver's state there, from ``init`` or a resumed run), relative to
        max(1, |bound|): the first entry of the history's ``violation`` column.

        None (this default): the solver reports no violation; the record has no such
        column and ``History.violation`` is None, and the driver adds nothing to the
        program. A solver that returns a scalar here (a constrained method) reports the
        violation at every new iterate too, in ``Step.violation``. The driver calls it only
        when it records a history (``options.history``), once, outside the loop, and reads
        ``Step.violation`` only then: a solver may leave it None without a history (read
        ``options.history`` in :meth:`bind_options`), so that its program is unchanged.
        """
        return None


class GradientStepSolver(NativeSolver):
    """A solver whose update needs only the gradient at the current iterate.

    The driver evaluates ``f`` and its gradient at each iterate, checks them, then calls
    ``update``; nothing is carried across iterations but the iterate and the state.
    """

    @abc.abstractmethod
    def init(self, objective: Objective, x: PyTree) -> PyTree:
        """The state at the first iterate ``x``."""

    @abc.abstractmethod
    def update(
        self, objective: Objective, x: PyTree, f: jax.Array, g: PyTree, state: PyTree
    ) -> Update:
        """The next iterate and state, with what the update cost and whether it failed."""


class Update(NamedTuple):
    """A gradient step's result: the next iterate and state, the evaluations of f and of
    the gradient the update made itself (a value-only line search's trials) beyond the
    driver's one, and whether its line search met non-finite values (the run then fails,
    keeping the current iterate)."""

    x: PyTree
    state: PyTree
    f_evals: jax.Array
    grad_evals: jax.Array
    failed: jax.Array
