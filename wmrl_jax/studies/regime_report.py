"""The regime map's command: run (or extend) its runs, analyse them, render the map.

`run_and_report` resolves the best real cell (`study.best_real`, else the pick
`make study-realsweep` wrote), runs every (seed, run) of the map with the
compute study's runner (`wmrl_jax.studies.compute.run_study`), writes
``results.json`` (the config, every run's steps, the analysis of
`wmrl_jax.studies.regime`), ``table.md`` and ``regime.png``, and with a README or
a docs page rewrites the `regime` section of ``docs/regime.md`` and the README's
``regime-headline``. ``extend`` runs only the runs ``results.json`` lacks.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import time

import ml_collections
import numpy as np
from absl import logging

from wmrl_jax.readme import report_paths, write_report
from wmrl_jax.studies import compute as study
from wmrl_jax.studies import regime
from wmrl_jax.studies.compute_report import earlier_runs
from wmrl_jax.train import cost
from wmrl_jax.train.config import override
from wmrl_jax.train.summary import write_json

SECTION = "regime"  # <!-- regime:begin --> in docs/regime.md, regime-headline in the README.


def resolve_best_real(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with `study.best_real` set: as given, else the pick in `study.best_real_from`.

    Raises:
      ValueError: neither is there, naming the command that makes the pick.
    """
    if config.study.best_real:
        return config
    path = config.study.best_real_from
    try:
        with open(path) as f:
            pick = json.load(f).get("best_real", "")
    except FileNotFoundError:
        pick = ""
    if not pick:
        raise ValueError(
            f"the regime map needs the best real cell: run `make study-realsweep` (it writes "
            f"its pick to {path}) or pass --config.study.best_real=real_g<groups>_lr<lr>"
        )
    logging.info("best real cell %s (from %s)", pick, path)
    return override(config, **{"study.best_real": pick})


def axes(config) -> regime.Axes:
    """The map's cost axes from the config (a cost of 0: the recorded seconds)."""
    model = cost.from_config(ml_collections.ConfigDict(config))
    if model is None:
        raise ValueError("the regime map needs config.cost_model (params > 0)")
    s = config["study"]
    return regime.Axes(
        model=model,
        costs=tuple(float(c) if c else None for c in s["regime_costs"]),
        params=tuple(float(n) for n in s["regime_params"]),
    )


def analyse(runs: dict, config) -> dict:
    """`regime.analyse` of the runs with the config's arms, axes and margins."""
    s = config["study"]
    return regime.analyse(
        runs, arms=tuple(s["regime_arms"]), axes=axes(config), smooth=s["exact_smooth"],
        margin=s["margin"],
    )  # fmt: skip


def run_and_report(
    config, workdir: str, readme: str | None = None, docs: str | None = None, extend: bool = False
) -> dict:
    """Runs (or extends) the map, writes `results.json`, renders; returns the analysis."""
    report_paths(SECTION, readme, docs)  # Missing pages fail now, not after the runs.
    config = resolve_best_real(config)
    start = time.perf_counter()
    runs, earlier_wall = earlier_runs(config, workdir) if extend else ({}, 0.0)
    results = study.run_study(config, workdir, log=logging.info, skip=runs)
    runs.update({k: [{key: s[key] for key in ("steps", "exact_start") if key in s} for s in v]
                 for k, v in results.items()})  # fmt: skip
    runs = {label: runs[label] for label, _ in study.study_runs(config)}
    payload = {
        "config": config.to_dict(),
        "wall_seconds": earlier_wall + time.perf_counter() - start,
        "runs": runs,
        "analysis": analyse(runs, config),
    }
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "results.json"), payload)
    render(workdir, readme, docs)
    return payload["analysis"]


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> None:
    """The table, the figure (and the docs section, the README headline) from
    `workdir/results.json`."""
    readme, docs = report_paths(SECTION, readme, docs)
    with open(os.path.join(workdir, "results.json")) as f:
        payload = json.load(f)
    a, config = payload["analysis"], payload["config"]
    png = os.path.join(workdir, "regime.png")
    plot(a, png)
    table = tables(a)
    with open(os.path.join(workdir, "table.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    if docs is None:
        return
    shutil.copy(png, os.path.dirname(os.path.abspath(docs)))
    s = config["study"]
    intro = (
        f"`python -m experiments.regime` ({s['num_seeds']} seeds; every run stops at "
        f"{config['num_steps']} updates; the target is `real_best` = `{s['best_real']}`, "
        f"the real sweep's pick on other seeds; its last command ran "
        f"{payload['wall_seconds'] / 60:.0f} min on this CPU, reading back the runs that had "
        "finished before)."
    )
    lines = headline(a)
    body = [intro, "", " ".join(lines), "", table, "", "![regime map](regime.png)"]
    lead = f"{lines[0].rstrip('.')}; {s['num_seeds']} paired seeds, {where_in_full(readme, docs)}."
    write_report(SECTION, "\n".join(body), brief(a, lead), readme=readme, docs=docs)


def where_in_full(readme: str | None, docs: str) -> str:
    """Where a README headline's every cell is: a link to the docs page, relative to it."""
    page = os.path.relpath(docs, os.path.dirname(os.path.abspath(readme or docs)))
    return f"every cell in [{page}]({page})"


def _cost_name(c) -> str:
    return "recorded s" if c is None else f"{c:g} s"


def _ratio_cell(r: dict) -> str:
    if r["median"] is None:
        return "—"
    if r["run_never"] == r["seeds"]:
        return f"never ({r['seeds']} seeds)"
    bound = f", {r['run_never']} never" if r["run_never"] else ""
    # Where the other run never reaches the target, its whole compute / the run's: a bound.
    bound += f", {r['other_never']} lower bounds" if r["other_never"] else ""
    return (f"{'≥ ' if r['other_never'] == r['seeds'] else ''}{r['median']:.2f}× "
            f"[{r['lo']:.2f}, {r['hi']:.2f}] ({r['reached']}/{r['seeds']}{bound})")  # fmt: skip


def _median(r: dict) -> str:
    """A ratio cell's median alone ("never": the run reached the target on no seed)."""
    if r["median"] is None or r["run_never"] == r["seeds"]:
        return "never"
    if r["median"] == 0.0:  # Most seeds never reached it.
        return f"never on {r['run_never']} of {r['seeds']} seeds"
    return f"{'≥ ' if r['other_never'] == r['seeds'] else ''}{r['median']:.2f}×"


def _q_cell(q) -> str:
    return "—" if q is None else f"{q:.2f}"


def _diff_cell(d: dict) -> str:
    if d["lo"] is None:
        return "—" if d["mean"] is None else f"{d['mean']:+.3f} (n = {d['n']})"
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}] {d['verdict']}"


def _cells(a: dict, n: float) -> dict[str, dict]:
    """`{label: {cost: row}}` of the rows at model size n, in the map's order."""
    out: dict[str, dict] = {}
    rows = sorted((r for r in a["rows"] if r["params"] == n),
                  key=lambda r: (r["arm"], not r["learned"], r["q"] or 0.0))  # fmt: skip
    for r in rows:
        out.setdefault(r["label"], {})[r["cost"]] = r
    return out


def tables(a: dict) -> str:
    """Per model size: compute-to-target ratios against `real_best` and against
    `anchors_only` per execution cost; then the break-even q per (arm, N, cost)."""
    costs, parts = a["costs"], []
    head = f"| run | q target | q realised | {a['measure']} | run − `anchors_only` (90% t) | "
    head += " | ".join(_cost_name(c) for c in costs) + " |"
    rule = "|---|---|---|---|---|" + "---|" * len(costs)
    for n in a["params"]:
        cells = _cells(a, n)
        for key, other in (("ratio_vs_best_real", a["target"]), ("ratio_vs_anchors_only",
                                                                 a["control"])):  # fmt: skip
            parts += [f"N = {n / 1e9:g}B: compute to reach {a['target_level']}, "
                      f"`{other}` / run (median [5%, 95%] over seeds, (reached/seeds)):",
                      "", head, rule]  # fmt: skip
            if key == "ratio_vs_best_real":
                ctrl = [
                    a["anchors_only_vs_best_real"][f"{regime.cost_key(c)}|N{n:g}"] for c in costs
                ]
                parts.append(f"| {a['control']} | — | — | {a['control_final']:.3f} | — | "
                             + " | ".join(_ratio_cell(r) for r in ctrl) + " |")  # fmt: skip
            for label, by_cost in cells.items():
                r0 = by_cost[costs[0]]
                q = "learned" if r0["learned"] else f"{r0['q']:g}"
                parts.append(
                    f"| {label} | {q} | {_q_cell(r0['q_realised'])} | {r0['heldout_final']:.3f} "
                    f"| {_diff_cell(r0['vs_anchors_only'])} | "
                    + " | ".join(_ratio_cell(by_cost[c][key]) for c in costs)
                    + " |"
                )
            parts.append("")
    parts.append(break_even_table(a))
    if "repeats_charged" in a:
        parts += ["", repeats_sentence(a), "", break_even_table(repeats_charged(a))]
    return "\n".join(parts)


def repeats_charged(a: dict) -> dict:
    """The analysis with its map priced as if every cached repeat were executed again."""
    return {**a, **a["repeats_charged"]}


def repeats_sentence(a: dict) -> str:
    """The control against the target, and the learned world models against the control,
    were every cached repeat executed again (`regime.analyse`'s `repeats_charged`)."""
    r = repeats_charged(a)
    target, control = a["target"], a["control"]
    ctrl = _span(list(r["anchors_only_vs_best_real"].values()))
    learned = [
        f"`{control}` / `{arm}` with our learned world model {_span(got)}"
        for arm in a["arms"]
        if (
            got := [
                x["ratio_vs_anchors_only"] for x in r["rows"] if x["arm"] == arm and x["learned"]
            ]
        )  # fmt: skip
    ]
    return (f"**Were every repeat executed again** (priced only: the same runs, every cached "
            f"repeat charged as an execution, at {', '.join(_cost_name(c) for c in r['costs'])}): "
            f"`{target}` / `{control}` would be {ctrl}"
            + "".join(f"; {x}" for x in learned) + ". Break-even q then:")  # fmt: skip


def break_even_table(a: dict) -> str:
    """The break-even realised q per (arm, N) and execution cost, against the target and
    against the control."""
    costs = a["costs"]
    parts = ["Break-even realised q (the median ratio first reaches 1; — : no cell does), "
             f"against `{a['target']}` / against `{a['control']}`:", "",
             "| arm | N | " + " | ".join(_cost_name(c) for c in costs) + " |",
             "|---|---|" + "---|" * len(costs)]  # fmt: skip
    for arm in a["arms"]:
        for n in a["params"]:
            b = {x["cost"]: x for x in a["break_even"] if x["arm"] == arm and x["params"] == n}
            parts.append(f"| {arm} | {n / 1e9:g}B | " + " | ".join(
                f"{_q_cell(b[c]['q_break_even'])} / {_q_cell(b[c]['q_break_even_vs_anchors_only'])}"
                for c in costs) + " |")  # fmt: skip
    return "\n".join(parts)


def headline(a: dict) -> list[str]:
    """The map's answer in sentences, every number from the analysis."""
    target, control = a["target"], a["control"]
    lines = [f"**Where does a world model pay?** Against the best real-execution GRPO "
             f"(`{target}`, {a['measure']} {a['target_final']:.3f}; "
             f"`{control}` ends at {a['control_final']:.3f})."]  # fmt: skip
    by_n = []
    for n in a["params"]:
        cells = [(c, a["anchors_only_vs_best_real"][f"{regime.cost_key(c)}|N{n:g}"])
                 for c in a["costs"]]  # fmt: skip
        by_n.append(f"N = {n / 1e9:g}B: " + ", ".join(f"{_median(r)} at {_cost_name(c)}"
                                                      for c, r in cells))  # fmt: skip
    lines.append(
        f"`{control}` against it (`{target}` / `{control}`, compute to the target; "
        f"never: `{control}` does not reach it): {'; '.join(by_n)}."
    )
    if _has_ledgers(a):
        lines.append(_repeats_sentence(a))
    for arm in a["arms"]:
        for n in a["params"]:
            lines.append(_arm_sentence(a, arm, n))
            learned = [r for r in a["rows"] if r["arm"] == arm and r["learned"]
                       and r["params"] == n]  # fmt: skip
            if learned and learned[0]["q_realised"] is not None:
                at = "; ".join(
                    f"{_cost_name(r['cost'])}: {_ratio_cell(r['ratio_vs_best_real'])}"
                    for r in learned
                )
                vs = ", ".join(f"{_median(r['ratio_vs_anchors_only'])} at {_cost_name(r['cost'])}"
                               for r in learned)  # fmt: skip
                lines.append(f"Our learned world model realises q = "
                             f"{learned[0]['q_realised']:.2f}; there `{target}` / `{arm}` is "
                             f"{at}; `{control}` / `{arm}` is {vs}.")  # fmt: skip
    for point in a["literature"]:
        lines.append(_literature_sentence(a, point))
    if not _any_beats_target(a):
        lines.append(f"No cell of the map beats `{target}`.")
    return lines


def _has_ledgers(a: dict) -> bool:
    """Whether the analysis holds the target's and the control's samples (the real map)."""
    led = a.get("ledger", {})
    return all((led.get(k) or {}).get("samples") for k in (a["target"], a["control"]))


def _any_beats_target(a: dict) -> bool:
    """Whether some cell's median ratio against the target is above 1."""
    return any((r["ratio_vs_best_real"]["median"] or 0.0) > 1.0 for r in a["rows"])


def brief(a: dict, lead: str) -> str:
    """The map's answer for the README, every number from the analysis: `lead`, the
    control against the target, the break-even table, and per arm its saving at its
    highest q, with the learned world model, and its paired final level against the
    control over its cells. Ratios are ranges of medians over execution costs and N."""
    target, control, margin = a["target"], a["control"], a["margin"]
    ctrl = _span(list(a["anchors_only_vs_best_real"].values()))
    head = [lead, f"`{control}` never reaches `{target}`'s level." if ctrl == "never" else
            f"`{target}` / `{control}`, compute to the target: {ctrl}."]  # fmt: skip
    if _has_ledgers(a):
        head.append(_repeats_sentence(a))
    arms = []
    for arm in a["arms"]:
        rows = [r for r in a["rows"] if r["arm"] == arm]
        syn = [r for r in rows if not r["learned"] and r["q_realised"] is not None]
        learned = [r for r in rows if r["learned"] and r["q_realised"] is not None]
        parts = []
        if syn:
            top = max(r["q_realised"] for r in syn)
            at = [r for r in syn if r["q_realised"] == top]
            parts.append(f"at its highest realised q ({top:.2f}) `{target}` / `{arm}` is "
                         f"{_span([r['ratio_vs_best_real'] for r in at])}, `{control}` / "
                         f"`{arm}` {_span([r['ratio_vs_anchors_only'] for r in at])}")  # fmt: skip
        if learned:
            parts.append(f"with our learned world model (q = {learned[0]['q_realised']:.2f}) "
                         f"`{target}` / `{arm}` is "
                         f"{_span([r['ratio_vs_best_real'] for r in learned])}, `{control}` / "
                         f"`{arm}` {_span([r['ratio_vs_anchors_only'] for r in learned])}, "
                         f"final level − `{control}` "
                         f"{_diff_cell(learned[0]['vs_anchors_only'])}")  # fmt: skip
        diffs = {r["label"]: r["vs_anchors_only"] for r in rows}.values()  # One per cell.
        verdicts = collections.Counter(d["verdict"] for d in diffs)
        shown = sum(d["lo"] is not None and d["lo"] > -margin for d in diffs)
        parts.append(f"final level − `{control}` (paired, 90% t, margin {margin:g}) over its "
                     f"{len(diffs)} cells: " + ", ".join(f"{v} {k}" for k, v in
                                                       sorted(verdicts.items()))
                     + f"; not below by more than the margin (interval above −{margin:g}) in "
                     f"{shown} of {len(diffs)}")  # fmt: skip
        arms.append(f"- `{arm}`: " + "; ".join(parts) + ".")
    tail = [_literature_sentence(a, point) for point in a["literature"]]
    repeats = []
    if "repeats_charged" in a:
        repeats = [repeats_sentence(a), break_even_table(repeats_charged(a))]
    if not _any_beats_target(a):
        tail.append(f"No cell of the map beats `{target}`.")
    return "\n\n".join(
        [" ".join(head), break_even_table(a), "Ratios: medians over seeds, ranging over "
         "execution costs and N.\n\n" + "\n".join(arms), *repeats, " ".join(tail)]
    )  # fmt: skip


def _span(cells: list[dict]) -> str:
    """The range of ratio cells' medians (`ratio_summary`s), saying how many cells are
    "never" (the run reached the target on no seed, or on fewer than half) and how many
    are lower bounds (the other run never reached it)."""
    never = [r for r in cells if not r["median"] or r["run_never"] == r["seeds"]]
    got = [r for r in cells if r not in never]
    if not got:
        return "never"
    lo, hi = min(r["median"] for r in got), max(r["median"] for r in got)
    text = f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"
    notes = [f"never in {len(never)} of {len(cells)} cells"] if never else []
    bounds = sum(r["other_never"] == r["seeds"] for r in got)
    notes += [f"lower bounds in {bounds}"] if bounds else []
    return text + (f" ({', '.join(notes)})" if notes else "")


def _literature_sentence(a: dict, point: dict) -> str:
    """Where a published judge's quality falls against each arm's break-even q."""
    q = point["spearman"]

    def cells(key: str) -> str:
        got: dict[tuple, list[str]] = {}
        for x in a["break_even"]:
            if x[key] is not None and x[key] <= q:
                got.setdefault((x["arm"], x["params"]), []).append(_cost_name(x["cost"]))
        return "; ".join(f"`{arm}` at {', '.join(c)} (N = {n / 1e9:g}B)"
                         for (arm, n), c in got.items()) or "no cell of the map"  # fmt: skip

    return (f"{point['name']} ({point['pairwise_accuracy']:.1%} pairwise accuracy, Kendall "
            f"τ = {point['kendall_tau']:.2f}, Spearman q = {q:.2f} under a Gaussian copula) "
            f"is at or above the break-even against `{a['target']}` for "
            f"{cells('q_break_even')}, and against `{a['control']}` for "
            f"{cells('q_break_even_vs_anchors_only')}.")  # fmt: skip


def _repeats_sentence(a: dict) -> str:
    """How much of each baseline's sampling the execution cache answered (programs recur),
    against the executions of the first world-model arm (learned world model)."""
    led = a["ledger"]

    def part(label: str) -> str:
        x = led[label]
        share = x["cached"] / x["samples"] if x["samples"] else float("nan")
        return (f"`{label}` executed {x['executions']:.0f} programs per seed and answered "
                f"{share:.0%} of its {x['samples']:.0f} samples from the cache")  # fmt: skip

    arm = a["arms"][0]
    tail = (f"; `{arm}` executed {led[arm]['executions']:.0f}" if arm in led
            and led[arm]["executions"] is not None else "")  # fmt: skip
    return (
        f"Programs recur on this benchmark (a repeat of a program already executed on "
        f"its task is free): {part(a['target'])}, {part(a['control'])}{tail}."
    )


def _arm_sentence(a: dict, arm: str, n: float) -> str:
    """Where `arm` at model size n needs less compute than the target and than the control
    (its break-even q per execution cost), and how much less at the map's highest q."""
    rows = [x for x in a["break_even"] if x["arm"] == arm and x["params"] == n]

    def where(key: str) -> str:
        return "; ".join(f"{'never' if x[key] is None else f'from q = {x[key]:.2f}'} at "
                         f"{_cost_name(x['cost'])}" for x in rows)  # fmt: skip

    out = (f"`{arm}` (N = {n / 1e9:g}B, medians over seeds) needs less compute than "
           f"`{a['target']}` {where('q_break_even')}, and than `{a['control']}` "
           f"{where('q_break_even_vs_anchors_only')}")  # fmt: skip
    syn = [r for r in a["rows"] if r["arm"] == arm and r["params"] == n and not r["learned"]
           and r["q_realised"] is not None]  # fmt: skip
    if not syn:
        return out + "."
    top = max(r["q_realised"] for r in syn)
    at_top = [r for r in syn if r["q_realised"] == top]
    ratios = {key: ", ".join(f"{_median(r[key])} at {_cost_name(r['cost'])}" for r in at_top)
              for key in ("ratio_vs_best_real", "ratio_vs_anchors_only")}  # fmt: skip
    return out + (f"; at its highest q ({top:.2f}) `{a['target']}` / `{arm}` is "
                  f"{ratios['ratio_vs_best_real']}, `{a['control']}` / `{arm}` "
                  f"{ratios['ratio_vs_anchors_only']}.")  # fmt: skip


def plot(a: dict, path: str) -> None:
    """Median ratio against `real_best` over realised q, a line per execution cost, a
    panel per (arm, N); the learned world model as a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(arm, n) for arm in a["arms"] for n in a["params"]]
    fig, axs = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (arm, n) in zip(axs[0], panels, strict=True):
        for i, c in enumerate(a["costs"]):
            rows = [
                r
                for r in a["rows"]
                if r["arm"] == arm
                and r["params"] == n
                and r["cost"] == c
                and r["ratio_vs_best_real"]["median"] is not None
            ]
            syn = sorted((r for r in rows if not r["learned"] and r["q_realised"] is not None),
                         key=lambda r: r["q_realised"])  # fmt: skip
            color = f"C{i}"
            if syn:
                x = [r["q_realised"] for r in syn]
                y = np.array([[r["ratio_vs_best_real"][k] for k in ("median", "lo", "hi")]
                              for r in syn])  # fmt: skip
                ax.errorbar(x, y[:, 0], yerr=[y[:, 0] - y[:, 1], y[:, 2] - y[:, 0]],
                            marker="o", color=color, capsize=3, label=_cost_name(c))  # fmt: skip
            for r in rows:
                if r["learned"] and r["q_realised"] is not None:
                    ax.plot([r["q_realised"]], [r["ratio_vs_best_real"]["median"]], "*",
                            color=color, markersize=12)  # fmt: skip
        for point in a["literature"]:
            name = point["name"].split(":")[0]
            ax.axvline(point["spearman"], color="grey", lw=0.8, ls=":", label=name)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.set_ylim(bottom=0.0)  # A ratio: 0 is a run that never reached the target.
        star = " (★ learned WM)" if any(r["learned"] for r in a["rows"]) else ""
        ax.set(title=f"{arm}, N = {n / 1e9:g}B{star}",
               xlabel="realised within-group Spearman q",
               ylabel=f"{a['target']} / run, compute to target")  # fmt: skip
        ax.legend(title="per execution", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
