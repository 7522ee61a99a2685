r"""The controlled study (the main job for now).

    python -m experiments.controlled --config=experiments/configs/controlled.py \
        --workdir=outputs/controlled

Writes ``results.json`` (config, per-arm summary, per-step curves, the
blind-spot sweep), ``table.md`` and ``controlled.png`` into ``--workdir``
and prints the tables; with ``--readme``, rewrites the README's controlled
section between its markers.
"""

from __future__ import annotations

import json
import pathlib

from absl import app, flags, logging
from ml_collections import config_flags

from wmrl_jax.readme import write_section
from wmrl_jax.studies import controlled, report
from wmrl_jax.train.summary import write_json

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/controlled.py", "Study config.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", "outputs/controlled", "Where outputs go.")
_README = flags.DEFINE_string("readme", None, "README to update between the controlled markers.")


_RENDER_ONLY = flags.DEFINE_bool(
    "render_only",
    False,
    "Only rewrite table.md and the README section from --workdir/results.json (no plot).",
)
_COMMAND = "python -m experiments.controlled --config=experiments/configs/controlled.py"


def _tables(summary: dict, sweep: dict, *, fraction: float, seeds: int, steps: int) -> str:
    return (
        f"At blind-spot fraction {fraction:.0%}, {seeds} seeds, "
        f"{steps} updates per arm:\n\n{controlled.format_table(summary)}\n\n"
        f"Final true reward over the blind-spot sweep (same seeds and updates):\n\n"
        f"{controlled.format_sweep(sweep)}"
    )


def render(workdir: str, readme: str | None = None) -> str:
    """Rewrites `workdir/table.md` (and the README section) from `workdir/results.json`."""
    workdir = pathlib.Path(workdir)
    payload = json.loads((workdir / "results.json").read_text())
    config = payload["config"]
    sweep = {float(f): s for f, s in payload["blind_spot_sweep"].items()}
    table = _tables(
        payload["summary"], sweep, fraction=float(config["world_model"]["blind_spot_fraction"]),
        seeds=config["num_seeds"], steps=config["num_steps"],
    )  # fmt: skip
    (workdir / "table.md").write_text(table + "\n")
    if readme:
        write_section(readme, "controlled", f"`{_COMMAND}`\n\n{table}")
    return table


def run_and_report(config, workdir: str, readme: str | None = None) -> dict:
    """Runs the study and its blind-spot sweep, writes the outputs; returns the summary."""
    results = controlled.run_study(config)
    summary = controlled.summarize(results, config)
    fraction = float(config.world_model.blind_spot_fraction)
    sweep = controlled.run_sweep(config, known={fraction: summary})
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    curves = {arm: {k: v.mean(0) for k, v in out.items()} for arm, out in results.items()}
    write_json(
        workdir / "results.json",
        {
            "config": config.to_dict(),
            "summary": summary,
            "mean_curves": curves,
            "blind_spot_sweep": {str(f): s for f, s in sweep.items()},
        },
    )
    table = render(workdir, readme)
    report.plot_study(results, config, workdir / "controlled.png")
    print(table)
    logging.info("Wrote %s", workdir)
    return summary


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _RENDER_ONLY.value:
        print(render(_WORKDIR.value, _README.value))
        return
    run_and_report(_CONFIG.value, _WORKDIR.value, _README.value)


if __name__ == "__main__":
    app.run(main)
