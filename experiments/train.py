r"""Trains an agent with WMRL (or one of its ablation arms).

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=outputs/tiny_cpu

Resumes from the latest checkpoint in ``--workdir`` when there is one (one
trainer per workdir: a second one fails at once, naming the first's pid). On
SIGTERM or Ctrl-C it closes its executors and checkpoints and exits 143 or 130.
Prints
one line per step, then the final summary, and writes ``summary.json`` and
plots into ``--workdir``. Libraries' INFO logs (orbax, absl) are off unless
``--verbosity=0`` (or higher) is given; warnings always show.

From an installed wheel (this file is not part of the package), run it as a
script: ``python path/to/experiments/train.py --config=path/to/config.py``.

On several hosts, run the same command on each, told its place by
``config.distributed``, ``WMRL_COORDINATOR`` / ``WMRL_NUM_PROCESSES`` /
``WMRL_PROCESS_ID``, a Kubernetes Indexed Job or SLURM (`launch/`); they join
`jax.distributed` before anything else and train as one run, process 0 executing
the anchors and writing the files (`wmrl_jax.train.multihost`):

    WMRL_COORDINATOR=host0:61234 WMRL_NUM_PROCESSES=2 WMRL_PROCESS_ID=0 \
        python -m experiments.train --config=... --workdir=/shared/run

``--dry_run`` loads the config only (no weights, no tasks), prints the memory
plan per device of a text-agent run (`wmrl_jax.train.memory`) and exits 0 when
it fits, 1 with the knob to change when it does not:

    python -m experiments.train --config=experiments/configs/qwen3_8b_mledojo.py \
        --dry_run --dry_run_model=qwen3-8b --dry_run_device=h200

Without ``--dry_run_device`` it plans for this host's devices, after checking
the config's mesh against them (a mesh over several hosts needs the flag). The
architecture comes from ``--dry_run_model`` (a known name or a checkpoint
directory), else from ``config.agent.text.checkpoint``'s config.json.
"""

from __future__ import annotations

import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.envs.grading import TaskError
from wmrl_jax.envs.task import ManifestError
from wmrl_jax.models import architectures
from wmrl_jax.sandbox.files import InputError
from wmrl_jax.train import distributed, loop, memory, mesh, multihost, stopping, summary
from wmrl_jax.train.checkpoint import CheckpointError
from wmrl_jax.train.config import ConfigError
from wmrl_jax.train.evaluation import ExecutionFailure
from wmrl_jax.train.lock import WorkdirBusy
from wmrl_jax.train.resume import ResumeError

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/tiny_cpu.py", "Training config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/tiny_cpu", "Checkpoints, metrics, plots.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the memory plan per device and exit: 0 if it fits, else 1."
)
_DRY_RUN_DEVICE = flags.DEFINE_string(
    "dry_run_device", "",
    f"Plan for this accelerator ({', '.join([*memory.ACCELERATORS, 'cpu'])}) instead of the "
    "devices present.",
)  # fmt: skip
_DRY_RUN_MODEL = flags.DEFINE_string(
    "dry_run_model", "",
    f"The architecture: {', '.join(architectures.names())}, or a checkpoint directory; "
    "default: config.agent.text.checkpoint.",
)  # fmt: skip


def quiet_libraries() -> None:
    """Library INFO logs off, unless the user asked for a verbosity."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


# What a user can fix (a config, a task directory, a damaged, full, busy or foreign
# workdir, an executor that runs nothing): one line, exit 1.
USER_ERRORS = (ConfigError, ManifestError, TaskError, InputError, CheckpointError, ResumeError,
               WorkdirBusy, ExecutionFailure)  # fmt: skip


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    quiet_libraries()
    if _DRY_RUN.value:
        try:
            plan = mesh.plan_run(
                _CONFIG.value, device=_DRY_RUN_DEVICE.value, model=_DRY_RUN_MODEL.value
            )
        except ConfigError as e:
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
        print(f"architecture: {_DRY_RUN_MODEL.value or _CONFIG.value.agent.text.checkpoint}")
        print(plan.format())
        if not plan.fits:
            print("error: the run does not fit: " + "; ".join(plan.problems), file=sys.stderr)
            sys.exit(1)
        return
    # SIGTERM (a preemption, a time limit) and Ctrl-C stop the run (never in the middle
    # of a checkpoint write: `stopping`); the trainer closes its executors (their
    # sandboxes stopped and removed), its checkpoints and its lock, then the process
    # exits 128 + the signal; rerunning the same command resumes from the last checkpoint.
    try:
        with stopping.on_signals():
            multihost.join(_CONFIG.value)  # Several processes: before any other JAX call.
            result = loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value, console=True)
    except USER_ERRORS as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    except (stopping.Stopped, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, stopping.Stopped) else signal.SIGINT
        print(
            f"error: stopped by {signal.Signals(signum).name}: executors closed and the "
            f"checkpoints saved so far kept in {_WORKDIR.value}; rerun the same command to resume",
            file=sys.stderr,
        )
        sys.exit(128 + signum)
    if distributed.is_primary():  # The report is process 0's; the others only trained.
        print(summary.write_run_report(result, _WORKDIR.value))
    logging.info("Wrote %s", _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
