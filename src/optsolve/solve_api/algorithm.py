"""The base every optsolve algorithm derives from, with its capability traits."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any, ClassVar


def check_replace(algorithm: Any, changes: dict[str, Any], valid: Iterable[str]) -> None:
    """Raise a TypeError naming the valid names when ``changes`` holds another one."""
    valid = list(valid)
    unknown = sorted(set(changes) - set(valid))
    if unknown:
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise TypeError(
            f"{type(algorithm).__name__}.replace: unknown hyperparameter(s) {unknown}; valid: "
            f"{', '.join(valid) or '(none)'}.{hint}"
        )


def argument_error(cls: type, args: tuple, kwargs: dict) -> str | None:
    """A short message for a construction ``cls(*args, **kwargs)`` whose arguments do not
    fit the class's signature (the argument, the nearest valid name, the valid names), or
    None when they fit."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()):
        return None  # a class taking any arguments checks them itself
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        problem = str(err)
    else:
        return None
    names = [
        n
        for n, p in signature.parameters.items()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    unknown = [k for k in kwargs if k not in names]
    if unknown:  # named first: a misspelling also leaves its argument missing
        problem = f"unknown argument(s) {', '.join(map(repr, unknown))}"
    close = difflib.get_close_matches(unknown[0], names, n=1) if unknown else []
    hint = f"; did you mean {close[0]!r}?" if close else "."
    required = [
        n
        for n, p in signature.parameters.items()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    needs = f" (required: {', '.join(required)})" if required else ""
    start = f"{cls.__name__}: {problem}{hint} {cls.__name__} takes "
    takes = ", ".join(names) or "no arguments"
    if len(start) + len(takes) + len(needs) > 280:  # a long list, cut: help() has it whole
        room = 280 - len(start) - len(needs) - len(f", ... ({len(names)} in all)")
        shown: list[str] = []
        for n in names:
            if len(", ".join(shown + [n])) > room:
                break
            shown.append(n)
        takes = f"{', '.join(shown)}, ... ({len(names)} in all)"
    return f"{start}{takes}{needs}."


def _declared_signature(cls: type[Any]) -> inspect.Signature:
    for klass in cls.__mro__:
        for name in ("_declared_signature", "__signature__"):
            own = klass.__dict__.get(name)
            if isinstance(own, inspect.Signature):
                return own
    init = inspect.signature(cls.__init__)
    return init.replace(parameters=list(init.parameters.values())[1:])  # without self


class _Checked(type):
    """The metaclass of :class:`Algorithm`: a construction with arguments the class does
    not take raises a short TypeError naming the valid ones (and the nearest to a misspelled
    one), for every algorithm class in one place, instead of its signature with every
    annotation. Other errors of a construction pass unchanged."""

    # inspect.signature(cls) would otherwise read this metaclass's __call__: the class's
    # own (declared, or its __init__'s) stays what help() and the docs show
    @property
    def __signature__(cls) -> inspect.Signature:
        return _declared_signature(cls)

    @__signature__.setter
    def __signature__(cls, value: inspect.Signature) -> None:
        type.__setattr__(cls, "_declared_signature", value)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except TypeError as err:
            message = argument_error(cls, args, kwargs)
            if message is None:
                raise
            raise TypeError(message) from err


class Algorithm(metaclass=_Checked):
    """Base class of optsolve algorithms: immutable pytrees whose numeric hyperparameters
    are leaves, so a new value reuses compiled code.

    Capability traits are class attributes, checked in one place by ``solve`` before
    dispatch (see :mod:`optsolve.solve_api.capabilities`):

    Attributes:
      family: the backend family's name, as shown in errors and the catalog.
      needs_gradient: uses the gradient of f.
      needs_hessian: uses Hessian(-vector) products of f.
      needs_residuals: works on the residuals of a
        :class:`~optsolve.solve_api.least_squares.LeastSquaresProblem` and their Jacobian.
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
      threads_model_state: evaluates f once per step, so that a model's state that f
        changes in place (BatchNorm statistics, RNG counters; a problem with ``trainable``)
        is carried from step to step and returned in ``sol.x``.
      compiled_driver: runs in optsolve's compiled JAX loop, which starts from x0 itself
        (``maxiters=0`` returns its initial state); other backends are not called then.
      dense_matrices: how many dense matrices of x's size squared (n x n; for a method on
        residuals n x max(n, m), m residuals) the run holds at once: BFGS's inverse Hessian
        and its update; 0 for matrix-free methods. ``solve`` refuses, before it runs, a
        problem whose matrices would not fit in memory.
      float_dtypes: the floating-point dtypes x0 may hold, by name; ``solve`` refuses
        another before the run (LAPACK's factorisations have no 16-bit kernels; float16's
        range, 6e-5 to 65504, defeats methods whose estimates underflow or overflow it).
      solves_roots: how it solves a :class:`~optsolve.RootProblem` (F(x, p) = 0), or None
        where it solves none: "field" (a JAX-native root finder, handed the problem's
        :class:`~optsolve.solve_api.root_problem.RootSystem`), "residuals" (a least-squares
        method, handed the least-squares problem of F), "scipy" (scipy's ``root``).
      roots_only: it solves RootProblems only (NewtonRaphson, Broyden, ScipyRoot): ``solve``
        refuses a minimisation or least-squares problem.
      conditional_traits: traits that hold only for some configurations of an instance
        (see :meth:`capabilities`), each with the condition, which errors list with the name.
    """

    family: ClassVar[str] = "abstract"
    needs_gradient: ClassVar[bool] = True
    needs_hessian: ClassVar[bool] = False
    needs_residuals: ClassVar[bool] = False
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
    compiled_driver: ClassVar[bool] = False
    threads_model_state: ClassVar[bool] = False
    dense_matrices: ClassVar[int] = 0
    float_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32", "float64")
    solves_roots: ClassVar[str | None] = None
    roots_only: ClassVar[bool] = False
    # Its backend returns a multiplier for every constraint component (never NaN), so
    # solve computes the least-squares KKT multipliers only for their derivative.
    gives_multipliers: ClassVar[bool] = False
    conditional_traits: ClassVar[dict[str, str]] = {}

    @classmethod
    def traits(cls) -> dict[str, Any]:
        """The capability traits of this algorithm class, by name."""
        names = (
            "family",
            "needs_gradient",
            "needs_hessian",
            "needs_residuals",
            "takes_bounds",
            "takes_constraints",
            "jittable",
            "vmappable",
            "stops_by_itself",
            "extra_options",
            "unrollable",
            "resumable",
            "records_history",
            "takes_data",
            "compiled_driver",
            "threads_model_state",
            "dense_matrices",
            "float_dtypes",
            "solves_roots",
            "roots_only",
        )
        return {n: getattr(cls, n) for n in names}

    def replace(self, **changes: Any) -> Algorithm:
        """A copy with some hyperparameters changed, validated like a new construction.

        Raises:
          TypeError: naming the valid hyperparameters, for a name the algorithm lacks.
        """
        if not dataclasses.is_dataclass(self):
            raise NotImplementedError(f"{type(self).__name__} does not define replace().")
        # a field the constructor does not take is the algorithm's own (set by
        # specialised_for), not a hyperparameter
        names = [f.name for f in dataclasses.fields(self) if f.init]
        check_replace(self, changes, names)
        return dataclasses.replace(self, **changes)

    def capabilities(self) -> dict[str, Any]:
        """This instance's capability traits, by name: its class's, unless its configuration
        changes one (basinhopping's local method). ``solve`` checks these, once."""
        return type(self).traits()

    def specialised_for(self, problem: Any) -> Algorithm:
        """This configuration with its static choices made for ``problem`` while the
        problem is still concrete (``solve`` calls it before any tracing of its own): itself
        by default. A choice that depends on the problem's values, not only its structure
        (InteriorPoint's ``linear_solver="auto"``), is made here."""
        return self

    def minimised_problem(self, problem: Any) -> Any:
        """The problem this configuration actually minimises: ``problem`` itself by default.

        The implicit adjoint differentiates the optimality condition of this problem's ``f``
        and ``Solution.objective`` is its value, so an algorithm that minimises something
        else than ``problem.f`` (a robust loss of the residuals, as
        :class:`~optsolve.ScipyLeastSquares` can) returns that objective's problem here."""
        return problem

    def inverse_hessian_estimate(self, problem: Any, state: Any) -> Callable[[Any], Any] | None:
        """The run's own estimate of v -> H^-1 v at its solution, on x flattened with
        ``jax.flatten_util.ravel_pytree``, from its final ``state`` (an L-BFGS memory): the
        implicit adjoint's CG preconditioner. None (no estimate) by default."""
        return None

    def unrolls_by_forward_passes(self) -> bool:
        """Whether :class:`~optsolve.solve_api.adjoint.UnrolledAdjoint` differentiates this
        configuration by forward passes (:mod:`~optsolve.solve_api.forward_passes`), for
        iterations that hold a loop reverse mode cannot transpose; False by default."""
        return False

    def unrolling_hazards(self) -> list[str]:
        """Warnings for differentiating this configuration by unrolling its iterations
        (:class:`~optsolve.solve_api.adjoint.UnrolledAdjoint`), each naming the fix; none by
        default."""
        return []
