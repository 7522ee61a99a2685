"""Building the recipe table: execute and grade every (task, recipe, replicate).

`build` executes each recipe program of a suite `replicates` times, each run with
its replicate index in `recipes.REPLICATE_ENV`, and returns a `tabular.RecipeTable`;
`stale_tasks` and `merge` re-execute only the tasks whose data or programs
changed; `refresh-boards` re-reads the leaderboards without executing anything.

    python -m wmrl_jax.envs.table_build build --suite DIR --out FILE [--workers 2]
        [--only ids] [--replicates 3] [--update]
    python -m wmrl_jax.envs.table_build refresh-boards --suite DIR --table FILE
    python -m wmrl_jax.envs.table_build summary --table FILE

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
import io
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

from wmrl_jax.envs import families, grading, recipes
from wmrl_jax.envs.tabular import (
    FORMAT_VERSION,
    REPLICATES,
    STATUS_NAMES,
    RecipeTable,
    TableError,
    data_digest,
    programs_digest,
    recipe_digests,
)
from wmrl_jax.envs.task import Task, load_task, load_tasks

_IMPORTS = (
    "numpy", "sklearn.dummy", "sklearn.ensemble", "sklearn.linear_model", "sklearn.naive_bayes",
    "sklearn.metrics", "sklearn.neighbors", "sklearn.neural_network", "sklearn.pipeline",
    "sklearn.preprocessing", "sklearn.tree",
)  # fmt: skip
_SINGLE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


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


def run_in_process(
    task: Task, source: str, *, replicate: int = 0
) -> tuple[str, float, float, float, str]:
    """Executes `source` in this process for `task` and grades it (trusted programs only).

    The program sees its inputs, its output dir and `replicate` in the
    environment (`WMRL_INPUT_DIR`, `WMRL_OUTPUT_DIR`, `recipes.REPLICATE_ENV`),
    as a sandboxed run does.

    Returns:
        (status, score, cpu_seconds, wall_seconds, message): a `STATUS_NAMES`
        entry, the raw score (NaN unless "ok"), the execution's CPU and wall
        seconds, and a failure message.
    """
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="wmrl-recipe-") as work:
        out = os.path.join(work, "output")
        os.mkdir(out)
        os.environ.update(
            {
                "WMRL_INPUT_DIR": task.public_dir,
                "WMRL_OUTPUT_DIR": out,
                recipes.REPLICATE_ENV: str(int(replicate)),
            }
        )
        os.chdir(work)
        message = ""
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            # What the program prints (its validation score) is not kept.
            with contextlib.redirect_stdout(io.StringIO()):
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
        budget = task.limits.get("cpu_seconds", float("inf"))
        if status == "ok" and cpu > budget:  # killed at the budget: that is what it cost
            status, message, cpu = "timeout", f"used {cpu:.2f} CPU s of {budget}", budget
        score = float("nan")
        if status == "ok":
            result = grading.grade(task, os.path.join(out, task.submission.file))
            if result.valid:
                score = result.score
            else:
                status, message = "invalid", f"{result.error_kind}: {result.message}"
    return status, score, cpu, seconds, message[:300]


def _run_pair(task_dir: str, index: int, replicate: int) -> tuple[str, float, float, float, str]:
    task = load_task(task_dir)
    source = recipes.compile_program(recipes.recipe_from_index(index), task)
    return run_in_process(task, source, replicate=replicate)


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
    return load_tasks([os.path.join(suite_dir, n) for n in names])


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
    replicates: int = REPLICATES,
    log=sys.stderr,
) -> RecipeTable:
    """Executes and grades every (task, recipe, replicate) of the suite; returns the table.

    Args:
        suite_dir: a suite directory (one task directory per task).
        workers: worker processes (each single-threaded).
        only: task ids to include (default: all tasks of the suite).
        indices: recipe indices to execute (default: all); others are marked "error"
            with message "not executed" (for quick estimates only).
        replicates: executions per (task, recipe), replicate indices 0..K-1.
    """
    if replicates < 1:
        raise ValueError(f"replicates must be >= 1, got {replicates}")
    tasks = _suite_tasks(suite_dir, only)
    indices = range(recipes.NUM_RECIPES) if indices is None else list(indices)
    shape = (len(tasks), recipes.NUM_RECIPES, replicates)
    status = np.full(shape, STATUS_NAMES.index("error"), np.int8)
    score, seconds, wall = np.full(shape, np.nan), np.zeros(shape), np.zeros(shape)
    messages = [
        {(r, k): "not executed" for r in range(recipes.NUM_RECIPES) for k in range(replicates)}
        for _ in tasks
    ]
    start = time.perf_counter()
    startup, startup_wall = measure_startup()
    env = {**os.environ}
    os.environ.update(_SINGLE_THREAD)  # inherited by the spawned workers
    try:
        with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
        ) as pool:
            runs = sorted(
                ((i, r, k) for i in range(len(tasks)) for r in indices for k in range(replicates)),
                key=lambda p: -_cost_guess(tasks[p[0]], p[1]),  # longest first
            )
            futures = {
                pool.submit(_run_pair, os.path.dirname(tasks[i].public_dir), r, k): (i, r, k)
                for i, r, k in runs
            }
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                i, r, k = futures[future]
                name, score[i, r, k], seconds[i, r, k], wall[i, r, k], message = future.result()
                status[i, r, k] = STATUS_NAMES.index(name)
                messages[i].pop((r, k))
                if message:
                    messages[i][r, k] = message
                if log is not None and done % 200 == 0:
                    print(f"{done}/{len(futures)} in {time.perf_counter() - start:.0f} s", file=log)
    finally:
        os.environ.clear()
        os.environ.update(env)
    import sklearn

    meta = {
        "format_version": FORMAT_VERSION,
        "generation": families.GENERATION,
        "num_recipes": recipes.NUM_RECIPES,
        "slot_sizes": list(recipes.SLOT_SIZES),
        "status_names": list(STATUS_NAMES),
        "replicates": replicates,
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
            "messages": {f"{r}/{k}": m for (r, k), m in sorted(messages[i].items())},
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


def update(
    base: RecipeTable, suite_dir: str, *, workers: int = 2, only: Sequence[str] | None = None,
    log=sys.stderr,
) -> RecipeTable:  # fmt: skip
    """`base` with the tasks in `only` (default: the stale ones, `stale_tasks`) re-executed
    and every other task's boards re-read from `suite_dir`.

    A stale task's data differs from the table's, so only the tasks kept are checked
    against the suite; with every task stale, nothing of `base` but its replicate
    count and start-up overhead remains.
    """
    only = list(only or stale_tasks(base, suite_dir))
    print(f"re-executing {only or 'nothing'}", file=log)
    kept = [t for t in base.task_ids if t not in only]
    table = base.with_boards(suite_dir, only=kept) if kept else base
    if not only:
        return table
    fresh = build(suite_dir, workers=workers, only=only, replicates=base.num_replicates, log=log)
    return merge(table, fresh)


def merge(base: RecipeTable, update: RecipeTable) -> RecipeTable:
    """`base` with the tasks of `update` replaced or added (start-up overhead from `base`)."""
    if update.num_replicates != base.num_replicates:
        raise TableError(
            f"cannot merge a table of {update.num_replicates} replicates into one of "
            f"{base.num_replicates}"
        )
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
                else np.full(src.status.shape[1:], np.nan)
            )
        arrays[name] = np.stack(rows)
    meta = json.loads(json.dumps(base.meta))
    meta["tasks"].update(json.loads(json.dumps(update.meta["tasks"])))
    # Tasks kept from `base` have the same data digest under both generations.
    meta["generation"] = update.meta.get("generation", 1)
    boards = {**base.boards, **update.boards}
    return RecipeTable(
        tuple(ids), arrays["status"], arrays["score"], arrays["seconds"], boards, meta,
        arrays["wall_seconds"],
    )  # fmt: skip


def summary(table: RecipeTable) -> str:
    """Per task: best and median mean percentile over recipes, the replicates' noise
    (root mean replicate variance of the reward), failed share, mean seconds."""
    head = ("task", "best", "median", "rep_sd", "failed", "mean_s")
    lines = ["{:24s} {:>6s} {:>6s} {:>6s} {:>6s} {:>7s}".format(*head)]
    for task_id in table.task_ids:
        t, pct = table.row(task_id), table.percentile(task_id)
        noise = float(np.sqrt(np.mean(table.reward_var(task_id))))
        lines.append(
            f"{task_id:24s} {np.nanmax(pct):6.3f} {np.nanmedian(pct):6.3f} {noise:6.3f} "
            f"{np.mean(table.status[t] != 0):6.3f} {np.mean(table.seconds[t]):7.3f}"
        )
    failed = float(np.mean(table.status != 0))
    lines.append(
        f"all: {table.status.size} executions ({table.num_replicates} replicates), "
        f"failed {failed:.4f}, mean {table.seconds.mean():.3f} s, "
        f"total {table.seconds.sum():.0f} s, startup {table.meta['startup_seconds']:.2f} s, "
        f"build {table.meta['build']['wall_seconds']:.0f} s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="execute every (task, recipe, replicate)")
    p.add_argument("--suite", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated task ids")
    p.add_argument("--recipes", default=None, help="comma-separated recipe indices (estimates)")
    p.add_argument(
        "--replicates", type=int, default=REPLICATES, help="executions per (task, recipe)"
    )
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
            table = update(RecipeTable.load(args.out), args.suite, workers=args.workers, only=only)
        else:
            table = build(
                args.suite,
                workers=args.workers,
                only=only,
                indices=indices,
                replicates=args.replicates,
            )
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
