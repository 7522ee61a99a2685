r"""The embodied study: success rate vs simulator steps, WMRL against real-rollout GRPO.

    python -m experiments.study_embodied --config=experiments/configs/embodied.py \
        --workdir=outputs/embodied --readme=README.md

Writes ``results.json`` (the config, every curve and ledger, the analysis),
``table.md`` and ``embodied.png`` into ``--workdir``; with ``--readme``,
copies the plot to ``docs/embodied.png`` and replaces the README's section
between ``<!-- embodied:begin -->`` and ``<!-- embodied:end -->``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.embodied import report, study
from wmrl_jax.readme import write_section

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/embodied.py", "Study config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/embodied", "Where outputs go.")
_README = flags.DEFINE_string("readme", None, "README to update between the embodied markers.")
_RENDER_ONLY = flags.DEFINE_bool(
    "render_only", False, "Only re-render the table, plot and README from --workdir/results.json."
)
_ASSETS = "docs"


def run_and_report(config, workdir: str, readme: str | None = None) -> dict:
    """Runs the study, writes its outputs, optionally updates the README; returns the analysis."""
    start = time.perf_counter()
    runs = {name: config.tasks[name] for name in config.tasks}
    results = study.run_study(
        runs,
        arms=tuple(config.arms),
        seeds=tuple(range(config.num_seeds)),
        workers=config.workers,
        log=logging.info,
    )
    os.makedirs(workdir, exist_ok=True)
    payload = {
        "config": config.to_dict(),
        "results": results,
        "wall_seconds": time.perf_counter() - start,
    }
    with open(os.path.join(workdir, "results.json"), "w") as f:
        json.dump(payload, f, indent=1, default=float)
    return render(workdir, readme)


def render(workdir: str, readme: str | None = None) -> dict:
    """Analyses ``results.json`` and writes the table, the plot and the README section."""
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    config = payload["config"]
    analysis = study.analyse(payload["results"], bootstrap=config["bootstrap"])
    table = report.table(analysis)
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table + "\n")
    plot_path = os.path.join(workdir, "embodied.png")
    report.plot(analysis, plot_path)
    if readme:
        os.makedirs(_ASSETS, exist_ok=True)
        shutil.copyfile(plot_path, os.path.join(_ASSETS, "embodied.png"))
        budgets = ", ".join(f"{t} {c['budget'] // 1000}k" for t, c in config["tasks"].items())
        runs = [r for e in payload["results"].values() for rs in e["arms"].values() for r in rs]
        cpu = sum(r.get("cpu_seconds", math.nan) for r in runs)
        cpu_text = "" if math.isnan(cpu) else f", {cpu / 60:.0f} CPU-min in the runs"
        body = (
            f"`python -m experiments.study_embodied` ({config['num_seeds']} seeds, "
            f"simulator-step budget per run: {budgets}; {payload['wall_seconds'] / 60:.0f} min "
            f"wall-clock with {config['workers']} processes on a shared 2-core machine"
            f"{cpu_text}). {report.headline(analysis)}\n\n"
            f"{table}\n\n![embodied study](docs/embodied.png)"
        )
        write_section(readme, report.MARKER, body)
    return analysis


def main(argv):
    del argv
    if _RENDER_ONLY.value:
        render(_WORKDIR.value, _README.value)
    else:
        run_and_report(_CONFIG.value, _WORKDIR.value, _README.value)


if __name__ == "__main__":
    app.run(main)
