r"""The embodied study: success rate vs simulator steps, WMRL against real-rollout GRPO.

    python -m experiments.study_embodied --config=experiments/configs/embodied.py \
        --workdir=outputs/embodied --readme=README.md

Writes ``results.json`` (the config, every curve and ledger, the analysis),
``table.md`` and ``embodied.png`` into ``--workdir``; with ``--readme``,
replaces the section of ``docs/embodied.md`` beside it between
``<!-- embodied:begin -->`` and ``<!-- embodied:end -->`` (``--docs`` names
another page; the plot is copied beside the page) and the README's
``embodied-headline`` section with the headline. ``--docs`` alone writes
only the page.
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
from wmrl_jax.readme import report_paths, write_report

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/embodied.py", "Study config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/embodied", "Where outputs go.")
_README = flags.DEFINE_string(
    "readme", None, "README to update between the embodied-headline markers (the headline)."
)
_DOCS = flags.DEFINE_string(
    "docs",
    None,
    "Page to update between the embodied markers (the full section); default: "
    "docs/embodied.md beside --readme.",
)
_RENDER_ONLY = flags.DEFINE_bool(
    "render_only",
    False,
    "Only re-render the table, plot, docs section and headline from --workdir/results.json.",
)


def run_and_report(
    config, workdir: str, readme: str | None = None, docs: str | None = None
) -> dict:
    """Runs the study, writes its outputs, optionally updates the docs page and the README's
    headline (`render`); returns the analysis."""
    report_paths(report.MARKER, readme, docs)  # Missing pages fail now, not after the study.
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
    return render(workdir, readme, docs)


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> dict:
    """Analyses ``results.json`` and writes the table, the plot, the docs page's section and
    the README's headline; ``docs`` defaults to the study's page beside ``readme``."""
    readme, docs = report_paths(report.MARKER, readme, docs)
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    config = payload["config"]
    analysis = study.analyse(payload["results"], bootstrap=config["bootstrap"])
    table = report.table(analysis)
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table + "\n")
    plot_path = os.path.join(workdir, "embodied.png")
    report.plot(analysis, plot_path)
    if docs is not None:
        # The plot beside the docs page, which links it by name.
        shutil.copyfile(
            plot_path, os.path.join(os.path.dirname(os.path.abspath(docs)), "embodied.png")
        )
        budgets = ", ".join(f"{t} {c['budget'] // 1000}k" for t, c in config["tasks"].items())
        runs = [r for e in payload["results"].values() for rs in e["arms"].values() for r in rs]
        cpu = sum(r.get("cpu_seconds", math.nan) for r in runs)
        cpu_text = "" if math.isnan(cpu) else f", {cpu / 60:.0f} CPU-min in the runs"
        body = (
            f"`python -m experiments.study_embodied` ({config['num_seeds']} seeds, "
            f"simulator-step budget per run: {budgets}; {payload['wall_seconds'] / 60:.0f} min "
            f"wall-clock with {config['workers']} processes on a shared 2-core machine"
            f"{cpu_text}). {report.headline(analysis)}\n\n"
            f"{table}\n\n![embodied study](embodied.png)"
        )
        write_report(report.MARKER, body, report.headline(analysis), readme=readme, docs=docs)
    return analysis


def main(argv):
    del argv
    if _RENDER_ONLY.value:
        render(_WORKDIR.value, _README.value, _DOCS.value)
    else:
        run_and_report(_CONFIG.value, _WORKDIR.value, _README.value, _DOCS.value)


if __name__ == "__main__":
    app.run(main)
