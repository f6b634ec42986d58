"""Backends, one subpackage per family over the shared driver in ``native``. Importing this
package registers them all."""

from optsolve.backends import classical, constrained, optax, scipy  # noqa: F401  (registration)
