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
import tempfile

import pytest

from tests.sandbox.conftest import TEST_LIMITS
from tests.sandbox.engines import ExtraEngine, running
from wmrl_jax.sandbox import DockerExecutor

STATE = os.path.join(tempfile.gettempdir(), "wmrl-dockerd-gpu-stub")
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


class StubEngine(ExtraEngine):
    """A dockerd with the stand-in hook on its PATH, on its own socket."""

    def __init__(self):
        self.bin_dir = os.path.join(STATE, "bin")
        env = {
            **os.environ,
            "PATH": f"{self.bin_dir}:{os.environ['PATH']}",
            "WMRL_GPU_STUB_RECORD": RECORD,
        }
        super().__init__(STATE, env=env, fresh=True)  # one a killed run left may lack the hook

    def start(self) -> None:
        os.makedirs(self.bin_dir, exist_ok=True)
        os.makedirs(RECORD, exist_ok=True)
        hook = os.path.join(self.bin_dir, "nvidia-container-runtime-hook")
        with open(hook, "w") as f:
            f.write(HOOK)
        os.chmod(hook, 0o755)
        super().start()


@pytest.fixture(scope="module")
def stub_engine(docker_image):
    """The stub engine, answering, with the sandbox image; stopped afterwards."""
    with running(StubEngine(), docker_image) as engine:
        yield engine


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
