"""GPU requests through a real engine whose GPU driver is a recording stand-in.

A Docker engine registers its NVIDIA GPU driver when `nvidia-container-runtime-hook`
is on its PATH; the engine started here (a dockerd of its own, state under one
temporary dir that outlives the run, the sandbox image copied in once) finds
a stand-in there, which records the NVIDIA variables the engine put in the
container's spec instead of mounting devices. So everything up to the devices
is real: the probe that finds a GPU runtime, the device request the engine
turns into `NVIDIA_VISIBLE_DEVICES`, the prestart hook it runs, the variables
the program's exec gets, and the lockdown around it. Whether a program then
computes on the GPU is `launch/gpu_sandbox_check.sh`'s job, on a GPU machine.
"""

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from tests.sandbox.conftest import TEST_LIMITS, engine_lock
from wmrl_jax.sandbox import DockerExecutor

STATE = os.path.join(tempfile.gettempdir(), "wmrl-dockerd-gpu-stub")
SOCKET = os.path.join(STATE, "docker.sock")
RECORD = os.path.join(STATE, "record")
HOOK = """#!/bin/sh
# Stand-in for the NVIDIA hook: records the NVIDIA variables of the container's spec.
state=$(cat)
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle":"\\([^"]*\\)".*/\\1/p')
id=$(printf '%s' "$state" | sed -n 's/.*"id":"\\([^"]*\\)".*/\\1/p')
grep -o 'NVIDIA_[A-Z_]*=[^"]*' "$bundle/config.json" > "$WMRL_GPU_STUB_RECORD/$id.env"
echo "$@" > "$WMRL_GPU_STUB_RECORD/$id.args"
"""
# Prints what the sandbox shows the program: its GPU variables, its container, its lockdown.
PROGRAM = """
import json, os, socket, time
time.sleep(DELAY_S)  # long enough for concurrent runs to overlap
print(json.dumps({
    "env": {k: v for k, v in os.environ.items() if k.startswith(("NVIDIA", "XLA", "WMRL_GPU"))},
    "container": socket.gethostname(),
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "uid": os.getuid(),
}))
"""


class StubEngine:
    """A dockerd with the stand-in hook on its PATH, on its own socket."""

    def __init__(self):
        self.pid_file = os.path.join(STATE, "dockerd.pid")
        self.proc = None

    def client(self, timeout=120):
        import docker

        return docker.DockerClient(base_url=f"unix://{SOCKET}", timeout=timeout)

    def answers(self) -> bool:
        try:
            return bool(self.client(timeout=5).ping())
        except Exception:
            return False

    def start(self) -> None:
        bin_dir = os.path.join(STATE, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        os.makedirs(RECORD, exist_ok=True)
        hook = os.path.join(bin_dir, "nvidia-container-runtime-hook")
        with open(hook, "w") as f:
            f.write(HOOK)
        os.chmod(hook, 0o755)
        if self.answers():  # left by a killed run: its PATH may lack the hook
            self.stop()
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "WMRL_GPU_STUB_RECORD": RECORD,
        }
        with open(os.path.join(STATE, "dockerd.log"), "a") as log:
            self.proc = subprocess.Popen(
                [
                    "dockerd", f"--data-root={STATE}/data", f"--exec-root={STATE}/exec",
                    f"--pidfile={self.pid_file}", f"--host=unix://{SOCKET}", "--bridge=none",
                    "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                ],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(STATE, "dockerd.log")) as f:
                    pytest.fail(f"the stub GPU engine did not start: {f.read()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        try:
            with open(self.pid_file) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)


@pytest.fixture(scope="module")
def stub_engine(docker_image):
    """The stub engine, answering, with the sandbox image; stopped afterwards."""
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        reason = "an engine of its own needs dockerd and root"
        if os.environ.get("WMRL_REQUIRE_DOCKER"):
            pytest.fail(f"WMRL_REQUIRE_DOCKER is set but {reason}")
        pytest.skip(reason)
    import docker

    engine = StubEngine()
    engine.start()
    try:
        with engine_lock():
            want = docker.from_env(timeout=300).images.get(docker_image).id
        client = engine.client(timeout=300)
        try:
            have = client.images.get(docker_image).id
        except docker.errors.ImageNotFound:
            have = None
        if have != want:
            save = subprocess.Popen(["docker", "save", docker_image], stdout=subprocess.PIPE)
            subprocess.run(
                ["docker", f"--host=unix://{SOCKET}", "load", "--quiet"],
                stdin=save.stdout, check=True, capture_output=True,
            )  # fmt: skip
            save.stdout.close()
            assert save.wait() == 0
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def records(stub_engine):
    """The hook's records (container id -> NVIDIA variables of its spec), fresh per test."""
    for name in os.listdir(RECORD):
        os.remove(os.path.join(RECORD, name))

    def read() -> dict[str, dict[str, str]]:
        out = {}
        for name in os.listdir(RECORD):
            if name.endswith(".env"):
                with open(os.path.join(RECORD, name)) as f:
                    pairs = (line.strip().partition("=") for line in f if line.strip())
                    out[name[: -len(".env")]] = {k: v for k, _, v in pairs}
        return out

    return read


def _source(delay_s: float = 0.0) -> str:
    return PROGRAM.replace("DELAY_S", repr(delay_s))


def _report(result) -> dict:
    assert result.status == "ok", result
    return json.loads(result.stdout)


def _run(executor) -> dict:
    return _report(executor.run(_source()))


def _spec_of(records: dict, report: dict) -> dict[str, str]:
    """The spec variables the hook recorded for the container the report came from."""
    (spec,) = [env for cid, env in records.items() if cid.startswith(report["container"])]
    return spec


def test_the_probe_passes_and_the_request_reaches_the_runtime(docker_image, stub_engine, records):
    with DockerExecutor(
        docker_image, client=stub_engine.client(), gpus="device=0,1", gpu_memory_fraction=0.25,
        limits=TEST_LIMITS, timeout_s=30,
    ) as ex:  # fmt: skip
        assert ex.gpu_refusal is None
        report = _run(ex)
    # The engine turned the device request into the runtime's variable and ran the hook,
    # for the probe and for the run.
    specs = records()
    assert _spec_of(specs, report) == {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert len(specs) == 2 and all(s == {"NVIDIA_VISIBLE_DEVICES": "0,1"} for s in specs.values())
    for container_id in specs:
        with open(os.path.join(RECORD, f"{container_id}.args")) as f:
            assert f.read().split() == ["prestart"]
    # The exec does not inherit the spec's variable: the executor sets it, with the cap.
    assert report["env"] == {
        "NVIDIA_VISIBLE_DEVICES": "0,1",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
        "WMRL_GPU_MEMORY_FRACTION": "0.25",
    }
    assert report["interfaces"] == ["lo"] and report["uid"] == 65534


@pytest.mark.parametrize("gpus, visible", [(2, "0,1"), ("all", "all"), (["GPU-5e"], "GPU-5e")])
def test_counts_and_ids_become_the_runtimes_devices(
    gpus, visible, docker_image, stub_engine, records
):
    with DockerExecutor(
        docker_image, client=stub_engine.client(), gpus=gpus, probe_gpus=False,
        limits=TEST_LIMITS, timeout_s=30,
    ) as ex:  # fmt: skip
        report = _run(ex)
    assert _spec_of(records(), report) == {"NVIDIA_VISIBLE_DEVICES": visible}
    assert report["env"] == {"NVIDIA_VISIBLE_DEVICES": visible}


def test_concurrent_programs_get_disjoint_devices(docker_image, stub_engine, records):
    with DockerExecutor(
        docker_image, client=stub_engine.client(), gpus=2, gpus_per_program=1,
        probe_gpus=False, limits=TEST_LIMITS, timeout_s=30, max_workers=2,
    ) as ex:  # fmt: skip
        futures = [ex.submit(_source(1.0)) for _ in range(2)]
        reports = [_report(f.result()) for f in concurrent.futures.as_completed(futures)]
    specs = records()
    assert sorted(_spec_of(specs, r)["NVIDIA_VISIBLE_DEVICES"] for r in reports) == ["0", "1"]
    assert sorted(r["env"]["NVIDIA_VISIBLE_DEVICES"] for r in reports) == ["0", "1"]


def test_a_cpu_run_asks_the_gpu_runtime_for_nothing(docker_image, stub_engine, records):
    with DockerExecutor(
        docker_image, client=stub_engine.client(), limits=TEST_LIMITS, timeout_s=30
    ) as ex:
        report = _run(ex)
    assert records() == {}  # no device request: the hook never ran
    assert report["env"] == {"NVIDIA_VISIBLE_DEVICES": "void"}
