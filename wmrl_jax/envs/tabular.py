"""A tabular benchmark of the recipe space, in the spirit of NAS-Bench.

Every (task, recipe) program is executed once for real and graded; the table
keeps status, raw score and measured execution seconds per pair, the tasks'
leaderboards (so percentiles come from boards) and a digest of each task's
data (a table never answers for different data). `outcomes.ReplayExecutor`
answers from it and charges the recorded seconds, so many-seed studies cost
minutes while the compute they account for is the real cost.

    python -m wmrl_jax.envs.tabular build --suite DIR --out FILE [--workers 2] [--only ids]
    python -m wmrl_jax.envs.tabular refresh-boards --suite DIR --table FILE
    python -m wmrl_jax.envs.tabular summary --table FILE

The build executes programs inside worker processes (`exec` in a fresh temp
dir with `WMRL_INPUT_DIR` / `WMRL_OUTPUT_DIR` set), not in a sandbox: recipe
programs are our own generated code, so this is acceptable here and never for
free-form programs. Each worker is single-threaded and has the libraries
imported before it times anything; the interpreter and import start-up that a
sandboxed run pays on top is measured once (median of bare subprocess runs)
and stored as `meta["startup_seconds"]`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from wmrl_jax.envs import grading, recipes
from wmrl_jax.envs.task import Task, load_task

# Table codes: grading's sandbox statuses with "invalid" (ran, unusable submission).
STATUS_NAMES: tuple[str, ...] = ("ok", "invalid", "error", "killed", "timeout", "oom")
FORMAT_VERSION = 1
_IMPORTS = (
    "numpy", "sklearn.dummy", "sklearn.ensemble", "sklearn.linear_model", "sklearn.naive_bayes",
    "sklearn.neighbors", "sklearn.neural_network", "sklearn.pipeline", "sklearn.preprocessing",
    "sklearn.tree",
)  # fmt: skip
_SINGLE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


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
    """Recorded outcomes of every (task, recipe) pair.

    Attributes:
        task_ids: T task ids.
        status: int8 codes into `STATUS_NAMES`, of shape [T, R].
        score: raw metric values, NaN unless status is "ok", of shape [T, R].
        seconds: execution seconds to charge (start-up excluded): CPU seconds of a
            single-threaded run, which equal its wall time on an unshared core and,
            unlike wall time, are not inflated by a busy build machine; of shape [T, R].
        boards: task id -> board name -> scores of shape [N].
        wall_seconds: measured wall seconds of the same runs, of shape [T, R].
        meta: JSON-able: "startup_seconds" (CPU, median), and per task in meta["tasks"][id]
            "metric", "direction", "percentile_rule", "data_digest",
            "programs_digest", "messages" (recipe index -> failure message).
    """

    task_ids: tuple[str, ...]
    status: np.ndarray
    score: np.ndarray
    seconds: np.ndarray
    boards: dict[str, dict[str, np.ndarray]]
    meta: dict
    wall_seconds: np.ndarray | None = None

    def __post_init__(self):
        shape = (len(self.task_ids), recipes.NUM_RECIPES)
        for name in ("status", "score", "seconds"):
            if getattr(self, name).shape != shape:
                raise TableError(f"{name} has shape {getattr(self, name).shape}, need {shape}")
        self._pct: dict[str, np.ndarray] = {}

    def row(self, task_id: str) -> int:
        """The row of `task_id`; TableError naming the task when absent."""
        if task_id not in self.task_ids:
            raise TableError(f"task {task_id!r} is not in the recipe table {self.task_ids}")
        return self.task_ids.index(task_id)

    def status_names(self, task_id: str) -> list[str]:
        """The status name of each recipe, length R."""
        return [STATUS_NAMES[c] for c in self.status[self.row(task_id)]]

    def digest(self) -> str:
        """sha256 over everything an answer depends on: tasks, statuses, scores, the
        seconds charged, boards and meta (wall seconds, which are not charged, excluded)."""
        h = hashlib.sha256()
        h.update(json.dumps([self.task_ids, self.meta], sort_keys=True).encode())
        for a in (self.status, self.score, self.seconds):
            h.update(np.ascontiguousarray(a).tobytes())
        for task_id in sorted(self.boards):
            for name in sorted(self.boards[task_id]):
                h.update(f"{task_id}/{name}".encode() + b"\0")
                h.update(np.ascontiguousarray(self.boards[task_id][name], np.float64).tobytes())
        return h.hexdigest()

    def percentile(self, task_id: str) -> np.ndarray:
        """Board percentile of each recipe (NaN unless valid), of shape [R]."""
        if task_id not in self._pct:
            t, info = self.row(task_id), self.meta["tasks"][task_id]
            pct = np.full(recipes.NUM_RECIPES, np.nan)
            for r in np.flatnonzero(self.status[t] == 0):
                pct[r] = np.mean([
                    grading.percentile(
                        self.score[t, r], b, direction=info["direction"],
                        rule=info["percentile_rule"],
                    )
                    for b in self.boards[task_id].values()
                ])  # fmt: skip
            self._pct[task_id] = pct
        return self._pct[task_id]

    def reward(
        self, task_id: str, floors: grading.RewardFloors = grading.DEFAULT_FLOORS
    ) -> np.ndarray:
        """The training reward of each recipe (percentile or the status's floor), shape [R]."""
        table = floors._asdict() if isinstance(floors, grading.RewardFloors) else dict(floors)
        out = self.percentile(task_id).copy()
        for r, name in enumerate(self.status_names(task_id)):
            if name != "ok":
                out[r] = table[name]
        return out

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

    def check_suite(self, suite_dir: str) -> None:
        """`check_task` for every table task present in `suite_dir` (at least one must be)."""
        present = [t for t in self.task_ids if os.path.isdir(os.path.join(suite_dir, t))]
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
                raise TableError(f"{path}: table format {meta.get('format_version')}")
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

    def with_boards(self, suite_dir: str) -> RecipeTable:
        """A copy whose boards are re-read from `suite_dir` (same data, new competitors).

        Tasks absent from `suite_dir` keep their boards; at least one must be present.
        """
        self.check_suite(suite_dir)
        boards = dict(self.boards)
        for task_id in self.task_ids:
            if os.path.isdir(os.path.join(suite_dir, task_id)):
                boards[task_id] = grading.load_leaderboards(
                    load_task(os.path.join(suite_dir, task_id))
                )
        return dataclasses.replace(self, boards=boards, meta=json.loads(json.dumps(self.meta)))


def measure_startup(python: str = sys.executable, *, repeats: int = 5) -> tuple[float, float]:
    """Start-up of a bare interpreter importing numpy and the recipes' scikit-learn modules.

    Returns:
        (cpu_seconds, wall_seconds): medians over `repeats` runs; CPU seconds are
        user + system time of the child, which a shared machine does not inflate.
    """
    code = "import " + ", ".join(_IMPORTS)
    cpu, wall = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([python, "-c", code], check=True, env={**os.environ, **_SINGLE_THREAD})
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return float(statistics.median(cpu)), float(statistics.median(wall))


_worker_limits = None


def _init_worker() -> None:
    global _worker_limits
    import importlib

    from threadpoolctl import threadpool_limits

    for name in _IMPORTS:  # imports are start-up cost, measured separately
        importlib.import_module(name)
    _worker_limits = threadpool_limits(limits=1)


def run_in_process(task: Task, source: str) -> tuple[str, float, float, float, str]:
    """Executes `source` in this process for `task` and grades it (trusted programs only).

    Returns:
        (status, score, cpu_seconds, wall_seconds, message): a `STATUS_NAMES`
        entry, the raw score (NaN unless "ok"), the execution's CPU and wall
        seconds, and a failure message.
    """
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="wmrl-recipe-") as work:
        out = os.path.join(work, "output")
        os.mkdir(out)
        os.environ.update(WMRL_INPUT_DIR=task.public_dir, WMRL_OUTPUT_DIR=out)
        os.chdir(work)
        message = ""
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            exec(compile(source, "main.py", "exec"), {"__name__": "__main__"})
        except MemoryError as e:
            status, message = "oom", repr(e)
        except Exception as e:  # a failing program is a result
            status, message = "error", f"{type(e).__name__}: {e}"
        else:
            status = "ok"
        finally:
            seconds = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        if status == "ok" and seconds > task.limits.get("wall_seconds", float("inf")):
            status, message = "timeout", f"ran {seconds:.1f} s"
        score = float("nan")
        if status == "ok":
            result = grading.grade(task, os.path.join(out, task.submission.file))
            if result.valid:
                score = result.score
            else:
                status, message = "invalid", f"{result.error_kind}: {result.message}"
    return status, score, cpu, seconds, message[:300]


def _run_pair(task_dir: str, index: int) -> tuple[str, float, float, float, str]:
    task = load_task(task_dir)
    return run_in_process(task, recipes.compile_program(recipes.recipe_from_index(index), task))


def _suite_tasks(suite_dir: str, only: Sequence[str] | None) -> list[Task]:
    names = sorted(
        n
        for n in os.listdir(suite_dir)
        if os.path.isfile(os.path.join(suite_dir, n, "manifest.json"))
    )
    if only is not None:
        missing = set(only) - set(names)
        if missing:
            raise ValueError(f"tasks {sorted(missing)} are not in the suite {suite_dir}")
        names = [n for n in names if n in set(only)]
    return [load_task(os.path.join(suite_dir, n)) for n in names]


def _cost_guess(task: Task, index: int) -> float:
    """A rough relative cost of a pair, to schedule the longest first."""
    r = recipes.recipe_from_index(index)
    size = os.path.getsize(os.path.join(task.public_dir, "train.csv"))
    width = len(task.submission.target_columns)
    family = recipes.MODELS[r.model]
    weight = {"boosting": 10.0 * width, "mlp": 5.0, "forest": 3.0, "linear": 2.0}.get(family, 1.0)
    return size * weight * (3.0 if recipes.PREPROCESS[r.preprocess] == "poly2" else 1.0) * (1 + r.b)


def build(
    suite_dir: str,
    *,
    workers: int = 2,
    only: Sequence[str] | None = None,
    indices: Sequence[int] | None = None,
    log=sys.stderr,
) -> RecipeTable:
    """Executes and grades every (task, recipe) pair of the suite; returns the table.

    Args:
        suite_dir: a suite directory (one task directory per task).
        workers: worker processes (each single-threaded).
        only: task ids to include (default: all tasks of the suite).
        indices: recipe indices to execute (default: all); others are marked "error"
            with message "not executed" (for quick estimates only).
    """
    tasks = _suite_tasks(suite_dir, only)
    indices = range(recipes.NUM_RECIPES) if indices is None else list(indices)
    shape = (len(tasks), recipes.NUM_RECIPES)
    status = np.full(shape, STATUS_NAMES.index("error"), np.int8)
    score, seconds, wall = np.full(shape, np.nan), np.zeros(shape), np.zeros(shape)
    messages = [{r: "not executed" for r in range(recipes.NUM_RECIPES)} for _ in tasks]
    start = time.perf_counter()
    startup, startup_wall = measure_startup()
    env = {**os.environ}
    os.environ.update(_SINGLE_THREAD)  # inherited by the spawned workers
    try:
        with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
        ) as pool:
            pairs = sorted(
                ((i, r) for i in range(len(tasks)) for r in indices),
                key=lambda p: -_cost_guess(tasks[p[0]], p[1]),  # longest first
            )
            futures = {
                pool.submit(_run_pair, os.path.dirname(tasks[i].public_dir), r): (i, r)
                for i, r in pairs
            }
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                i, r = futures[future]
                name, score[i, r], seconds[i, r], wall[i, r], message = future.result()
                status[i, r] = STATUS_NAMES.index(name)
                messages[i].pop(r)
                if message:
                    messages[i][r] = message
                if log is not None and done % 200 == 0:
                    print(f"{done}/{len(futures)} in {time.perf_counter() - start:.0f} s", file=log)
    finally:
        os.environ.clear()
        os.environ.update(env)
    import sklearn

    meta = {
        "format_version": FORMAT_VERSION,
        "num_recipes": recipes.NUM_RECIPES,
        "slot_sizes": list(recipes.SLOT_SIZES),
        "status_names": list(STATUS_NAMES),
        "startup_seconds": startup,
        "startup_wall_seconds": startup_wall,
        "build": {
            "workers": workers,
            "wall_seconds": time.perf_counter() - start,
            "python": sys.version.split()[0],
            "numpy": np.__version__,
            "sklearn": sklearn.__version__,
        },
        "tasks": {},
    }
    for i, task in enumerate(tasks):
        meta["tasks"][task.id] = {
            "metric": task.metric.name,
            "direction": task.metric.direction,
            "percentile_rule": task.percentile_rule,
            "data_digest": data_digest(task),
            "programs_digest": programs_digest(recipe_digests(task)),
            "messages": {str(r): m for r, m in sorted(messages[i].items())},
        }
    boards = {t.id: grading.load_leaderboards(t) for t in tasks}
    return RecipeTable(tuple(t.id for t in tasks), status, score, seconds, boards, meta, wall)


def stale_tasks(table: RecipeTable, suite_dir: str) -> list[str]:
    """Suite tasks whose data or compiled programs differ from the table's (or are absent)."""
    out = []
    for task in _suite_tasks(suite_dir, None):
        info = table.meta["tasks"].get(task.id)
        if (
            info is None
            or info["data_digest"] != data_digest(task)
            or info["programs_digest"] != programs_digest(recipe_digests(task))
        ):
            out.append(task.id)
    return out


def merge(base: RecipeTable, update: RecipeTable) -> RecipeTable:
    """`base` with the tasks of `update` replaced or added (start-up overhead from `base`)."""
    ids = list(base.task_ids) + [t for t in update.task_ids if t not in base.task_ids]
    arrays = {}
    for name in ("status", "score", "seconds", "wall_seconds"):
        rows = []
        for task_id in ids:
            src = update if task_id in update.task_ids else base
            values = getattr(src, name)
            rows.append(
                values[src.row(task_id)]
                if values is not None
                else np.full(recipes.NUM_RECIPES, np.nan)
            )
        arrays[name] = np.stack(rows)
    meta = json.loads(json.dumps(base.meta))
    meta["tasks"].update(json.loads(json.dumps(update.meta["tasks"])))
    boards = {**base.boards, **update.boards}
    return RecipeTable(
        tuple(ids), arrays["status"], arrays["score"], arrays["seconds"], boards, meta,
        arrays["wall_seconds"],
    )  # fmt: skip


def summary(table: RecipeTable) -> str:
    """Per task: best and median percentile over recipes, invalid share, mean seconds."""
    lines = [f"{'task':24s} {'best':>6s} {'median':>6s} {'failed':>6s} {'mean_s':>7s}"]
    for task_id in table.task_ids:
        t, pct = table.row(task_id), table.percentile(task_id)
        lines.append(
            f"{task_id:24s} {np.nanmax(pct):6.3f} {np.nanmedian(pct):6.3f} "
            f"{np.mean(table.status[t] != 0):6.3f} {np.mean(table.seconds[t]):7.3f}"
        )
    failed = float(np.mean(table.status != 0))
    lines.append(
        f"all: {table.status.size} pairs, failed {failed:.4f}, mean {table.seconds.mean():.3f} s, "
        f"total {table.seconds.sum():.0f} s, startup {table.meta['startup_seconds']:.2f} s, "
        f"build {table.meta['build']['wall_seconds']:.0f} s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="execute every (task, recipe) pair")
    p.add_argument("--suite", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated task ids")
    p.add_argument("--recipes", default=None, help="comma-separated recipe indices (estimates)")
    p.add_argument(
        "--update",
        action="store_true",
        help="re-execute only the tasks whose data or programs changed, into the existing --out",
    )
    p = sub.add_parser("refresh-boards", help="re-read the boards without re-executing")
    p.add_argument("--suite", required=True)
    p.add_argument("--table", required=True)
    p = sub.add_parser("summary", help="print per-task statistics")
    p.add_argument("--table", required=True)
    args = parser.parse_args(argv)
    if args.command == "build":
        only = args.only.split(",") if args.only else None
        indices = [int(i) for i in args.recipes.split(",")] if args.recipes else None
        if args.update and os.path.exists(args.out):
            base = RecipeTable.load(args.out)
            only = only or stale_tasks(base, args.suite)
            print(f"re-executing {only or 'nothing'}", file=sys.stderr)
            table = base.with_boards(args.suite)
            if only:
                table = merge(table, build(args.suite, workers=args.workers, only=only))
        else:
            table = build(args.suite, workers=args.workers, only=only, indices=indices)
        table.save(args.out)
    elif args.command == "refresh-boards":
        table = RecipeTable.load(args.table).with_boards(args.suite)
        table.save(args.table)
    else:
        table = RecipeTable.load(args.table)
    print(summary(table))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
