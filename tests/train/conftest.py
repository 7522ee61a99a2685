"""Fixtures of the train-step tests: a tiny random Qwen3 and a one-device mesh, once per module."""

import jax
import pytest

from tests.train.sharded_step_check import tiny_model
from wmrl_jax.models import sharding


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
