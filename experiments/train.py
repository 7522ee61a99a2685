r"""Trains an agent with WMRL (or one of its ablation arms).

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=outputs/tiny_cpu

Resumes from the latest checkpoint in ``--workdir`` when there is one. Prints
the final summary and writes ``summary.json`` and plots into ``--workdir``.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.train import loop, report

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/tiny_cpu.py", "Training config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/tiny_cpu", "Checkpoints, metrics, plots.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    summary = loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    text = report.write_run_report(summary, _WORKDIR.value)
    print(text)
    logging.info("Wrote %s", _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
