"""Which backend runs which algorithm: a registry keyed on the algorithm's type.

Backend modules fill it when imported; ``solve`` only looks things up. Adding a family is
one new backend module calling :func:`register_backend` (and :func:`register_adapter` for
foreign objects, such as a raw optax transformation, that it turns into an Algorithm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optsolve.solve_api.algorithm import Algorithm

Backend = Callable[..., Any]

_BACKENDS: dict[type, Backend] = {}
_ADAPTERS: dict[type, Callable[[Any], Algorithm]] = {}
_ALGORITHMS: list[type[Algorithm]] = []


def register_backend(algorithm_type: type[Algorithm], backend: Backend) -> None:
    """Route algorithms of ``algorithm_type`` (and subclasses) to
    ``backend(problem, alg, opts)``."""
    _BACKENDS[algorithm_type] = backend


def register_algorithm(algorithm_type: type[Algorithm]) -> type[Algorithm]:
    """List a concrete algorithm class (for error messages and the catalog)."""
    if algorithm_type not in _ALGORITHMS:
        _ALGORITHMS.append(algorithm_type)
    return algorithm_type


def register_adapter(foreign_type: type, adapter: Callable[[Any], Algorithm]) -> None:
    """Accept instances of ``foreign_type`` as algorithms by converting them with ``adapter``."""
    _ADAPTERS[foreign_type] = adapter


def algorithm_classes() -> list[type[Algorithm]]:
    """Every registered concrete algorithm class, in registration order."""
    return list(_ALGORITHMS)


def as_algorithm(obj: Any) -> Algorithm:
    """``obj`` itself if it is an Algorithm, else its adapted form; a clear error otherwise."""
    if isinstance(obj, Algorithm):
        return obj
    for klass in type(obj).__mro__:
        if klass in _ADAPTERS:
            return _ADAPTERS[klass](obj)
    if isinstance(obj, type) and issubclass(obj, Algorithm):
        raise TypeError(
            f"solve: `algorithm` must be an instance, got the class {obj.__name__}; "
            f"call it, e.g. {obj.__name__}(...)."
        )
    raise TypeError(
        "solve: `algorithm` must be an optsolve algorithm (e.g. optsolve.Adam(1e-3)) or an "
        f"optax GradientTransformation, got {type(obj).__name__}: {obj!r}."
    )


def backend_for(algorithm: Algorithm) -> Backend:
    """The backend registered for the algorithm's type, searching its class hierarchy."""
    for klass in type(algorithm).__mro__:
        if klass in _BACKENDS:
            return _BACKENDS[klass]
    raise TypeError(f"solve: no backend is registered for {type(algorithm).__name__}.")
