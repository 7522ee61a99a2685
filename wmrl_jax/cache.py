"""Where wmrl_jax keeps what it builds once and reuses: compiled kernels, built suites.

One root for every cache: `$WMRL_JAX_CACHE_DIR` when set, else
`$XDG_CACHE_HOME/wmrl_jax`, else `~/.cache/wmrl_jax`. Each user of the cache
takes a subdirectory of its own (`native/`, `builtin/`).

Example:
    >>> import os
    >>> os.environ["WMRL_JAX_CACHE_DIR"] = "/tmp/c"
    >>> cache_root()
    '/tmp/c'
"""

from __future__ import annotations

import os

CACHE_ENV = "WMRL_JAX_CACHE_DIR"


def cache_root() -> str:
    """The cache root: `$WMRL_JAX_CACHE_DIR`, `$XDG_CACHE_HOME/wmrl_jax` or `~/.cache/wmrl_jax`."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wmrl_jax")
