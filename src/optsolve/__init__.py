"""optsolve: one interface over every kind of optimizer for JAX users."""

# Not sorted: these imports register the algorithm classes, and their order is the order
# the catalog and error messages list them in.
# isort: off
from optsolve.solve_api import (
    Algorithm,
    Constraint,
    ImplicitAdjoint,
    LeastSquaresProblem,
    OptimizationProblem,
    ReturnCode,
    Solution,
    Stats,
    UnrolledAdjoint,
    enable_compilation_cache,
    load,
    save,
    solve,
)
from optsolve.backends.optax.backend import OptaxAlgorithm, OptaxTransform
from optsolve.backends.optax.groups import ParameterGroups
from optsolve.backends.optax import schedules
from optsolve.backends.optax.compose import (
    AddDecayedWeights,
    ApplyIfFinite,
    Chain,
    Clip,
    ClipByGlobalNorm,
    MultiSteps,
    Scale,
    chain,
)
from optsolve.backends.optax.algorithms import ALGORITHMS as _OPTAX_ALGORITHMS
from optsolve.backends.classical.descent import GradientDescent, NonlinearCG
from optsolve.backends.classical.linesearch import Backtracking, Zoom
from optsolve.backends.classical.quasi_newton import BFGS, LBFGS
from optsolve.backends.classical.second_order import AdaHessian, Newton, TrustRegion
from optsolve.backends.classical.least_squares import GaussNewton, LevenbergMarquardt
from optsolve.backends.classical.roots import Broyden, NewtonRaphson
from optsolve.solve_api.root_problem import RootProblem
from optsolve.backends.classical.scalar import Brent, GoldenSection
from optsolve.backends.classical.bracketing import Bisection, Brentq
from optsolve.backends.native.multistart import Multistart
from optsolve.backends.constrained.algorithms import AugmentedLagrangian, InteriorPoint
from optsolve.backends.scipy.backend import ScipyGlobal, ScipyMinimize
from optsolve.backends.scipy.least_squares import ScipyLeastSquares
from optsolve.backends.scipy.root import ScipyRoot
from optsolve.backends.scipy.scalar import ScipyMinimizeScalar
from optsolve.solve_api.covariance import covariance
from optsolve.solve_api.recompilation import RecompilationWarning
from optsolve.fitting import curve_fit, curve_fit_problem
# isort: on

globals().update(_OPTAX_ALGORITHMS)

__version__ = "0.1.0"
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
    "load",
    "save",
    "solve",
    "enable_compilation_cache",
    "OptaxAlgorithm",
    "OptaxTransform",
    "ParameterGroups",
    *sorted(_OPTAX_ALGORITHMS),
    "AddDecayedWeights",
    "ApplyIfFinite",
    "Chain",
    "Clip",
    "ClipByGlobalNorm",
    "MultiSteps",
    "Scale",
    "chain",
    "AdaHessian",
    "BFGS",
    "Backtracking",
    "GaussNewton",
    "GradientDescent",
    "LBFGS",
    "LevenbergMarquardt",
    "Newton",
    "NonlinearCG",
    "TrustRegion",
    "Zoom",
    "Multistart",
    "Brent",
    "GoldenSection",
    "ScipyMinimizeScalar",
    "ScipyGlobal",
    "ScipyLeastSquares",
    "ScipyMinimize",
    "covariance",
    "curve_fit",
    "curve_fit_problem",
    "schedules",
    "RecompilationWarning",
    "RootProblem",
    "NewtonRaphson",
    "Broyden",
    "ScipyRoot",
    "Bisection",
    "Brentq",
    "InteriorPoint",
    "AugmentedLagrangian",
]
