"""Native CPU kernels, compiled on first use and called from XLA through the FFI.

The kernels live in C++ sources next to this file. They are built once per
(source, jaxlib version, compiler) with the system C++ compiler into a cache
directory (``wmrl_jax.cache.cache_root()/native``) and registered as
XLA FFI targets for the CPU platform. When no compiler is available or the
build fails, `load` returns False with a logged warning and callers use their
pure-XLA path, which computes the same function.

Set ``WMRL_JAX_NATIVE=0`` to skip the native kernels entirely.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import tempfile

import jax
import jaxlib

from wmrl_jax import cache

_log = logging.getLogger(__name__)
_SOURCES = {"isotonic": ("WmrlIsotonicFit", "WmrlIsotonicPredict")}
_TARGET_NAMES = {
    "WmrlIsotonicFit": "wmrl_isotonic_fit",
    "WmrlIsotonicPredict": "wmrl_isotonic_predict",
}


def _cache_dir() -> pathlib.Path:
    return pathlib.Path(cache.cache_root()) / "native"


def _build(name: str) -> pathlib.Path:
    """Compiles ``<name>.cc`` into the cache (once; safe across processes)."""
    source = pathlib.Path(__file__).with_name(f"{name}.cc")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    flags = ["-O3", "-std=c++17", "-shared", "-fPIC", "-isystem", jax.ffi.include_dir()]
    digest = hashlib.sha256(
        source.read_bytes() + jaxlib.__version__.encode() + " ".join([compiler, *flags]).encode()
    ).hexdigest()[:16]
    out_dir = _cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / f"lib{name}-{digest}.so"
    if library.exists():
        return library
    with open(out_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Another process may be building it.
        if library.exists():
            return library
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            partial = pathlib.Path(tmp) / library.name
            proc = subprocess.run(
                [compiler, *flags, str(source), "-o", str(partial)],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {source.name} failed:\n{proc.stderr[-4000:]}")
            os.replace(partial, library)
    return library


@functools.cache
def load(name: str = "isotonic") -> bool:
    """Builds (if needed) and registers the FFI targets of one native source.

    Returns:
      True when the targets are registered for the CPU platform, False when the
      native path is disabled or could not be built (a warning says why).
    """
    if os.environ.get("WMRL_JAX_NATIVE", "1") == "0":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(_build(name)))
    except (OSError, RuntimeError) as error:
        _log.warning("wmrl_jax native %s kernels unavailable, using the XLA path: %s", name, error)
        return False
    for symbol in _SOURCES[name]:
        with contextlib.suppress(ValueError):  # Already registered by this process.
            jax.ffi.register_ffi_target(
                _TARGET_NAMES[symbol], jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu"
            )
    return True


def target(symbol: str) -> str:
    """The FFI target name registered for a kernel symbol."""
    return _TARGET_NAMES[symbol]
