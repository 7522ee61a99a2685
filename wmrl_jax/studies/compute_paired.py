"""The compute study's paired analysis of the exact curves (`wmrl_jax.studies.exact`).

Each run records the policy's exact expected held-out percentile and train
reward after every update (and at its start, the shared warm start), so its
curves carry no evaluation noise and are dense in compute. On them:

* the final level: a trailing mean over the last `smooth` updates;
* compute-to-target: where the smoothed curve first reaches the baseline's
  final level of the same seed (`analysis.reach`, interpolated between
  updates), with the seeds that never reach it counted as such;
* paired differences of the final level against the baseline and the
  control, seed by seed (the seeds share their warm start and keys), with a
  Student-t interval and a verdict against the equivalence margin declared
  in the config (`analysis.equivalence`). A variant is compared with the
  baseline's or control's run of the same variant where the study ran one
  (`wmrl_warm600` with `real_warm600` and `anchors_only_warm600`: the same
  longer warm start), else with the plain one.
"""

from __future__ import annotations

import functools

import numpy as np

from wmrl_jax.studies import analysis
from wmrl_jax.studies.compute import last_finite, step_compute, step_series
from wmrl_jax.studies.smoothing import trailing_mean
from wmrl_jax.train.cost import CostModel

KEYS = ("heldout_percentile", "train_reward")


def has_exact(results: dict) -> bool:
    """Every run of `results` recorded the exact values (`config.study.exact_every`)."""
    return all("exact_start" in s for runs in results.values() for s in runs)


def exact_curves(summaries: list[dict], key: str, cost: CostModel | None = None):
    """(compute, value) of shape [seeds, 1 + steps]: the start (compute 0) and every step;
    NaN where a step was not evaluated and after a run's end."""
    x = step_compute(summaries, cost)
    y = step_series(summaries, f"exact/{key}")
    start = np.array([s["exact_start"][f"exact/{key}"] for s in summaries], np.float64)
    zeros = np.zeros((len(summaries), 1))
    return np.concatenate([zeros, x], 1), np.concatenate([start[:, None], y], 1)


def smoothed(y: np.ndarray, window: int) -> np.ndarray:
    """A trailing mean of each row over `window` points, NaN where `y` is NaN."""
    return np.where(np.isfinite(y), trailing_mean(y, window), np.nan)


def _ratio_cells(base: np.ndarray, own: np.ndarray) -> dict:
    """Per seed base / own compute-to-target, where both reach it and own > 0."""
    ok = np.isfinite(base) & np.isfinite(own) & (own > 0)
    ratio = np.where(ok, base / np.where(ok, own, 1.0), np.nan)
    finite = ratio[np.isfinite(ratio)]
    return {
        "ratio": [analysis.finite(r) for r in ratio],
        "ratio_median": float(np.median(finite)) if finite.size else None,
        "ratio_lo": float(np.min(finite)) if finite.size else None,
        "ratio_hi": float(np.max(finite)) if finite.size else None,
        "ratio_seeds": int(finite.size),
    }


def matched(label: str, other: str, labels) -> str:
    """`other` with `label`'s variant suffix where `labels` hold that run, else `other`.

    `matched("wmrl_warm600", "anchors_only", ...)` is `anchors_only_warm600` when the
    study ran it: a variant that changes what every arm starts from is compared with
    the control that starts there too. A run is never matched with itself.
    """
    for i, char in enumerate(label):
        if char == "_" and (own := other + label[i:]) in labels and own != label:
            return own
    return other


def analyse_exact(
    results: dict[str, list[dict]],
    *,
    margin: float,
    smooth: int = 5,
    baseline: str = "real",
    control: str = "anchors_only",
    cost: CostModel | None = None,
    level: float = 0.9,
) -> dict:
    """Per run label: exact start and final levels, compute-to-target and paired differences.

    Returns `{"margin", "level", "smooth", "baseline", "control", "rows": {label: row}}`;
    a row's `vs_<baseline>` / `vs_<control>` hold `analysis.Paired.to_dict()` of the
    final held-out percentile (run − other), its `verdict` against `margin` and the run
    it was compared with (`against`: the baseline's or control's run of the same
    variant where there is one, `matched`).
    """
    finals, rows = {}, {}
    curves = {label: exact_curves(s, "heldout_percentile", cost) for label, s in results.items()}
    for label, (_, y) in curves.items():
        finals[label] = last_finite(smoothed(y, smooth))

    @functools.cache  # A baseline's own reach serves every run matched with it.
    def reach(label: str, target: str) -> np.ndarray:
        x, y = curves[label]
        return analysis.reach_rows(x, smoothed(y, smooth), finals[target])

    for label, summaries in results.items():
        _, train_y = exact_curves(summaries, "train_reward", cost)
        x, y = curves[label]
        row = {
            "seeds": len(summaries),
            "heldout_start": float(np.mean(y[:, 0])),
            "heldout_final": float(np.mean(finals[label])),
            "heldout_final_seeds": finals[label].tolist(),
            "train_start": float(np.mean(train_y[:, 0])),
            "train_final": float(np.mean(last_finite(smoothed(train_y, smooth)))),
        }
        # To the final level of the baseline's run of the same variant where there is one.
        base = matched(label, baseline, finals)
        own = reach(label, base)
        row.update(
            to_target=[analysis.finite(r) for r in own],
            reached=int(np.sum(np.isfinite(own))),
            compute_total=float(np.mean(last_finite(x))),
            target=base,
            **_ratio_cells(reach(base, base), own),
        )
        for other in (baseline, control):
            against = matched(label, other, finals)
            if against in finals and against != label:
                p = analysis.paired(finals[label], finals[against], level=level)
                row[f"vs_{other}"] = {
                    **p.to_dict(), "verdict": analysis.equivalence(p, margin), "against": against,
                }  # fmt: skip
        rows[label] = row
    return {
        "margin": margin, "level": level, "smooth": smooth, "baseline": baseline,
        "control": control, "rows": rows,
    }  # fmt: skip


def best_real(exact: dict, prefix: str = "real") -> str:
    """The `real` run (the baseline or a sweep cell, labels starting with `prefix`) with
    the highest mean final exact held-out percentile."""
    cells = {k: r for k, r in exact["rows"].items() if k.startswith(prefix)}
    if not cells:
        raise ValueError(f"no run labelled {prefix}* in the exact analysis")
    return max(cells, key=lambda k: cells[k]["heldout_final"])


def _diff_cell(row: dict, other: str) -> str:
    d = row.get(f"vs_{other}")
    if d is None:
        return "—"
    n = f"n = {d['n']}" + (f", against `{a}`" if (a := d.get("against", other)) != other else "")
    if d["lo"] is None:
        return f"{d['mean']:+.3f} ({n})" if d["mean"] is not None else "—"
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] {d['verdict']} ({n})"


def format_exact_table(exact: dict) -> str:
    """One markdown table of `analyse_exact`'s rows."""
    base, control = exact["baseline"], exact["control"]
    lines = [
        f"| run | exact held-out percentile, start → final | exact train reward, final "
        f"| `{base}` / run, compute to `{base}`'s final (median [min, max], seeds) "
        f"| run − `{base}` (90% t interval) | run − `{control}` (90% t interval) |",
        "|---|---|---|---|---|---|",
    ]
    for label, row in exact["rows"].items():
        target = row.get("target", base)
        against = f", against `{target}`" if target != base else ""
        ratio = (
            f"{row['ratio_median']:.2f}× [{row['ratio_lo']:.2f}, {row['ratio_hi']:.2f}] "
            f"({row['ratio_seeds']}/{row['seeds']}{against})"
            if row["ratio_median"] is not None
            else f"never ({row['reached']}/{row['seeds']} reach it{against})"
        )
        lines.append(
            f"| {label} | {row['heldout_start']:.3f} → {row['heldout_final']:.3f} "
            f"| {row['train_final']:.3f} | {ratio} | {_diff_cell(row, base)} "
            f"| {_diff_cell(row, control)} |"
        )
    return "\n".join(lines)


def exact_lines(exact: dict) -> list[str]:
    """The headline's sentences on the exact, paired comparison (`wmrl` and `real_best`)."""
    rows, control = exact["rows"], exact["control"]
    n = min(r["seeds"] for r in rows.values())
    lines = [
        f"Exact, paired: the policy's expected held-out percentile (its sampling distribution "
        f"times the recorded table, after every update), final level over the last "
        f"{exact['smooth']} updates, compared seed by seed ({n} seeds, "
        f"{exact['level']:.0%} Student-t interval; equivalence margin ±{exact['margin']:g}, "
        "declared before the runs)."
    ]
    for label in ("wmrl", "real_best", *(k for k in rows if k.startswith("wmrl_"))):
        row = rows.get(label)
        if row is None or f"vs_{control}" not in row:
            continue
        d = row[f"vs_{control}"]
        if d["lo"] is None:
            continue
        lines.append(
            f"`{label}` − `{d.get('against', control)}`: "
            f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]: "
            f"**{d['verdict']}**."
        )
    return lines
