"""Backends for the sandbox tests.

Docker tests start an engine with launch/docker_engine.sh when none answers
and build the image when it is missing; they are skipped, with the reason,
only where no engine can be started (and fail instead when WMRL_REQUIRE_DOCKER
is set, as in CI). No test stops the usual engine, since other test workers
use it at the same time: the tests that take an engine down start one of
their own (`tests/sandbox/engines.py`).
"""

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import warnings

import pytest

from wmrl_jax.sandbox import DockerExecutor, Limits, LocalExecutor, WeakIsolationWarning
from wmrl_jax.sandbox.docker_backend import LABEL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE_SCRIPT = os.path.join(REPO, "launch", "docker_engine.sh")
LOCK_PATH = os.path.join(tempfile.gettempdir(), "wmrl-sandbox-tests.lock")
MiB = 1 << 20
TEST_LIMITS = Limits(
    memory_bytes=512 * MiB,
    pids=64,
    work_bytes=64 * MiB,
    tmp_bytes=16 * MiB,
    file_size_bytes=32 * MiB,
    tail_bytes=4096,
)


@contextlib.contextmanager
def _held(suffix: str):
    """An exclusive lock across test workers, named by `suffix`."""
    with open(LOCK_PATH + suffix, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _engine_client():
    """A client of a running engine, starting one if needed; (client, reason)."""
    import docker

    def ping():
        try:
            client = docker.from_env(timeout=120)
            client.ping()
            return client
        except Exception:
            return None

    if (client := ping()) is not None:
        return client, ""
    proc = subprocess.run([ENGINE_SCRIPT, "start"], capture_output=True, text=True, check=False)
    if (client := ping()) is not None:
        return client, ""
    return None, f"no Docker engine could be started: {proc.stderr.strip() or proc.stdout.strip()}"


@pytest.fixture(scope="session")
def docker_image():
    """The sandbox image tag (built if missing), or a skip saying why there is none."""
    from wmrl_jax.sandbox.image import build_image, default_image, image_exists

    with _held(".start"):  # one engine start across test workers
        client, reason = _engine_client()
    if client is None:
        if os.environ.get("WMRL_REQUIRE_DOCKER"):
            pytest.fail(f"WMRL_REQUIRE_DOCKER is set but {reason}")
        pytest.skip(reason)
    tag = default_image()
    if not image_exists(client, tag):
        with _held(".build"):  # one build across test workers
            if not image_exists(client, tag):
                build_image(tag, client=client)
    return tag


@pytest.fixture
def docker_available(docker_image):
    """The image tag, for tests that need the engine but no executor of the fixture's."""
    return docker_image


def local_executor(**kwargs) -> LocalExecutor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakIsolationWarning)
        kwargs.setdefault("python", sys.executable)  # what the trainer builds
        return LocalExecutor(limits=kwargs.pop("limits", TEST_LIMITS), **kwargs)


@pytest.fixture
def docker_executor(docker_image):
    executor = DockerExecutor(docker_image, limits=TEST_LIMITS, timeout_s=30)
    yield executor
    executor.close()
    left = executor.client.containers.list(all=True, filters={"label": f"{LABEL}={executor.token}"})
    assert not left, f"containers left behind: {left}"


@pytest.fixture(params=["local", "docker"])
def executor(request):
    """Each backend in turn, with small limits."""
    if request.param == "local":
        ex = local_executor(timeout_s=30)
        yield ex
        ex.close()
    else:
        yield request.getfixturevalue("docker_executor")
