"""Checkpoint I/O: bit-exact round trips, the same layout, clear errors."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from tests.models.conftest import NAMES, fixture_path, load, reference
from wmrl_jax import models
from wmrl_jax.models import hf_io, safetensors_io


def _tensors(path):
    out = {}
    for file in sorted(os.listdir(path)):
        if file.endswith(".safetensors"):
            for k, v in safetensors_io.open_tensors(os.path.join(path, file)).items():
                out[k] = (file, v.dtype, np.asarray(v).tobytes())
    return out


@pytest.mark.parametrize("fixture", NAMES)
def test_save_load_round_trip_is_bit_exact(fixture, tmp_path):
    model = load(fixture)
    model.save_pretrained(tmp_path)
    # Same tensor names, files, dtypes and bytes as the source checkpoint.
    assert _tensors(tmp_path) == _tensors(fixture_path(fixture))
    with open(os.path.join(fixture_path(fixture), "config.json")) as f:
        source_config = json.load(f)
    with open(tmp_path / "config.json") as f:
        assert json.load(f) == source_config
    if os.path.isfile(os.path.join(fixture_path(fixture), hf_io.INDEX_FILE)):
        with open(os.path.join(fixture_path(fixture), hf_io.INDEX_FILE)) as f:
            source_map = json.load(f)["weight_map"]
        with open(tmp_path / hf_io.INDEX_FILE) as f:
            assert json.load(f)["weight_map"] == source_map
    again = models.from_pretrained(tmp_path)
    assert again.tokenizer is not None
    ids = reference(fixture)["input_ids"]
    np.testing.assert_array_equal(np.asarray(again.logits(ids)), np.asarray(model.logits(ids)))


def test_bf16_save_keeps_source_dtypes(tmp_path):
    fixture = NAMES[0]
    model = load(fixture, "bfloat16")
    model.save_pretrained(tmp_path)
    saved = _tensors(tmp_path)
    assert {d for _, d, _ in saved.values()} == {np.dtype(np.float32)}
    # Rounded to bf16 and back: equal to the source up to bf16 precision.
    src = safetensors_io.open_tensors(os.path.join(fixture_path(fixture), "model.safetensors"))
    out = safetensors_io.open_tensors(tmp_path / "model.safetensors")
    for k in src:
        np.testing.assert_allclose(out[k], src[k], rtol=2**-8, atol=0)


def test_safetensors_writer_reads_back_bf16(tmp_path):
    import ml_dtypes

    arrays = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
        "b": np.array([1, 2, 3], np.int64),
    }
    safetensors_io.write_tensors(tmp_path / "x.safetensors", arrays)
    back = safetensors_io.open_tensors(tmp_path / "x.safetensors")
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(back[k], v)


def _copy(fixture, tmp_path):
    dst = tmp_path / fixture
    shutil.copytree(fixture_path(fixture), dst)
    return dst


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.from_pretrained(tmp_path / "nope")
    path = _copy(NAMES[0], tmp_path)
    os.remove(path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        models.from_pretrained(path)
    os.remove(path / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.from_pretrained(path)


def test_missing_shard(tmp_path):
    path = _copy("qwen3_gqa4_yarn", tmp_path)
    os.remove(path / "model-00002-of-00005.safetensors")
    with pytest.raises(FileNotFoundError, match="model-00002-of-00005"):
        models.from_pretrained(path)


def test_unknown_model_type(tmp_path):
    path = _copy(NAMES[0], tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["model_type"] = "mamba"
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="unknown model_type 'mamba'"):
        models.from_pretrained(path)


def test_shape_mismatch_names_the_tensor(tmp_path):
    path = _copy(NAMES[0], tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["intermediate_size"] += 8
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(
        ValueError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*\(96, 64\).*\(104, 64\)"
    ):
        models.from_pretrained(path)


def test_missing_tensor_is_named(tmp_path):
    path = _copy(NAMES[0], tmp_path)
    # Copies, not memory-mapped views: the file is about to be overwritten.
    tensors = {
        k: np.array(v)
        for k, v in safetensors_io.open_tensors(path / "model.safetensors").items()
        if k != "model.norm.weight"
    }
    safetensors_io.write_tensors(path / "model.safetensors", tensors)
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        models.from_pretrained(path)


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        models.from_pretrained(fixture_path(NAMES[0]), dtype="int8")


def test_random_model_save_and_load(tmp_path):
    raw = models.qwen3_config_dict(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
    )
    model = models.random_model(raw, jax.random.key(0))
    model.save_pretrained(tmp_path)
    again = models.from_pretrained(tmp_path)
    ids = np.arange(10, dtype=np.int32)[None]
    np.testing.assert_array_equal(np.asarray(again.logits(ids)), np.asarray(model.logits(ids)))


def test_bf16_checkpoint_round_trip_is_bit_exact(tmp_path):
    raw = models.qwen3_config_dict(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        dtype="bfloat16",
    )
    models.random_model(raw, jax.random.key(1), dtype="bfloat16").save_pretrained(tmp_path / "a")
    loaded = models.from_pretrained(tmp_path / "a", dtype="bfloat16")
    loaded.save_pretrained(tmp_path / "b")
    first, second = _tensors(tmp_path / "a"), _tensors(tmp_path / "b")
    assert first == second
    assert {d.name for _, d, _ in first.values()} == {"bfloat16"}
