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
  percentile first reaches the final smoothed percentile of `real` (per seed);
  the headline is `real / wmrl`;
* the bias and error variance of the rewards fed to GRPO (against each
  sample's true replayed reward), σ² estimates, fusion weights and the
  WM–real rank correlation, over training.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import jax
import ml_collections
import numpy as np

from wmrl_jax.studies.oracle import replay_oracle
from wmrl_jax.studies.smoothing import trailing_mean
from wmrl_jax.train import builder, loop
from wmrl_jax.train.config import override

# Policy updates in the moving average of the training samples' true reward.
TRAIN_SMOOTH = 5


def study_runs(config: ml_collections.ConfigDict) -> list[tuple[str, dict]]:
    """(label, overrides) of every run per seed: the arms, then the ρ and WM-quality sweeps."""
    s = config.study
    runs = [(arm, {"arm": arm}) for arm in s.arms]
    for rho in s.rho_sweep:
        if rho != config.anchor_fraction:
            runs.append((f"wmrl_rho{rho:g}", {"arm": "wmrl", "anchor_fraction": rho}))
    for warm in s.warm_sweep:
        if warm != config.agent.recipe.warm_start.steps:
            for arm in s.warm_sweep_arms:
                runs.append(
                    (f"{arm}_warm{warm}", {"arm": arm, "agent.recipe.warm_start.steps": warm})
                )
    return runs


def run_study(config: ml_collections.ConfigDict, workdir: str, *, log=print) -> dict:
    """Runs every (seed, run) pair; returns `{label: [summary per seed]}`."""
    tasks = builder.load_tasks(config)
    table = builder.load_table(config)
    runs = study_runs(config)
    results: dict[str, list[dict]] = {label: [] for label, _ in runs}
    for seed in range(config.study.num_seeds):
        built: dict[int, object] = {}
        for label, overrides in runs:
            run_config = override(config, seed=config.seed + seed, **overrides)
            warm = run_config.agent.recipe.warm_start.steps
            if warm not in built:  # One warm start per (seed, length), shared by the arms.
                key = jax.random.split(jax.random.key(run_config.seed))[1]
                built[warm] = builder.build_agent(run_config, tasks, key, table=table)
            outcomes, _ = builder.make_outcomes(run_config, table=table)
            b = built[warm]
            start = time.perf_counter()
            summary = loop.train_and_evaluate(
                run_config,
                os.path.join(workdir, "runs", f"{label}_seed{seed}"),
                outcomes=outcomes,
                prebuilt=b._replace(params=jax.tree.map(lambda x: x.copy(), b.params)),
                hooks=[replay_oracle(outcomes)],
            )
            results[label].append(summary)
            log(
                f"seed {seed} {label:>22}: held-out {summary['heldout_before']:.3f} -> "
                f"{summary['heldout_after']:.3f}, compute {summary['compute_seconds']:.0f} s, "
                f"{time.perf_counter() - start:.1f} s wall"
            )
    return results


def curves(summaries: Iterable[dict]) -> dict[str, np.ndarray]:
    """Eval-point curves of shape [seeds, points]: steps, compute, execution seconds, percentile."""
    hist = [s["history"] for s in summaries]
    field = lambda f: np.array([[h[f] for h in run] for run in hist], np.float64)  # noqa: E731
    return {
        "step": field("step"),
        "compute": field("gen_seconds") + field("wm_seconds") + field("exec_seconds"),
        "exec_seconds": field("exec_seconds"),
        "executions": field("executions"),
        "percentile": field("eval/heldout_percentile"),
    }


def first_reach(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """The first x at which y >= target (NaN if never)."""
    hit = np.flatnonzero(y >= target - 1e-12)
    return float(x[hit[0]]) if hit.size else float("nan")


def step_series(summaries: Iterable[dict], key: str) -> np.ndarray:
    """A per-step metric of shape [seeds, steps] (NaN where absent, and after a run that
    stopped earlier than the longest, as budget-limited runs do)."""
    rows = [[s.get(key, np.nan) for s in run["steps"]] for run in summaries]
    out = np.full((len(rows), max(map(len, rows), default=0)), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = np.asarray(r, np.float64)
    return out


def _nanstat(fn, x: np.ndarray):
    return float(fn(x)) if np.isfinite(x).any() else None


def _ratio(base_reach: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Per seed `base_reach / reach`; NaN where the run starts at or above the target."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(reach > 0, base_reach / reach, np.nan)


def _reach(x: np.ndarray, y: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per seed (rows of x, y): the first x at which y reaches that seed's target."""
    return np.array([first_reach(x[i], y[i], t) for i, t in enumerate(targets)])


def _matched(
    base_x: np.ndarray, base_y: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The compute `baseline` needs for this run's final level, over this run's own (per seed).

    Returns (ratio, censored): where the baseline never reaches the level within
    its budget, ratio is the lower bound `baseline total / run's` and censored
    is True; NaN where the run ends at or below its start (no level to match).
    """
    level = y[:, -1]
    own = _reach(x, y, level)
    base = _reach(base_x, base_y, level)
    censored = ~np.isfinite(base)
    ratio = _ratio(np.where(censored, base_x[:, -1], base), own)
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


def analyse(results: dict[str, list[dict]], *, smooth: int, baseline: str = "real") -> dict:
    """Per run label: final percentile, compute-to-target and its ratio to `baseline`.

    Two iso-performance comparisons, on held-out and on training tasks: the
    compute at which each run reaches `baseline`'s final level (the paper's
    headline, `ratio_*`), and the reverse, the compute `baseline` needs for each
    run's final level (`matched_*`; a lower bound where it never gets there).
    """
    base = curves(results[baseline])
    base_sm = trailing_mean(base["percentile"], smooth)
    targets = base_sm[:, -1]  # Per seed.
    base_reach = _reach(base["compute"], base_sm, targets)
    # The same on the training tasks: the true reward of the samples (replay knows
    # it), smoothed over steps, against the baseline's final value.
    base_train = trailing_mean(step_series(results[baseline], "oracle/true_reward"), TRAIN_SMOOTH)
    train_targets = base_train[:, -1]
    base_train_x = step_series(results[baseline], "ledger/compute_seconds")
    base_train_reach = _reach(base_train_x, base_train, train_targets)
    # Whether the baseline's held-out target is above its own start at all.
    above_start = bool(np.mean(targets) > np.mean(base["percentile"][:, 0]))
    out = {}
    for label, summaries in results.items():
        c = curves(summaries)
        sm = trailing_mean(c["percentile"], smooth)
        reach = _reach(c["compute"], sm, targets)
        reach_exec = _reach(c["exec_seconds"], sm, targets)
        ratio = _ratio(base_reach, reach)
        n = len(summaries)
        final = c["percentile"][:, -1]
        row = {
            "seeds": n,
            "heldout_before": float(np.mean(c["percentile"][:, 0])),
            "heldout_final": float(np.mean(final)),
            "heldout_final_se": float(np.std(final, ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
            "heldout_final_smoothed": float(np.mean(sm[:, -1])),
            "compute_total": float(np.mean(c["compute"][:, -1])),
            "exec_seconds_total": float(np.mean(c["exec_seconds"][:, -1])),
            "executions_total": float(np.mean(c["executions"][:, -1])),
            "reached": int(np.sum(np.isfinite(reach))),
            "compute_to_target": reach.tolist(),
            "exec_seconds_to_target": reach_exec.tolist(),
            "ratio_vs_baseline": ratio.tolist(),
            "ratio_median": _nanstat(np.nanmedian, ratio),
            "ratio_min": _nanstat(np.nanmin, ratio),
            "ratio_max": _nanstat(np.nanmax, ratio),
        }
        row.update(_matched_row("", *_matched(base["compute"], base_sm, c["compute"], sm)))
        train = trailing_mean(step_series(summaries, "oracle/true_reward"), TRAIN_SMOOTH)
        train_x = step_series(summaries, "ledger/compute_seconds")
        t_reach = _reach(train_x, train, train_targets)
        t_ratio = _ratio(base_train_reach, t_reach)
        row.update(_matched_row("train_", *_matched(base_train_x, base_train, train_x, train)))
        row.update(
            {
                "train_reward_start": float(np.mean(train[:, 0])),
                "train_reward_final": float(np.mean(train[:, -1])),
                "train_reached": int(np.sum(np.isfinite(t_reach))),
                "train_ratio_vs_baseline": t_ratio.tolist(),
                "train_ratio_median": _nanstat(np.nanmedian, t_ratio),
                "heldout_target_above_start": above_start,
            }
        )
        # Charged executions are unique ones: the run's cache answers repeats (`cached`).
        row["unique_executions"] = row["executions_total"]
        cached = [s.get("ledger", {}).get("cached", 0.0) for s in summaries]
        row["cached_executions"] = float(np.mean(cached))
        rank = step_series(summaries, "oracle/wm_oos_group_rank_corr")
        row["wm_rank_corr"] = _nanstat(np.nanmean, rank)
        for key in ("oracle/fed_bias", "oracle/fed_error_var", "correction/rank_corr"):
            series = step_series(summaries, key)
            if np.isfinite(series).any():
                q = max(1, series.shape[1] // 4)
                row[f"{key}/first_quarter"] = float(np.nanmean(series[:, :q]))
                row[f"{key}/last_quarter"] = float(np.nanmean(series[:, -q:]))
        out[label] = row
    return out
