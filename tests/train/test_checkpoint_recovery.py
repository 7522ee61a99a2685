"""A damaged newest checkpoint: fall back to the newest readable step, set the bad one
aside (never deleted) with one warning line, or refuse with one clear line."""

import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.train.checkpoint import Checkpointer, CheckpointError


def state_at(step):
    return {"w": jnp.full((3,), float(step)), "count": jnp.asarray(step, jnp.int32)}


ABSTRACT = jax.eval_shape(lambda: state_at(0))


def save_steps(directory, steps=(1, 2, 3)):
    with Checkpointer(directory, keep=5, async_save=False) as ckpt:
        for step in steps:
            ckpt.save(step, state_at(step), {"step": step})


def damage(step_dir, how):
    if how == "garbage-state":
        for root, _, files in os.walk(os.path.join(step_dir, "state")):
            for name in files:
                with open(os.path.join(root, name), "wb") as f:
                    f.write(b"garbage")
    elif how == "broken-meta":
        with open(os.path.join(step_dir, "meta", "metadata"), "w") as f:
            f.write("{not json")
    elif how == "state-removed":
        shutil.rmtree(os.path.join(step_dir, "state"))


@pytest.mark.parametrize("how", ["garbage-state", "broken-meta", "state-removed"])
def test_resume_falls_back_to_the_newest_readable_step(tmp_path, caplog, how):
    directory = tmp_path / "ckpt"
    save_steps(directory)
    damage(directory / "3", how)
    with caplog.at_level(logging.WARNING, logger="wmrl_jax.train.checkpoint"):
        with Checkpointer(directory, keep=5, async_save=False) as ckpt:
            # The trainer's resume sequence.
            assert ckpt.latest_step() == 3
            assert ckpt.meta() in ({"step": 3}, {"step": 2})  # the state may be the bad part
            state, meta = ckpt.restore(abstract_state=ABSTRACT)
            assert meta == {"step": 2}
            np.testing.assert_array_equal(state["w"], [2.0, 2.0, 2.0])
            assert ckpt.latest_step() == 2 and ckpt.all_steps() == [1, 2]
            # Training goes on: step 3 is saved again and becomes the newest.
            assert ckpt.save(3, state_at(3), {"step": 3})
            ckpt.wait()
            assert ckpt.restore(abstract_state=ABSTRACT)[1] == {"step": 3}
    ours = [r for r in caplog.records if r.name == "wmrl_jax.train.checkpoint"]
    assert len(ours) == 1 and "\n" not in ours[0].getMessage()
    assert "step 3" in ours[0].getMessage() and "resuming from step 2" in ours[0].getMessage()
    kept = tmp_path / "ckpt.unreadable" / "3"
    assert kept.is_dir(), "the damaged step must be kept, not deleted"


def test_nothing_readable_is_one_clear_error_and_nothing_moves(tmp_path):
    directory = tmp_path / "ckpt"
    save_steps(directory, steps=(1, 2))
    for step in ("1", "2"):
        damage(directory / step, "broken-meta")
    with Checkpointer(directory, async_save=False) as ckpt:
        with pytest.raises(CheckpointError, match="step 2: .*; step 1: ") as info:
            ckpt.meta()
    assert "\n" not in str(info.value)
    assert sorted(os.listdir(directory)) == ["1", "2"]
    assert not (tmp_path / "ckpt.unreadable").exists()


def test_a_target_of_another_structure_moves_nothing(tmp_path):
    directory = tmp_path / "ckpt"
    save_steps(directory, steps=(1, 2))
    other = jax.eval_shape(lambda: {"w": jnp.zeros((3,)), "other": jnp.zeros(())})
    with Checkpointer(directory, async_save=False) as ckpt:
        with pytest.raises(CheckpointError, match="can be read"):
            ckpt.restore(abstract_state=other)
        assert ckpt.all_steps() == [1, 2]
        assert ckpt.restore(abstract_state=ABSTRACT)[1] == {"step": 2}


def test_an_explicit_unreadable_step_is_refused_in_one_line(tmp_path):
    directory = tmp_path / "ckpt"
    save_steps(directory, steps=(1, 2))
    damage(directory / "1", "broken-meta")
    with Checkpointer(directory, async_save=False) as ckpt:
        with pytest.raises(CheckpointError, match="step 1 .* unreadable"):
            ckpt.meta(1)
        assert json.dumps(ckpt.meta(2)) == '{"step": 2}'
        assert ckpt.all_steps() == [1, 2]
