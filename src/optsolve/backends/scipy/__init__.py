"""The scipy family: scipy.optimize's local, global and least-squares methods, evaluated on
the host with JAX derivatives; one row of a method table per method."""

from optsolve.backends.scipy import backend  # noqa: F401  (registration)
from optsolve.backends.scipy import least_squares  # noqa: F401  (registration)
