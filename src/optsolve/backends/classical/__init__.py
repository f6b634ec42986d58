"""The JAX-native classical methods: line searches, gradient descent, nonlinear CG,
quasi-Newton, Newton and trust region."""

from optsolve.backends.classical import descent, quasi_newton, second_order  # noqa: F401  (registration)
