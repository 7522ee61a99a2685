"""Builds what the trainer composes, from a validated config: tasks, outcomes, agent, correction.

`wmrl_jax.train.config.validate_config` checks the whole config before any of
these run; the builders raise `ConfigError` for what only shows once files
are read (no train tasks, a competition without a metric).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

import ml_collections

from wmrl_jax import agents
from wmrl_jax.core.correction import RewardCorrection
from wmrl_jax.envs import grading
from wmrl_jax.envs.task import Task, check_unique_ids, load_task
from wmrl_jax.train import arms
from wmrl_jax.train.config import ConfigError, lora_settings
from wmrl_jax.train.sections import CorrectionSection, ExecutorSection

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskSets:
    """The tasks a run trains on, evaluates on and warm-starts from."""

    train: list[Task]
    heldout: list[Task]
    pretrain: list[Task]


def _split(tasks: list[Task], split: str) -> list[Task]:
    return sorted((t for t in tasks if t.split == split), key=lambda t: t.id)


def _builtin_tasks(c: ml_collections.ConfigDict) -> list[Task]:
    from wmrl_jax.envs import builtin

    root = builtin.cached_suite(seed=c.suite_seed, suite_name=c.suite)
    paths = [os.path.join(root, d) for d in sorted(os.listdir(root))]
    return [load_task(p) for p in paths if os.path.isdir(p)]


def _dir_tasks(c: ml_collections.ConfigDict) -> list[Task]:
    root = os.path.expanduser(c.path)
    return [load_task(os.path.join(root, d)) for d in sorted(os.listdir(root))]


def _mle_dojo_tasks(c: ml_collections.ConfigDict) -> list[Task]:
    return load_mle_dojo_tasks(c.path, c.views, c.split_file, c.metrics_file)


def _mle_bench_tasks(c: ml_collections.ConfigDict) -> list[Task]:
    return load_mle_bench_tasks(c.path, c.data_root, c.views, c.split_file, c.metrics_file)


# Where each `config.tasks.source` reads its tasks from (`config.TASK_SOURCES` names
# the same keys); a loader gets the `config.tasks` section.
TASK_LOADERS = {
    "builtin": _builtin_tasks,
    "dir": _dir_tasks,
    "mle_dojo": _mle_dojo_tasks,
    "mle_bench": _mle_bench_tasks,
}


def load_tasks(config: ml_collections.ConfigDict) -> TaskSets:
    """Loads the configured task source's tasks, checks them and splits them."""
    source = config.tasks.source
    tasks = TASK_LOADERS[source](config.tasks)
    check_unique_ids(tasks)  # The execution cache keys on ids: two tasks must not share one.
    for t in tasks:  # A broken grader side fails here, in one line, not mid-run.
        try:
            grading.check_task(t)
        except grading.TaskError as e:
            raise ConfigError(f"task {t.id!r} cannot be graded: {e}") from e
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


def load_mle_bench_tasks(
    competitions: str, data_root: str, views: str, split_file: str, metrics_file: str = ""
) -> list[Task]:
    """MLE-bench prepared competitions as linked task views (see `envs.mle_bench`).

    Args:
      competitions: MLE-bench's competitions directory, one `<id>/` (config.yaml,
        description.md, grade.py, leaderboard.csv) per competition.
      data_root: the prepared data root that each `config.yaml`'s dataset paths are
        relative to (`<data_root>/<id>/prepared/{public,private}`).
      views: where the view directories are written (links, no copies).
      split_file: the user's split (`{"train": [...], "held-out": [...]}` or the
        upstream `competition.json` form); only the competitions it names are loaded.
      metrics_file: optional JSON `{id: {"name": metric, "direction": ...}}`; without
        an entry a competition's `grader.name` must name a contract metric, and its
        direction is inferred from the board as MLE-bench does.
    """
    import json

    from wmrl_jax.envs import mle_bench, mle_dojo

    if not data_root:
        raise ConfigError("config.tasks.data_root is required for tasks.source='mle_bench'")
    if not split_file:
        raise ConfigError("config.tasks.split_file is required for tasks.source='mle_bench'")
    competitions, views = os.path.expanduser(competitions), os.path.expanduser(views)
    split = mle_dojo.load_split(os.path.expanduser(split_file))
    metric_of = {}
    if metrics_file:
        with open(os.path.expanduser(metrics_file), encoding="utf-8") as f:
            metric_of = json.load(f)
    tasks = []
    for name in sorted(split):
        try:
            comp = mle_bench.load_competition(
                os.path.join(competitions, name), os.path.expanduser(data_root)
            )
            task = mle_bench.make_task(
                comp, os.path.join(views, name), split=split, metric=metric_of.get(name)
            )
        except ValueError as e:
            raise ConfigError(f"MLE-bench competition {name!r}: {e}") from e
        tasks.append(task)
    return tasks


def make_correction(config: ml_collections.ConfigDict) -> RewardCorrection:
    """The reward correction of `config.arm` (its switches come from the table of arms)."""
    return arms.make_correction(
        arms.get(config.arm),
        **CorrectionSection.of(config).kwargs(),
        local_features=agents.capabilities(config.agent.kind).program_features,
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


def make_outcomes(config: ml_collections.ConfigDict, *, table=None, tasks=()):
    """The outcome source: real execution in a sandbox, or replay of the recipe table.

    Args:
      config: the training config (`executor`, `rewards`).
      table: the recipe table answering a replay (default: `executor.table`'s).
      tasks: the tasks an executing source grades; their grader side (answers, boards,
        grading fields) becomes its fingerprint, which the resume guard compares.

    Returns:
      `(outcomes, environment)`: an object with `submit(task, source)` and
      `close()`, and a word for the logs ("docker", "local", "replay", ...).
    """
    from wmrl_jax.envs import outcomes as outcomes_lib

    floors = reward_floors(config)
    kind = config.executor.kind
    if kind == "replay":  # The recipe table answers; nothing is executed.
        table = table if table is not None else load_table(config)
        return outcomes_lib.ReplayExecutor(table, floors=floors), "replay"
    from wmrl_jax import sandbox

    c = ExecutorSection.of(config)
    try:
        executor, environment = EXECUTORS[kind](c)
    except sandbox.InfraError as e:
        raise ConfigError(f"config.executor.kind={kind!r} but: {e}") from e
    if isinstance(executor, sandbox.DockerExecutor) and executor.gpu_refusal:
        # No GPU runtime: every run would be an infra_error; say so before training.
        executor.close()
        raise ConfigError(f"config.executor.gpus={c.gpus!r} but {executor.gpu_refusal}")
    return (
        outcomes_lib.SandboxOutcomes(
            executor, floors=floors, timeout_s=c.timeout_s, num_replicates=c.replicates,
            tasks=tasks,
        ),
        environment,
    )  # fmt: skip


# Executors of `config.executor.kind`: each builds a sandbox executor from
# `config.executor` and names its environment for the logs; a backend that cannot
# run raises `sandbox.InfraError` (reported as a `ConfigError`).
def _docker_executor(c: ExecutorSection):
    from wmrl_jax import sandbox

    return sandbox.DockerExecutor(c.image or None, **_run_kwargs(c), **_gpu_kwargs(c)), "docker"


def _local_executor(c: ExecutorSection):
    from wmrl_jax import sandbox

    # Refuses where it cannot hide the grader-side data (no user namespaces).
    return sandbox.LocalExecutor(python=sys.executable, **_run_kwargs(c)), "local"


def _auto_executor(c: ExecutorSection):
    """Docker if it can run, else the local backend (which says what it isolates);
    with GPUs there is no local fallback."""
    from wmrl_jax import sandbox

    executor = sandbox.make_executor(
        c.image or None, python=sys.executable, **_run_kwargs(c), **_gpu_kwargs(c)
    )
    return executor, "local" if isinstance(executor, sandbox.LocalExecutor) else "docker"


def _ray_executor(c: ExecutorSection):
    """Executions fanned out over a Ray cluster's nodes, each running Docker."""
    import functools

    from wmrl_jax import sandbox
    from wmrl_jax.sandbox.ray_executor import RayExecutor

    make = functools.partial(
        sandbox.DockerExecutor, c.image or None, timeout_s=c.timeout_s, **_gpu_kwargs(c)
    )
    executor = RayExecutor(
        c.ray_address or None, slots_per_node=c.workers, make_executor=make,
        node_resource=c.ray_node_resource or None, **_fanout_kwargs(c),
    )  # fmt: skip
    return executor, "ray"


def _engines_executor(c: ExecutorSection):
    """Executions fanned out over several Docker engines."""
    from wmrl_jax.sandbox.remote import EnginePool, engines_from_env

    urls = [u.strip() for u in c.engines.split(",") if u.strip()] or engines_from_env()
    if not urls:
        raise ConfigError("config.executor.engines (or WMRL_DOCKER_ENGINES) names no engine")
    pool = EnginePool(
        urls, c.image or None, slots=c.workers, timeout_s=c.timeout_s,
        **_fanout_kwargs(c), **_gpu_kwargs(c),
    )  # fmt: skip
    return pool, "engines"


EXECUTORS = {
    "auto": _auto_executor,
    "docker": _docker_executor,
    "local": _local_executor,
    "ray": _ray_executor,
    "engines": _engines_executor,
}


def _run_kwargs(c: ExecutorSection) -> dict:
    return dict(max_workers=c.workers, timeout_s=c.timeout_s)


def _fanout_kwargs(c: ExecutorSection) -> dict:
    return dict(max_retries=c.infra_retries, deadline_s=c.deadline_s or None)


def check_workdir(path: str) -> None:
    """Creates `path` if needed and checks that files can be written there.

    Raises:
      ConfigError: it is a file, or not writable (read-only, no permission).
    """
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"--workdir {path!r} is not a writable directory: {e.strerror}") from e


def _gpu_kwargs(c: ExecutorSection) -> dict:
    """`DockerExecutor`'s GPU keywords from config.executor ({} without GPUs)."""
    if not c.gpus:
        return {}
    return dict(
        gpus=c.gpus,
        gpus_per_program=c.gpus_per_program or None,
        gpu_memory_fraction=c.gpu_memory_fraction or None,
    )


def load_table(config: ml_collections.ConfigDict):
    """The recipe table answering `executor.kind='replay'` ("" = the committed one)."""
    from wmrl_jax.envs import tabular

    return tabular.RecipeTable.load(os.path.expanduser(config.executor.table) or None)


def build_agent(
    config: ml_collections.ConfigDict,
    tasks: TaskSets,
    key,
    *,
    mesh=None,
    batch_sizes=None,
    **kwargs,
) -> agents.Built:
    """The agent of `config.agent.kind`, from its sub-config `config.agent.<kind>`.

    Args:
      config: the training config.
      tasks: the run's tasks.
      key: PRNG key for the agent's initialisation and warm start.
      mesh: the run's mesh (the agent loads and generates sharded on it).
      batch_sizes: rows per generation call by role, from the memory plan.
      **kwargs: passed to the kind's factory (e.g. an already loaded `table`).
    """
    kind = config.agent.kind
    context = agents.AgentContext(
        train=tasks.train, heldout=tasks.heldout, pretrain=tasks.pretrain,
        floors=reward_floors(config), key=key, mesh=mesh, batch_sizes=batch_sizes,
        lora=lora_settings(config),
    )  # fmt: skip
    try:
        return agents.make(kind, config.agent[kind], context, **kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from e
