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

import json
import math
import os
import shutil
import time

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.readme import write_section
from wmrl_jax.studies import compute as study
from wmrl_jax.studies import report
from wmrl_jax.train.summary import write_json

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/study_compute.py", "Study config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/study_compute", "Where outputs go.")
_README = flags.DEFINE_string("readme", None, "README to update between the study markers.")
_RENDER_ONLY = flags.DEFINE_bool(
    "render_only",
    False,
    "Only re-render the tables, the plot and the README from --workdir/results.json.",
)
_ASSETS = "docs"


def run_and_report(config, workdir: str, readme: str | None = None) -> dict:
    """Runs the study, writes its outputs, optionally updates the README; returns the analysis."""
    start = time.perf_counter()
    results = study.run_study(config, workdir, log=logging.info)
    analysis = study.analyse(results, smooth=config.study.smooth)
    os.makedirs(workdir, exist_ok=True)
    payload = {
        "config": config.to_dict(),
        "analysis": analysis,
        "wall_seconds": time.perf_counter() - start,
        # Every eval point and every step's metrics: what `render` plots from.
        "runs": {
            k: [{"history": s["history"], "steps": s["steps"]} for s in v]
            for k, v in results.items()
        },
    }
    write_json(os.path.join(workdir, "results.json"), payload)
    render(workdir, readme)
    return analysis


def headline(analysis: dict) -> str:
    """The README's headline sentences, composed from the analysis alone."""
    wmrl, real = analysis["wmrl"], analysis["real"]
    num = report.fmt_number
    if real["heldout_target_above_start"]:
        paper = (
            f"**{num(wmrl['ratio_median'], '.2f')}×** [{num(wmrl['ratio_min'], '.2f')}, "
            f"{num(wmrl['ratio_max'], '.2f')}] (median [min, max] over the "
            f"{wmrl['reached']}/{wmrl['seeds']} seeds that reach it)"
        )
    else:
        paper = (
            "**not measurable here**: `real` itself ends lower on the held-out tasks than it "
            f"starts ({real['heldout_before']:.3f} → {real['heldout_final']:.3f}), so there is "
            "no target to reach"
        )
    w_train, r_train = wmrl["train_reward_final"], real["train_reward_final"]
    diff = wmrl["heldout_final"] - real["heldout_final"]
    se = math.hypot(wmrl["heldout_final_se"], real["heldout_final_se"])
    heldout = (
        f"On the held-out tasks `wmrl` and `real` end within two standard errors of each "
        f"other ({wmrl['heldout_final']:.3f} vs {real['heldout_final']:.3f}, difference "
        f"{diff:+.3f} ± {se:.3f}), so the held-out reverse ratio ({report.matched_cell(wmrl)}) "
        "is no evidence either way."
        if abs(diff) < 2 * se
        else f"On the held-out tasks `wmrl` ends {'above' if diff > 0 else 'below'} `real` "
        f"({wmrl['heldout_final']:.3f} vs {real['heldout_final']:.3f}, difference {diff:+.3f} "
        f"± {se:.3f}); real's compute to reach `wmrl`'s held-out level over `wmrl`'s: "
        f"{report.matched_cell(wmrl)}."
    )
    return " ".join(
        [
            "Headline in the paper's form, real / wmrl compute to reach `real`'s final held-out "
            f"percentile: {paper}.",
            "In the reverse form, on the training tasks where every arm improves: real-execution "
            f"GRPO needs **{report.matched_cell(wmrl, 'train_')}** the compute of `wmrl` to reach "
            f"the true reward `wmrl` ends at ({w_train:.3f}); after the same number of updates "
            f"`wmrl` ends {'below' if w_train < r_train else 'above'} `real` ({w_train:.3f} vs "
            f"{r_train:.3f}; {wmrl['train_reached']}/{wmrl['seeds']} seeds reach `real`'s final).",
            heldout,
            "(“never”: `real` does not get there within its whole budget, so the ratio is a lower "
            "bound.)",
        ]
    )


def render(workdir: str, readme: str | None = None) -> None:
    """Tables, the plot (and the README section) from `workdir/results.json`."""
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    config, analysis = payload["config"], payload["analysis"]
    arms = list(config["study"]["arms"])
    plot = os.path.join(workdir, "study_compute.png")
    report.plot_compute_study(payload["runs"], arms, plot, step_series=study.step_series)
    sweeps = [label for label in analysis if label not in arms]
    table = report.format_study_table(analysis, arms)
    sweep_table = report.format_study_table(analysis, ["wmrl", "real", *sweeps])
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(workdir, "sweeps.md"), "w") as f:
        f.write(sweep_table + "\n")
    print(table, "\n\n", sweep_table, sep="")
    if not readme:
        return
    root = os.path.dirname(os.path.abspath(readme))
    os.makedirs(os.path.join(root, _ASSETS), exist_ok=True)
    shutil.copy(os.path.join(workdir, "study_compute.png"), os.path.join(root, _ASSETS))
    body = "\n".join(
        [
            f"`python -m experiments.study_compute` ({config['study']['num_seeds']} seeds, "
            f"{config['num_steps']} updates per run, {payload['wall_seconds'] / 60:.0f} min on "
            f"this CPU). {headline(analysis)}",
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
    write_section(readme, "study", body)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _RENDER_ONLY.value:
        render(_WORKDIR.value, _README.value)
    else:
        run_and_report(_CONFIG.value, _WORKDIR.value, _README.value)


if __name__ == "__main__":
    app.run(main)
