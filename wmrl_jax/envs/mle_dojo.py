"""MLE-Dojo prepared competitions mapped onto the task contract, without copying data.

Upstream layout of one prepared competition (what MLE-Dojo's preparation writes)::

    <name>/data/public/...                       # train / test files, sample_submission.csv,
    <name>/data/public/description.txt           #   and the description shown to the agent
    <name>/data/private/test_answer.csv          # first column the id, then the answer columns
    <name>/data/private/public_leaderboard.csv   # `rank,score`; either board may be absent,
    <name>/data/private/private_leaderboard.csv  #   but not both

`make_task` writes a small *view* directory in the contract's layout whose
entries are symbolic links into the upstream tree (no data is copied)::

    <view>/manifest.json, <view>/description.md -> public/description.txt
    <view>/public -> <name>/data/public
    <view>/private/answers.csv -> test_answer.csv
    <view>/private/leaderboards/{public,private}.csv -> the upstream boards

so `load_task` and `grading.grade` work unchanged. MLE-Dojo's percentile rule
(`percentile_rule="mle_dojo"`): the fraction of the board that the score
equals or beats, averaged over the boards present — MLE-Dojo's "position
score" (total - position + 1) / total, position = 1 + #strictly better.

Metrics: the contract grades numeric answers with a named metric from
`metrics.METRICS` (or a "module:function" grader over arrays), so the metric
must be given explicitly (`metric={"name": "auc", "direction": "higher"}`).
MLE-Dojo's own metric classes read pandas frames; when the `mledojo` package
is installed, `make_task` checks the given direction against the class's
`higher_is_better` (`upstream_metric_class`, `upstream_direction`).

Splits (151 training / 51 evaluation competitions upstream) are never invented
here: `load_split` reads a file or mapping that the user supplies.

Example:
    >>> comp = load_competition("prepared/GiveMeSomeCredit")      # doctest: +SKIP
    >>> task = make_task(comp, "views/GiveMeSomeCredit", split="train",
    ...                  metric={"name": "auc", "direction": "higher"})  # doctest: +SKIP
    >>> mounts = sandbox_mounts(task)                              # doctest: +SKIP
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from wmrl_jax.envs import metrics
from wmrl_jax.envs import task as task_lib
from wmrl_jax.sandbox.files import InputError, input_files

ANSWERS_FILE = "test_answer.csv"
DESCRIPTION_FILE = "description.txt"
SAMPLE_SUBMISSION_FILE = "sample_submission.csv"
BOARD_FILES = {"public": "public_leaderboard.csv", "private": "private_leaderboard.csv"}
TRAIN_SIZE, HELD_OUT_SIZE = 151, 51  # Upstream's split sizes; the lists come from the user.
DEFAULT_LIMITS = {"wall_seconds": 3600, "memory_mb": 32768, "cpus": 4}


class CompetitionError(ValueError):
    """A competition directory or split file does not have the upstream layout."""


class PrivateMountError(PermissionError):
    """Something asked to expose grader-side (private) files to the sandbox."""


@dataclasses.dataclass(frozen=True)
class Competition:
    """One prepared MLE-Dojo competition, as found on disk (nothing copied).

    Attributes:
        name: the competition name (directory name).
        data_dir: `<name>/data`.
        public_dir: `<name>/data/public`, the only part a sandbox may see.
        answers_path: `<name>/data/private/test_answer.csv`.
        boards: board name ("public" / "private") -> leaderboard CSV path.
        columns: header of `test_answer.csv` (id column first).
    """

    name: str
    data_dir: str
    public_dir: str
    answers_path: str
    boards: Mapping[str, str]
    columns: tuple[str, ...]

    @property
    def private_dir(self) -> str:
        """Grader side only."""
        return os.path.join(self.data_dir, "private")


def csv_header(path: str) -> list[str]:
    """The first row of a CSV file (a byte-order mark dropped).

    Raises:
        CompetitionError: the file is empty.
    """
    with open(path, newline="", encoding="utf-8-sig") as f:
        row = next(csv.reader(f), None)
    if not row:
        raise CompetitionError(f"{os.path.basename(path)} is empty")
    return row


def load_competition(path: str | os.PathLike[str]) -> Competition:
    """Finds and checks one prepared competition at `path` (the `<name>` directory).

    Raises:
        CompetitionError: a required file is missing, the answers have no target
            column, or a leaderboard lacks its `score` column; the message names it.
    """
    root = os.path.abspath(os.fspath(path))
    name = os.path.basename(root.rstrip(os.sep))
    data = os.path.join(root, "data")
    public, private = os.path.join(data, "public"), os.path.join(data, "private")
    for required in (public, private):
        if not os.path.isdir(required):
            raise CompetitionError(
                f"competition {name!r} has no {os.path.relpath(required, root)}/"
            )
    for required in (
        os.path.join(public, DESCRIPTION_FILE),
        os.path.join(private, ANSWERS_FILE),
    ):
        if not os.path.isfile(required):
            raise CompetitionError(f"competition {name!r} has no {os.path.relpath(required, root)}")
    boards = {
        board: os.path.join(private, file)
        for board, file in BOARD_FILES.items()
        if os.path.isfile(os.path.join(private, file))
    }
    if not boards:
        raise CompetitionError(f"competition {name!r} has no leaderboard in data/private/")
    for board, board_path in boards.items():
        if "score" not in csv_header(board_path):
            raise CompetitionError(
                f"competition {name!r}: {board} leaderboard has no 'score' column"
            )
    columns = tuple(csv_header(os.path.join(private, ANSWERS_FILE)))
    if len(columns) < 2:
        raise CompetitionError(f"competition {name!r}: {ANSWERS_FILE} needs an id and a target")
    return Competition(
        name=name,
        data_dir=data,
        public_dir=public,
        answers_path=os.path.join(private, ANSWERS_FILE),
        boards=boards,
        columns=columns,
    )


def load_split(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    expected_sizes: tuple[int, int] | None = None,
) -> dict[str, str]:
    """Competition name -> "train" / "held-out", from a user-supplied split.

    Accepted forms (a JSON file path or the mapping itself):

    * upstream's `competition.json`: {"Training": [...], "Evaluation": {group: [...]}}
      (every evaluation group is held out);
    * {"train": [...], "held-out": [...]}.

    Args:
        source: the file or mapping.
        expected_sizes: (n_train, n_held_out) to check, e.g. (TRAIN_SIZE, HELD_OUT_SIZE).

    Raises:
        CompetitionError: unknown form, a name in both splits, or the wrong sizes.
    """
    if isinstance(source, Mapping):
        raw = source
    else:
        with open(source, encoding="utf-8") as f:
            raw = json.load(f)
    if "Training" in raw and "Evaluation" in raw:
        evaluation = raw["Evaluation"]
        groups = evaluation.values() if isinstance(evaluation, Mapping) else [evaluation]
        train, held = list(raw["Training"]), [n for g in groups for n in g]
    elif set(raw) == {"train", "held-out"}:
        train, held = list(raw["train"]), list(raw["held-out"])
    else:
        raise CompetitionError(
            "split needs keys 'Training' and 'Evaluation' or 'train' and 'held-out', "
            f"got {sorted(raw)}"
        )
    both = sorted(set(train) & set(held))
    if both:
        raise CompetitionError(f"competitions in both splits: {both}")
    if expected_sizes is not None and (len(set(train)), len(set(held))) != tuple(expected_sizes):
        raise CompetitionError(
            f"split has {len(set(train))} train / {len(set(held))} held-out competitions, "
            f"expected {expected_sizes[0]} / {expected_sizes[1]}"
        )
    return {**{n: "train" for n in train}, **{n: "held-out" for n in held}}


def upstream_metric_class(name: str):
    """MLE-Dojo's metric class for competition `name` (needs the `mledojo` package).

    Its instances carry `higher_is_better` and `evaluate(y_true, y_pred)` over
    pandas frames; use it to check a metric mapping, not inside `grading.grade`.

    Raises:
        CompetitionError: `mledojo` is not installed (pass an explicit metric instead).
    """
    try:
        registry = importlib.import_module("mledojo.competitions")
    except ImportError as e:
        raise CompetitionError(
            f"the mledojo package is not installed; give competition {name!r} an explicit "
            "metric mapping, e.g. {'name': 'auc', 'direction': 'higher'}"
        ) from e
    return registry.get_metric(name)


def upstream_direction(name: str) -> str | None:
    """The direction MLE-Dojo's metric class declares, or None without `mledojo`."""
    try:
        cls = upstream_metric_class(name)
    except CompetitionError:
        return None
    return metrics.HIGHER if cls().higher_is_better else metrics.LOWER


def check_mount(task: task_lib.Task, path: str | os.PathLike[str]) -> str:
    """Returns the real path of `path` if it may be mounted for `task`, else raises.

    A mount is refused when it is, contains, or lies inside grader-side files:
    the view's `private/`, the upstream answers and boards, or their directory;
    or when a top-level entry of it is a link into them.

    Raises:
        PrivateMountError: the mount would expose private files.
    """
    real = os.path.realpath(os.fspath(path))
    forbidden = task_lib.private_paths(task)
    entries = [real]
    if os.path.isdir(real):
        entries += [os.path.realpath(e.path) for e in os.scandir(real) if e.is_symlink()]
    for entry in entries:
        for secret in forbidden:
            if task_lib.overlaps(entry, secret):
                raise PrivateMountError(
                    f"refusing to mount {os.fspath(path)!r} into the sandbox for task "
                    f"{task.id!r}: it exposes grader-side files ({secret!r}); "
                    "mount task.public_dir only"
                )
    return real


def sandbox_mounts(task: task_lib.Task) -> list[str]:
    """The directories to mount read-only into the sandbox: the checked public dir."""
    return [check_mount(task, task.public_dir)]


def _link(target: str, link: str) -> None:
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(target, link)


def check_numeric_column(path: str, column: str, *, rows: int = 1000) -> None:
    """Raises `CompetitionError` unless `column` of the CSV at `path` parses as floats.

    The contract's grader reads answers as floats; failing when the view is made
    beats failing mid-training. Only the first `rows` rows are read.
    """
    with open(path, newline="", encoding="utf-8-sig") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i >= rows:
                break
            try:
                float(row[column])
            except (TypeError, ValueError) as e:
                raise CompetitionError(
                    f"{os.path.basename(path)} column {column!r} is not numeric ({row[column]!r}); "
                    "the contract grades numeric answers only"
                ) from e


def write_view(
    out_dir: str | os.PathLike[str],
    *,
    manifest: Mapping[str, Any],
    public_dir: str,
    description: str,
    answers: str,
    boards: Mapping[str, str],
) -> task_lib.Task:
    """Writes a contract view of upstream files (links, no copies) and loads it.

    Raises:
        PrivateMountError: the public dir overlaps a grader-side file.
        ManifestError: the manifest is invalid, or the public dir holds a link
            leaving it or a special file (nothing is written then).
    """
    root = os.path.abspath(os.fspath(out_dir))
    task_lib.parse_manifest(manifest, root)  # Validate before writing anything.
    public_real = os.path.realpath(public_dir)
    try:  # links leaving the public dir or special files: refused by load_task too
        input_files(public_real)
    except InputError as e:
        raise task_lib.ManifestError(f"public dir {public_dir!r}: {e}") from e
    for secret in (answers, *boards.values()):
        secret_real = os.path.realpath(secret)
        if task_lib.overlaps(public_real, os.path.dirname(secret_real)) or task_lib.overlaps(
            public_real, secret_real
        ):
            raise PrivateMountError(
                f"public dir {public_dir!r} overlaps grader-side file {secret!r}"
            )
    os.makedirs(os.path.join(root, "private", "leaderboards"), exist_ok=True)
    _link(public_real, os.path.join(root, "public"))
    _link(os.path.realpath(description), os.path.join(root, "description.md"))
    _link(os.path.realpath(answers), os.path.join(root, "private", "answers.csv"))
    for board, board_path in boards.items():
        _link(
            os.path.realpath(board_path),
            os.path.join(root, "private", "leaderboards", f"{board}.csv"),
        )
    with open(os.path.join(root, task_lib.MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    return task_lib.load_task(root)


def make_task(
    competition: Competition,
    out_dir: str | os.PathLike[str],
    *,
    split: str | Mapping[str, str],
    metric: Mapping[str, str],
    target_columns: Sequence[str] | None = None,
    answer_column: str | None = None,
    limits: Mapping[str, float] | None = None,
) -> task_lib.Task:
    """Maps `competition` onto the task contract as a linked view at `out_dir`.

    Args:
        competition: from `load_competition`.
        out_dir: where the view (manifest + links) is written; may already exist.
        split: "train" / "held-out", or a mapping from `load_split`.
        metric: {"name": <metrics.METRICS key> | "grader": "module:function",
            "direction": "higher" | "lower"}; required, never guessed. A grader's
            module must be allowed (`task.grader_modules`).
        target_columns: submission prediction columns (default: the answers'
            non-id columns).
        answer_column: the truth column (default: the single non-id column).
        limits: sandbox limits (default `DEFAULT_LIMITS`).

    Returns:
        The loaded `Task`, with `percentile_rule="mle_dojo"` over the boards present.

    Raises:
        CompetitionError: the split lacks the competition, the answer column is
            ambiguous or not numeric, or the direction contradicts MLE-Dojo's
            metric class (checked only when `mledojo` is installed).
        ManifestError: the metric mapping is invalid.
    """
    if isinstance(split, Mapping):
        if competition.name not in split:
            raise CompetitionError(f"competition {competition.name!r} is in neither split")
        split = split[competition.name]
    id_column, *targets = competition.columns
    if answer_column is None:
        if len(targets) != 1:
            raise CompetitionError(
                f"competition {competition.name!r} has answer columns {targets}; pass answer_column"
            )
        answer_column = targets[0]
    if answer_column not in targets:
        raise CompetitionError(f"{answer_column!r} is not an answer column of {targets}")
    check_numeric_column(competition.answers_path, answer_column)
    upstream = upstream_direction(competition.name)
    if upstream is not None and metric.get("direction") != upstream:
        raise CompetitionError(
            f"competition {competition.name!r}: metric direction {metric.get('direction')!r} "
            f"contradicts MLE-Dojo's metric class, which is {upstream}-is-better"
        )
    manifest = {
        "format_version": task_lib.FORMAT_VERSION,
        "id": competition.name,
        "source": "mle-dojo",
        "split": split,
        "metric": dict(metric),
        "submission": {
            "file": "submission.csv",
            "id_column": id_column,
            "target_columns": list(target_columns or targets),
            "answer_column": answer_column,
        },
        "limits": dict(limits or DEFAULT_LIMITS),
        "percentile_rule": "mle_dojo",
        "leaderboards": sorted(competition.boards),
    }
    return write_view(
        out_dir,
        manifest=manifest,
        public_dir=competition.public_dir,
        description=os.path.join(competition.public_dir, DESCRIPTION_FILE),
        answers=competition.answers_path,
        boards=competition.boards,
    )
