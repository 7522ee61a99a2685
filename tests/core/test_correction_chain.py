"""The reward correction as a chain: bit-identical to the recorded behaviour, piece by piece."""

import numpy as np
import pytest

from tests.core.fixtures import correction_replay
from wmrl_jax.core.correction import make_reward_correction


@pytest.fixture(scope="module")
def replayed():
    return correction_replay.record(make_reward_correction)


@pytest.mark.parametrize("name", list(correction_replay.CONFIGS))
def test_replay_is_bit_identical_to_the_recorded_correction(replayed, name):
    recorded = np.load(correction_replay.PATH)
    keys = sorted(k for k in recorded.files if k.startswith(f"{name}/"))
    assert keys == sorted(k for k in replayed if k.startswith(f"{name}/"))
    for key in keys:
        np.testing.assert_array_equal(replayed[key], recorded[key], err_msg=key, strict=True)
