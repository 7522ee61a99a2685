"""The main job's runlocal path with the text agent on the Qwen3.5 fixtures."""

import json

import pytest

from tests.test_experiments import _run


@pytest.mark.parametrize(
    ("name", "model_type"),
    [("qwen3_5_4b_mledojo", "qwen3_5"), ("qwen3_5_9b_mledojo", "qwen3_5_text")],
)
def test_qwen3_5_configs_runlocal(tmp_path, name, model_type):
    out = _run(f"experiments/configs/{name}.py:runlocal", tmp_path)
    assert "held-out percentile, after" in out
    saved = json.loads((tmp_path / "policy_hf" / "config.json").read_text())
    assert saved["model_type"] == model_type
