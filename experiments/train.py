r"""Trains an agent with WMRL (or one of its ablation arms).

    python -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=outputs/tiny_cpu

Resumes from the latest checkpoint in ``--workdir`` when there is one. Prints
one line per step, then the final summary, and writes ``summary.json`` and
plots into ``--workdir``. Libraries' INFO logs (orbax, absl) are off unless
``--verbosity=0`` (or higher) is given; warnings always show.

From an installed wheel (this file is not part of the package), run it as a
script: ``python path/to/experiments/train.py --config=path/to/config.py``.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.train import loop, summary

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/tiny_cpu.py", "Training config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/tiny_cpu", "Checkpoints, metrics, plots.")


def quiet_libraries() -> None:
    """Library INFO logs off, unless the user asked for a verbosity."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    quiet_libraries()
    result = loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value, console=True)
    print(summary.write_run_report(result, _WORKDIR.value))
    logging.info("Wrote %s", _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
