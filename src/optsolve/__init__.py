"""optsolve: one interface over every kind of optimizer for JAX users."""

from optsolve.solve_api import (
    Algorithm, Constraint, OptimizationProblem, ReturnCode, Solution, Stats, solve,
)
from optsolve.backends.optax_backend import OptaxAlgorithm, OptaxTransform
from optsolve.backends.optax_algorithms import ALGORITHMS as _OPTAX_ALGORITHMS

globals().update(_OPTAX_ALGORITHMS)

__version__ = "0.1.0"
__all__ = [
    "Algorithm", "Constraint", "OptimizationProblem", "ReturnCode", "Solution", "Stats", "solve",
    "OptaxAlgorithm", "OptaxTransform", *sorted(_OPTAX_ALGORITHMS),
]
