"""Backends, one module per family. Importing this package registers them all."""

from optsolve.backends import optax_backend, optax_algorithms  # noqa: F401  (registration)
