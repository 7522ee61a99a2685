r"""A smoke measurement of the world-model quality knob: `wmrl` with the synthetic world
model at several target q, beside `anchors_only`, at a short update cap (not a headline).

    python -m experiments.wm_quality_smoke --workdir=outputs/wm_quality_smoke \
        --q=0,0.4,0.8 --seeds=3 --steps=60 [--suite=core]

Every run is the compute study's (`experiments/configs/study_compute.py`: the grown
suite, replayed, one anchor group of ten per step), stopped at `--steps` updates
instead of a compute budget, so that one run gives its compute under every
execution cost (`wmrl_jax.train.cost.reprice`). Per run it prints the realised q
(`wm/q_realised` pooled over the run's scored groups), the held-out expected
percentile before and after, the executions, and the modelled compute (N = 4e9)
with each execution charged its recorded seconds, 30 s, 300 s and 1800 s; and
writes them to `<workdir>/smoke.json`.
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import app, flags

from experiments.configs import study_compute
from wmrl_jax.studies import compute as study
from wmrl_jax.train import builder, cost
from wmrl_jax.train.config import override
from wmrl_jax.worldmodel.synthetic import realised_q

FLAGS = flags.DEFINE_string("workdir", None, "Where runs and smoke.json go.", required=True)
Q = flags.DEFINE_list("q", ["0", "0.4", "0.8"], "Target within-group Spearman values.")
SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds (each warm-started once, shared by its runs).")
STEPS = flags.DEFINE_integer("steps", 60, "Updates per run (an update cap; no compute budget).")
WORKERS = flags.DEFINE_integer("workers", 1, "Seeds in parallel processes.")
SUITE = flags.DEFINE_enum(
    "suite", "grown", ["grown", "core"],
    "The study's grown suite, or the core one with the study's runlocal task settings.",
)  # fmt: skip
COSTS = (None, 30.0, 300.0, 1800.0)  # Seconds per execution; None: the recorded ones.


def smoke_config(qs, *, seeds: int, steps: int, workers: int, suite: str = "grown"):
    """The compute study's config at an update cap, with one variant per target q."""
    config = study_compute.get_config()
    if suite == "core":  # 4 tasks per step, one anchor group: the study's runlocal setting
        config = override(config, tasks_per_step=4, anchor_fraction=0.25, **{"tasks.suite": "core"})
    variants = tuple(
        f"wmrl_q{q}: arm=wmrl, world_model.kind=synthetic, world_model.synthetic.q={q}" for q in qs
    )
    return override(
        config, num_steps=steps, eval_every=steps, **{
            "budget.compute_seconds": 0.0, "study.num_seeds": seeds, "study.workers": workers,
            "study.arms": ("anchors_only",), "study.variants": variants,
        },
    )  # fmt: skip


def _mean(values) -> float:
    """Mean over the finite values; NaN when none is (e.g. q of an arm without a WM)."""
    x = np.asarray(values, np.float64)
    return float(x[np.isfinite(x)].mean()) if np.isfinite(x).any() else float("nan")


def run_row(summary: dict, model) -> dict:
    """One run's realised q, held-out levels, executions and re-priced compute."""
    steps = summary["steps"]
    last = summary["history"][-1]
    row = {
        "q_realised": realised_q(steps),
        "heldout_before": summary["heldout_before"],
        "heldout_after": summary["heldout_after"],
        "updates": len(steps),
        "executions": last["executions"],
    }
    for c in COSTS:
        key = "compute_recorded" if c is None else f"compute_{c:.0f}s"
        row[key] = float(cost.reprice([last], model, execution_seconds=c)[0])
    return row


def main(argv):
    del argv
    qs = [float(q) for q in Q.value]
    config = smoke_config(
        qs, seeds=SEEDS.value, steps=STEPS.value, workers=WORKERS.value, suite=SUITE.value
    )
    model = cost.from_config(config)
    builder.load_tasks(config)  # The suite is built (once) here, not in the seeds' workers.
    results = study.run_study(config, FLAGS.value)
    table = {label: [run_row(s, model) for s in runs] for label, runs in results.items()}
    os.makedirs(FLAGS.value, exist_ok=True)
    with open(os.path.join(FLAGS.value, "smoke.json"), "w") as f:
        json.dump({"suite": SUITE.value, "steps": STEPS.value, "seeds": SEEDS.value,
                   "runs": table}, f, indent=1)  # fmt: skip
    print(f"\nsmoke measurement ({SUITE.value} suite, {SEEDS.value} seeds, {STEPS.value} updates "
          "each; not a headline)")  # fmt: skip
    print("| run | realised q | held-out before -> after | executions | compute (recorded / 30 s"
          " / 300 s / 1800 s per execution, N=4e9) |")  # fmt: skip
    for label, rows in table.items():
        mean = {k: _mean([r[k] for r in rows]) for k in rows[0]}
        print(f"| {label} | {mean['q_realised']:.3f} | {mean['heldout_before']:.3f} -> "
              f"{mean['heldout_after']:.3f} | {mean['executions']:.0f} | "
              f"{mean['compute_recorded']:.0f} / {mean['compute_30s']:.0f} / "
              f"{mean['compute_300s']:.0f} / {mean['compute_1800s']:.0f} |")  # fmt: skip
        for i, r in enumerate(rows):
            print(f"|   seed {i} | {r['q_realised']:.3f} | {r['heldout_before']:.3f} -> "
                  f"{r['heldout_after']:.3f} | {r['executions']:.0f} | |")  # fmt: skip


if __name__ == "__main__":
    app.run(main)
