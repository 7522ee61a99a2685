"""Builds what the training loop composes, from a config: tasks, executor, agent, correction.

Every builder validates its part of the config and fails with a message that
names the field before any expensive work starts (`validate_config` runs all
the checks up front).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from wmrl_jax.core.correction import RewardCorrection, make_reward_correction
from wmrl_jax.envs import grading
from wmrl_jax.envs.task import Task, load_task

log = logging.getLogger(__name__)

ARMS = ("real", "wm_naive", "wm_debias", "wmrl")
EXECUTORS = ("auto", "docker", "local", "replay")
AGENTS = ("recipe", "text")
ANCHOR_POLICIES = ("random", "uncertain")
ON_INFRA_ERROR = ("wm_only", "raise")
TASK_SOURCES = ("builtin", "dir", "mle_dojo")


class ConfigError(ValueError):
    """A config that cannot run; raised before any work is done."""


def _choice(config, field: str, choices: Sequence[str]) -> None:
    value = config
    for part in field.split("."):
        value = value[part]
    if value not in choices:
        raise ConfigError(f"config.{field} must be one of {tuple(choices)}, got {value!r}")


def override(config: ml_collections.ConfigDict, **fields) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted fields replaced.

    Example:
      >>> c = override(tiny_cpu.get_config(), **{"executor.kind": "replay"})  # doctest: +SKIP
    """
    import copy

    config = copy.deepcopy(config)
    with config.unlocked():
        for key, value in fields.items():
            node = config
            *parents, leaf = key.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = value
    return config


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks a training config; raises `ConfigError` naming the first bad field."""
    _choice(config, "arm", ARMS)
    _choice(config, "executor.kind", EXECUTORS)
    _choice(config, "executor.on_infra_error", ON_INFRA_ERROR)
    _choice(config, "agent.kind", AGENTS)
    _choice(config, "anchor_policy", ANCHOR_POLICIES)
    _choice(config, "tasks.source", TASK_SOURCES)
    _choice(config, "agent.wm_params", ("current", "initial"))
    if config.eval_samples < 0:
        raise ConfigError(f"config.eval_samples must be >= 0, got {config.eval_samples}")
    if not 0.0 <= config.anchor_fraction <= 1.0:
        raise ConfigError(f"config.anchor_fraction must be in [0, 1], got {config.anchor_fraction}")
    for field in ("num_steps", "tasks_per_step", "group_size", "eval_every"):
        if int(config[field]) < 1:
            raise ConfigError(f"config.{field} must be >= 1, got {config[field]}")
    if config.group_size < 2:
        raise ConfigError(
            f"config.group_size must be >= 2 for group advantages, got {config.group_size}"
        )
    if config.agent.kind == "text" and not config.agent.checkpoint:
        raise ConfigError("config.agent.checkpoint must name a local Hugging Face directory")
    if config.agent.kind == "text" and config.train.loss.aux_coef:
        raise ConfigError("config.train.loss.aux_coef must be 0 for the text agent")
    if config.agent.kind == "text" and config.executor.kind == "replay":
        raise ConfigError(
            "config.executor.kind='replay' answers recipe programs only; "
            "free-form programs need 'docker', 'local' or 'auto'"
        )
    if config.tasks.source in ("dir", "mle_dojo") and not config.tasks.path:
        raise ConfigError(f"config.tasks.path is required for tasks.source={config.tasks.source!r}")


@dataclasses.dataclass(frozen=True)
class TaskSets:
    """The tasks a run trains on, evaluates on and warm-starts from."""

    train: list[Task]
    heldout: list[Task]
    pretrain: list[Task]


def _split(tasks: list[Task], split: str) -> list[Task]:
    return sorted((t for t in tasks if t.split == split), key=lambda t: t.id)


def load_tasks(config: ml_collections.ConfigDict) -> TaskSets:
    """Loads the configured task directories and splits them."""
    source = config.tasks.source
    if source == "builtin":
        from wmrl_jax.envs import builtin

        root = builtin.cached_suite(seed=config.tasks.suite_seed)
        paths = [os.path.join(root, d) for d in sorted(os.listdir(root))]
        tasks = [load_task(p) for p in paths if os.path.isdir(p)]
    elif source == "dir":
        root = os.path.expanduser(config.tasks.path)
        tasks = [load_task(os.path.join(root, d)) for d in sorted(os.listdir(root))]
    else:
        tasks = load_mle_dojo_tasks(
            config.tasks.path,
            config.tasks.views,
            config.tasks.split_file,
            config.tasks.metrics_file,
        )
    sets = TaskSets(
        train=_split(tasks, "train"),
        heldout=_split(tasks, "held-out"),
        pretrain=_split(tasks, "pretrain"),
    )
    if not sets.train:
        raise ConfigError(f"no train tasks found for tasks.source={source!r}")
    if not sets.heldout:
        raise ConfigError(f"no held-out tasks found for tasks.source={source!r}")
    return sets


def load_mle_dojo_tasks(
    prepared: str, views: str, split_file: str, metrics_file: str
) -> list[Task]:
    """MLE-Dojo prepared competitions as linked task views (see `envs.mle_dojo`).

    Args:
      prepared: the directory holding `<name>/data/...` competitions.
      views: where the view directories are written (links, no copies).
      split_file: the user's split (upstream `competition.json` or train / held-out lists).
      metrics_file: JSON `{name: {"name": metric, "direction": "higher" | "lower"}}`;
        MLE-Dojo's metrics are never guessed.
    """
    import json

    from wmrl_jax.envs import mle_dojo

    for field, value in (("split_file", split_file), ("metrics_file", metrics_file)):
        if not value:
            raise ConfigError(f"config.tasks.{field} is required for tasks.source='mle_dojo'")
    prepared, views = os.path.expanduser(prepared), os.path.expanduser(views)
    split = mle_dojo.load_split(os.path.expanduser(split_file))
    with open(os.path.expanduser(metrics_file), encoding="utf-8") as f:
        metric_of = json.load(f)
    tasks = []
    for name in sorted(split):
        if name not in metric_of:
            raise ConfigError(f"{metrics_file} has no metric for competition {name!r}")
        comp = mle_dojo.load_competition(os.path.join(prepared, name))
        tasks.append(
            mle_dojo.make_task(comp, os.path.join(views, name), split=split, metric=metric_of[name])
        )
    return tasks


def make_correction(config: ml_collections.ConfigDict) -> RewardCorrection:
    """The reward correction for `config.arm` (switches as in the paper's ablations)."""
    c = config.correction
    return make_reward_correction(
        capacity=c.capacity,
        debias=config.arm in ("wm_debias", "wmrl"),
        ivd=config.arm == "wmrl",
        use_real=config.arm != "wm_naive",
        decay=c.decay,
        real_var_prior=c.real_var_prior,
        min_anchors=c.min_anchors,
        wm_var=c.wm_var,
    )


def optimizer_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config.optimizer` with `total_steps` (-1) derived from the run's length."""
    opt = ml_collections.ConfigDict(config.optimizer.to_dict())
    if opt.total_steps < 0:
        opt.total_steps = config.num_steps * config.train.num_epochs
    opt.warmup_steps = min(opt.warmup_steps, opt.total_steps)
    return opt


def reward_floors(config: ml_collections.ConfigDict) -> grading.RewardFloors:
    f = config.rewards
    return grading.RewardFloors(
        invalid=f.invalid, error=f.error, killed=f.error, timeout=f.timeout, oom=f.timeout
    )


def make_outcomes(config: ml_collections.ConfigDict, *, table=None):
    """The outcome source: real execution in a sandbox, or replay of the recipe table.

    Returns:
      `(outcomes, environment)`: an object with `submit(task, source)` and
      `close()`, and a word for the logs ("docker", "local", "replay").
    """
    from wmrl_jax.envs import outcomes as outcomes_lib

    floors = reward_floors(config)
    kind = config.executor.kind
    if kind == "replay":
        table = table if table is not None else load_table(config)
        return outcomes_lib.ReplayExecutor(table, floors=floors), "replay"
    from wmrl_jax import sandbox

    kwargs = dict(max_workers=config.executor.workers, timeout_s=config.executor.timeout_s)
    if kind == "docker":
        try:
            executor = sandbox.DockerExecutor(config.executor.image or None, **kwargs)
        except sandbox.InfraError as e:
            raise ConfigError(f"config.executor.kind='docker' but: {e}") from e
    elif kind == "local":
        executor = sandbox.LocalExecutor(python=sys.executable, **kwargs)
    else:  # "auto"; the local backend warns that it does not isolate.
        executor = sandbox.make_executor(
            config.executor.image or None, python=sys.executable, **kwargs
        )
    return (
        outcomes_lib.SandboxOutcomes(executor, floors=floors, timeout_s=kwargs["timeout_s"]),
        "local" if isinstance(executor, sandbox.LocalExecutor) else "docker",
    )


def load_table(config: ml_collections.ConfigDict):
    """The committed recipe benchmark table (for warm-starting and replay)."""
    from wmrl_jax.envs import tabular

    return tabular.RecipeTable.load(os.path.expanduser(config.executor.table) or None)


def make_recipe_agent(config: ml_collections.ConfigDict, tasks: TaskSets, table, key):
    """A tiny backbone over the recipe vocabulary, warm-started on the pretrain tasks.

    Returns:
      `(agent, params, info)`; `info` holds the warm-start loss curves.
    """
    from wmrl_jax.models import api
    from wmrl_jax.train import recipe_lm
    from wmrl_jax.train.agent import RecipeAgent

    a = config.agent
    vocab = recipe_lm.RecipeVocab()
    raw = recipe_lm.make_backbone(
        vocab, hidden_size=a.hidden_size, num_layers=a.num_layers, num_heads=a.num_heads
    )
    init_key, warm_key = jax.random.split(key)
    model = api.random_model(raw, init_key)
    params, info = model.params, {}
    w = config.warm_start
    if w.steps > 0:
        if not tasks.pretrain:
            raise ConfigError("config.warm_start.steps > 0 but there are no pretrain tasks")
        floors = reward_floors(config)
        data = recipe_lm.warm_start_data(
            vocab,
            np.stack([recipe_lm.task_prompt(vocab, t) for t in tasks.pretrain]),
            np.stack([table.reward(t.id, floors) for t in tasks.pretrain]),
        )
        params, info = recipe_lm.warm_start(
            model.graphdef,
            params,
            data,
            steps=w.steps,
            batch_size=w.batch_size,
            lr=w.lr,
            key=warm_key,
            temperature=w.temperature,
            vocab=vocab,
        )
    agent = RecipeAgent(model.graphdef, vocab, temperature=a.temperature, min_mass=a.min_mass)
    return agent, params, dict(raw_config=raw, warm_start=info, graphdef=model.graphdef)


def make_text_agent(config: ml_collections.ConfigDict):
    """A Hugging Face checkpoint writing free-form programs (GPU configs)."""
    from wmrl_jax.models import api
    from wmrl_jax.train.text_agent import TextAgent

    a = config.agent
    model = api.from_pretrained(os.path.expanduser(a.checkpoint), dtype=a.dtype)
    agent = TextAgent(
        model.graphdef,
        model.tokenizer,
        max_prompt_tokens=a.max_prompt_tokens,
        max_new_tokens=a.max_new_tokens,
        wm_max_new_tokens=a.wm_max_new_tokens,
        wm_samples=a.wm_samples,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        anchors_per_task=a.anchors_per_task,
        chat_template_kwargs={"enable_thinking": bool(a.enable_thinking)},
    )
    return agent, model.params, dict(raw_config=model.raw_config, graphdef=model.graphdef)
