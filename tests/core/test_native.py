"""The native-kernel loader: build, cache, and fallback to the XLA path."""

import os
import subprocess
import sys
import textwrap

import pytest

_PROBE = textwrap.dedent(
    """
    import logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
    import jax.numpy as jnp
    from wmrl_jax.core import _native, isotonic
    fit = isotonic.isotonic_fit(jnp.array([0., 1., 2.]), jnp.array([1., 0., 2.]))
    print("loaded", _native.load("isotonic"))
    print("value", isotonic.isotonic_predict(fit, jnp.array([1.5])).tolist())
    try:
        isotonic.isotonic_fit(jnp.zeros(2), jnp.zeros(2), backend="native")
        print("native ok")
    except RuntimeError as e:
        print("native error", e)
    """
)


def _run(tmp_path, **env):
    full_env = dict(os.environ, WMRL_JAX_CACHE_DIR=str(tmp_path / "cache"), **env)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=full_env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_builds_into_cache_and_reuses_it(tmp_path):
    out = _run(tmp_path)
    assert "loaded True" in out and "value [1.25]" in out and "native ok" in out
    libraries = list((tmp_path / "cache" / "native").glob("libisotonic-*.so"))
    assert len(libraries) == 1
    stamp = libraries[0].stat().st_mtime_ns
    _run(tmp_path)  # A second process loads the cached library, no rebuild.
    assert libraries[0].stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    "env, reason",
    [({"WMRL_JAX_NATIVE": "0"}, None), ({"CXX": "/bin/false"}, "compiling isotonic.cc failed")],
)
def test_falls_back_to_xla_with_a_clear_message(tmp_path, env, reason):
    out = _run(tmp_path, **env)
    assert "loaded False" in out
    assert "value [1.25]" in out  # Same function through the XLA path.
    assert "native error backend='native' requested" in out
    if reason:
        assert "using the XLA path" in out and reason in out
