"""MetricWriter: JSONL and TensorBoard read-back, non-finite values, resume."""

import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.train.writer import MetricWriter, read_jsonl, read_tensorboard_scalars


def test_jsonl_and_tensorboard_read_back(tmp_path):
    with MetricWriter(tmp_path) as writer:
        writer.write(
            1,
            {
                "reward/wmrl": 0.5,
                "reward/real": np.float32(0.25),
                "kl": jnp.asarray(0.125),
                "executions": 4,
                "clip_fraction": 0.0,
            },
        )
        writer.write(3, {"reward/wmrl": 0.75, "kl": 1.5})
    entries = read_jsonl(tmp_path / "metrics.jsonl")
    assert entries == [
        {
            "step": 1,
            "reward/wmrl": 0.5,
            "reward/real": 0.25,
            "kl": 0.125,
            "executions": 4,
            "clip_fraction": 0.0,
        },
        {"step": 3, "reward/wmrl": 0.75, "kl": 1.5},
    ]
    assert read_jsonl(tmp_path) == entries  # a workdir works too
    scalars = read_tensorboard_scalars(tmp_path)
    assert scalars["reward/wmrl"] == [(1, 0.5), (3, 0.75)]
    assert scalars["kl"] == [(1, 0.125), (3, 1.5)]
    assert scalars["executions"] == [(1, 4.0)]
    assert set(scalars) == {"reward/wmrl", "reward/real", "kl", "executions", "clip_fraction"}


def test_non_finite_values_keep_strict_json(tmp_path):
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        writer.write(0, {"a": math.nan, "b": math.inf, "c": -np.inf, "d": 2.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()

    def reject(token):
        raise AssertionError(f"non-standard JSON token {token}")

    raw = json.loads(lines[0], parse_constant=reject)
    assert raw == {"step": 0, "a": None, "b": "Infinity", "c": "-Infinity", "d": 2.0}
    (entry,) = read_jsonl(tmp_path)
    assert math.isnan(entry["a"]) and entry["b"] == math.inf and entry["c"] == -math.inf


def test_write_errors(tmp_path):
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        writer.write(2, {"x": 1.0})
        with pytest.raises(ValueError, match="not after"):
            writer.write(2, {"x": 1.0})
        with pytest.raises(ValueError, match="reserved"):
            writer.write(3, {"step": 1.0})
        with pytest.raises(ValueError, match="scalars"):
            writer.write(3, {"x": np.ones(2)})
        writer.write(3, {"x": 3.0})
    assert [e["step"] for e in read_jsonl(tmp_path)] == [2, 3]


def test_resume_truncates_and_purges(tmp_path):
    with MetricWriter(tmp_path) as writer:
        for step in range(1, 6):
            writer.write(step, {"loss": float(step)})
    # Resume from a checkpoint at step 3: steps 4 and 5 are redone with new values.
    with MetricWriter(tmp_path, resume_step=3) as writer:
        with pytest.raises(ValueError, match="not after"):
            writer.write(3, {"loss": 0.0})
        writer.write(4, {"loss": 40.0})
    assert read_jsonl(tmp_path) == [
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 2.0},
        {"step": 3, "loss": 3.0},
        {"step": 4, "loss": 40.0},
    ]
    # TensorBoard keeps the first file; the purge hides its steps >= 4 (including 5).
    assert len(os.listdir(tmp_path / "tensorboard")) == 2
    assert read_tensorboard_scalars(tmp_path) == {"loss": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]}


def test_fresh_writer_refuses_existing_log(tmp_path):
    with MetricWriter(tmp_path, tensorboard=False) as writer:
        writer.write(1, {"x": 1.0})
    with pytest.raises(FileExistsError, match="resume_step"):
        MetricWriter(tmp_path, tensorboard=False)
    with MetricWriter(tmp_path, tensorboard=False, overwrite=True) as writer:
        writer.write(1, {"x": 2.0})
    assert read_jsonl(tmp_path) == [{"step": 1, "x": 2.0}]


def test_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    assert read_jsonl(path) == [{"step": 1, "x": 1.0}]
    with MetricWriter(tmp_path, tensorboard=False, resume_step=1) as writer:
        writer.write(2, {"x": 2.0})
    assert read_jsonl(path) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}]
    path.write_text('{"step": 1\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        read_jsonl(path)


def test_undefined_values_are_left_out_of_tensorboard(tmp_path):
    with MetricWriter(tmp_path) as writer:
        writer.write(1, {"a": math.nan, "b": 1.0})
        writer.write(2, {"a": 0.5, "b": math.inf})
    scalars = read_tensorboard_scalars(tmp_path)
    assert scalars["a"] == [(2, 0.5)]  # The NaN of step 1 is not plotted,
    assert scalars["b"] == [(1, 1.0)]  # nor the infinity of step 2.
    assert math.isnan(read_jsonl(tmp_path)[0]["a"])  # The JSONL keeps it, as null.
