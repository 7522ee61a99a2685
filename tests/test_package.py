"""The package as users get it: a wheel installs every module; layers import only downward.

The wheel test builds `pip wheel --no-deps .`, installs it into a fresh venv
whose dependencies come from the test interpreter's site-packages (added as a
plain path, so the editable install of the source tree is never seen), imports
every module from the wheel and runs the main job's runlocal variant with
`experiments/train.py` as a script (the entry points live outside the package).
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import pkgutil
import subprocess
import sys
import sysconfig
import venv

import pytest

import wmrl_jax

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "wmrl_jax"


def _modules() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.walk_packages([str(PACKAGE)], prefix="wmrl_jax.")
        if not m.name.split(".")[-1].startswith("_")
    )


def test_every_package_folder_has_an_init():
    missing = [
        str(d.relative_to(REPO))
        for d in PACKAGE.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
        and not (d / "__init__.py").exists()
    ]  # fmt: skip
    assert not missing, f"package folders without __init__.py (a wheel would skip them): {missing}"


def _imports(path: pathlib.Path) -> set[str]:
    """Absolute module names a file imports, at any depth (lazy imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        ("train", ("wmrl_jax.agents.recipe", "wmrl_jax.agents.text", "wmrl_jax.studies")),
        ("core", ("wmrl_jax.train", "wmrl_jax.agents", "wmrl_jax.studies", "wmrl_jax.envs",
                  "wmrl_jax.models", "wmrl_jax.sandbox", "wmrl_jax.worldmodel")),
        ("agents", ("wmrl_jax.train", "wmrl_jax.studies")),
        ("sandbox", ("wmrl_jax.models", "wmrl_jax.train", "wmrl_jax.agents")),
        ("envs", ("wmrl_jax.models", "wmrl_jax.train", "wmrl_jax.agents")),
    ],
)  # fmt: skip
def test_layers_import_only_downward(layer, forbidden):
    bad = {
        f"{path.relative_to(REPO)}: {name}"
        for path in (PACKAGE / layer).rglob("*.py")
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    }
    assert not bad, f"{layer}/ imports what it must not: {sorted(bad)}"


def test_importing_the_trainer_loads_no_agent_kind_and_no_study():
    code = (
        "import sys, wmrl_jax.train, wmrl_jax.train.loop, wmrl_jax.train.stages; "
        "bad = [m for m in sys.modules if m.startswith(('wmrl_jax.agents.recipe', "
        "'wmrl_jax.agents.text', 'wmrl_jax.studies'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_wheel_installs_and_runs_the_main_job(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(wheels), str(REPO)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = wheels.glob("wmrl_jax-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    # Dependencies from this interpreter, as a plain path: its .pth files (the editable
    # install's finder among them) are not processed.
    deps = sysconfig.get_paths()["purelib"]
    pathlib.Path(site, "deps.pth").write_text(deps + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(wheel)],
        check=True,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    code = (
        "import importlib, json, sys, wmrl_jax; "
        f"mods = {_modules()!r}; "
        "[importlib.import_module(m) for m in mods]; "
        "print(json.dumps({'file': wmrl_jax.__file__, 'n': len(mods)}))"
    )
    out = subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path, env=env
    ).stdout  # fmt: skip
    info = json.loads(out.strip().splitlines()[-1])
    assert info["file"].startswith(site), info  # The wheel, not the source tree.
    assert info["n"] >= 40
    assert pathlib.Path(wmrl_jax.__file__).parent == PACKAGE  # (the test itself: the tree)
    workdir = tmp_path / "run"
    run = subprocess.run(
        [python, REPO / "experiments" / "train.py",
         f"--config={REPO / 'experiments/configs/tiny_cpu.py'}:runlocal",
         "--config.executor.kind=replay", f"--workdir={workdir}"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "held-out percentile, after" in run.stdout
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["environment"] == "replay" and summary["ledger"]["executions"] > 0
