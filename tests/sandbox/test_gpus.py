"""GPU sandboxes: the device requests a container gets, and the refusal without a GPU runtime.

The request tests read what `DockerExecutor` hands the engine (the keywords of
`containers.create`); the refusal tests run against the local engine, which
has no GPU runtime here (they skip on an engine that has one: the real path
is `launch/gpu_sandbox_check.sh` on a GPU machine).
"""

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import warnings

import docker
import pytest

from tests.sandbox.conftest import TEST_LIMITS
from wmrl_jax.sandbox import (
    DockerExecutor,
    InfraError,
    InputError,
    Limits,
    LocalExecutor,
    WeakIsolationWarning,
    gpu_check,
    make_executor,
)
from wmrl_jax.sandbox.docker_backend import KEEPER_GRACE_S, LABEL
from wmrl_jax.sandbox.gpus import (
    GPU_LIMITS,
    GpuLeases,
    GpuRequest,
    check_memory_fraction,
    parse_gpus,
    program_environment,
    split_devices,
)


@pytest.mark.parametrize(
    "spec, want",
    [
        (None, None),
        (0, None),
        ("", None),
        ("none", None),
        ("0", None),
        ([], None),
        (2, GpuRequest(count=2)),
        ("2", GpuRequest(count=2)),
        ("all", GpuRequest(count=-1)),
        (" ALL ", GpuRequest(count=-1)),
        ("device=0,1", GpuRequest(device_ids=("0", "1"))),
        ("device=3", GpuRequest(device_ids=("3",))),
        ("0, 1", GpuRequest(device_ids=("0", "1"))),
        (["1"], GpuRequest(device_ids=("1",))),
        (("GPU-1a2b", "GPU-3c4d"), GpuRequest(device_ids=("GPU-1a2b", "GPU-3c4d"))),
        ("MIG-5e6f-7a8b", GpuRequest(device_ids=("MIG-5e6f-7a8b",))),
        ("nvidia.com/gpu=0", GpuRequest(device_ids=("nvidia.com/gpu=0",), driver="cdi")),
        (
            "device=nvidia.com/gpu=0,nvidia.com/gpu=1",
            GpuRequest(device_ids=("nvidia.com/gpu=0", "nvidia.com/gpu=1"), driver="cdi"),
        ),
    ],
)
def test_parse_gpus(spec, want):
    got = parse_gpus(spec)
    assert got == want
    if got is not None:  # the compact form reads back as the same request
        assert parse_gpus(got.spec()) == got


@pytest.mark.parametrize(
    "spec, error, match",
    [
        (-1, ValueError, ">= 0"),
        ("gpu", ValueError, "want a count"),
        ("0,,1", ValueError, "empty device id"),
        ("device=", ValueError, "empty device id"),
        ("nvidia.com/gpu=0,1", ValueError, "mixes CDI names"),
        (True, TypeError, "gpus must be"),
        (1.5, TypeError, "gpus must be"),
    ],
)
def test_parse_gpus_refuses_bad_specs(spec, error, match):
    with pytest.raises(error, match=match):
        parse_gpus(spec)


def test_device_requests_are_what_docker_run_gpus_sends():
    # The engine API's DeviceRequest, as `docker run --gpus 2 / all / '"device=0,1"'` sends it.
    assert dict(parse_gpus(2).device_request()) == {
        "Driver": "", "Count": 2, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {},
    }  # fmt: skip
    assert dict(parse_gpus("all").device_request())["Count"] == -1
    assert dict(parse_gpus("device=0,1").device_request()) == {
        "Driver": "", "Count": 0, "DeviceIDs": ["0", "1"], "Capabilities": [["gpu"]],
        "Options": {},
    }  # fmt: skip
    # The CDI driver refuses capabilities and counts: names only.
    assert dict(parse_gpus("nvidia.com/gpu=all").device_request()) == {
        "Driver": "cdi", "Count": 0, "DeviceIDs": ["nvidia.com/gpu=all"], "Capabilities": [],
        "Options": {},
    }  # fmt: skip
    with pytest.raises(ValueError, match="count or device ids"):
        GpuRequest(count=1, device_ids=("0",))
    with pytest.raises(ValueError, match="count or device ids"):
        GpuRequest()


def test_program_environment_mirrors_the_runtime_and_carries_the_advisory_cap():
    # A count n is devices 0..n-1 (the engine's rule), as NVIDIA_VISIBLE_DEVICES says.
    assert program_environment(parse_gpus(3), None) == {"NVIDIA_VISIBLE_DEVICES": "0,1,2"}
    assert program_environment(parse_gpus("all"), 0.25) == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
        "WMRL_GPU_MEMORY_FRACTION": "0.25",
    }
    assert program_environment(parse_gpus("device=GPU-1a"), None) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-1a"
    }
    assert program_environment(parse_gpus("nvidia.com/gpu=0"), None) == {}
    # Without GPUs the NVIDIA runtime, where it is the default, exposes none.
    assert program_environment(None, None) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert check_memory_fraction(None) is None and check_memory_fraction(1) == 1.0
    for bad in (0, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            check_memory_fraction(bad)
    with pytest.raises(TypeError):
        check_memory_fraction("0.5")


def test_split_devices_into_disjoint_groups():
    assert [g.device_ids for g in split_devices(parse_gpus(4), 2)] == [("0", "1"), ("2", "3")]
    assert [g.device_ids for g in split_devices(parse_gpus("GPU-a,GPU-b"), 1)] == [
        ("GPU-a",),
        ("GPU-b",),
    ]
    with pytest.raises(ValueError, match="must divide"):
        split_devices(parse_gpus(3), 2)
    with pytest.raises(ValueError, match="not 'all'"):
        split_devices(parse_gpus("all"), 1)


def test_leases_hand_out_each_group_to_one_program_at_a_time():
    groups = split_devices(parse_gpus(2), 1)
    leases = GpuLeases(groups)
    got, acquired, release = [], threading.Event(), threading.Event()

    def third():
        with leases.lease() as group:
            got.append(group)
            acquired.set()
            release.wait(10)

    with contextlib.ExitStack() as held:
        first = held.enter_context(leases.lease())
        second = held.enter_context(leases.lease())
        assert {first, second} == set(groups)
        waiter = threading.Thread(target=third)
        waiter.start()
        assert not acquired.wait(0.2)  # both groups are taken: it waits
    assert acquired.wait(10)
    assert got[0] in groups
    release.set()
    waiter.join(10)


def test_make_executor_does_not_fall_back_to_local_for_gpus(monkeypatch, tmp_path):
    # No engine: without GPUs the local backend takes over; with GPUs that
    # would be a silent run without them, so it is an error.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(InfraError, match="GPUs were asked for.*no Docker engine answers"):
        make_executor(gpus=1, timeout_s=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakIsolationWarning)
        ex = make_executor(gpus=0, gpu_memory_fraction=0.5, timeout_s=5)
    try:
        assert isinstance(ex, LocalExecutor)
    finally:
        ex.close()


def test_missing_cuda_image_names_the_variant_to_build(docker_available):
    with pytest.raises(InfraError, match=r"python -m wmrl_jax\.sandbox\.image --variant=cuda"):
        DockerExecutor("wmrl-sandbox-cuda:does-not-exist", gpus=1)


@pytest.fixture
def create_calls(monkeypatch):
    """Every `containers.create(image, **kwargs)` call, recorded, then passed on to the engine."""
    calls = []
    original = docker.models.containers.ContainerCollection.create

    def create(self, image, command=None, **kwargs):
        calls.append((image, command, kwargs))
        return original(self, image, command, **kwargs)

    monkeypatch.setattr(docker.models.containers.ContainerCollection, "create", create)
    return calls


def _leftovers(executor) -> list:
    return executor.client.containers.list(all=True, filters={"label": f"{LABEL}={executor.token}"})


def _refusing_executor(image, **kwargs) -> DockerExecutor:
    ex = DockerExecutor(image, limits=TEST_LIMITS, timeout_s=30, **kwargs)
    if kwargs.get("probe_gpus", True) and ex.gpu_refusal is None:
        ex.close()
        pytest.skip("this engine has a GPU runtime; see launch/gpu_sandbox_check.sh")
    return ex


def test_no_gpu_runtime_is_an_infra_error_known_up_front(docker_available, create_calls, tmp_path):
    ex = _refusing_executor(docker_available, gpus=1)
    try:
        assert "the Docker engine has no GPU runtime" in ex.gpu_refusal
        assert "could not select device driver" in ex.gpu_refusal
        assert "gpus=0" in ex.gpu_refusal
        assert ex.environment.endswith("+gpus=1")
        # The probe asked for exactly the request, with no network, and was removed.
        ((image, command, probe),) = create_calls
        assert (image, command) == (docker_available, ["true"])
        assert probe["device_requests"] == [parse_gpus(1).device_request()]
        assert probe["network_mode"] == "none"
        result = ex.run("print('ran')")
        assert result.status == "infra_error" and result.exit_code is None
        assert result.message == ex.gpu_refusal and result.stdout == ""
        assert len(create_calls) == 1  # no container for the run
        assert not _leftovers(ex)
        # A bad input is still the caller's error, not the engine's.
        (tmp_path / "leak").symlink_to("/etc/hostname")
        with pytest.raises(InputError):
            ex.run("print('ran')", input_dir=tmp_path)
    finally:
        ex.close()


def test_gpu_request_keeps_the_lockdown_and_fails_at_start(docker_available, create_calls):
    with DockerExecutor(docker_available, limits=TEST_LIMITS, timeout_s=30) as cpu:
        result = cpu.run("import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])")
    assert result.status == "ok" and result.stdout == "void\n", result
    ex = _refusing_executor(docker_available, gpus="device=0,1", probe_gpus=False)
    try:
        assert ex.gpu_refusal is None and not create_calls[1:]
        # Without the probe the engine refuses when the container starts.
        result = ex.run("print('ran')")
        assert result.status == "infra_error" and result.exit_code is None, result
        assert result.message.startswith("the Docker engine has no GPU runtime: asked for")
        assert "devices 0,1" in result.message and result.stdout == ""
        assert not _leftovers(ex)
    finally:
        ex.close()
    (_, cpu_command, cpu_kwargs), (image, command, gpu_kwargs) = create_calls
    # The main process sleeps a little longer than the run's timeout (30 s), then ends.
    lifetime = ["sleep", str(math.ceil(30 + KEEPER_GRACE_S))]
    assert image == docker_available and command == cpu_command == lifetime
    # Everything but the device request is the CPU container's lockdown.
    assert gpu_kwargs.pop("device_requests") == [
        docker.types.DeviceRequest(device_ids=["0", "1"], capabilities=[["gpu"]])
    ]
    assert cpu_kwargs.pop("environment") == {"NVIDIA_VISIBLE_DEVICES": "void"}
    for kwargs in (cpu_kwargs, gpu_kwargs):
        kwargs.pop("labels")
        kwargs.pop("mounts")  # per-run temporary dirs
    assert gpu_kwargs == cpu_kwargs
    assert gpu_kwargs["network_mode"] == "none" and gpu_kwargs["read_only"] is True
    assert gpu_kwargs["cap_drop"] == ["ALL"] and gpu_kwargs["pids_limit"] == TEST_LIMITS.pids
    assert gpu_kwargs["mem_limit"] == gpu_kwargs["memswap_limit"] == TEST_LIMITS.memory_bytes


def test_gpu_executors_default_to_gpu_limits(docker_available):
    with DockerExecutor(docker_available, gpus="all", probe_gpus=False) as ex:
        # No more CPUs than the engine has: it refuses a larger quota.
        cpus = min(GPU_LIMITS.cpus, ex.client.info()["NCPU"])
        assert ex.limits == dataclasses.replace(GPU_LIMITS, cpus=cpus)
        assert ex.limits.pids > Limits().pids
    with DockerExecutor(docker_available, gpus=1, probe_gpus=False, limits=TEST_LIMITS) as ex:
        assert ex.limits == TEST_LIMITS
    with DockerExecutor(docker_available) as ex:
        assert ex.limits == Limits()


def test_gpus_per_program_gives_concurrent_runs_disjoint_devices(docker_available, create_calls):
    ex = _refusing_executor(
        docker_available, gpus="0,1", gpus_per_program=1, probe_gpus=False, max_workers=2
    )
    try:
        assert ex.environment.endswith("+gpus=device=0,1/1")
        results = [f.result() for f in [ex.submit("print(1)") for _ in range(2)]]
        assert [r.status for r in results] == ["infra_error", "infra_error"]
    finally:
        ex.close()
    devices = sorted(tuple(kw["device_requests"][0]["DeviceIDs"]) for _, _, kw in create_calls)
    assert devices == [("0",), ("1",)]


def test_gpu_options_are_checked_before_the_engine_is_asked():
    with pytest.raises(ValueError, match="gpus_per_program needs gpus"):
        DockerExecutor("any:tag", gpus_per_program=1)
    with pytest.raises(ValueError, match="must divide"):
        DockerExecutor("any:tag", gpus=3, gpus_per_program=2)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        DockerExecutor("any:tag", gpus=1, gpu_memory_fraction=2.0)


def test_gpu_check_program_reports_what_the_host_judges(tmp_path):
    # The check's program, run here on the host's CPU JAX: it must print the
    # report the GPU machine's checks read.
    program = tmp_path / "main.py"
    program.write_text(gpu_check.PROGRAM)
    out = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    ).stdout  # fmt: skip
    report = {"run": "gpu-0", "status": "ok", **json.loads(out.strip().splitlines()[-1])}
    assert report["platform"] == "cpu" and report["matmul_right"] is True
    failures = gpu_check._gpu_failures(report, parse_gpus(1), None, 0.5)
    assert "gpu-0: JAX runs on cpu, want gpu" in failures
    assert any("XLA_PYTHON_CLIENT_MEM_FRACTION=None" in f for f in failures)
    good = {**report, "platform": "gpu", "interfaces": ["lo"], "root_writable": False,
            "uid": 65534, "mem_fraction": "0.5", "bytes_limit": None}  # fmt: skip
    assert gpu_check._gpu_failures(good, parse_gpus(1), None, 0.5) == []
    two = gpu_check._gpu_failures(good, parse_gpus(2), None, 0.5)
    assert two == [f"gpu-0: {len(report['device_kinds'])} devices, want 2"]


def test_gpu_check_stops_at_the_refusal(docker_available):
    reports, failures = gpu_check.check(gpus="1", image=docker_available, timeout_s=30)
    if not failures:
        pytest.skip("this engine has a GPU runtime")
    assert reports == [] and len(failures) == 1
    assert failures[0].startswith("the Docker engine has no GPU runtime")


def test_engine_pool_leaves_out_an_engine_without_gpus(docker_available):
    from wmrl_jax.sandbox.remote import EnginePool

    url = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    probe = _refusing_executor(docker_available, gpus=1)
    probe.close()
    with pytest.raises(InfraError, match="no Docker engine answers among .*has no GPU runtime"):
        EnginePool([url], docker_available, gpus=1, timeout_s=30)
    with pytest.raises(InfraError, match="has no GPU runtime"):
        EnginePool([url], docker_available, gpus=1, timeout_s=30, require_all=True)
