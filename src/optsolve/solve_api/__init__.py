"""What users touch: the problem, solve(), the solution and its return codes."""

from optsolve.solve_api.adjoint import ImplicitAdjoint, UnrolledAdjoint
from optsolve.solve_api.algorithm import Algorithm
from optsolve.solve_api.checkpoint import load, save
from optsolve.solve_api.compilation_cache import enable_compilation_cache
from optsolve.solve_api.least_squares import LeastSquaresProblem
from optsolve.solve_api.problem import Constraint, OptimizationProblem
from optsolve.solve_api.returncode import ReturnCode
from optsolve.solve_api.solution import Solution, Stats
from optsolve.solve_api.solve import solve

__all__ = [
    "Algorithm",
    "Constraint",
    "ImplicitAdjoint",
    "LeastSquaresProblem",
    "OptimizationProblem",
    "ReturnCode",
    "Solution",
    "Stats",
    "UnrolledAdjoint",
    "enable_compilation_cache",
    "load",
    "save",
    "solve",
]
