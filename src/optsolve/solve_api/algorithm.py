"""The base every optsolve algorithm derives from, with its capability traits."""

from __future__ import annotations

from typing import Any, ClassVar


class Algorithm:
    """Base class of optsolve algorithms: immutable pytrees whose numeric hyperparameters
    are leaves, so a new value reuses compiled code.

    Capability traits are class attributes, checked in one place by ``solve`` before
    dispatch (see :mod:`optsolve.solve_api.capabilities`):

    Attributes:
      family: the backend family's name, as shown in errors and the catalog.
      needs_gradient: uses the gradient of f.
      needs_hessian: uses Hessian(-vector) products of f.
      takes_bounds: honours ``problem.bounds``.
      takes_constraints: honours ``problem.constraints``.
      jittable: ``solve`` may run inside ``jax.jit``.
      vmappable: ``solve`` may run under ``jax.vmap``.
      stops_by_itself: has a default convergence test; when False ``solve`` needs
        ``maxiters`` (or gtol / ftol / maxtime).
      extra_options: options accepted by ``solve`` beyond the common vocabulary.
      unrollable: the run can be differentiated by unrolling its iterations
        (:class:`~optsolve.solve_api.adjoint.UnrolledAdjoint`).
      resumable: ``solve(..., resume=sol)`` continues an earlier run.
      records_history: ``solve(..., history=True)`` records every iterate's objective.
      takes_data: trains on ``solve(..., data=...)`` with an objective f(x, p, batch).
    """

    family: ClassVar[str] = "abstract"
    needs_gradient: ClassVar[bool] = True
    needs_hessian: ClassVar[bool] = False
    takes_bounds: ClassVar[bool] = False
    takes_constraints: ClassVar[bool] = False
    jittable: ClassVar[bool] = True
    vmappable: ClassVar[bool] = True
    stops_by_itself: ClassVar[bool] = False
    extra_options: ClassVar[tuple[str, ...]] = ()
    unrollable: ClassVar[bool] = False
    resumable: ClassVar[bool] = False
    records_history: ClassVar[bool] = False
    takes_data: ClassVar[bool] = False

    @classmethod
    def traits(cls) -> dict[str, Any]:
        """The capability traits of this algorithm class, by name."""
        names = (
            "family", "needs_gradient", "needs_hessian", "takes_bounds", "takes_constraints",
            "jittable", "vmappable", "stops_by_itself", "extra_options", "unrollable",
            "resumable", "records_history", "takes_data",
        )
        return {n: getattr(cls, n) for n in names}
