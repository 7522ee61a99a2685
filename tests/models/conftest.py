"""Shared fixtures: the committed tiny checkpoints and their reference outputs."""

import functools
import os

import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
ALL_NAMES = sorted(
    n for n in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, n, "config.json"))
)
# The dense Qwen3 checkpoints, and the hybrid Qwen3.5 ones (tested in test_qwen3_5*.py).
QWEN3_5_NAMES = [n for n in ALL_NAMES if n.startswith("qwen3_5_")]
NAMES = [n for n in ALL_NAMES if n not in QWEN3_5_NAMES]


def fixture_path(name: str) -> str:
    return os.path.join(FIXTURES, name)


@functools.cache
def load(name: str, dtype: str = "float32"):
    """A loaded model, cached per process (loading and compiling cost ~1 s each)."""
    from wmrl_jax import models

    return models.from_pretrained(fixture_path(name), dtype=dtype)


@functools.cache
def reference(name: str) -> dict:
    with np.load(os.path.join(fixture_path(name), "reference.npz")) as f:
        return dict(f)


@pytest.fixture(params=NAMES)
def name(request):
    return request.param
