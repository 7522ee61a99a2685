"""The compute study's command: run (or extend) it, analyse, and render its report.

`run_and_report` runs the study (`wmrl_jax.studies.compute`), writes
``results.json`` (the config, every run's eval points and steps, the
analyses), ``table.md`` and ``study_compute.png``, and, with a README or a
docs page, replaces the study section of ``docs/compute_study.md`` (between
its ``<!-- study:begin -->`` / ``<!-- study:end -->`` markers) with the
headline, the tables and the plot, and the README's ``study-headline``
section with the headline's answer, so neither carries hand-typed numbers.

With ``extend``, only the runs ``results.json`` does not hold yet run
(arms or variants added to the config since), and all are reported together.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time

import ml_collections
from absl import logging

from wmrl_jax.readme import HEADLINES, report_paths, write_report
from wmrl_jax.studies import analysis, report
from wmrl_jax.studies import compute as study
from wmrl_jax.studies import compute_paired as paired
from wmrl_jax.train import cost
from wmrl_jax.train.summary import write_json

SECTION = "study"  # <!-- study:begin --> in docs/compute_study.md, study-headline in the README.


def section_of(config) -> str:
    """The docs section a study writes: `config.study.section` (the real sweep and the paired
    study have their own on the same page, and no README headline), else `SECTION`."""
    return config["study"].get("section", SECTION)


# The arms beyond the paper, each with the idea it adds to `wmrl`.
BEYOND = {
    "wmrl_memory": "anchor memory",
    "wmrl_local": "the local correction",
    "wmrl_active": "active anchors",
    "wmrl_plus": "all three",
    "wmrl_adaptive": "adaptive ρ",
}
# Settings that may differ between a study and its extension: which runs, how many at once.
# Settings that only add or drop runs (and the process count): an extension may change them
# as long as every earlier run keeps its label and its overrides.
_EXTENDABLE = (
    "arms", "workers", "variants", "rho_sweep", "warm_sweep", "warm_sweep_arms",
    "real_sweep_groups", "real_sweep_lr", "best_real", "regime_arms",
)  # fmt: skip


def _flat(tree: dict, prefix: str = "") -> dict:
    """`{"a.b": leaf}` of a nested dict, leaves through a JSON round trip (tuples → lists)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.loads(json.dumps(v))
    return out


def earlier_runs(config, workdir: str) -> tuple[dict, float]:
    """The runs of `workdir/results.json` and their wall seconds, for `--extend`.

    Every setting the earlier study had must be unchanged, but those that only
    list runs (`_EXTENDABLE`: arms, sweeps, variants) and `study.workers`;
    every earlier run must still be one, with the same overrides. Settings
    added since (new options, whose defaults keep the earlier behaviour) are
    logged, not refused.

    Raises:
      ValueError: the earlier study ran with another config, naming the settings.
    """
    with open(os.path.join(workdir, "results.json")) as f:
        earlier = json.load(f)
    now, then = _flat(config.to_dict()), _flat(earlier["config"])
    free = {f"study.{k}" for k in _EXTENDABLE}
    changed = sorted(k for k in then if k not in free and now.get(k, then[k]) != then[k])
    gone = sorted(k for k in then if k not in now and k not in free)
    kept = dict(study.study_runs(config))
    for label, overrides in study.study_runs(ml_collections.ConfigDict(earlier["config"])):
        if json.loads(json.dumps(kept.get(label))) != json.loads(json.dumps(overrides)):
            gone.append(f"run {label}")
    if changed or gone:
        raise ValueError(
            f"--extend: {workdir}/results.json ran with another config "
            f"(changed: {changed or 'none'}; no longer settings: {gone or 'none'}); "
            "rerun the whole study"
        )
    added = sorted(k for k in now if k not in then)
    if added:
        logging.info("--extend: settings added since the earlier study: %s", ", ".join(added))
    return earlier["runs"], earlier["wall_seconds"]


def run_and_report(
    config, workdir: str, readme: str | None = None, docs: str | None = None, extend: bool = False
) -> dict:
    """Runs the study, writes its outputs, optionally updates the docs page and the README's
    headline (`render`); returns the analysis.

    With `extend`, only the runs `workdir/results.json` lacks (`earlier_runs`).
    """
    report_paths(section_of(config), readme, docs)  # Missing pages fail now, not after it.
    start = time.perf_counter()
    runs, earlier_wall = earlier_runs(config, workdir) if extend else ({}, 0.0)
    results = study.run_study(config, workdir, log=logging.info, skip=runs)
    os.makedirs(workdir, exist_ok=True)
    # Every eval point and every step's metrics: what `render` plots from.
    runs.update(
        {
            k: [
                {
                    key: s[key]
                    for key in ("history", "steps", "exact_start", "wall_seconds")
                    if key in s
                }
                for s in v
            ]
            for k, v in results.items()
        }
    )
    labels = [label for label, _ in study.study_runs(config)]
    runs = {label: runs[label] for label in labels}
    payload = {
        "config": config.to_dict(),
        "wall_seconds": earlier_wall + time.perf_counter() - start,
        "runs": runs,
    }
    results = runs
    payload.update(analyses(results, config))
    write_json(os.path.join(workdir, "results.json"), payload)
    render(workdir, readme, docs)
    return payload["analysis"]


def analyses(results: dict, config) -> dict:
    """The analysis under the measured ledger, under the modelled one (`config.cost_model`),
    and the modelled one over the model sizes of `config.study.cost_sweep`."""
    smooth = config.study.smooth
    out = {"analysis": study.analyse(results, smooth=smooth)}
    if paired.has_exact(results) and "real" in results:
        out["exact"] = paired.analyse_exact(
            results, margin=config.study.margin, smooth=config.study.exact_smooth
        )
        if any(label.startswith("real_g") for label in results):  # The real sweep's pick.
            out["best_real"] = paired.best_real(out["exact"])
    model = cost.from_config(config)
    if model is not None:
        out["analysis_modelled"] = study.analyse(results, smooth=smooth, cost=model)
        out["break_even"] = {
            str(n): study.analyse(
                results, smooth=smooth, cost=dataclasses.replace(model, params=float(n))
            )
            for n in config.study.cost_sweep
        }
    return out


def _compare(a: dict, b: dict, few: bool) -> tuple[float, float, str]:
    """Final held-out difference a − b, its standard error, and where a ends relative to b
    in words. Paired over seeds where both rows hold their seeds' finals
    (`analysis.paired`: "level with" while the 90% t interval holds 0); else, for an
    earlier study's rows, unpaired ("level with": within two standard errors)."""
    if few:
        return a["heldout_final"] - b["heldout_final"], 0.0, "(one seed) beside"
    if "heldout_final_seeds" in a and "heldout_final_seeds" in b:
        p = analysis.paired(a["heldout_final_seeds"], b["heldout_final_seeds"])
        side = "above" if p.lo > 0 else "below" if p.hi < 0 else "level with"
        return p.mean, p.se, side
    diff = a["heldout_final"] - b["heldout_final"]
    se = math.hypot(a["heldout_final_se"], b["heldout_final_se"])
    return diff, se, "level with" if abs(diff) <= 2 * se else ("above" if diff > 0 else "below")


def headline(analysis: dict) -> str:
    """The docs page's headline: two questions answered in words, from the analysis alone."""
    return " ".join(_headline_lines(analysis))


def short_headline(analysis: dict) -> str:
    """The README's headline: the two questions and the aim (`headline`'s sentences on them),
    and, where `wmrl` does not end above `anchors_only`, that the world model does not pay."""
    lines = _headline_lines(analysis)
    short = [line for line in lines if line.startswith(("**", "Our aim"))]
    real, wmrl, control = analysis["real"], analysis["wmrl"], analysis.get("anchors_only")
    if control is not None and _compare(wmrl, control, real["seeds"] < 2)[2] in (
        "level with",
        "below",
    ):
        short.append(
            "The world model does not pay for itself on this benchmark: `wmrl` does not end "
            "above `anchors_only`, which executes the same groups and trains on nothing else."
        )
    return " ".join(short)


def _headline_lines(analysis: dict) -> list[str]:
    """The headline's sentences, in order (`headline`, `short_headline`)."""
    real, wmrl = analysis["real"], analysis["wmrl"]
    control = analysis.get("anchors_only")
    gain = real["heldout_final"] - real["heldout_before"]
    gain_se = real["heldout_final_se"]
    few = real["seeds"] < 2  # No standard error: no claim rests on one seed.
    lines = [
        f"`real` moves the held-out percentile from {real['heldout_before']:.3f} to "
        f"{real['heldout_final']:.3f}"
        + (
            " (one seed: no error bars, so nothing below is a claim)."
            if few
            else f" (± {gain_se:.3f}, s.e. of the final level over seeds): "
            + (
                "more than two standard errors, so its final level is a target worth reaching."
                if gain > 2 * gain_se
                else "not more than two standard errors, so the held-out target is weak."
            )
        )
    ]
    if not real["heldout_target_above_start"]:
        lines.append(
            "**How much less compute does `wmrl` need than `real`?** Not measurable: `real` "
            "ends no higher on the held-out tasks than it starts."
        )
    elif wmrl["ratio_median"] is None:
        lines.append(
            "**How much less compute does `wmrl` need than `real` to reach `real`'s final "
            f"held-out level?** `wmrl` does not reach it within the same compute on any seed "
            f"(it ends at {wmrl['heldout_final']:.3f} ± {wmrl['heldout_final_se']:.3f})."
        )
    else:
        lines.append(
            "**How much less compute does `wmrl` need than `real` to reach `real`'s final "
            f"held-out level?** `real` needs **{report.ratio_cell(wmrl, 'ratio')}** the compute "
            "of `wmrl` (median [min, max] over the seeds where both get there)."
        )
    if control is not None:
        diff, se, side = _compare(wmrl, control, few)
        lines.append(
            f"**Does it beat `anchors_only`?** At the same compute `wmrl` ends {side} "
            f"`anchors_only` on the held-out tasks ({wmrl['heldout_final']:.3f} vs "
            f"{control['heldout_final']:.3f}, difference {diff:+.3f} ± {se:.3f}); "
            f"`anchors_only` needs {report.ratio_cell(wmrl, 'ratio_vs_control')} the compute "
            "of `wmrl` to reach `real`'s final level"
            + (
                "."
                if control["ratio_median"] is not None
                else " (`anchors_only` never gets there)."
            )
        )
        won = (
            not few
            and wmrl["ratio_median"] is not None
            and wmrl["ratio_median"] >= 3
            and side == "above"
        )
        lines.append(
            "Our aim, ≥ 3× against `real` and a clear win over `anchors_only`: "
            + ("**met**." if won else "**not met** on this benchmark.")
        )
    for arm, idea in BEYOND.items():
        row = analysis.get(arm)
        if row is None:
            continue
        diff, se, side = _compare(row, wmrl, few)
        line = (
            f"`{arm}` ({idea}) ends {side} `wmrl` ({row['heldout_final']:.3f} "
            f"vs {wmrl['heldout_final']:.3f}, {diff:+.3f} ± {se:.3f})"
        )
        if control is not None:
            diff, se, side = _compare(row, control, few)
            line += f" and {side} `anchors_only` ({diff:+.3f} ± {se:.3f})"
        lines.append(line + f"; `real` needs {report.ratio_cell(row, 'ratio')} its compute.")
    lines += _variant_lines(analysis, few)
    fused, real_err, wm_err = (wmrl.get(f"anchor_{s}_error_var") for s in ("fed", "real", "wm"))
    if None not in (fused, real_err, wm_err):
        below = fused < min(real_err, wm_err)
        lines.append(
            f"Fusion on executed rows: error variance against the replicate mean {fused:.4f} "
            f"(fed) vs {real_err:.4f} (real) and {wm_err:.4f} (debiased WM): "
            + ("below both streams" if below else "not below both streams")
            + (f"; the real and WM errors correlate {corr:+.2f} (mean over steps)."
               if (corr := wmrl.get("anchor_error_corr")) is not None else ".")
        )  # fmt: skip
    return lines


def _variant_lines(analysis: dict, few: bool) -> list[str]:
    """A sentence per `wmrl` variant (a sweep or a named variant, `wmrl_*` beyond the arms):
    its WM rank correlation, and where it ends against `wmrl` and against its control
    (`anchors_only` of the same variant where the study ran one, `compute_paired.matched`,
    else `anchors_only`)."""
    wmrl, lines = analysis["wmrl"], []
    for label, row in analysis.items():
        if not label.startswith("wmrl_") or label in BEYOND:
            continue
        control = paired.matched(label, "anchors_only", analysis)
        control = control if control in analysis else None
        corr = row.get("wm_rank_corr")
        diff, se, side = _compare(row, wmrl, few)
        line = f"`{label}`" + (
            f" (WM rank correlation {corr:.2f}, `wmrl` {wmrl['wm_rank_corr']:.2f})"
            if corr is not None and wmrl.get("wm_rank_corr") is not None
            else ""
        )
        line += f" ends {side} `wmrl` ({diff:+.3f} ± {se:.3f})"
        if control is not None:
            diff, se, side = _compare(row, analysis[control], few)
            line += f" and {side} `{control}` ({diff:+.3f} ± {se:.3f})"
        lines.append(line + ".")
    return lines


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> None:
    """Tables, the plot (and the docs page's section, the README's headline) from
    `workdir/results.json`; `docs` defaults to the study's page beside `readme`."""
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    config, analysis = payload["config"], payload["analysis"]
    section = section_of(config)
    readme, docs = report_paths(section, readme, docs)
    if section not in HEADLINES:  # Its docs section only.
        readme = None
    arms = list(config["study"]["arms"])
    plot = os.path.join(workdir, "study_compute.png")
    report.plot_compute_study(payload["runs"], arms, plot, step_series=study.step_series)
    sweeps = [label for label in analysis if label not in arms]
    table = report.format_study_table(analysis, arms)
    parts, sweep_table = [table], None
    if sweeps:
        sweep_table = report.format_study_table(
            analysis, [a for a in ("wmrl", "anchors_only", "real") if a in analysis] + sweeps
        )
        parts += ["", sweep_table]
    exact = payload.get("exact")
    if exact is not None:  # The exact, paired comparison (and the real sweep's pick).
        parts += ["", paired.format_exact_table(exact)]
        if "best_real" in payload:
            parts += ["", f"Best `real` cell (highest final exact held-out percentile on these "
                          f"seeds): `{payload['best_real']}`."]  # fmt: skip
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write("\n".join(parts) + "\n")
    print("\n".join(parts))
    if docs is None:  # Neither --readme nor --docs.
        return
    # The plot beside the docs page, which links it by name (one per section).
    image = "study_compute.png" if section == SECTION else f"study_compute_{section}.png"
    shutil.copy(plot, os.path.join(os.path.dirname(os.path.abspath(docs)), image))
    budget = config["budget"]["compute_seconds"]
    body = [
        f"`python -m experiments.study_compute` ({config['study']['num_seeds']} seeds; every "
        f"run spends the same measured compute, {budget:.0f} s of generation + WM + execution, "
        f"evaluated at {config['budget']['eval_points']} equal steps of it, or stops at "
        f"{config['num_steps']} updates; {_wall_minutes(payload):.0f} min of runs on this CPU).",
        "",
        headline(analysis) if "wmrl" in analysis else _sweep_line(payload),
        *(["", " ".join(paired.exact_lines(exact))] if exact is not None else []),
        "",
        "Measured ledger:",
        "",
        table,
    ]
    if "analysis_modelled" in payload:
        cm = config["cost_model"]
        body += [
            "",
            f"Modelled ledger (a model, not a measurement): the same runs charged as an LLM "
            f"agent of N = {cm['params'] / 1e9:g}B parameters on {cm['accelerator']} at "
            f"{cm['mfu']:.0%} MFU would be, {cm['sample_tokens']:.0f} tokens per sample, "
            f"{cm['wm_tokens']:.0f} per world-model score and {cm['train_tokens']:.0f} per "
            "trained row (2·N FLOPs per forward token, 6·N per trained token), plus the "
            "measured execution seconds:",
            "",
            report.format_study_table(payload["analysis_modelled"], arms),
        ]
    if "analysis_modelled" in payload and "wmrl" in analysis:
        body += [
            "",
            "Where the world model pays for itself, over the model size N (modelled ledger):",
            "",
            report.format_break_even({float(n): a for n, a in payload["break_even"].items()}),
        ]
    if sweeps:
        body += ["", "Sweeps and variants (beside `wmrl` and its controls):", "", sweep_table]
    if exact is not None:
        body += ["", "Exact expected values, paired over seeds:", "",
                 paired.format_exact_table(exact)]  # fmt: skip
    body += ["", f"![compute study]({image})"]
    said = short_headline(analysis) if readme is not None else ""
    write_report(section, "\n".join(body), said, readme=readme, docs=docs)


def _wall_minutes(payload: dict) -> float:
    """The study's wall minutes: its runs' own, summed (runs read back from an earlier,
    interrupted invocation included), else the last invocation's."""
    walls = [r.get("wall_seconds") for runs in payload["runs"].values() for r in runs]
    if walls and all(w is not None for w in walls):
        return sum(walls) / 60
    return payload["wall_seconds"] / 60


def _sweep_line(payload: dict) -> str:
    """What a study without `wmrl` (the real sweep) says in place of the arms' headline."""
    cells = [label for label in payload["analysis"] if label.startswith("real")]
    pick = payload.get("best_real")
    said = f"{len(cells)} `real` cells"
    return said + (f"; the declared rule picks `{pick}`." if pick else ".")
