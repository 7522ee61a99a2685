"""The world-model probe's report in markdown, from its `results.json` payload.

Every number comes from the payload (`wmrl_jax.studies.wm_probe.probe`); a metric
without a value says why ("no failures observed", "no group counts").
"""

from __future__ import annotations

from wmrl_jax.studies.regime_readout import Q_MEANING

_SPLIT = {"train": "train", "held-out": "held-out", "both": "train and held-out"}


def _f(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _cost(c) -> str:
    return "its recorded seconds" if c is None else f"{c:g} s"


def metrics_table(m: dict) -> list[str]:
    """The four metrics, each with what it rests on."""
    s, pw, auc, cal = m["spearman"], m["pairwise"], m["failure_auc"], m["calibration"]
    rho = "no group counts" if s["mean"] is None else _f(s["mean"])
    if s["se"] is not None:
        rho += f" ± {s['se']:.3f} (s.e.)"
    left = (f"{s['too_few']} with fewer than 3 programs having both, {s['constant_real']} "
            f"with constant real rewards, {s['constant_pred']} with constant predictions "
            "left out")  # fmt: skip
    auc_value = auc["note"] if auc["auc"] is None else _f(auc["auc"])
    ece = cal["note"]
    if cal["ece"] is not None:
        ece = f"{cal['ece']:.3f} (raw predictions: {_f(cal['raw_ece'])})"
    return [
        "| metric | value | n |",
        "|---|---|---|",
        f"| within-group Spearman | {rho} | {s['groups']} of {s['of']} groups ({left}) |",
        f"| pairwise accuracy | {_f(pw['accuracy'])} | {pw['pairs']} within-group pairs with "
        f"different real rewards ({pw['tied_real']} with equal ones left out) |",
        f"| AUC for predicting failure | {auc_value} | {auc['programs']} programs, "
        f"{auc['failures']} failed |",
        f"| calibration error (ECE) after a cross-fitted isotonic map | {ece} | "
        f"{cal['programs']} programs, {cal['folds']} folds of groups, {cal['bins']} "
        "quantile bins |",
    ]


def setting(payload: dict) -> str:
    """What was probed, in one paragraph."""
    run, c = payload["run"], payload["counts"]
    ex = payload["seconds"]
    return (
        f"The `{run['agent']}` agent's starting policy sampled k = {run['k']} programs for "
        f"each of {len(run['tasks'])} {_SPLIT[run['split']]} task(s); the world model "
        f"(`{run['world_model']}`) predicted each, and each was executed "
        f"{run['replicates']} time(s) ({run['environment']}; its real reward is the mean). "
        f"{c['rows']} programs: {c['no_program']} without a program (never executed nor "
        f"asked), {c['unusable_predictions']} unusable predictions, {c['no_real_reward']} "
        f"without a real reward (infrastructure errors after retries); "
        f"{c.get('executions', 0)} executions charging {ex.get('execution', 0.0):.1f} s. "
        f"Wall time: {ex.get('generation', 0.0):.0f} s sampling, "
        f"{ex.get('world_model', 0.0):.0f} s world model, "
        f"{ex.get('execution_wall', 0.0):.0f} s executing, {ex['total']:.0f} s in all."
    )


def regime_lines(payload: dict) -> list[str]:
    """Where the world model sits on the regime map, or how to make one."""
    r, q = payload["regime"], payload["metrics"]["spearman"]["mean"]
    m = payload["measure"]
    lines = ["**On the regime map.** "]
    if not r["available"]:
        lines[0] += (
            f"No regime map is available: {r['why']}. `make regime` writes "
            "`outputs/regime/results.json`; pass it with "
            "`--config.probe.regime=outputs/regime/results.json`."
        )
        return lines
    same = "The probe's Spearman is **not** the same measure:"
    if m["same_as_map_q"]:
        same = "The probe's Spearman is the same measure, but:"
    lines[0] += (
        f"Map `{r['path']}` at {payload['execution_seconds']:.3g} s per execution "
        f"({payload['execution_seconds_from']}), read at {_cost(r['cost'])} and "
        f"N = {r['params'] / 1e9:g}B" + (f" ({'; '.join(r['notes'])})" if r["notes"] else "") + ". "
        f"On its q axis: {Q_MEANING}. {same} " + "; ".join(m["notes"]) + "."
    )
    if r["group_size"] is not None and r["group_size"] != payload["run"]["k"]:
        lines[0] += (f" The map's groups hold G = {r['group_size']} programs, the probe's "
                     f"k = {payload['run']['k']}.")  # fmt: skip
    lines += [
        "",
        "| arm | break-even q (vs real_best / vs anchors_only) | median ratio at this q "
        "(vs real_best / vs anchors_only) |",
        "|---|---|---|",
    ]
    for arm, e in r["arms"].items():
        note = f" ({e['note']})" if e["note"] else ""
        lines.append(
            f"| `{arm}` | {_f(e['q_break_even'], 2)} / {_f(e['q_break_even_vs_anchors_only'], 2)} "
            f"| {_f(e['ratio_vs_best_real'], 2)} / {_f(e['ratio_vs_anchors_only'], 2)}{note} |"
        )
    lines.append(f"| `anchors_only` | — | {_f(r['anchors_only'], 2)} / — |")
    rec = r["recommendation"]
    rho = "every group executed" if rec["rho"] == 1.0 else f"ρ = {rec['rho']:g}"
    lines += [
        "",
        f"**Recommendation:** `{rec['arm']}` ({rho}; median ratio against real GRPO "
        f"{rec['ratio']:.2f}): {rec['why']}. Probe Spearman: {_f(q)}.",
    ]
    return lines


def markdown(payload: dict) -> str:
    """The whole report."""
    run = payload["run"]
    lines = [
        f"### World-model probe: `{run['agent']}` agent, `{run['world_model']}` world model",
        "",
        setting(payload),
        "",
        *metrics_table(payload["metrics"]),
        "",
        *regime_lines(payload),
    ]
    return "\n".join(lines)
