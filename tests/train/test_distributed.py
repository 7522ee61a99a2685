"""Multi-host training: the process layout from each launcher's environment, and two
real `jax.distributed` CPU processes against one process (distributed_check.py)."""

import json
import os
import socket
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest

from tests.train import sharded_step_check as ref
from wmrl_jax.train import distributed
from wmrl_jax.train.distributed import DEFAULT_PORT, ProcessSpec, expand_hostlist, resolve

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[8-10]-ib,b1", ["a8-ib", "a9-ib", "a10-ib", "b1"]),
        ("x[098-100],y[1]", ["x098", "x099", "x100", "y1"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["gpu[01-03", "gpu01]", "gpu[3-1]", "gpu[a-b]", "g[[1]]"])
def test_expand_hostlist_rejects_malformed_lists(bad):
    with pytest.raises(ValueError, match="SLURM host list"):
        expand_hostlist(bad)


def test_no_launcher_means_one_process():
    assert resolve(environ={}) == ProcessSpec()


def test_slurm_environment():
    env = {  # what srun sets for task 3 of 4, one task per node
        "SLURM_JOB_ID": "12345",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NODELIST": "gpu[07-08],gpu[11-12]",
        "SLURM_JOB_NODELIST": "ignored[1-4]",
    }
    spec = resolve(environ=env)
    assert spec == ProcessSpec(4, 3, f"gpu07:{DEFAULT_PORT + 12345 % 2000}", "slurm")
    del env["SLURM_STEP_NODELIST"]  # inside the batch script, before srun
    assert resolve(environ=env).coordinator.startswith("ignored1:")


def test_kubernetes_indexed_job_environment():
    env = {
        "JOB_COMPLETION_INDEX": "1",
        "WMRL_NUM_PROCESSES": "2",
        "WMRL_COORDINATOR": "wmrl-trainer-0.wmrl-trainer",
    }
    assert resolve(environ=env) == ProcessSpec(
        2, 1, f"wmrl-trainer-0.wmrl-trainer:{DEFAULT_PORT}", "kubernetes"
    )
    with pytest.raises(ValueError, match="WMRL_NUM_PROCESSES must be set"):
        resolve(environ={"JOB_COMPLETION_INDEX": "0"})


def test_explicit_environment_and_config():
    env = {"WMRL_PROCESS_ID": "0", "WMRL_NUM_PROCESSES": "2", "WMRL_COORDINATOR": "10.0.0.1:99"}
    assert resolve(environ=env) == ProcessSpec(2, 0, "10.0.0.1:99", "env")
    # Explicit ids win over a launcher's; the config wins over the environment.
    assert (
        resolve(environ={**env, "JOB_COMPLETION_INDEX": "1", "SLURM_PROCID": "1"}).source == "env"
    )
    config = distributed.default_config()
    config.coordinator, config.num_processes, config.process_id = "host", 3, 2
    assert resolve(config, environ=env) == ProcessSpec(3, 2, f"host:{DEFAULT_PORT}", "config")


@pytest.mark.parametrize(
    "env, match",
    [
        ({"WMRL_PROCESS_ID": "2", "WMRL_NUM_PROCESSES": "2", "WMRL_COORDINATOR": "h:1"}, "2 of 2"),
        ({"WMRL_PROCESS_ID": "0", "WMRL_NUM_PROCESSES": "2"}, "need a coordinator"),
        ({"WMRL_PROCESS_ID": "x", "WMRL_NUM_PROCESSES": "2"}, "must be an integer"),
        ({"WMRL_NUM_PROCESSES": "2"}, "needs WMRL_PROCESS_ID"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "NODELIST"),
    ],
)
def test_incomplete_layouts_raise(env, match):
    with pytest.raises(ValueError, match=match):
        resolve(environ=env)


def test_bad_config_raises():
    config = ml_collections.ConfigDict(dict(coordinator="h:1", num_processes=2, process_id=-1))
    with pytest.raises(ValueError, match="process_id -1 of 2"):
        resolve(config, environ={})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out_dir, devices: int, layout: dict) -> subprocess.Popen:
    os.makedirs(out_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WMRL_", "SLURM_", "JOB_COMP"))}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        PYTHONPATH=REPO,
        **layout,
    )
    log = open(os.path.join(out_dir, f"log{layout.get('WMRL_PROCESS_ID', '')}.txt"), "w")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.train.distributed_check", str(out_dir)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait(procs, out_dirs, timeout_s=400):
    """Waits for every process; the first failure (or the timeout) kills the others."""
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs):
        failed = any(p.poll() not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                p.kill()
                p.wait()
            break
        time.sleep(0.2)
    if any(p.returncode != 0 for p in procs):
        logs = [
            (d / name).read_text()[-3000:]
            for d in sorted(set(out_dirs))
            for name in os.listdir(d)
            if name.startswith("log")
        ]
        pytest.fail(f"exit codes {[p.returncode for p in procs]}:\n" + "\n".join(logs))


def test_two_processes_match_one(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    multi, single = tmp_path / "multi", tmp_path / "single"
    procs = [
        _launch(
            multi,
            2,
            dict(WMRL_COORDINATOR=coordinator, WMRL_NUM_PROCESSES="2", WMRL_PROCESS_ID=str(i)),
        )
        for i in range(2)
    ]
    procs.append(_launch(single, 4, {}))
    _wait(procs, [multi, multi, single])

    info = [json.loads((multi / f"process{i}.json").read_text()) for i in range(2)]
    assert [p["source"] for p in info] == ["env", "env"]
    assert [p["local_devices"] for p in info] == [2, 2]
    assert [p["rows"] for p in info] == [[0, 8], [8, 16]]  # each process loads its half
    assert [p["wrote"] for p in info] == [True, False]  # only process 0 writes
    assert json.loads((multi / "primary.json").read_text()) == {"writer": 0}
    assert [p["step"] for p in info] == [2, 2]
    assert [p["rewards"] for p in info] == [[1.0, 2.0, 3.0, 4.0]] * 2  # process 0's, everywhere

    got, want = np.load(multi / "result.npz"), np.load(single / "result.npz")
    assert sorted(got.files) == sorted(want.files)
    for name in want.files:
        if name.startswith("restored"):
            original = name.removeprefix("restored_")
            np.testing.assert_array_equal(got[name], got[original], err_msg=name)  # bit-exact
            continue
        atol = ref.PARAMS_ATOL if name.startswith("params") else ref.ATOL
        np.testing.assert_allclose(got[name], want[name], rtol=ref.RTOL, atol=atol, err_msg=name)
    assert float(got["metrics2/kl"]) > 0.0  # the second step is off the reference policy
