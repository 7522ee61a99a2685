r"""The controlled study (the main job for now).

    python -m experiments.controlled --config=experiments/configs/controlled.py \
        --workdir=outputs/controlled

Writes ``results.json`` (config, per-arm summary, per-step curves),
``table.md`` and ``controlled.png`` into ``--workdir`` and prints the table.
"""

from __future__ import annotations

import pathlib

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.studies import controlled, report
from wmrl_jax.train.summary import write_json

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/controlled.py", "Study config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/controlled", "Where outputs go.")


def run_and_report(config, workdir: str) -> dict:
    """Runs the study and writes its outputs; returns the summary."""
    results = controlled.run_study(config)
    summary = controlled.summarize(results, config)
    table = controlled.format_table(summary)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    curves = {arm: {k: v.mean(0) for k, v in out.items()} for arm, out in results.items()}
    write_json(
        workdir / "results.json",
        {"config": config.to_dict(), "summary": summary, "mean_curves": curves},
    )
    (workdir / "table.md").write_text(table + "\n")
    report.plot_study(results, config, workdir / "controlled.png")
    print(table)
    logging.info("Wrote %s", workdir)
    return summary


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    run_and_report(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
