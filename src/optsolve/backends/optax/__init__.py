"""The optax family: every optax optimizer as a pytree algorithm, raw transformations,
parameter groups, composition (chain, MultiSteps, ApplyIfFinite) and pytree schedules."""

from optsolve.backends.optax import (  # noqa: F401  (registration)
    algorithms,
    backend,
    compose,
    groups,
    schedules,
)
