"""The embodied study: every (task, arm, seed) run at an equal simulator-step budget, analysed.

`run_study` runs them (in ``workers`` processes: MuJoCo steps on one core each)
and `analyse` turns the curves into the headline: for each task, the number of
simulator steps each arm needs to reach `real`'s final success rate (the mean
over seeds at the full budget), and the ratio real / arm, with a bootstrap
interval over seeds. Reaching a target is the studies' one definition
(`wmrl_jax.studies.analysis.reach`: the first crossing of the linearly
interpolated seed-mean curve); an arm that never reaches the target gets no
ratio ("never"), and a target that `real` does not raise above its own start
makes no ratio measurable at all.

Example (a few seconds):
  >>> from wmrl_jax.embodied import config as cfg_lib
  >>> runs = {"reacher": cfg_lib.run_config("reacher", budget=2000, eval_points=1)}
  >>> results = run_study(runs, arms=("real",), seeds=(0,), workers=1)
  >>> analyse(results)["reacher"]["real"]["final_mean"] >= 0.0
  True
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping, Sequence

import ml_collections
import numpy as np

from wmrl_jax.embodied import train
from wmrl_jax.studies.analysis import reach


def _run_one(args) -> tuple:
    task, config_dict, arm, seed = args
    config = ml_collections.ConfigDict(config_dict)
    return task, arm, seed, train.run_arm(config, arm=arm, seed=seed)


def run_study(
    runs: Mapping[str, ml_collections.ConfigDict],
    *,
    arms: Sequence[str],
    seeds: Sequence[int],
    workers: int = 2,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Runs every arm and seed on every task.

    Args:
      runs: task name -> run config (`wmrl_jax.embodied.config.run_config`).
      arms: arm names (keys of `wmrl_jax.embodied.arms.ARMS`).
      seeds: run seeds, the same for every arm.
      workers: processes; 1 runs in this process.
      log: called with one line per finished run.

    Returns:
      ``{task: {"config": dict, "arms": {arm: [run result per seed]}}}``.
    """
    jobs = [(task, c.to_dict(), arm, s) for task, c in runs.items() for arm in arms for s in seeds]
    results = {t: {"config": c.to_dict(), "arms": {a: {} for a in arms}} for t, c in runs.items()}

    def collect(item):
        task, arm, seed, out = item
        results[task]["arms"][arm][seed] = out
        final = out["curve"][-1]
        log(
            f"{task}/{arm}/seed {seed}: success {final['success']:.2f}, "
            f"{out['updates']} updates, {out['wall_seconds']:.0f}s"
        )

    if workers <= 1:
        for job in jobs:
            collect(_run_one(job))
    else:
        # Spawned workers: JAX and MuJoCo do not survive a fork of a process using them.
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for item in pool.imap_unordered(_run_one, jobs):
                collect(item)
    for task in results:
        for arm in arms:
            by_seed = results[task]["arms"][arm]
            results[task]["arms"][arm] = [by_seed[s] for s in seeds]
    return results


def _curves(runs: list) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([p["sim_steps"] for p in runs[0]["curve"]], np.float64)
    y = np.array([[p["success"] for p in r["curve"]] for r in runs], np.float64)
    return x, y


def _ratio(x, real_y, arm_y, fraction) -> float:
    target = fraction * real_y[:, -1].mean()
    real_steps = reach(x, real_y.mean(0), target)
    arm_steps = reach(x, arm_y.mean(0), target)
    return real_steps / arm_steps if np.isfinite(arm_steps) and arm_steps > 0 else 0.0


def _target_stats(x, real_y, y, fraction, rng, bootstrap, measurable) -> dict:
    """Steps for the arm's seed-mean to reach ``fraction`` x real's final; the ratio."""
    target = fraction * float(real_y[:, -1].mean())
    steps = reach(x, y.mean(0), target)
    real_steps = reach(x, real_y.mean(0), target)
    ratios = []
    for _ in range(bootstrap if measurable else 0):
        ry = real_y[rng.integers(0, real_y.shape[0], real_y.shape[0])]
        ay = y[rng.integers(0, y.shape[0], y.shape[0])]
        ratios.append(_ratio(x, ry, ay, fraction))
    finite = measurable and np.isfinite(steps)
    return {
        "target": target,
        "steps": steps,
        "ratio": real_steps / max(steps, 1.0) if finite else None,
        "ratio_lo": float(np.percentile(ratios, 10)) if ratios else None,
        "ratio_hi": float(np.percentile(ratios, 90)) if ratios else None,
        "seeds_reaching": int(sum(np.isfinite(reach(x, yi, target)) for yi in y)),
    }


def analyse(results: dict, *, bootstrap: int = 1000, seed: int = 0) -> dict:
    """Per task and arm: curves, final success, steps and ratio to reach `real`'s final.

    The headline target is `real`'s final success (mean over seeds at the full
    budget); a second, at 90% of it, is less brittle where `real` saturates
    (at 1.0 a single failed evaluation episode misses the target). The
    interval of a ratio is the 10th-90th percentile over bootstrap resamples
    of the seeds (of `real` and of the arm independently); a resample in which
    the arm does not reach the target counts as ratio 0.

    Returns:
      ``{task: {arm: {...}}}`` with, per arm: ``steps`` [P], ``mean`` and
      ``se`` [P] (success over seeds), ``start_mean``, ``final_mean``,
      ``final_se``, ``measurable`` (real's final is above its start),
      ``at_final`` and ``at_90`` (each: ``target``, ``steps`` (inf: never),
      ``ratio`` (None: never or not measurable), ``ratio_lo``, ``ratio_hi``,
      ``seeds_reaching``), ``updates``, ``wm_rank_corr``, and the mean ledger.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for task, entry in results.items():
        arms = entry["arms"]
        x, real_y = _curves(arms["real"])
        measurable = bool(real_y[:, -1].mean() > real_y[:, 0].mean())
        out[task] = {}
        for arm, runs in arms.items():
            _, y = _curves(runs)
            n = y.shape[0]
            ledgers = [r["ledger"] for r in runs]
            corr = [r["wm_rank_corr"] for r in runs if np.isfinite(r["wm_rank_corr"])]
            out[task][arm] = {
                "steps": x.tolist(),
                "mean": y.mean(0).tolist(),
                "se": (y.std(0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(x)).tolist(),
                "start_mean": float(y[:, 0].mean()),
                "final_mean": float(y[:, -1].mean()),
                "final_se": float(y[:, -1].std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
                "measurable": measurable,
                "at_final": _target_stats(x, real_y, y, 1.0, rng, bootstrap, measurable),
                "at_90": _target_stats(x, real_y, y, 0.9, rng, bootstrap, measurable),
                "seeds": n,
                "updates": float(np.mean([r["updates"] for r in runs])),
                "wm_rank_corr": float(np.mean(corr)) if corr else None,
                "ledger": {k: float(np.mean([lg[k] for lg in ledgers])) for k in ledgers[0]},
            }
    return out
