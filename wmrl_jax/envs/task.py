"""The task contract: one task is one directory, whatever its origin.

Layout::

    <task>/manifest.json          # the contract below
    <task>/description.md         # shown to the agent
    <task>/data_report.md         # optional; computed from the data, never invented
    <task>/public/                # the ONLY thing a sandbox may mount (read-only)
    <task>/private/answers.csv    # id column + the answer column; grader side only
    <task>/private/leaderboards/<name>.csv   # a `score` column (+ optional `entry`)

`manifest.json`::

    {
      "format_version": 1,
      "id": "iris", "source": "builtin", "split": "train",   # or held-out / pretrain
      "metric": {"name": "log_loss", "direction": "lower"},  # or {"grader": "pkg.mod:fn",
                                                              #     "direction": ...}
                                                              # (an allowed grader, below)
      "submission": {"file": "submission.csv", "id_column": "id",
                     "target_columns": ["p_0", "p_1", "p_2"], "answer_column": "target"},
      "limits": {"wall_seconds": 600, "memory_mb": 4096, "cpus": 1},
      "percentile_rule": "mid_rank",                          # mle_dojo / beat_ratio
      "leaderboards": ["private"]
    }

`submission.file` is a relative path inside the program's output directory
(`name.csv` or `sub/name.csv`): not empty, absolute, a directory (`.`, `out/`),
nor through `..`. A `metric.grader` is code the grader imports and runs, so
only allowed modules may name one: a grader "pkg.mod:fn" loads when `pkg.mod`
is, or lies inside, a module of `GRADER_MODULES` or of the comma-separated
environment variable `GRADER_MODULES_ENV` (`WMRL_GRADER_MODULES`), which the
person who runs the trainer sets; a manifest cannot allow itself.

The boundary: sandbox-facing code gets `Task.public_dir`, `Task.description`
and `Task.data_report` only. `Task` exposes no private path; the grader finds
answers and leaderboards through `grading`, which runs outside the sandbox.
`load_task` checks the boundary on disk: `public/` (which may itself be a
link, as in the MLE-Dojo / MLE-bench views) and the agent-facing files must
not be, contain or lie inside grader-side files (`private/`, what its entries
link to, and those files' directories); inside `public/` a link must resolve
to a regular file inside it (`sandbox.files.input_files`); and no public file
may be a hard link of a private one.

Example:
    >>> task = load_task("suite/iris")          # doctest: +SKIP
    >>> mount = task.public_dir                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wmrl_jax.envs import metrics
from wmrl_jax.sandbox.files import InputError, input_files

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "held-out", "pretrain")
PERCENTILE_RULES = ("mid_rank", "mle_dojo", "beat_ratio")
# Modules whose functions a manifest may name as its grader; the environment adds more.
GRADER_MODULES = ("wmrl_jax.envs.metrics",)
GRADER_MODULES_ENV = "WMRL_GRADER_MODULES"
_GRADER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z]\w*")


class ManifestError(ValueError):
    """A task manifest is missing, malformed or inconsistent; names the field."""


@dataclasses.dataclass(frozen=True)
class SubmissionSpec:
    """What a valid submission file looks like.

    Attributes:
        file: file name the program must write (relative to its output dir).
        id_column: the row id column, matched against the answers' ids.
        target_columns: prediction columns, in the order the metric reads them.
        answer_column: the column of `private/answers.csv` holding the truth.
    """

    file: str
    id_column: str
    target_columns: tuple[str, ...]
    answer_column: str


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """A named built-in metric, or a grader entry point "module:function"."""

    name: str | None
    grader: str | None
    direction: str


@dataclasses.dataclass(frozen=True)
class Task:
    """One task, loaded from its directory by `load_task`.

    Attributes:
        id, source, split: identity; `split` is one of `SPLITS`.
        metric: the metric spec with its explicit direction.
        submission: the submission spec.
        limits: resource limits for the sandbox (wall_seconds, memory_mb, cpus, ...).
        percentile_rule: one of `PERCENTILE_RULES`.
        leaderboards: names of the boards (grader side).
    """

    id: str
    source: str
    split: str
    metric: MetricSpec
    submission: SubmissionSpec
    limits: Mapping[str, float]
    percentile_rule: str
    leaderboards: tuple[str, ...]
    _root: str = dataclasses.field(repr=False)

    @property
    def public_dir(self) -> str:
        """The directory to mount read-only into the sandbox; nothing else may be."""
        return os.path.join(self._root, "public")

    @property
    def description(self) -> str:
        """The agent-facing description (`description.md`)."""
        with open(os.path.join(self._root, "description.md"), encoding="utf-8") as f:
            return f.read()

    @property
    def data_report(self) -> str | None:
        """The computed data report (`data_report.md`), or None when absent."""
        path = os.path.join(self._root, "data_report.md")
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            return f.read()


def _require(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str):
    field = f"{where}.{key}" if where else key
    if key not in mapping:
        raise ManifestError(f"manifest field {field!r} is missing")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ManifestError(f"manifest field {field!r} has type {type(value).__name__}")
    return value


def _positive_finite(value) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:  # an integer beyond any float
        return False


def _parse_metric(raw: Mapping[str, Any]) -> MetricSpec:
    direction = _require(raw, "direction", str, "metric")
    if direction not in metrics.DIRECTIONS:
        raise ManifestError(
            f"manifest field 'metric.direction' is {direction!r}, not one of {metrics.DIRECTIONS}"
        )
    name, grader = raw.get("name"), raw.get("grader")
    if (name is None) == (grader is None):
        raise ManifestError("manifest field 'metric' needs exactly one of 'name' or 'grader'")
    if name is not None:
        if not isinstance(name, str) or name not in metrics.METRICS:
            raise ManifestError(
                f"manifest field 'metric.name' is {name!r}, not one of {sorted(metrics.METRICS)}"
            )
        if metrics.METRICS[name].direction != direction:
            raise ManifestError(
                f"manifest field 'metric.direction' is {direction!r} but {name} is "
                f"{metrics.METRICS[name].direction}-is-better"
            )
    else:
        check_grader(grader)
    return MetricSpec(name=name, grader=grader, direction=direction)


def grader_modules() -> tuple[str, ...]:
    """The modules graders may come from: `GRADER_MODULES` and those in `GRADER_MODULES_ENV`."""
    extra = os.environ.get(GRADER_MODULES_ENV, "")
    return GRADER_MODULES + tuple(m.strip() for m in extra.split(",") if m.strip())


def check_grader(grader: Any) -> str:
    """`grader` if it is "module:function" in an allowed module (`grader_modules`);
    else `ManifestError` naming the field and what is allowed."""
    if not isinstance(grader, str) or not _GRADER.fullmatch(grader):
        raise ManifestError(
            f"manifest field 'metric.grader' is {grader!r}, not 'module:function' "
            "(dotted identifiers, a public function)"
        )
    module = grader.partition(":")[0]
    allowed = grader_modules()
    if not any(module == m or module.startswith(m + ".") for m in allowed):
        raise ManifestError(
            f"manifest field 'metric.grader' is {grader!r}, whose module is not an allowed "
            f"grader module {list(allowed)}; add it to {GRADER_MODULES_ENV} to allow it"
        )
    return grader


def check_submission_file(file: Any) -> str:
    """`file` if it names a file inside the output directory; else `ManifestError`."""
    ok = (
        isinstance(file, str)
        and file not in ("", ".")
        and not file.startswith("/")
        and "\\" not in file
        and "\0" not in file
        and posixpath.normpath(file) == file
        and ".." not in file.split("/")
    )
    if not ok:
        raise ManifestError(
            f"manifest field 'submission.file' is {file!r}; it must be a file path relative to "
            "the output directory, like 'submission.csv' (not empty, absolute, a directory or "
            "through '..')"
        )
    return file


def _parse_submission(raw: Mapping[str, Any]) -> SubmissionSpec:
    file = check_submission_file(_require(raw, "file", str, "submission"))
    targets = _require(raw, "target_columns", list, "submission")
    if not targets or not all(isinstance(c, str) for c in targets):
        raise ManifestError("manifest field 'submission.target_columns' must list column names")
    return SubmissionSpec(
        file=file,
        id_column=_require(raw, "id_column", str, "submission"),
        target_columns=tuple(targets),
        answer_column=_require(raw, "answer_column", str, "submission"),
    )


def parse_manifest(raw: Mapping[str, Any], root: str) -> Task:
    """Validates a manifest dict and returns the `Task` rooted at `root`."""
    if not isinstance(raw, Mapping):
        raise ManifestError("manifest must be a JSON object")
    version = _require(raw, "format_version", int, "")
    if version != FORMAT_VERSION:
        raise ManifestError(f"manifest field 'format_version' is {version}, need {FORMAT_VERSION}")
    split = _require(raw, "split", str, "")
    if split not in SPLITS:
        raise ManifestError(f"manifest field 'split' is {split!r}, not one of {SPLITS}")
    rule = raw.get("percentile_rule", "mid_rank")
    if rule not in PERCENTILE_RULES:
        raise ManifestError(
            f"manifest field 'percentile_rule' is {rule!r}, not one of {PERCENTILE_RULES}"
        )
    limits = _require(raw, "limits", dict, "")
    for key, value in limits.items():
        if not _positive_finite(value):
            raise ManifestError(
                f"manifest field 'limits.{key}' must be a positive finite number, got {value!r}"
            )
    boards = _require(raw, "leaderboards", list, "")
    if not boards or not all(isinstance(b, str) and b.isidentifier() for b in boards):
        raise ManifestError("manifest field 'leaderboards' must list board names")
    return Task(
        id=_require(raw, "id", str, ""),
        source=_require(raw, "source", str, ""),
        split=split,
        metric=_parse_metric(_require(raw, "metric", dict, "")),
        submission=_parse_submission(_require(raw, "submission", dict, "")),
        limits=dict(limits),
        percentile_rule=rule,
        leaderboards=tuple(boards),
        _root=os.path.abspath(root),
    )


def load_task(path: str | os.PathLike[str]) -> Task:
    """Loads and validates the task directory at `path`.

    Raises:
        ManifestError: the manifest is missing, not JSON, or a field is wrong
            (the message names the field), or `description.md` / `public/` is absent.
    """
    root = os.fspath(path)
    manifest = os.path.join(root, MANIFEST_NAME)
    if not os.path.isfile(manifest):
        raise ManifestError(f"no {MANIFEST_NAME} in task directory {root!r}")
    try:
        with open(manifest, encoding="utf-8") as f:
            raw = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, or a 5000-digit integer
        raise ManifestError(f"{MANIFEST_NAME} is not valid JSON: {e}") from e
    except RecursionError as e:
        raise ManifestError(f"{MANIFEST_NAME} is nested too deeply to be a manifest") from e
    task = parse_manifest(raw, root)
    if not os.path.isfile(os.path.join(root, "description.md")):
        raise ManifestError(f"task {task.id!r} has no description.md")
    if not os.path.isdir(task.public_dir):
        raise ManifestError(f"task {task.id!r} has no public/ directory")
    check_boundary(task)
    return task


def check_unique_ids(tasks: Iterable[Task]) -> None:
    """Raises `ManifestError` when two tasks share an id, naming the id and both paths.

    Everything downstream (execution caches, recipe tables, boards) keys on the
    id, so two tasks with one id would answer for each other.
    """
    seen: dict[str, str] = {}
    for t in tasks:
        if t.id in seen:
            raise ManifestError(
                f"duplicate task id {t.id!r}: {seen[t.id]!r} and {t._root!r} (task ids must be "
                "unique in a task set)"
            )
        seen[t.id] = t._root


def load_tasks(paths: Sequence[str | os.PathLike[str]]) -> list[Task]:
    """`load_task` of every path in `paths`, refusing duplicate ids (`check_unique_ids`)."""
    tasks = [load_task(p) for p in paths]
    check_unique_ids(tasks)
    return tasks


def overlaps(a: str, b: str) -> bool:
    """Whether real paths `a` and `b` are equal or one lies inside the other."""
    return (
        a == b or a.startswith(b.rstrip(os.sep) + os.sep) or b.startswith(a.rstrip(os.sep) + os.sep)
    )


def private_paths(task: Task, *, directories: bool = True) -> set[str]:
    """Grader-side real paths: `private/`, what its entries are or link to and, when
    `directories`, the directories of those files (an upstream `private/`)."""
    private = os.path.join(task._root, "private")
    found, stack = {os.path.realpath(private)}, [private]
    while stack:
        directory = stack.pop()
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            real = os.path.realpath(entry.path)
            found.add(real)
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif directories and os.path.isfile(real):
                found.add(os.path.dirname(real))
    return found


def check_boundary(task: Task) -> None:
    """Raises `ManifestError` unless `task`'s public side cannot reach its private side.

    See the module docstring for the rules.
    """
    secrets = private_paths(task)
    # A file is checked against the private files and dirs only: MLE-bench keeps
    # the description next to the (grader-side) leaderboard.
    agent_facing = {"public/": (task.public_dir, secrets)}
    files_only = private_paths(task, directories=False)
    for name in ("description.md", "data_report.md"):
        if os.path.lexists(path := os.path.join(task._root, name)):
            agent_facing[name] = (path, files_only)
    for name, (path, forbidden) in agent_facing.items():
        real = os.path.realpath(path)
        for secret in forbidden:
            if overlaps(real, secret):
                raise ManifestError(
                    f"task {task.id!r}: {name} ({real!r}) exposes grader-side {secret!r}"
                )
    try:
        entries = input_files(task.public_dir)
    except InputError as e:
        raise ManifestError(f"task {task.id!r}: public/: {e}") from e
    except OSError as e:
        raise ManifestError(f"task {task.id!r}: cannot read public/: {e}") from e
    linked = {}
    for _, path in entries:
        info = os.stat(path)
        if info.st_nlink > 1:
            linked[(info.st_dev, info.st_ino)] = path
    if linked:  # a hard link carries no path: compare identities with the private files
        for secret in secrets:
            if os.path.isfile(secret):
                info = os.stat(secret)
                if (info.st_dev, info.st_ino) in linked:
                    raise ManifestError(
                        f"task {task.id!r}: public file {linked[(info.st_dev, info.st_ino)]!r} "
                        f"is a hard link of grader-side {secret!r}"
                    )
