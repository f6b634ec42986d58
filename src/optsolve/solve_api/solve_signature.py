"""``solve``'s keyword options as its own signature declares them, for the modules that
``solve`` is built on and that still name its keywords: the error listing the valid options
(:mod:`~optsolve.solve_api.options`) and the root path's check of which options a call
changed (:mod:`~optsolve.solve_api.roots`).

Those modules are imported by :mod:`~optsolve.solve_api.solve`, so they cannot import it
back (an import cycle). Instead ``solve`` declares itself here where it is defined
(``@declare_solve_signature``), and its ``def`` stays the one place where the keywords and
their defaults are written. Importing any optsolve module imports the package, which
defines ``solve``, so the signature is declared before anything can ask for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

Function = TypeVar("Function", bound=Callable[..., Any])

_declared: dict[str, inspect.Signature] = {}


def declare_solve_signature(solve: Function) -> Function:
    """Decorator for ``solve``: note its signature, and return it unchanged."""
    _declared["solve"] = inspect.signature(solve)
    return solve


def solve_keyword_defaults() -> dict[str, Any]:
    """``solve``'s keyword-only parameters and their defaults, in its signature's order."""
    try:
        signature = _declared["solve"]
    except KeyError:
        raise RuntimeError(
            "optsolve.solve_api.solve has not declared its signature: import "
            "optsolve (which defines solve) first."
        ) from None
    return {
        name: param.default
        for name, param in signature.parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY
    }
