"""The scipy family: scipy.optimize's local, global and least-squares methods, evaluated on
the host with JAX derivatives; one row of a method table per method."""

from optsolve.backends.scipy import backend, least_squares  # noqa: F401  (registration)
