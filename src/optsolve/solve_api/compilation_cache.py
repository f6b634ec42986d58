"""JAX's persistent compilation cache, turned on by one call: a later process that builds
the same program (the same objective, shapes, dtypes and algorithm) reads the compiled
code from disk instead of compiling it again."""

from __future__ import annotations

import os
from pathlib import Path

import jax


def default_path() -> Path:
    """``$XDG_CACHE_HOME/optsolve/jax``, or ``~/.cache/optsolve/jax``."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "optsolve" / "jax"


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path:
    """Turn on JAX's persistent compilation cache for this process, in ``path``.

    Every program JAX compiles from then on is written to the directory, and a later
    process that compiles the same program (the same function, shapes, dtypes, compiler
    options, JAX version and device) loads it instead: a script's first solve, run again,
    skips XLA's compilation. Tracing still runs in each process.

    Programs of every size and compile time are written. JAX's own defaults write only
    those that took a second or more to compile, which leaves out most of optsolve's.
    Call it at start-up, before the first solve: programs compiled earlier in the process
    are not written. The directory grows without bound unless JAX's own
    ``jax_compilation_cache_max_size`` is set (which needs the ``filelock`` package).

    The cache holds executable code: keep it in a directory that only you can write to,
    as JAX's guide to the cache says.

    Args:
      path: the cache directory, created if missing. Default: ``~/.cache/optsolve/jax``
        (under ``$XDG_CACHE_HOME`` where that is set).

    Returns:
      The cache directory, absolute.

    Example:
      >>> import optsolve
      >>> optsolve.enable_compilation_cache()  # doctest: +SKIP
      PosixPath('/home/me/.cache/optsolve/jax')
    """
    directory = (default_path() if path is None else Path(path)).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    # jax's Config declares its flags at run time, not as attributes
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current is not None and Path(current).expanduser().resolve() != directory:
        # JAX opens its cache once per process: another directory needs it reopened
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_enable_compilation_cache", True)
    # JAX's defaults leave out programs that compile in under a second and, on some file
    # systems, small entries: most of optsolve's programs are both
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory
