"""The JAX-native constrained methods, on the shared driver: interior point (and, next,
augmented Lagrangian), with bounds and general constraints."""

from optsolve.backends.constrained import algorithms  # noqa: F401  (registration)
