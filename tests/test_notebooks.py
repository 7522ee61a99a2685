"""Executes every notebook in colabs/ top to bottom; any cell error fails the test.

Each notebook runs in its own kernel (the running interpreter's, so the installed package
and its dependencies are the ones under test) from a temporary working directory, with the
repository root on `PYTHONPATH` so the notebooks' `experiments.configs` imports resolve.
"""

from __future__ import annotations

import os
import pathlib

import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ("quickstart.ipynb", "calibration.ipynb", "ablations.ipynb")
CELL_TIMEOUT_S = 600


def test_every_notebook_is_listed():
    assert sorted(p.name for p in (ROOT / "colabs").glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs(name):
    nb = nbformat.read(ROOT / "colabs" / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code cells"
    assert "%pip install" in code[0].source, f"{name}: the first code cell must install"
    for cell in code:
        assert not cell.outputs and cell.execution_count is None, f"{name} has outputs"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, monkeypatch):
    nb = nbformat.read(ROOT / "colabs" / name, as_version=4)
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        # jupyter_client starts "python3" with sys.executable: this environment's packages.
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # Raises CellExecutionError on the first failing cell.
