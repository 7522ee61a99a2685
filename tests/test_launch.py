"""The launch files: the SLURM batch script run against a recording `srun`, and the
Kubernetes manifests parsed and checked against what `distributed.resolve` reads."""

import json
import os
import re
import stat
import subprocess
import sys

import pytest
import yaml

from wmrl_jax.train.distributed import ProcessSpec, resolve

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH = os.path.join(REPO, "launch", "slurm", "train.sbatch")
K8S = os.path.join(REPO, "launch", "k8s")

# Stands in for srun: records its arguments and the environment it was given.
FAKE_SRUN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["SRUN_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}, f)
"""


def _directives(path) -> dict:
    out = {}
    with open(path) as f:
        for line in f:
            if m := re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line):
                out[m.group(1)] = m.group(2)
    return out


def test_sbatch_runs_one_trainer_task_per_node_with_the_config_and_workdir(tmp_path):
    directives = _directives(SBATCH)
    assert directives["ntasks-per-node"] == "1" and "nodes" in directives
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    record = tmp_path / "srun.json"
    env = {  # what sbatch sets in the batch step on the first node
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SRUN_RECORD": str(record),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[03-04]",
        "SLURM_SUBMIT_DIR": REPO,
        "WMRL_PYTHON": "/opt/venv/bin/python",
    }
    workdir = tmp_path / "run"
    cmd = ["bash", SBATCH, "experiments/configs/tiny_cpu.py", str(workdir), "--config.seed=3"]
    subprocess.run(cmd, env=env, check=True, timeout=60)
    got = json.loads(record.read_text())
    assert got["cwd"] == REPO and workdir.is_dir()
    assert got["argv"] == [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "/opt/venv/bin/python",
        "-m",
        "experiments.train",
        "--config=experiments/configs/tiny_cpu.py",
        f"--workdir={workdir}",
        "--config.seed=3",
    ]
    # srun adds each task's id and the step's node list; port 61234 + 4242 mod 2000.
    for task in range(2):
        task_env = {
            **got["env"],
            "SLURM_PROCID": str(task),
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NODELIST": "gpu[03-04]",
        }
        assert resolve(environ=task_env) == ProcessSpec(2, task, "gpu03:61476", "slurm")


def test_sbatch_without_arguments_says_how_to_call_it():
    proc = subprocess.run(["bash", SBATCH], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: sbatch" in proc.stderr


def _load(name) -> list[dict]:
    with open(os.path.join(K8S, name)) as f:
        return list(yaml.safe_load_all(f))


def test_trainer_indexed_job_and_its_headless_service():
    service, job = _load("trainer.yaml")
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["WMRL_NUM_PROCESSES"] == str(spec["completions"])
    host, port = env["WMRL_COORDINATOR"].rsplit(":", 1)
    # Pod 0 of an Indexed Job is named <job>-0; under the subdomain it resolves as such.
    assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert int(port) in [p["containerPort"] for p in container["ports"]]
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    for index in range(spec["completions"]):  # what each pod's trainer reads
        got = resolve(environ={**env, "JOB_COMPLETION_INDEX": str(index)})
        assert got == ProcessSpec(spec["completions"], index, env["WMRL_COORDINATOR"], "kubernetes")
    assert "experiments.train" in " ".join(container["args"])


def test_ray_executors_cluster():
    (cluster,) = _load("ray-executors.yaml")
    assert cluster["kind"] == "RayCluster" and cluster["apiVersion"].startswith("ray.io/")
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    (group,) = cluster["spec"]["workerGroupSpecs"]
    resources = json.loads(json.loads(group["rayStartParams"]["resources"]))
    assert resources == {"sandbox": 1}
    pod = group["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    # The engine bind-mounts program files by path: the temp dir is the same inside and out.
    assert mounts["sandbox-tmp"] == volumes["sandbox-tmp"] == env["TMPDIR"]
    assert mounts["docker-socket"] == volumes["docker-socket"] == "/var/run/docker.sock"
    # The trainer joins this cluster by the head's service name.
    (_, job) = _load("trainer.yaml")
    args = " ".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
    assert f"--address={cluster['metadata']['name']}-head-svc:6379" in args


@pytest.mark.parametrize("name", ["trainer.yaml", "ray-executors.yaml"])
def test_manifests_name_no_host_paths_of_a_developer_machine(name):
    text = open(os.path.join(K8S, name)).read()
    assert "/root/" not in text and "/home/" not in text
