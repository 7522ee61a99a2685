"""A Docker engine of the tests' own: a dockerd on its own socket, with the sandbox image.

Data root, exec root, pid file, log and unix socket live under one state dir
that outlives the test run, so the sandbox image is copied in (`docker save |
docker load`) only when it differs from the usual engine's. No bridge and no
iptables: sandbox containers have no network anyway.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time

import pytest

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


def socket_url(state: str) -> str:
    """The engine URL of the unix socket under the state dir `state`."""
    return f"unix://{os.path.join(state, 'docker.sock')}"


class ExtraEngine:
    """A dockerd of its own under `state`; `start` / `stop`.

    Args:
        state: the state dir (created).
        env: the engine's environment (default: this process's).
        fresh: `start` restarts an engine a killed run left answering, instead
            of reusing it (when `env` must be the one it runs with).
    """

    def __init__(self, state: str, *, env: dict | None = None, fresh: bool = False):
        self.state, self.env, self.fresh = state, env, fresh
        self.url = socket_url(state)
        self.pid_file = os.path.join(state, "dockerd.pid")
        self.proc = None

    def client(self, timeout=120):
        import docker

        return docker.DockerClient(base_url=self.url, timeout=timeout)

    def answers(self) -> bool:
        try:
            return bool(self.client(timeout=5).ping())
        except Exception:
            return False

    def pid(self) -> int | None:
        try:
            with open(self.pid_file) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        os.makedirs(self.state, exist_ok=True)
        if self.answers():
            if not self.fresh:
                return
            self.stop()
        log_path = os.path.join(self.state, "dockerd.log")
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen(
                [
                    "dockerd", f"--data-root={self.state}/data", f"--exec-root={self.state}/exec",
                    f"--pidfile={self.pid_file}", f"--host={self.url}", "--bridge=none",
                    "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                ],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path) as f:
                    pytest.fail(f"dockerd under {self.state} did not start: {f.read()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after `STOP_TIMEOUT_S`) to the engine of the pid file, if it runs."""
        pid = self.pid()
        if pid is None or not os.path.exists(f"/proc/{pid}"):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.1)
        else:
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(STOP_TIMEOUT_S)


@contextlib.contextmanager
def running(engine: ExtraEngine, docker_image: str):
    """`engine` started, holding `docker_image` as the usual engine has it; stopped after.

    Skips without dockerd or root (fails when WMRL_REQUIRE_DOCKER is set).
    """
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        reason = "an engine of the tests' own needs dockerd and root"
        if os.environ.get("WMRL_REQUIRE_DOCKER"):
            pytest.fail(f"WMRL_REQUIRE_DOCKER is set but {reason}")
        pytest.skip(reason)
    import docker

    engine.start()
    try:
        want = docker.from_env(timeout=300).images.get(docker_image).id
        try:
            have = engine.client(timeout=300).images.get(docker_image).id
        except docker.errors.ImageNotFound:
            have = None
        if have != want:
            save = subprocess.Popen(["docker", "save", docker_image], stdout=subprocess.PIPE)
            subprocess.run(
                ["docker", f"--host={engine.url}", "load", "--quiet"],
                stdin=save.stdout, check=True, capture_output=True,
            )  # fmt: skip
            save.stdout.close()
            assert save.wait() == 0
        yield engine
    finally:
        engine.stop()
