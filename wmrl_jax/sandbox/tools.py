"""The environment's tools in an episode: data information and validation on a sample.

An episode (`wmrl_jax.agents.text.episodes`) is a short conversation between the
agent and a task's environment. Besides submitting (the final program, graded
by the trainer's outcome source like any program), the agent may call:

* ``info``: a fixed program, run in the sandbox on the task's public data,
  that lists the input files with their sizes and describes every CSV file
  (rows, columns, whether each column looks numeric, missing values among
  the first rows, the first rows themselves);
* ``validate``: the agent's own program, run in the sandbox on a small
  sample of the public data (every CSV file cut to its header and first
  `validate_rows` records, other files as they are), answered with its
  status, the tails of its output, and a check of the submission file it
  wrote against the task's submission spec (file present, columns, row
  count, ids of the sample's test rows). Nothing private is read: the check
  compares the submission with the public sample, never with answers.

Each call is one real `Executor.run` with its own wall-clock budget
(`info_timeout_s`, `validate_timeout_s`). A crash or a timeout is an answer in
the transcript (`ToolResult.status`), never an exception and never an
execution of the submission; `ToolResult.seconds` is what the sandbox spent,
which the caller accounts apart from the submissions' execution seconds.

Example:
    >>> tools = ToolBox(LocalExecutor(timeout_s=60))                # doctest: +SKIP
    >>> tools.call(task, "info").result().text                      # doctest: +SKIP
    '3 files in the input directory\\n- sample_submission.csv: ...'
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import NamedTuple

from wmrl_jax.prompt_text import valid_text
from wmrl_jax.sandbox.files import input_files

TOOLS = ("info", "validate")
# Where the ids of the test rows are looked for in the sample, in this order.
ID_FILES = ("sample_submission.csv", "test.csv")

INFO_PROGRAM = r"""import csv, os, sys
sys.stdout.reconfigure(errors="backslashreplace")  # a file name that is not UTF-8
root = os.environ["WMRL_INPUT_DIR"]
MAX_FILES, MAX_CSV, MAX_COLUMNS, HEAD, SCAN = 40, 8, 40, 3, 2000
csv.field_size_limit(1 << 24)
entries = []
for d, dirs, files in os.walk(root):
    dirs.sort()
    entries += sorted(os.path.relpath(os.path.join(d, f), root) for f in files)
print(f"{len(entries)} files in the input directory")
for rel in entries[:MAX_FILES]:
    print(f"- {rel}: {os.path.getsize(os.path.join(root, rel))} bytes")
if len(entries) > MAX_FILES:
    print(f"- ... and {len(entries) - MAX_FILES} more")
for rel in [e for e in entries if e.lower().endswith(".csv")][:MAX_CSV]:
    with open(os.path.join(root, rel), newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        rows, head = 0, []
        numeric, missing = [True] * len(header), [0] * len(header)
        for row in reader:
            rows += 1
            if rows <= HEAD:
                head.append(row)
            if rows <= SCAN:
                for j, value in enumerate(row[: len(header)]):
                    if value == "":
                        missing[j] += 1
                    elif numeric[j]:
                        try:
                            float(value)
                        except ValueError:
                            numeric[j] = False
    print(f"\n{rel}: {rows} rows, {len(header)} columns")
    for j, name in enumerate(header[:MAX_COLUMNS]):
        kind = "numeric" if numeric[j] else "text"
        print(f"  {name}: {kind}, {missing[j]} missing in the first {min(rows, SCAN)} rows")
    if len(header) > MAX_COLUMNS:
        print(f"  ... and {len(header) - MAX_COLUMNS} more columns")
    print("  first rows:")
    for row in head:
        print("  " + ",".join(row)[:200])
"""


class ToolResult(NamedTuple):
    """One tool call's answer.

    Attributes:
      name: the tool ("info" or "validate").
      status: the run's `ExecutionResult.status` ("ok", "error", "timeout", ...).
      text: what the environment says back (not yet cut to any budget), valid text
        (`wmrl_jax.prompt_text.valid_text`: a file name that is not UTF-8 is escaped).
      seconds: sandbox wall seconds of the call (0 when nothing ran).
    """

    name: str
    status: str
    text: str
    seconds: float


def _infra_error(name: str, error: Exception) -> ToolResult:
    return ToolResult(name, "infra_error", valid_text(f"{type(error).__name__}: {error}"), 0.0)


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"[... {len(text) - limit} characters]\n{text[-limit:]}"


def write_sample(public_dir: str, target: str, rows: int) -> None:
    """Copies `public_dir` into `target` with every CSV file cut to `rows` records.

    CSV files keep their header and first `rows` records (quoted fields that
    span lines stay whole); other files are hard-linked, or copied where a link
    is impossible. The same entries as any sandbox input are refused
    (`files.input_files` raises `InputError`).
    """
    csv.field_size_limit(1 << 24)
    for rel, real in input_files(public_dir):
        dst = os.path.join(target, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if rel.lower().endswith(".csv"):
            with (
                open(real, newline="", encoding="utf-8", errors="replace") as src,
                open(dst, "w", newline="", encoding="utf-8") as out,
            ):
                writer = csv.writer(out, lineterminator="\n")
                for i, record in enumerate(csv.reader(src)):
                    if i > rows:
                        break
                    writer.writerow(record)
        else:
            try:
                os.link(real, dst)
            except OSError:
                shutil.copyfile(real, dst)


def _read_csv(data: bytes) -> tuple[list[str], list[list[str]]] | None:
    try:
        reader = csv.reader(io.StringIO(data.decode("utf-8")))
        header = next(reader, None)
        return (header, list(reader)) if header else None
    except (UnicodeDecodeError, csv.Error):
        return None


def sample_ids(sample_dir: str, id_column: str) -> list[str] | None:
    """The test ids of a sample: `id_column` of the first of `ID_FILES` holding it."""
    for name in ID_FILES:
        path = os.path.join(sample_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                parsed = _read_csv(f.read())
            if parsed and id_column in parsed[0]:
                j = parsed[0].index(id_column)
                return [row[j] for row in parsed[1] if len(row) > j]
    return None


def submission_report(task, files: Mapping[str, bytes], ids: list[str] | None) -> str:
    """Lines checking the submission a validated program wrote (public facts only).

    Args:
      task: the task (its `submission` spec).
      files: the run's output files.
      ids: the sample's test ids (`sample_ids`), or None when the sample has none.
    """
    spec = task.submission
    if spec.file not in files:
        written = ", ".join(sorted(files)) or "none"
        return f"submission: {spec.file} was not written (output files: {written})"
    parsed = _read_csv(files[spec.file])
    if parsed is None:
        return f"submission: {spec.file} is not a CSV file with a header row"
    header, rows = parsed
    expected = [spec.id_column, *spec.target_columns]
    lines = [f"submission: {spec.file}, {len(rows)} rows, columns {', '.join(header)}"]
    missing = [c for c in expected if c not in header]
    extra = [c for c in header if c not in expected]
    lines.append(
        f"  missing columns: {', '.join(missing)}" if missing else "  every expected column"
    )
    if extra:
        lines.append(f"  unexpected columns: {', '.join(extra)}")
    if ids is not None and spec.id_column in header:
        j = header.index(spec.id_column)
        got = {row[j] for row in rows if len(row) > j}
        absent = sum(i not in got for i in ids)
        lines.append(
            f"  ids: {len(ids) - absent} of the sample's {len(ids)} test ids present"
            + (f", {len(rows) - len(ids)} rows too many" if len(rows) > len(ids) else "")
        )
    return "\n".join(lines)


class ToolBox:
    """The environment side of an episode's tool calls (module docstring).

    Args:
      executor: an `Executor` (or `ExecutorPool`): what every call runs on.
      info_timeout_s: wall-clock budget of an ``info`` call.
      validate_timeout_s: wall-clock budget of a ``validate`` call.
      validate_rows: records kept per CSV file in the validation sample.
      output_chars: characters of stdout and of stderr kept in a validation answer.
      close_executor: whether `close()` closes the executor too.
    """

    def __init__(
        self,
        executor,
        *,
        info_timeout_s: float = 30.0,
        validate_timeout_s: float = 120.0,
        validate_rows: int = 100,
        output_chars: int = 2000,
        close_executor: bool = True,
    ):
        if not info_timeout_s > 0 or not validate_timeout_s > 0:
            raise ValueError(f"tool budgets must be > 0: {info_timeout_s=}, {validate_timeout_s=}")
        if validate_rows < 1 or output_chars < 1:
            raise ValueError(f"need validate_rows >= 1 and output_chars >= 1, got "
                             f"{validate_rows}, {output_chars}")  # fmt: skip
        self.executor = executor
        self.info_timeout_s = float(info_timeout_s)
        self.validate_timeout_s = float(validate_timeout_s)
        self.validate_rows = int(validate_rows)
        self.output_chars = int(output_chars)
        self.close_executor = close_executor
        self._scratch = tempfile.TemporaryDirectory(prefix="wmrl-tools-")
        self._samples: dict[str, tuple[str, list[str] | None]] = {}
        self._lock = threading.Lock()

    def sample(self, task) -> tuple[str, list[str] | None]:
        """The validation sample of `task` (built once): its directory and test ids."""
        with self._lock:
            if task.public_dir not in self._samples:
                target = os.path.join(self._scratch.name, str(len(self._samples)))
                write_sample(task.public_dir, target, self.validate_rows)
                ids = sample_ids(target, task.submission.id_column)
                self._samples[task.public_dir] = (target, ids)
            return self._samples[task.public_dir]

    def call(self, task, name: str, source: str = "") -> concurrent.futures.Future:
        """Schedules tool `name` on `task` (`source`: the program to validate).

        Returns:
          A Future of the `ToolResult`; a call the sandbox cannot take resolves
          to one with status "infra_error".

        Raises:
          ValueError: `name` is not one of `TOOLS`.
        """
        if name not in TOOLS:
            raise ValueError(f"unknown tool {name!r}; known: {TOOLS}")
        outer: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if name == "info":
                inner = self.executor.submit(
                    INFO_PROGRAM, input_dir=task.public_dir, timeout_s=self.info_timeout_s
                )
                ids = None
            else:
                sample_dir, ids = self.sample(task)
                inner = self.executor.submit(
                    source, input_dir=sample_dir, timeout_s=self.validate_timeout_s
                )
        except Exception as e:  # the sandbox could not take it: an answer, not a crash
            outer.set_result(_infra_error(name, e))
            return outer

        def finish(done: concurrent.futures.Future) -> None:
            try:
                answer = self._answer(task, name, done.result(), ids)
                outer.set_result(answer._replace(text=valid_text(answer.text)))
            except Exception as e:  # an executor bug must not escape as a crash
                outer.set_result(_infra_error(name, e))

        inner.add_done_callback(finish)
        return outer

    def _answer(self, task, name: str, result, ids) -> ToolResult:
        seconds = float(result.wall_seconds)
        if name == "info":
            if result.ok:
                return ToolResult(name, "ok", result.stdout, seconds)
            text = f"info failed ({result.status}): {_tail(result.stderr or result.message, 500)}"
            return ToolResult(name, result.status, text, seconds)
        budget = f" (budget {self.validate_timeout_s:g} s)" if result.status == "timeout" else ""
        lines = [
            f"status: {result.status}{budget} (exit code {result.exit_code}, {seconds:.1f} s, "
            f"on the first {self.validate_rows} rows of each CSV file)"
        ]
        if result.stdout.strip():
            lines += ["stdout:", _tail(result.stdout.rstrip(), self.output_chars)]
        if result.stderr.strip():
            lines += ["stderr:", _tail(result.stderr.rstrip(), self.output_chars)]
        if result.status == "infra_error" and result.message:
            lines.append(f"sandbox: {result.message}")
        if result.status == "ok":
            lines.append(submission_report(task, result.files, ids))
        return ToolResult(name, result.status, "\n".join(lines), seconds)

    def close(self) -> None:
        if self.close_executor:
            self.executor.close()
        self._scratch.cleanup()
