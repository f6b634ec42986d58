"""The JAX-native driver every compiled family runs on: the solver protocol, the stopping
rules, the loop (whole, chunked for Ctrl-C, or unrolled) and training on data."""
