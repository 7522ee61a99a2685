"""A tabular benchmark of the recipe space, in the spirit of NAS-Bench.

Every (task, recipe) program is executed for real `replicates` times (default
`REPLICATES`), each run with its replicate index in `recipes.REPLICATE_ENV`
(which seeds the program's model and validation split), and graded; the table
keeps status, raw score and measured execution seconds per (task, recipe,
replicate), the tasks' leaderboards (so percentiles come from boards) and a
digest of each task's data (a table never answers for different data).
`outcomes.ReplayExecutor` answers from it and charges the recorded seconds, so
many-seed studies cost minutes while the compute they account for is the real
cost. A recipe's true reward is its replicate mean (`RecipeTable.reward`); the
spread across replicates (`RecipeTable.reward_var`) is the noise of real
execution that a correction has to estimate.

`table_build` builds, updates and summarises tables:

    python -m wmrl_jax.envs.table_build build --suite DIR --out FILE
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from wmrl_jax.envs import grading, recipes
from wmrl_jax.envs.task import Task, load_task

# Table codes: grading's sandbox statuses with "invalid" (ran, unusable submission).
STATUS_NAMES: tuple[str, ...] = ("ok", "invalid", "error", "killed", "timeout", "oom")
# 2: status / score / seconds carry a replicate axis, [T, R, K] (1 had one run per pair).
FORMAT_VERSION = 2
REPLICATES = 3


DEFAULT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "recipe_table.npz")


class TableError(ValueError):
    """The table does not fit the suite or the recipes it is asked about."""


def data_digest(task: Task) -> str:
    """sha256 over the data that decides a recipe's score: train, test and the answers.

    Boards, descriptions and the sample submission are left out: they may change
    (new competitors) without changing any recorded score.
    """
    root = os.path.dirname(task.public_dir)
    h = hashlib.sha256()
    for rel in ("public/test.csv", "public/train.csv", "private/answers.csv"):
        with open(os.path.join(root, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def source_digest(source: str) -> str:
    """sha256 of a program's text."""
    return hashlib.sha256(source.encode()).hexdigest()


def recipe_digests(task: Task) -> list[str]:
    """`source_digest` of every recipe's program for `task`, in recipe-index order."""
    return [
        source_digest(recipes.compile_program(recipes.recipe_from_index(i), task))
        for i in range(recipes.NUM_RECIPES)
    ]


def programs_digest(digests: Sequence[str]) -> str:
    """One digest for all of a task's recipe programs: changes when any program does."""
    return hashlib.sha256("".join(digests).encode()).hexdigest()


@dataclasses.dataclass
class RecipeTable:
    """Recorded outcomes of every (task, recipe, replicate).

    Attributes:
        task_ids: T task ids.
        status: int8 codes into `STATUS_NAMES`, of shape [T, R, K] (K replicates).
        score: raw metric values, NaN unless status is "ok", of shape [T, R, K].
        seconds: execution seconds to charge (start-up excluded): CPU seconds of a
            single-threaded run, which equal its wall time on an unshared core and,
            unlike wall time, are not inflated by a busy build machine; of shape
            [T, R, K].
        boards: task id -> board name -> scores of shape [N].
        wall_seconds: measured wall seconds of the same runs, of shape [T, R, K].
        meta: JSON-able: "startup_seconds" (CPU, median), "replicates" (K), and per
            task in meta["tasks"][id] "metric", "direction", "percentile_rule",
            "data_digest", "programs_digest", "messages" ("recipe/replicate" ->
            failure message).

    Example:
        >>> table = RecipeTable.load()                      # doctest: +SKIP
        >>> table.reward("iris").shape, table.num_replicates  # doctest: +SKIP
        ((288,), 3)
    """

    task_ids: tuple[str, ...]
    status: np.ndarray
    score: np.ndarray
    seconds: np.ndarray
    boards: dict[str, dict[str, np.ndarray]]
    meta: dict
    wall_seconds: np.ndarray | None = None

    def __post_init__(self):
        if self.status.ndim != 3 or self.status.shape[2] < 1:
            raise TableError(f"status has shape {self.status.shape}, need [T, R, K >= 1]")
        shape = (len(self.task_ids), recipes.NUM_RECIPES, self.status.shape[2])
        for name in ("status", "score", "seconds"):
            if getattr(self, name).shape != shape:
                raise TableError(f"{name} has shape {getattr(self, name).shape}, need {shape}")
        self._pct: dict[str, np.ndarray] = {}

    @property
    def num_replicates(self) -> int:
        """K: recorded executions per (task, recipe), each with its own replicate index."""
        return int(self.status.shape[2])

    def check_replicate(self, replicate: int) -> int:
        """`replicate` as an int; ValueError unless it is in [0, num_replicates)."""
        if isinstance(replicate, bool) or int(replicate) != replicate:
            raise ValueError(f"replicate must be an integer, got {replicate!r}")
        if not 0 <= int(replicate) < self.num_replicates:
            raise ValueError(
                f"replicate must be in [0, {self.num_replicates}): the table records "
                f"{self.num_replicates} executions per (task, recipe), got {replicate}"
            )
        return int(replicate)

    def row(self, task_id: str) -> int:
        """The row of `task_id`; TableError naming the task when absent."""
        if task_id not in self.task_ids:
            raise TableError(
                f"task {task_id!r} is not in the recipe table ({len(self.task_ids)} tasks: "
                f"{', '.join(self.task_ids)}); add the suite's missing tasks with "
                "`python -m wmrl_jax.envs.table_build build --suite DIR --out TABLE --update`"
            )
        return self.task_ids.index(task_id)

    def status_names(self, task_id: str, replicate: int = 0) -> list[str]:
        """The status name of each recipe in one replicate, length R."""
        k = self.check_replicate(replicate)
        return [STATUS_NAMES[c] for c in self.status[self.row(task_id), :, k]]

    def digest(self) -> str:
        """sha256 over everything an answer depends on: tasks, statuses, scores, the
        seconds charged, boards and meta (wall seconds, which are not charged, excluded)."""
        h = hashlib.sha256()
        h.update(json.dumps([self.task_ids, self.meta], sort_keys=True).encode())
        h.update(repr(self.status.shape).encode())
        for a in (self.status, self.score, self.seconds):
            h.update(np.ascontiguousarray(a).tobytes())
        for task_id in sorted(self.boards):
            for name in sorted(self.boards[task_id]):
                h.update(f"{task_id}/{name}".encode() + b"\0")
                h.update(np.ascontiguousarray(self.boards[task_id][name], np.float64).tobytes())
        return h.hexdigest()

    def replicate_percentile(self, task_id: str) -> np.ndarray:
        """Board percentile of each execution (NaN unless valid), of shape [R, K]."""
        if task_id not in self._pct:
            t, info = self.row(task_id), self.meta["tasks"][task_id]
            pct = np.full(self.status.shape[1:], np.nan)
            for r, k in zip(*np.nonzero(self.status[t] == 0), strict=True):
                pct[r, k] = np.mean([
                    grading.percentile(
                        self.score[t, r, k], b, direction=info["direction"],
                        rule=info["percentile_rule"],
                    )
                    for b in self.boards[task_id].values()
                ])  # fmt: skip
            self._pct[task_id] = pct
        return self._pct[task_id]

    def percentile(self, task_id: str) -> np.ndarray:
        """Mean board percentile of each recipe over its valid replicates (NaN when none
        is valid), of shape [R]."""
        pct = self.replicate_percentile(task_id)
        valid = np.isfinite(pct)
        total = np.where(valid, pct, 0.0).sum(axis=1)
        return np.where(valid.any(axis=1), total / np.maximum(valid.sum(axis=1), 1), np.nan)

    def replicate_reward(
        self, task_id: str, floors: grading.RewardFloors = grading.DEFAULT_FLOORS
    ) -> np.ndarray:
        """The training reward of each execution (percentile or its status's floor),
        of shape [R, K]."""
        table = floors._asdict() if isinstance(floors, grading.RewardFloors) else dict(floors)
        out = self.replicate_percentile(task_id).copy()
        status = self.status[self.row(task_id)]
        for code, name in enumerate(STATUS_NAMES):
            if name != "ok":
                out[status == code] = table[name]
        return out

    def reward(
        self, task_id: str, floors: grading.RewardFloors = grading.DEFAULT_FLOORS
    ) -> np.ndarray:
        """The true reward of each recipe: its replicate mean, of shape [R]."""
        return self.replicate_reward(task_id, floors).mean(axis=1)

    def reward_var(
        self, task_id: str, floors: grading.RewardFloors = grading.DEFAULT_FLOORS
    ) -> np.ndarray:
        """The replicate variance of each recipe's reward (unbiased, ddof=1), of shape [R].

        The noise of one real execution around the recipe's true reward; NaN for a
        table with one replicate.
        """
        if self.num_replicates < 2:
            return np.full(recipes.NUM_RECIPES, np.nan)
        return self.replicate_reward(task_id, floors).var(axis=1, ddof=1)

    def check_task(self, task: Task) -> None:
        """Raises TableError unless `task`'s data is the data the table was built on."""
        expected = self.meta["tasks"][self.task_ids[self.row(task.id)]]["data_digest"]
        found = data_digest(task)
        if found != expected:
            raise TableError(
                f"task {task.id!r}: data digest {found[:12]} differs from the table's "
                f"{expected[:12]}; the suite was built with another seed or generator "
                "(rebuild the table)"
            )

    def check_suite(self, suite_dir: str, only: Sequence[str] | None = None) -> None:
        """`check_task` for every table task (of `only`, default all) present in `suite_dir`
        (at least one must be)."""
        ids = self.task_ids if only is None else [t for t in self.task_ids if t in set(only)]
        present = [t for t in ids if os.path.isdir(os.path.join(suite_dir, t))]
        if not present:
            raise TableError(f"no task of the recipe table is in the suite {suite_dir}")
        for task_id in present:
            self.check_task(load_task(os.path.join(suite_dir, task_id)))

    def save(self, path: str) -> None:
        """Writes a compressed .npz (arrays + the JSON meta and board sizes)."""
        meta = json.loads(json.dumps(self.meta))
        flat = []
        for task_id in self.task_ids:
            boards = self.boards[task_id]
            meta["tasks"][task_id]["boards"] = {name: int(b.size) for name, b in boards.items()}
            flat += [np.asarray(b, np.float64) for b in boards.values()]
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            np.savez_compressed(
                f,
                task_ids=np.asarray(self.task_ids),
                status=self.status.astype(np.int8),
                score=self.score.astype(np.float64),
                seconds=self.seconds.astype(np.float32),
                wall_seconds=(
                    self.seconds if self.wall_seconds is None else self.wall_seconds
                ).astype(np.float32),
                board_scores=np.concatenate(flat) if flat else np.zeros(0),
                meta_json=np.asarray(json.dumps(meta, sort_keys=True)),
            )

    @classmethod
    def load(cls, path: str | None = None, *, suite: str | None = None) -> RecipeTable:
        """Reads a table (default: the committed one); with `suite`, refuses it unless
        every task's data digest matches."""
        path = path or DEFAULT_TABLE
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta_json"]))
            if meta.get("format_version") != FORMAT_VERSION:
                raise TableError(
                    f"{path}: recipe table format {meta.get('format_version')}, this version "
                    f"reads format {FORMAT_VERSION} (replicated outcomes: "
                    f"{REPLICATES} executions per task and recipe); rebuild it with "
                    "`python -m wmrl_jax.envs.table_build build --suite DIR --out FILE`"
                )
            if meta.get("num_recipes") != recipes.NUM_RECIPES:
                raise TableError(
                    f"{path}: table has {meta.get('num_recipes')} recipes, the space has "
                    f"{recipes.NUM_RECIPES}; rebuild the table"
                )
            task_ids = tuple(str(t) for t in z["task_ids"])
            flat, boards, at = z["board_scores"], {}, 0
            for task_id in task_ids:
                boards[task_id] = {}
                for name, size in meta["tasks"][task_id]["boards"].items():
                    boards[task_id][name] = flat[at : at + size].copy()
                    at += size
            table = cls(
                task_ids, z["status"].astype(np.int8), z["score"].astype(np.float64),
                z["seconds"].astype(np.float64), boards, meta, z["wall_seconds"].astype(np.float64),
            )  # fmt: skip
        if suite is not None:
            table.check_suite(suite)
        return table

    def with_boards(self, suite_dir: str, only: Sequence[str] | None = None) -> RecipeTable:
        """A copy whose boards are re-read from `suite_dir` (same data, new competitors).

        Tasks absent from `suite_dir`, or not in `only` (default: every task), keep
        their boards and are not checked; at least one task must be present.
        """
        self.check_suite(suite_dir, only)
        boards = dict(self.boards)
        for task_id in self.task_ids if only is None else only:
            if os.path.isdir(os.path.join(suite_dir, task_id)):
                boards[task_id] = grading.load_leaderboards(
                    load_task(os.path.join(suite_dir, task_id))
                )
        return dataclasses.replace(self, boards=boards, meta=json.loads(json.dumps(self.meta)))


if __name__ == "__main__":
    # The commands moved with the code that builds the table; say where.
    sys.exit(
        "the recipe table's commands moved to wmrl_jax.envs.table_build: "
        "python -m wmrl_jax.envs.table_build build|refresh-boards|summary ..."
    )
