"""Backends, one module per family. Importing this package registers them all."""

from optsolve.backends import optax_backend, optax_algorithms, optax_groups  # noqa: F401
from optsolve.backends import classical, quasi_newton, second_order  # noqa: F401  (registration)
from optsolve.backends import scipy_backend  # noqa: F401  (registration)
