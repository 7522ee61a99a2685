"""Metrics: TensorBoard event files and a JSONL log (the console is `train.console`).

`MetricWriter.write(step, scalars)` appends one JSON object per step to
`<workdir>/metrics.jsonl` (`{"step": 3, "reward/wmrl": 0.41, ...}`) and writes
TensorBoard scalar events under `<workdir>/tensorboard` (tensorboardX; no
TensorFlow needed). Both are flushed every step, so a killed run leaves valid
files up to its last completed write.

Non-finite values keep the JSONL strict JSON: NaN is written as `null`,
+/-inf as the strings "Infinity" / "-Infinity"; `read_jsonl` turns them back
into floats.

Resuming: `MetricWriter(workdir, resume_step=s)` rewrites `metrics.jsonl`
without the entries with step > s (written after the checkpoint the run resumes
from) and starts a TensorBoard file with `purge_step=s + 1`, which hides the
events with step >= s + 1 of earlier files (TensorBoard's own convention, also
applied by `read_tensorboard_scalars`). Steps must increase within one writer.

Example:
    >>> writer = MetricWriter(workdir)
    >>> writer.write(step, {"reward/wmrl": 0.41, "compute_seconds": 812.5})
    >>> writer.close()
"""

import contextlib
import glob
import json
import math
import os
import struct
import sys
import time
from collections.abc import Iterator, Mapping

import numpy as np

__all__ = ["MetricWriter", "read_jsonl", "read_tensorboard_scalars"]

JSONL_NAME = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_INF = {"Infinity": math.inf, "-Infinity": -math.inf}


@contextlib.contextmanager
def _without_torch() -> Iterator[None]:
    """Imports within the block see no torch, unless it is imported already.

    tensorboardX imports torch whenever it is installed, only to recognise its
    tensors; we log Python floats, and a torch import costs seconds of start-up
    (more on a loaded machine) in every process that writes metrics.
    """
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # `import torch` raises ImportError, which it catches.
    try:
        yield
    finally:
        del sys.modules["torch"]


def _encode(value) -> int | float | str | None:
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"metric values must be scalars, got shape {array.shape}")
    value = float(array.reshape(()))
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _decode(value):
    if value is None:
        return math.nan
    if isinstance(value, str):
        return _INF.get(value, value)
    return value


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Reads a `metrics.jsonl` (a file or a workdir holding one).

    Null values become NaN and "Infinity" / "-Infinity" become floats. A torn
    last line (a write interrupted by a kill) is skipped.

    Returns:
        One dict per step, in file order.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, JSONL_NAME)
    return [{k: _decode(v) for k, v in entry.items()} for entry in _read_entries(path)]


def _read_entries(path: str) -> list[dict]:
    entries = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # torn final write (no trailing newline)
                break
            raise
    return entries


class MetricWriter:
    """Writes per-step scalars to JSONL and TensorBoard.

    A non-finite value (an undefined diagnostic, e.g. a variance of one sample
    or before the first anchors) is written to JSONL (NaN as null, infinities as
    strings) and left out of TensorBoard, whose plots would show it as a spike
    or a gap with a warning.

    Args:
        workdir: run directory (created).
        tensorboard: write TensorBoard events under `workdir/tensorboard`.
        jsonl: write `workdir/metrics.jsonl`.
        resume_step: the step a resumed run restarts after: later entries of
            an existing log are dropped. None starts a new log.
        overwrite: with `resume_step=None`, replace an existing non-empty log
            instead of raising.

    Raises:
        FileExistsError: a non-empty log exists, `resume_step` is None and not
            `overwrite` (a fresh run would otherwise duplicate steps).
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        jsonl: bool = True,
        resume_step: int | None = None,
        overwrite: bool = False,
    ):
        self.workdir = os.fspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self._last_step = None if resume_step is None else int(resume_step)
        self._jsonl = None
        if jsonl:
            path = os.path.join(self.workdir, JSONL_NAME)
            self._prepare_jsonl(path, resume_step, overwrite)
            self._jsonl = open(path, "a", encoding="utf-8")  # closed in close()
        self._tb = None
        if tensorboard:
            with _without_torch():
                from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(
                os.path.join(self.workdir, TENSORBOARD_DIR),
                purge_step=None if resume_step is None else int(resume_step) + 1,
                filename_suffix=f".{time.time_ns()}",  # two writers in one second: two files
                flush_secs=10,
            )

    @staticmethod
    def _prepare_jsonl(path: str, resume_step: int | None, overwrite: bool) -> None:
        if not os.path.exists(path):
            return
        entries = _read_entries(path)
        if resume_step is None:
            if entries and not overwrite:
                raise FileExistsError(
                    f"{path!r} holds {len(entries)} entries; pass resume_step= to continue "
                    "that run or overwrite=True to start a new log"
                )
            entries = []
        else:
            entries = [e for e in entries if e.get("step", -1) <= resume_step]
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for entry in entries:
                f.write(json.dumps(entry, allow_nan=False) + "\n")
        os.replace(tmp, path)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Logs `scalars` for `step` (strictly greater than the previous step).

        Args:
            step: the global step.
            scalars: name -> scalar (Python / numpy / 0-d JAX values); names with
                "/" group in TensorBoard ("reward/wmrl").

        Raises:
            ValueError: a non-increasing step, a "step" key, or a non-scalar value.
        """
        step = int(step)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} is not after the last written step {self._last_step}")
        if "step" in scalars:
            raise ValueError('"step" is reserved for the step number')
        encoded = {str(k): _encode(v) for k, v in scalars.items()}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, **encoded}, allow_nan=False) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for name, value in encoded.items():
                if isinstance(value, int | float):  # NaN / inf: undefined, not plotted.
                    self._tb.add_scalar(name, float(value), global_step=step)
            self._tb.flush()
        self._last_step = step

    def close(self) -> None:
        """Flushes and closes the files."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _records(path: str):
    """Yields the payloads of a TFRecord file (length, crc, data, crc; crcs not checked)."""
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        end = offset + 12 + length
        if end + 4 > len(data):
            break  # torn final record
        yield data[offset + 12 : end]
        offset = end + 4


def read_tensorboard_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Reads the scalar events of a TensorBoard directory (or a workdir holding one).

    Files are read in the order of their first event's wall time; a session
    start with a purge step (as written on resume) drops the earlier events at
    or after that step, as TensorBoard does.

    Returns:
        tag -> [(step, value), ...] sorted by step.
    """
    with _without_torch():
        from tensorboardX.proto import event_pb2

    logdir = os.fspath(logdir)
    if os.path.isdir(os.path.join(logdir, TENSORBOARD_DIR)):
        logdir = os.path.join(logdir, TENSORBOARD_DIR)
    files = []
    for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        events = []
        for record in _records(path):
            event = event_pb2.Event()
            event.ParseFromString(record)
            events.append(event)
        if events:
            files.append((events[0].wall_time, path, events))
    scalars: dict[str, dict[int, float]] = {}
    for _, _, events in sorted(files, key=lambda f: (f[0], f[1])):
        for event in events:
            if (
                event.HasField("session_log")
                and event.session_log.status == event_pb2.SessionLog.START
            ):
                for series in scalars.values():
                    for s in [s for s in series if s >= event.step]:
                        del series[s]
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return {tag: sorted(series.items()) for tag, series in scalars.items()}
