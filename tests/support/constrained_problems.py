"""Shared constrained reference problems: Hock & Schittkowski's problems 35 (its objective)
and 71, and the Wächter-Biegler example.

W. Hock, K. Schittkowski, *Test Examples for Nonlinear Programming Codes*, Lecture Notes in
Economics and Mathematical Systems 187, Springer (1981), problem 71: four variables in
[1, 5], the product >= 25 and the sum of squares == 40, from (1, 5, 5, 1); f* = 17.0140173
at (1, 4.7429994, 3.8211503, 1.3794082). The functions are module-level so that every
variant (a new product bound, another dtype) shares one compiled loop.
"""

import jax.numpy as jnp
import numpy as np

from optsolve import Constraint, OptimizationProblem

HS071_F = 17.0140173
HS071_X = np.array([1.0, 4.7429994, 3.8211503, 1.3794082])


def hs035_objective(x, p):
    """HS035's convex quadratic (f* = 1/9 at (4/3, 7/9, 4/9) with x >= 0 and
    x0 + x1 + 2 x2 <= 3)."""
    return (
        9
        - 8 * x[0]
        - 6 * x[1]
        - 4 * x[2]
        + 2 * x[0] ** 2
        + 2 * x[1] ** 2
        + x[2] ** 2
        + 2 * x[0] * x[1]
        + 2 * x[0] * x[2]
    )


def hs071_objective(x, p):
    return x[0] * x[3] * (x[0] + x[1] + x[2]) + x[2]


def hs071_product(x, p):
    return jnp.prod(x)


def hs071_squares(x, p):
    return jnp.sum(x**2)


def hs071(product=25.0, dtype=jnp.float64) -> OptimizationProblem:
    """HS071 with the product's bound (25) a leaf, the sum of squares an equality."""
    return OptimizationProblem(
        hs071_objective,
        jnp.array([1.0, 5.0, 5.0, 1.0], dtype),
        bounds=(1.0, 5.0),
        constraints=[
            Constraint(hs071_product, lower=jnp.asarray(product, dtype)),
            Constraint(hs071_squares, lower=40.0, upper=40.0),
        ],
    )


def _wb_objective(x, p):
    return x[0]


def _wb_square(x, p):
    return x[0] ** 2 - x[1] + p[0]


def _wb_linear(x, p):
    return x[0] - x[2] - p[1]


def wachter_biegler(x0, p=(-1.0, 0.5)) -> OptimizationProblem:
    """A. Wächter, L. T. Biegler, Math. Programming 88 (2000) 565-574: min x1 s.t.
    x1^2 - x2 + a = 0, x1 - x3 - b = 0, x2, x3 >= 0, p = (a, b); the example's own is
    (-1, 1/2) from x0 = (-2, 1, 1), where a line-search interior-point method without
    feasibility restoration stalls at an infeasible point. Its solution, by hand: x1 >= b
    and x1^2 >= -a, least x1 = 1, x* = (1, 0, 1/2)."""
    inf = jnp.inf
    return OptimizationProblem(
        _wb_objective,
        jnp.asarray(x0, jnp.float64),
        jnp.asarray(p, jnp.float64),
        bounds=(jnp.array([-inf, 0.0, 0.0]), jnp.array([inf, inf, inf])),
        constraints=[
            Constraint(_wb_square, lower=0.0, upper=0.0),
            Constraint(_wb_linear, lower=0.0, upper=0.0),
        ],
    )
