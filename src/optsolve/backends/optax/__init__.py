"""The optax family: every optax optimizer as a pytree algorithm, raw transformations,
parameter groups."""

from optsolve.backends.optax import algorithms, backend, groups  # noqa: F401  (registration)
