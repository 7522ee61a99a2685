"""Suite-wide setup: one persistent XLA compilation cache for every process of a test run.

Many tests launch the same tiny configs in fresh processes (`experiments.train`
subprocesses, notebook kernels, xdist workers), and each would compile the same train
step again. The controller creates one cache directory before the workers start and
exports it; workers, subprocesses and kernels inherit the environment and share it.
A cache the caller already set (`JAX_COMPILATION_CACHE_DIR`) is used as it is and kept.
Only XLA's compilation is cached: tracing, lowering and every result are unchanged.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
# Compilations shorter than this are not worth a file read.
_MIN_COMPILE_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
_MIN_COMPILE_SECONDS = "0.2"
_created: list[str] = []


def pytest_configure(config):
    if os.environ.get(_CACHE_ENV):
        return  # A worker (the controller set it) or the caller's own cache.
    path = tempfile.mkdtemp(prefix="wmrl-xla-cache-")
    _created.append(path)
    os.environ[_CACHE_ENV] = path
    os.environ.setdefault(_MIN_COMPILE_ENV, _MIN_COMPILE_SECONDS)


def pytest_unconfigure(config):
    for path in _created:
        shutil.rmtree(path, ignore_errors=True)
