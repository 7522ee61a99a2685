"""The compute study: real-execution compute to reach the same agent, per arm, over seeds.

Every run is the real trainer (`wmrl_jax.train.loop.Trainer`) on the built-in suite,
with the recipe benchmark replaying each program's recorded outcome and
charging its recorded execution seconds to the ledger. Per seed the backbone
is warm-started once, and every arm starts from that same policy: arms differ
only in the rewards they feed to GRPO.

Measures (see `analyse`):

* held-out percentile (mean ± standard error over seeds) against cumulative
  compute (generation + world model + execution) and against execution
  seconds alone;
* compute-to-target: the compute at which an arm's smoothed held-out
  percentile first reaches the final smoothed percentile of `real` (per seed),
  interpolated linearly between evaluation points (`analysis.reach`); the
  headline is `real / wmrl`;
* the bias and error variance of the rewards fed to GRPO (against each
  sample's true replayed reward), σ² estimates, fusion weights and the
  WM–real rank correlation, over training.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Iterable

import jax
import ml_collections
import numpy as np

from wmrl_jax.studies import analysis, exact
from wmrl_jax.studies.oracle import replay_oracle
from wmrl_jax.studies.runs import parse_variant, real_cell, real_cells, study_runs  # noqa: F401
from wmrl_jax.studies.smoothing import trailing_mean
from wmrl_jax.train import builder, distributed, loop
from wmrl_jax.train.config import override
from wmrl_jax.train.cost import CostModel
from wmrl_jax.train.ledger import Ledger

# Policy updates in the moving average of the training samples' true reward.
TRAIN_SMOOTH = 5


def run_study(
    config: ml_collections.ConfigDict, workdir: str, *, log=print, skip: Iterable[str] = ()
) -> dict:
    """Runs every (seed, run) pair; returns `{label: [summary per seed]}`.

    Runs whose label is in `skip` (already run, e.g. an earlier study's arms)
    are left out of the runs and of the result.

    Seeds run in `config.study.workers` spawned processes (each runs one seed's
    runs in order); 1 runs them in this process. Each process loads the tasks
    and the table itself, so results do not depend on the number of workers
    beyond the measured generation and WM seconds.
    """
    skip = tuple(skip)
    labels = [label for label, _ in study_runs(config) if label not in skip]
    seeds = range(config.study.num_seeds)
    jobs = [(config.to_dict(), workdir, seed, skip) for seed in seeds]
    by_seed: dict[int, dict] = {}

    def collect(item):
        seed, summaries = item
        by_seed[seed] = summaries
        for label, (summary, wall) in summaries.items():
            summary["wall_seconds"] = wall  # Its own, also when it was read back.
            log(
                f"seed {seed} {label:>22}: held-out {summary['heldout_before']:.3f} -> "
                f"{summary['heldout_after']:.3f}, compute {summary['compute_seconds']:.0f} s, "
                f"{len(summary['steps'])} updates, {wall:.1f} s wall"
            )

    # The suite is built (once, cached) here: a pool worker cannot build it, as the build
    # starts a process pool of its own and daemonic workers may not have children.
    builder.load_tasks(config)
    if config.study.workers <= 1 or len(jobs) == 1:
        for job in jobs:
            collect(_run_seed(job))
    else:
        # Spawned, not forked: JAX does not survive a fork of a process using it.
        with multiprocessing.get_context("spawn").Pool(config.study.workers) as pool:
            for item in pool.imap_unordered(_run_seed, jobs):
                collect(item)
    return {label: [by_seed[s][label][0] for s in seeds] for label in labels}


def _run_seed(job: tuple[dict, str, int, tuple]) -> tuple[int, dict[str, tuple[dict, float]]]:
    """Every run of one seed but the skipped: `(seed, {label: (summary, wall seconds)})`."""
    config_dict, workdir, seed, skip = job
    config = ml_collections.ConfigDict(config_dict)
    tasks = builder.load_tasks(config)
    table = builder.load_table(config)
    built: dict[int, object] = {}
    out = {}
    for label, overrides in study_runs(config):
        if label in skip:
            continue
        run_config = override(config, seed=config.seed + seed, **overrides)
        path = os.path.join(workdir, "runs", f"{label}_seed{seed}")
        every = int(config.study.get("exact_every", 0))
        record = {"config": _run_identity(run_config.to_dict()), "exact_every": every}
        done = _finished(path, record)
        if done is not None:  # A killed study loses only its unfinished runs.
            out[label] = done
            continue
        warm = run_config.agent.recipe.warm_start.steps
        if warm not in built:  # One warm start per (seed, length), shared by the arms.
            key = jax.random.split(jax.random.key(run_config.seed))[1]
            built[warm] = builder.build_agent(run_config, tasks, key, table=table)
        outcomes, _ = builder.make_outcomes(run_config, table=table)
        b = built[warm]
        start = time.perf_counter()
        summary = _train(run_config, path, outcomes, b, tasks, every)
        out[label] = (summary, time.perf_counter() - start)
        finished = {**record, "summary": summary, "wall": out[label][1]}
        distributed.write_on_primary(
            os.path.join(path, FINISHED), json.dumps(finished, default=float)
        )
    return seed, out


# A finished run's summary, beside its metrics; read back instead of training again.
FINISHED = "study_run.json"


def _finished(path: str, record: dict) -> tuple[dict, float] | None:
    """(summary, wall seconds) of the run at `path` if it finished with the same run
    config and exact evaluation; else None (it runs again from the start)."""
    try:
        with open(os.path.join(path, FINISHED), encoding="utf-8") as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    mine = json.loads(json.dumps(record, default=float))  # As it was written.
    if isinstance(done.get("config"), dict):  # Written before the identity left `study` out.
        done["config"] = _run_identity(done["config"])
    if {k: done.get(k) for k in mine} != mine:
        return None
    return done["summary"], float(done["wall"])


def _run_identity(config: dict) -> dict:
    """What makes a run the same run: its config without `study`, which names the set of
    runs (sweeps, seeds, arms) and is read by no run. A sweep grown by a column, or the
    paired study's arms rerun by the main one, reads the runs it already has back."""
    return {k: v for k, v in config.items() if k != "study"}


def _train(config, path: str, outcomes, built, tasks, every: int) -> dict:
    """One run from a copy of `built`'s params; its summary. With `every` > 0, the policy's
    exact expected values (`exact`) after every `every` updates and at the start."""
    hooks = [replay_oracle(outcomes)]
    values = None
    if every:
        values = exact.task_values(outcomes, tasks.train, tasks.heldout)
        hooks.append(exact.exact_hook(
            built.agent, lambda: trainer.state.params, outcomes, tasks.train, tasks.heldout,
            every=every, values=values,
        ))  # fmt: skip
    trainer = loop.Trainer(
        config, path, outcomes=outcomes, hooks=hooks,
        prebuilt=built._replace(params=jax.tree.map(lambda x: x.copy(), built.params)),
    )  # fmt: skip
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    if every:  # Step 0: the warm start every arm of the seed shares.
        summary["exact_start"] = exact.exact_metrics(
            built.agent, built.params, tasks.train, tasks.heldout, values
        )
    return summary


def _padded(rows: list[list[float]]) -> np.ndarray:
    """Ragged rows as an array [len(rows), longest], NaN after a shorter row's end."""
    out = np.full((len(rows), max(map(len, rows), default=0)), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = np.asarray(r, np.float64)
    return out


def _ledger_seconds(entries: list[dict], cost: CostModel | None, prefix: str = "") -> list[float]:
    """Measured compute (gen + WM + exec seconds) of each entry's cumulative ledger, or the
    modelled seconds of `cost`. `prefix` is "ledger/" for per-step metrics."""
    if cost is None:
        if prefix:
            return [e[f"{prefix}compute_seconds"] for e in entries]
        return [Ledger.from_dict({k: e[k] for k in Ledger._fields if k in e}).compute_seconds
                for e in entries]  # fmt: skip
    fields = Ledger._fields
    return [
        cost.seconds(Ledger(**{f: e.get(f"{prefix}{f}", 0.0) for f in fields})) for e in entries
    ]


def curves(summaries: Iterable[dict], cost: CostModel | None = None) -> dict[str, np.ndarray]:
    """Eval-point curves of shape [seeds, points]: steps, compute, execution seconds,
    executions, percentile; NaN after a run that stopped earlier than the longest.

    `compute` is the measured ledger (generation + WM + execution seconds), or
    `cost`'s modelled seconds when given.
    """
    hist = [s["history"] for s in summaries]
    field = lambda f: _padded([[h[f] for h in run] for run in hist])  # noqa: E731
    return {
        "step": field("step"),
        "compute": _padded([_ledger_seconds(run, cost) for run in hist]),
        "exec_seconds": field("exec_seconds"),
        "executions": field("executions"),
        "percentile": field("eval/heldout_percentile"),
    }


def step_compute(summaries: Iterable[dict], cost: CostModel | None = None) -> np.ndarray:
    """Cumulative compute after each step, [seeds, steps] (see `curves`)."""
    return _padded([_ledger_seconds(s["steps"], cost, "ledger/") for s in summaries])


def last_finite(x: np.ndarray) -> np.ndarray:
    """Each row's last finite value (NaN for a row without any)."""
    out = np.full(x.shape[0], np.nan)
    for i, row in enumerate(x):
        ok = np.flatnonzero(np.isfinite(row))
        if ok.size:
            out[i] = row[ok[-1]]
    return out


def step_series(summaries: Iterable[dict], key: str) -> np.ndarray:
    """A per-step metric of shape [seeds, steps] (NaN where absent, and after a run that
    stopped earlier than the longest, as budget-limited runs do)."""
    return _padded([[s.get(key, np.nan) for s in run["steps"]] for run in summaries])


def _nanstat(fn, x: np.ndarray):
    return float(fn(x)) if np.isfinite(x).any() else None


def _ratio(base_reach: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Per seed `base_reach / reach`; NaN where the run starts at or above the target."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reach > 0, base_reach / reach, np.nan)


def _reach(x: np.ndarray, y: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per seed (rows of x, y): the x at which y reaches that seed's target, by the studies'
    one definition (`analysis.reach`, interpolated between points); NaN: never."""
    out = analysis.reach_rows(x, y, targets)
    return np.where(np.isfinite(out), out, np.nan)


def _smooth(x: np.ndarray, window: int) -> np.ndarray:
    """`trailing_mean` that stays NaN where `x` is (after a run's end)."""
    return np.where(np.isfinite(x), trailing_mean(x, window), np.nan)


def _matched(
    base_x: np.ndarray, base_y: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The compute `baseline` needs for this run's final level, over this run's own (per seed).

    Returns (ratio, censored): where the baseline never reaches the level within
    its budget, ratio is the lower bound `baseline total / run's` and censored
    is True; NaN where the run ends at or below its start (no level to match).
    """
    level = last_finite(y)
    own = _reach(x, y, level)
    base = _reach(base_x, base_y, level)
    censored = ~np.isfinite(base)
    ratio = _ratio(np.where(censored, last_finite(base_x), base), own)
    ratio = np.where(level > y[:, 0], ratio, np.nan)
    return ratio, censored & np.isfinite(ratio)


def _matched_row(prefix: str, ratio: np.ndarray, censored: np.ndarray) -> dict:
    return {
        f"{prefix}matched_ratio": ratio.tolist(),
        f"{prefix}matched_censored": censored.tolist(),
        f"{prefix}matched_ratio_median": _nanstat(np.nanmedian, ratio),
        f"{prefix}matched_seeds": int(np.sum(np.isfinite(ratio))),
        f"{prefix}matched_never": int(np.sum(censored)),
    }


def _ratio_row(prefix: str, ratio: np.ndarray) -> dict:
    return {
        f"{prefix}": ratio.tolist(),
        f"{prefix}_median": _nanstat(np.nanmedian, ratio),
        f"{prefix}_min": _nanstat(np.nanmin, ratio),
        f"{prefix}_max": _nanstat(np.nanmax, ratio),
        f"{prefix}_seeds": int(np.sum(np.isfinite(ratio))),
    }


def _quarters(summaries: list[dict], keys: Iterable[str]) -> dict:
    """Per-step diagnostics averaged over the first and last quarter of the steps."""
    row = {}
    for key in keys:
        series = step_series(summaries, key)
        if np.isfinite(series).any():
            q = max(1, series.shape[1] // 4)
            row[f"{key}/first_quarter"] = _nanstat(np.nanmean, series[:, :q])
            row[f"{key}/last_quarter"] = _nanstat(np.nanmean, series[:, -q:])
    return row


# Per-step diagnostics a study row summarises (oracle metrics come from `replay_oracle`).
DIAGNOSTICS = (
    "oracle/fed_bias",
    "oracle/fed_error_var",
    "correction/rank_corr",
    "correction/sigma2_real",
    "correction/fused_weight_wm",
)
STREAMS = ("real", "wm", "fed")


def analyse(
    results: dict[str, list[dict]],
    *,
    smooth: int,
    baseline: str = "real",
    control: str = "anchors_only",
    cost: CostModel | None = None,
) -> dict:
    """Per run label: final percentile, compute-to-target and its ratios.

    Two iso-performance comparisons, on held-out and on training tasks: the
    compute at which each run reaches `baseline`'s final level (the paper's
    headline, `ratio_*`: baseline's compute over the run's), and the reverse,
    the compute `baseline` needs for each run's final level (`matched_*`; a
    lower bound where it never gets there). `ratio_vs_control_*`: `control`'s
    compute to reach `baseline`'s final held-out level over the run's (above 1:
    the run gets there with less compute than the control). Seeds pair up by
    position. Compute is the measured ledger, or `cost`'s modelled one.
    """
    c = {label: curves(summaries, cost) for label, summaries in results.items()}
    sm = {label: _smooth(cv["percentile"], smooth) for label, cv in c.items()}
    targets = last_finite(sm[baseline])  # Per seed.
    reach = {label: _reach(c[label]["compute"], sm[label], targets) for label in results}
    # The same on the training tasks: the true reward of the samples (replay knows
    # it), smoothed over steps, against the baseline's final value.
    train = {
        label: _smooth(step_series(summaries, "oracle/true_reward"), TRAIN_SMOOTH)
        for label, summaries in results.items()
    }
    train_x = {label: step_compute(summaries, cost) for label, summaries in results.items()}
    train_targets = last_finite(train[baseline])
    train_reach = {label: _reach(train_x[label], train[label], train_targets) for label in results}
    base = c[baseline]
    # Whether the baseline's held-out target is above its own start at all.
    above_start = bool(np.mean(targets) > np.mean(base["percentile"][:, 0]))
    out = {}
    for label, summaries in results.items():
        cv, n = c[label], len(summaries)
        final = last_finite(cv["percentile"])
        row = {
            "seeds": n,
            "heldout_before": float(np.mean(cv["percentile"][:, 0])),
            "heldout_final": float(np.mean(final)),
            "heldout_final_se": float(np.std(final, ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
            "heldout_final_seeds": final.tolist(),  # Paired over seeds by `analysis.paired`.
            "compute_total": float(np.mean(last_finite(cv["compute"]))),
            "exec_seconds_total": float(np.mean(last_finite(cv["exec_seconds"]))),
            # Charged executions are unique ones: the run's cache answers repeats (`cached`).
            "executions_total": float(np.mean(last_finite(cv["executions"]))),
            "updates": float(np.mean(last_finite(cv["step"]))),
            "reached": int(np.sum(np.isfinite(reach[label]))),
            "heldout_target_above_start": above_start,
        }
        row.update(_ratio_row("ratio", _ratio(reach[baseline], reach[label])))
        if control in reach:
            row.update(_ratio_row("ratio_vs_control", _ratio(reach[control], reach[label])))
            row["control_reached"] = int(np.sum(np.isfinite(reach[control])))
        row.update(_matched_row("", *_matched(base["compute"], sm[baseline], cv["compute"],
                                               sm[label])))  # fmt: skip
        t_ratio = _ratio(train_reach[baseline], train_reach[label])
        row.update(
            _matched_row(
                "train_",
                *_matched(train_x[baseline], train[baseline], train_x[label], train[label]),
            )  # fmt: skip
        )
        row.update(
            {
                "train_reward_start": float(np.mean(train[label][:, 0])),
                "train_reward_final": float(np.mean(last_finite(train[label]))),
                "train_reached": int(np.sum(np.isfinite(train_reach[label]))),
                "train_ratio_median": _nanstat(np.nanmedian, t_ratio),
            }
        )
        row["cached_executions"] = float(
            np.mean([s["history"][-1].get("cached", 0.0) for s in summaries])
        )
        row["wm_rank_corr"] = _nanstat(
            np.nanmean, step_series(summaries, "oracle/wm_oos_group_rank_corr")
        )
        for stream in STREAMS:  # On executed rows: is the fused reward below both streams?
            key = f"oracle/anchor_{stream}_error_var"
            row[f"anchor_{stream}_error_var"] = _nanstat(np.nanmean, step_series(summaries, key))
        # Which the fusion's weights assume to be 0: the real and WM errors' correlation.
        row["anchor_error_corr"] = _nanstat(
            np.nanmean, step_series(summaries, "oracle/anchor_error_corr")
        )
        row.update(_quarters(summaries, DIAGNOSTICS))
        out[label] = row
    return out
