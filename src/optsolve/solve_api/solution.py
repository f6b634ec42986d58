"""The one result type every backend returns."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import numpy as np

from optsolve.solve_api.pytree import pytree_dataclass, static_field
from optsolve.solve_api.returncode import ReturnCode, reason_text

PyTree = Any


@pytree_dataclass
class Stats:
    """Counters of one solve. Any field may be None where the backend cannot know it.

    Attributes:
      iterations: accepted iterations (optimizer steps).
      f_evals: objective evaluations, line-search trials included.
      grad_evals: gradient evaluations.
      time: wall-clock seconds of the solve; None when ``solve`` ran inside a JAX
        transformation (jit, vmap, grad), where the host cannot time it.
      skipped: steps on data whose update was skipped because their batch's loss or
        gradient was not finite (``nonfinite="skip"``, or an ``optax.apply_if_finite``
        transformation); None where no step may be skipped. They count in ``iterations``.
    """

    iterations: Any = None
    f_evals: Any = None
    grad_evals: Any = None
    time: Any = None
    skipped: Any = None


@pytree_dataclass
class History:
    """Per-iteration record of a run, written inside the compiled loop (no host round-trips).

    Attributes:
      objective: ``f`` at iterates 0, 1, ..., maxiters (index = iteration of this run);
        NaN past the last iterate.
      grad_norm: the gradient's infinity norm (projected where the problem has bounds)
        at the same iterates; NaN past the last.
      metrics: with ``solve(..., metrics=fn)`` (or a problem with ``has_aux=True``), the
        values of ``fn(x, p[, batch])`` (of aux) at the same iterates: a pytree like one
        value, each leaf with the iterates as its leading axis (floats; NaN past the
        last); None otherwise.
      evaluation: with ``solve(..., evaluate=fn, eval_every=k)``, ``fn(x, p)`` at
        iterates 0, k, 2k, ... (NaN at the others), leaves as in ``metrics``; None
        otherwise.
      violation: for the methods that honour constraints (the JAX-native constrained
        family, InteriorPoint and the like, and the scipy methods that take constraints),
        the largest violation of the bounds and constraints at the same iterates,
        relative to max(1, |bound|) (the measure of the INFEASIBLE verdict); NaN past the
        last. None for the other methods.
    """

    objective: Any
    grad_norm: Any
    metrics: Any = None
    evaluation: Any = None
    violation: Any = None

    def plot(self, ax=None, log: bool = True):
        """Plot objective and gradient norm (and the constraint violation, where
        recorded) against the iteration (needs matplotlib)."""
        import matplotlib.pyplot as plt
        import numpy as np

        if ax is None:
            _, ax = plt.subplots()
        objective, grad_norm = np.asarray(self.objective), np.asarray(self.grad_norm)
        steps = np.arange(objective.shape[-1])
        ax.plot(steps, objective, label="objective")
        ax.plot(steps, grad_norm, label="gradient inf-norm")
        if self.violation is not None:
            ax.plot(steps, np.asarray(self.violation), label="constraint violation")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.legend()
        return ax


@pytree_dataclass
class Solution:
    """What ``solve`` returns, whatever ran underneath. A pytree: it can leave jit and vmap.

    Attributes:
      x: the solution, a pytree like ``problem.x0``.
      objective: ``f(x, p)`` at ``x``.
      retcode: a :class:`ReturnCode` (an int32 array inside JAX transformations).
      stats: :class:`Stats`.
      original: the backend's own result (optax: the optimizer state; scipy: OptimizeResult).
      state: the final optimizer state, from which a run can continue
        (``solve(problem, algorithm, resume=sol, maxiters=m)``).
      history: a :class:`History` when ``solve`` was asked for one, else None.
      reason: which test stopped a JAX-native run, an int code of
        :data:`~optsolve.solve_api.returncode.REASONS` (None where the backend says it in
        ``detail``).
      multipliers: for a problem with general constraints, the Lagrange multipliers at
        ``x``, one array per constraint shaped like its ``g``: the solver's own where it
        computes them (SLSQP, trust-constr), else the least-squares solution of the KKT
        conditions (:func:`~optsolve.solve_api.kkt.multipliers`, zero where inactive). One
        sign everywhere: ``-multipliers[j]`` is the derivative of the optimal objective with
        respect to constraint j's active bound. None without constraints.
      aux: for a problem with ``has_aux=True``, the auxiliary output of f at ``x``; else
        None.
      model_state: inside ``solve`` only: the carried leaves of a model (a problem with
        ``trainable``) as the run left them, which ``solve`` puts back into ``x``; None on
        the Solution ``solve`` returns.
      detail: the backend's own reason in full (scipy's message), or None.
      problem: the problem ``solve`` solved (what :func:`~optsolve.covariance` reads); an
        attribute of this object, not a pytree leaf, so it does not cross ``jax.jit`` (None
        on a Solution that did).
    """

    problem: ClassVar[Any] = None  # set per object by solve

    x: PyTree
    objective: Any
    retcode: Any
    stats: Stats
    original: Any = None
    state: Any = None
    history: History | None = None
    reason: Any = None
    multipliers: Any = None
    aux: Any = None
    model_state: Any = None
    detail: str | None = static_field(default=None)

    @property
    def success(self) -> Any:
        """True where the run converged (``retcode == ReturnCode.SUCCESS``)."""
        return self.retcode == ReturnCode.SUCCESS

    @property
    def message(self) -> str:
        """optsolve's summary of the retcode, then the reason the backend gave, in full
        (for concrete, unbatched solutions)."""
        code = _concrete_code(self.retcode)
        if code is None:
            return "retcode is traced or batched; call .message on a single concrete Solution"
        parts = [code.message]
        reason = _concrete_code(self.reason, reason_text)
        if reason:
            parts.append(reason)
        skipped = self.stats.skipped if self.stats is not None else None
        if (
            skipped is not None
            and np.ndim(skipped) == 0
            and not isinstance(skipped, jax.core.Tracer)
            and int(skipped) > 0
        ):
            parts.append(
                f"{int(skipped)} step(s) skipped: their batch's loss or gradient was not finite"
            )
        if self.detail:
            parts.append(f"backend: {self.detail}")
        return "; ".join(parts)

    def __repr__(self) -> str:
        code = _concrete_code(self.retcode)
        rc = code.name if code is not None else repr(self.retcode)
        return (
            f"Solution(retcode={rc}, objective={self.objective!r}, "
            f"iterations={self.stats.iterations!r}, x={self.x!r})"
        )


def _concrete_code(retcode: Any, convert: Any = ReturnCode) -> Any:
    if retcode is None or isinstance(retcode, jax.core.Tracer) or np.ndim(retcode) != 0:
        return None
    if isinstance(retcode, ReturnCode):
        return retcode
    return convert(int(retcode))
