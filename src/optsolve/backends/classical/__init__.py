"""The JAX-native classical methods: line searches, gradient descent, nonlinear CG,
quasi-Newton, Newton and trust region, Gauss-Newton and Levenberg-Marquardt."""

from optsolve.backends.classical import (  # noqa: F401  (registration)
    descent,
    least_squares,
    quasi_newton,
    second_order,
)
