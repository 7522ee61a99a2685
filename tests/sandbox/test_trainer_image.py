"""The Kubernetes launch's image: its build recipes agree with the manifests and the package."""

import os
import re
import subprocess
import sys

import pytest
import yaml

from wmrl_jax.sandbox import image, trainer_image

REPO = trainer_image.source_root()
K8S = os.path.join(REPO, "launch", "k8s")
DOCKERFILE = os.path.join(REPO, "launch", "trainer.Dockerfile")
NAME = f"{trainer_image.REPOSITORY}:{trainer_image.TAG}"


def _containers() -> list[dict]:
    found = []
    for name in ("trainer.yaml", "ray-executors.yaml"):
        with open(os.path.join(K8S, name)) as f:
            docs = list(yaml.safe_load_all(f))
        stack = docs
        while stack:  # every container spec, wherever the manifest nests it
            node = stack.pop()
            if isinstance(node, dict):
                if "image" in node and "name" in node:
                    found.append(node)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    return found


def test_every_manifest_runs_the_image_the_recipes_build():
    containers = _containers()
    assert len(containers) == 3  # trainer, Ray head, Ray worker
    for container in containers:
        assert container["image"] == NAME, container["name"]
        # A node that got the image by `docker load` runs it without a registry.
        assert container["imagePullPolicy"] == "IfNotPresent", container["name"]
    makefile = open(os.path.join(REPO, "Makefile")).read()
    assert f"-t {NAME} ." in makefile and "-m wmrl_jax.sandbox.trainer_image" in makefile
    assert f"EXTRAS ?= {','.join(trainer_image.EXTRAS)}" in makefile


def test_the_image_holds_what_the_trainer_command_runs():
    (trainer,) = [c for c in _containers() if c["name"] == "trainer"]
    command = " ".join(trainer["args"])
    assert "ray start" in command and "ray" in trainer_image.EXTRAS
    module = re.search(r"python -m ([\w.]+)", command).group(1)
    config = re.search(r"--config=(\S+)", command).group(1)
    # Run from the image's working dir, where experiments/ is copied.
    assert module.split(".")[0] == trainer_image.RUN_TREE
    assert os.path.isfile(os.path.join(REPO, *module.split(".")) + ".py")
    assert config.startswith(trainer_image.RUN_TREE + "/")
    assert os.path.isfile(os.path.join(REPO, config))
    assert "nvidia.com/gpu" in trainer["resources"]["limits"] and "cuda12" in trainer_image.EXTRAS


def test_dockerfile_builds_the_same_contents():
    text = open(DOCKERFILE).read()
    assert f"ARG EXTRAS={','.join(trainer_image.EXTRAS)}" in text
    assert f"WORKDIR {trainer_image.WORKDIR}" in text
    assert f"COPY {trainer_image.RUN_TREE} ./{trainer_image.RUN_TREE}" in text
    for source in trainer_image.SOURCES:
        assert f"COPY {source} " in text or f" {source} " in text.split("COPY ", 1)[1], source
    assert f"FROM python:{image.PYTHON_VERSION}-" in text  # the offline root's Python
    # The build context holds only what the image needs (no .venv, no outputs).
    allowed = [
        line[1:]
        for line in open(os.path.join(REPO, ".dockerignore")).read().splitlines()
        if line.startswith("!")
    ]
    assert sorted(allowed) == sorted([*trainer_image.SOURCES, trainer_image.RUN_TREE])


def test_offline_steps_install_the_wheel_with_its_extras_for_the_roots_python():
    debootstrap, pip = trainer_image.build_steps("/r", "/d/w.whl", python="python3")
    assert debootstrap[0] == "mmdebstrap" and image.SUITE in debootstrap
    assert pip[-1] == f"/d/w.whl[{','.join(trainer_image.EXTRAS)}]"
    assert pip[pip.index("--target") + 1] == os.path.join("/r", image.SITE_PACKAGES)
    assert pip[pip.index("--python-version") + 1] == image.PYTHON_VERSION
    assert "--only-binary=:all:" in pip and "--no-deps" not in pip  # dependencies resolved
    setup = open(os.path.join(REPO, "setup.py")).read()
    for extra in trainer_image.EXTRAS:  # extras the package declares
        assert re.search(rf'"{extra}":', setup), extra


def test_console_script_wrappers_run_with_the_roots_python(tmp_path):
    site, bin_dir = tmp_path / "site", tmp_path / "bin"
    (site / "demo").mkdir(parents=True)
    bin_dir.mkdir()
    (site / "demo" / "__init__.py").write_text("")
    (site / "demo" / "cli.py").write_text(
        "import sys\nclass app:\n    @staticmethod\n    def main():\n        print(sys.argv[1:])\n"
    )
    (site / "demo-1.0.dist-info").mkdir()
    (site / "demo-1.0.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\nDemo = demo.cli:app.main\n\n[other]\nx = y:z\n"
    )
    assert trainer_image.write_scripts(str(site), str(bin_dir)) == ["Demo"]
    script = (bin_dir / "Demo").read_text()
    assert script.startswith("#!/usr/bin/python3\n")
    out = subprocess.run(
        [sys.executable, str(bin_dir / "Demo"), "start", "--head"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "['start', '--head']\n"


def test_plan_names_the_manifests_image(capsys):
    assert trainer_image.main(["--plan", "--extras=ray"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# {NAME}\n") and out.rstrip().endswith(NAME)
    assert "[ray]" in out and "cuda12" not in out


@pytest.fixture
def built_image():
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.images.get(NAME)
    except Exception as e:
        pytest.skip(f"{NAME} is not built here (make trainer-image): {e}")
    return client


def test_built_image_runs_the_trainer_and_ray(built_image):
    out = built_image.containers.run(
        NAME,
        [
            "sh",
            "-c",
            # absl's help exits 1 after printing it
            "ray --version && python3 -c 'import wmrl_jax, experiments.train'"
            " && (python3 -m experiments.train --helpshort || true) && echo ok",
        ],
        network_mode="none",
        remove=True,
    ).decode()
    assert "ray, version" in out and out.rstrip().endswith("ok"), out
    assert "python -m experiments.train --config=" in out  # the trainer's usage
