"""The resume guard: which config differences make checkpoints another run's."""

import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.train import resume
from wmrl_jax.train.config import override


def test_mismatch_names_differences_outside_the_resumable_keys():
    assert resume.resume_mismatch({"a": {"b": 1}, "num_steps": 1}, {"a": {"b": 2}}) == ["a.b"]
    # An option added since the checkpoints: no difference at its default, one elsewhere.
    new = {"a": {"b": 1, "c": {"d": 0}}}
    defaults = {"a": {"b": 5, "c": {"d": 0}}}
    assert resume.resume_mismatch({"a": {"b": 1}}, new, defaults=defaults) == []
    assert resume.resume_mismatch({"a": {"b": 1}}, new) == ["a.c"]
    moved = {"a": {"b": 1, "c": {"d": 3}}}
    assert resume.resume_mismatch({"a": {"b": 1}}, moved, defaults=defaults) == ["a.c"]
    # Only the top-level keys are resumable: a nested "num_steps" is a difference.
    assert resume.resume_mismatch({"x": {"num_steps": 1}}, {"x": {"num_steps": 2}}) == [
        "x.num_steps"
    ]


def test_check_resumable_names_every_difference():
    config = override(tiny_cpu.get_config("runlocal"), **{"optimizer.total_steps": 10})
    meta = {"config": config.to_json_best_effort(), "outcomes_fingerprint": "replay:a"}
    resume.check_resumable(meta, config, fingerprint="replay:a", directory="ckpt")
    longer = override(config, num_steps=config.num_steps + 1, eval_every=1)
    resume.check_resumable(meta, longer, fingerprint="replay:a", directory="ckpt")
    other = override(config, seed=config.seed + 1)
    with pytest.raises(ValueError) as e:
        resume.check_resumable(meta, other, fingerprint="replay:b", directory="ckpt")
    assert str(e.value).startswith(
        "ckpt holds checkpoints of another run (config seed; outcome source (replay:a != replay:b))"
    )
    # Without a fixed schedule, num_steps sets the learning rates: no longer resumable.
    free = override(config, **{"optimizer.total_steps": -1})
    meta = {"config": free.to_json_best_effort(), "outcomes_fingerprint": None}
    with pytest.raises(ValueError, match="learning-rate schedule's length"):
        resume.check_resumable(meta, override(free, num_steps=free.num_steps + 1),
                               fingerprint=None, directory="ckpt")  # fmt: skip


def test_the_number_of_workers_does_not_make_another_run():
    config = override(tiny_cpu.get_config("runlocal"), **{"optimizer.total_steps": 10})
    meta = {"config": config.to_json_best_effort(), "outcomes_fingerprint": None}
    more = override(config, **{"executor.workers": 16, "executor.max_infra_steps": 0})
    resume.check_resumable(meta, more, fingerprint=None, directory="ckpt")
    # Any other executor setting still does, in one ResumeError (a ValueError) line.
    slower = override(config, **{"executor.timeout_s": 5.0})
    with pytest.raises(resume.ResumeError, match=r"another run \(config executor.timeout_s\)"):
        resume.check_resumable(meta, slower, fingerprint=None, directory="ckpt")
