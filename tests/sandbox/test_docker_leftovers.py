"""No sandbox container outlives its owner: close, interpreter exit, SIGKILL, reaping."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from tests.sandbox.conftest import REPO, TEST_LIMITS
from tests.sandbox.engines import ExtraEngine, running
from wmrl_jax.sandbox import DockerExecutor, owners
from wmrl_jax.sandbox.docker_backend import LABEL

LONG = "import time\ntime.sleep(600)\n"
WAIT_S = 120  # a bound on waits for the engine; no test relies on its length
OWN_STATE = os.path.join(tempfile.gettempdir(), "wmrl-dockerd-leftovers")


def _child(image: str, body: str, docker_host: str | None = None) -> subprocess.Popen:
    """A Python process that starts a long program on the engine (`docker_host`, default
    the usual one) and prints its container id."""
    head = textwrap.dedent(f"""
        import sys, threading, time
        from wmrl_jax.sandbox import DockerExecutor, docker_backend
        ex = DockerExecutor({image!r}, timeout_s=3)
    """)
    return subprocess.Popen(
        [sys.executable, "-c", head + body],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": REPO,
            **({"DOCKER_HOST": docker_host} if docker_host else {}),
        },
        stdout=subprocess.PIPE,
        text=True,
    )


# Waits until the program's container runs, then prints its id.
PRINT_ID = (
    "while not ex._live or not ex.client.api.inspect_container(next(iter(ex._live)))"
    "['State']['Running']:\n"
    "    time.sleep(0.05)\n"
    "print(next(iter(ex._live)), flush=True)\n"
)


def _state(client, container_id: str) -> dict | None:
    found = client.api.containers(all=True, filters={"id": container_id})
    return found[0] if found else None


def _wait_for(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def own_engine(docker_image):
    """An engine of this module's own: on the usual one, any executor another test worker
    starts would reap the dead owner's container before it could be seen to end itself."""
    with running(ExtraEngine(OWN_STATE), docker_image) as engine:
        yield engine


def test_killed_owner_container_ends_itself_and_is_reaped_live_owner_kept(docker_image, own_engine):
    # The child's program sleeps 600 s under a 60 s timeout; its container's own
    # deadline is made 20 s (60 + KEEPER_GRACE_S) so that this test waits less.
    child = _child(
        docker_image,
        "docker_backend.KEEPER_GRACE_S = -40.0\n"
        f"threading.Thread(target=ex.run, args=({LONG!r},), kwargs=dict(timeout_s=60)).start()\n"
        + PRINT_ID
        + "time.sleep(600)\n",
        docker_host=own_engine.url,
    )
    try:
        container_id = child.stdout.readline().strip()
        assert container_id, "the child printed no container id"
        with DockerExecutor(docker_image, limits=TEST_LIMITS, client=own_engine.client()) as other:
            client = other.client
            # A live owner's container is never reaped by another executor.
            assert _state(client, container_id)["State"] == "running"
            labels = _state(client, container_id)["Labels"]
            assert labels[owners.PID_LABEL] == str(child.pid)
    finally:
        child.send_signal(signal.SIGKILL)  # no close, no atexit: as under preemption
        child.wait()
    # The container stops by itself at its deadline although its owner never came back.
    _wait_for(lambda: _state(client, container_id)["State"] != "running", "the container to end")
    # The next executor that starts removes what the dead owner left.
    with DockerExecutor(docker_image, limits=TEST_LIMITS, client=own_engine.client()):
        assert _state(client, container_id) is None


def test_interpreter_exit_removes_containers_of_running_programs(docker_available):
    # The run is in a daemon thread: nothing waits for it, only the exit hook removes.
    child = _child(
        docker_available,
        f"threading.Thread(target=ex.run, args=({LONG!r},), kwargs=dict(timeout_s=60),"
        " daemon=True).start()\n" + PRINT_ID + "sys.exit(0)\n",
    )
    container_id = child.stdout.readline().strip()
    assert container_id and child.wait(WAIT_S) == 0
    with DockerExecutor(docker_available, limits=TEST_LIMITS, timeout_s=30) as ex:
        assert _state(ex.client, container_id) is None


def test_close_during_running_programs_removes_their_containers(docker_available):
    ex = DockerExecutor(docker_available, limits=TEST_LIMITS, timeout_s=60)
    future = ex.submit(LONG)  # close() waits for submitted runs ...
    plain = []  # ... not for runs of the caller's own threads
    thread = threading.Thread(target=lambda: plain.append(ex.run(LONG)))
    thread.start()

    def both_running():
        live = list(ex._live)
        return len(live) == 2 and all(_state(ex.client, c)["State"] == "running" for c in live)

    _wait_for(both_running, "both containers")
    ex.close()  # does not wait for the programs' timeout
    thread.join(WAIT_S)
    for result in (future.result(), *plain):
        assert result.status == "infra_error", result
        assert result.message.startswith("the executor was closed during the run"), result
    assert not ex.client.api.containers(all=True, filters={"label": f"{LABEL}={ex.token}"})
    # The executor still runs programs after close.
    assert ex.run("print(1)").stdout == "1\n"
    ex.close()


@pytest.mark.parametrize("host", ["this", "other"])
def test_owner_liveness_from_labels(host):
    labels = owners.owner_labels("t", deadline=1000.0)
    assert owners.owner_is_gone(labels) is False  # this process runs
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert owners.owner_is_gone({**labels, owners.PID_LABEL: done.stdout.strip()}) is True
    # Same pid, another start: the pid was reused by a later process.
    assert owners.owner_is_gone({**labels, owners.STARTED_LABEL: "1"}) is True
    assert owners.owner_is_gone({LABEL: "t"}) is None  # an earlier version's container
    if host == "other":  # liveness unknown: only the container's own deadline counts
        foreign = {**labels, owners.HOST_LABEL: "elsewhere"}
        margin = owners.FOREIGN_MARGIN_S
        assert owners.owner_is_gone(foreign, now=1000.0 + margin - 1) is False
        assert owners.owner_is_gone(foreign, now=1000.0 + margin + 1) is True


def test_a_removal_under_way_elsewhere_counts_as_removed():
    import docker

    def error(status: int, text: str):
        response = type("Response", (), {"status_code": status, "reason": "", "url": ""})()
        return docker.errors.APIError(text, response=response, explanation=text)

    assert owners.already_removed(error(404, "No such container"))
    assert owners.already_removed(error(409, "removal of container x is already in progress"))
    assert not owners.already_removed(error(409, "container is paused"))
    assert not owners.already_removed(error(500, "driver failed"))
