r"""Reproduces the headline: real-execution compute to reach the same agent, WMRL vs GRPO.

    python -m experiments.study_compute --config=experiments/configs/study_compute.py \
        --workdir=outputs/study_compute --readme=README.md

Writes ``results.json`` (the config and every number), ``table.md``,
``sweeps.md``, ``study_compute.png`` into ``--workdir`` and, with
``--readme``, replaces the README's study section (between its
``<!-- study:begin -->`` / ``<!-- study:end -->`` markers) with the new table
and plot, so the README never carries hand-typed numbers.
"""

from __future__ import annotations

import os
import shutil
import time

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.train import report, study

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/study_compute.py", "Study config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/study_compute", "Where outputs go.")
_README = flags.DEFINE_string("readme", None, "README to update between the study markers.")
_ASSETS = "docs"


def run_and_report(config, workdir: str, readme: str | None = None) -> dict:
    """Runs the study, writes its outputs, optionally updates the README; returns the analysis."""
    start = time.perf_counter()
    results = study.run_study(config, workdir, log=logging.info)
    analysis = study.analyse(results, smooth=config.study.smooth)
    arms = list(config.study.arms)
    sweeps = [label for label in analysis if label not in arms]
    table = report.format_study_table(analysis, arms)
    sweep_table = report.format_study_table(analysis, ["wmrl", "real", *sweeps])
    os.makedirs(workdir, exist_ok=True)
    plot = os.path.join(workdir, "study_compute.png")
    report.plot_compute_study(results, arms, plot, step_series=study.step_series)
    wall = time.perf_counter() - start
    report.write_json(
        os.path.join(workdir, "results.json"),
        {
            "config": config.to_dict(),
            "analysis": analysis,
            "wall_seconds": wall,
            "runs": {k: [{"history": s["history"]} for s in v] for k, v in results.items()},
        },
    )
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(workdir, "sweeps.md"), "w") as f:
        f.write(sweep_table + "\n")
    print(table, "\n\n", sweep_table, sep="")
    if readme:
        root = os.path.dirname(os.path.abspath(readme))
        os.makedirs(os.path.join(root, _ASSETS), exist_ok=True)
        shutil.copy(plot, os.path.join(root, _ASSETS, "study_compute.png"))
        headline = analysis.get("wmrl", {})
        body = "\n".join(
            [
                f"`python -m experiments.study_compute` ({config.study.num_seeds} seeds, "
                f"{config.num_steps} updates per run, {wall / 60:.0f} min on this CPU). "
                f"Headline, compute to reach `real`'s final held-out percentile, real / wmrl: "
                f"**{report.fmt_number(headline.get('ratio_median'), '.2f')}×** (median over seeds "
                f"that reach it; {headline.get('reached', 0)}/{headline.get('seeds', 0)} do)."
                + (
                    ""
                    if headline.get("heldout_target_above_start", True)
                    else " Here `real` itself ends no higher on held-out tasks than it starts, "
                    "so the held-out target says nothing; see the train-task columns."
                ),
                "",
                table,
                "",
                "Sweeps (anchor fraction ρ; warm-start length, i.e. world-model quality):",
                "",
                sweep_table,
                "",
                f"![compute study]({_ASSETS}/study_compute.png)",
            ]
        )
        with open(readme) as f:
            text = f.read()
        with open(readme, "w") as f:
            f.write(report.replace_between_markers(text, "study", body))
    return analysis


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    run_and_report(_CONFIG.value, _WORKDIR.value, _README.value)


if __name__ == "__main__":
    app.run(main)
