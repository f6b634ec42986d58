"""Test set-up: float64 available everywhere (float32 tests ask for it explicitly) and
JAX's strict dtype promotion, so silent up-casts are errors. Warnings are errors
(pyproject's filterwarnings)."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
