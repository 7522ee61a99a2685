"""A readiness probe for any world model: does it rank, foresee failures, calibrate?

Before a run spends anything, `probe` builds the run's agent and world model
from its training config (`config.world_model.kind`: the agent's own pass or
the synthetic one), samples `probe.k` programs for each task of `probe.split`
with the starting policy, asks the world model about every one, executes
them (or replays them from the recipe table) `probe.replicates` times, and
scores the predictions against the mean real reward with the metrics of
`wmrl_jax.studies.wm_metrics`: mean within-group Spearman, pairwise accuracy,
the AUC for predicting failure and the calibration error of a cross-fitted
isotonic map. With a regime map (`probe.regime`, `make regime`) it reads off
where this world model sits at the user's seconds per execution
(`regime_readout`); without one it says how to make one.

A row without a program (`Rollout.causes`) is never executed nor shown to the
world model: it is counted, and in no metric. A program is a failure when
most of its executions are not "ok" (as the synthetic world model's failures).
Infrastructure errors are retried (`execution.Runner`), then counted and left out.

`run` writes `results.json` (settings, counts, metrics, every program's row)
and `report.md` into the workdir and prints the report; `render` re-renders
from `results.json` and, with `--docs`, rewrites the page's `wm-probe` section.

Example:
    >>> payload = probe(config, "outputs/wm_probe")                # doctest: +SKIP
    >>> payload["metrics"]["spearman"]["mean"]                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax
import ml_collections
import numpy as np

from wmrl_jax import agents
from wmrl_jax.readme import report_paths, write_section
from wmrl_jax.studies import regime_readout, wm_metrics
from wmrl_jax.studies.wm_probe_report import markdown
from wmrl_jax.train import builder, execution, world_models
from wmrl_jax.train import mesh as mesh_lib
from wmrl_jax.train import state as state_lib
from wmrl_jax.train.config import ConfigError, validate_config
from wmrl_jax.train.summary import write_json

log = logging.getLogger(__name__)

SECTION = "wm-probe"  # <!-- wm-probe:begin --> in docs/wm_probe.md.
SPLITS = ("train", "held-out", "both")


def default_config() -> ml_collections.ConfigDict:
    """`config.probe`: what the probe samples, executes and reads off the map."""
    c = ml_collections.ConfigDict()
    c.k = 8  # Programs per task (one group).
    c.split = "train"  # "train" (the tasks training scores), "held-out" or "both".
    c.max_tasks = 0  # The first n tasks of the split by id; 0: all of them.
    c.replicates = 0  # Executions per program (their mean is its real reward); 0: all.
    c.execution_seconds = 0.0  # Your seconds per execution; 0: the probe's own mean.
    c.params = 0.0  # Your model size N for the map; 0: config.cost_model.params.
    c.folds = 5  # Folds of groups for the cross-fitted isotonic map.
    c.bins = 10  # Quantile bins of the calibration error.
    c.regime = ""  # A regime map's results.json (`make regime`); "": none.
    return c


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks the training config and `config.probe`; ConfigError naming the bad field."""
    validate_config(config)
    p = config.probe
    for field, ok, want in (
        ("k", p.k >= 2, ">= 2"),
        ("split", p.split in SPLITS, f"one of {SPLITS}"),
        ("max_tasks", p.max_tasks >= 0, ">= 0"),
        ("replicates", p.replicates >= 0, ">= 0"),
        ("execution_seconds", p.execution_seconds >= 0, ">= 0"),
        ("params", p.params >= 0, ">= 0"),
        ("folds", p.folds >= 2, ">= 2"),
        ("bins", p.bins >= 1, ">= 1"),
    ):
        if not ok:
            raise ConfigError(f"config.probe.{field} must be {want}, got {p[field]!r}")
    if p.regime:  # A missing or malformed map fails now, not after the probe.
        try:
            regime_readout.load_map(os.path.expanduser(p.regime))
        except ValueError as e:
            raise ConfigError(f"config.probe.regime: {e}") from None


def chosen_tasks(sets: builder.TaskSets, split: str, max_tasks: int) -> list:
    """The tasks of `split` ("both": train then held-out), the first `max_tasks` by id."""
    tasks = {"train": sets.train, "held-out": sets.heldout}.get(split)
    tasks = [*sets.train, *sets.heldout] if tasks is None else list(tasks)
    return sorted(tasks, key=lambda t: t.id)[: max_tasks or None]


@dataclasses.dataclass
class Rows:
    """Every sampled program of the probe, task-major, and what it cost."""

    tasks: list = dataclasses.field(default_factory=list)
    labels: list = dataclasses.field(default_factory=list)
    causes: list = dataclasses.field(default_factory=list)
    pred: list = dataclasses.field(default_factory=list)
    var: list = dataclasses.field(default_factory=list)
    outcomes: list = dataclasses.field(default_factory=list)  # per row: [Outcome, ...]
    counts: dict = dataclasses.field(default_factory=dict)
    seconds: dict = dataclasses.field(default_factory=dict)
    diagnostics: list = dataclasses.field(default_factory=list)  # the WM's own, per call

    def add(self, name: str, value: float, into: str = "counts") -> None:
        d = getattr(self, into)
        d[name] = d.get(name, 0) + value


def _batch_sizes(config, mesh):
    """Generation batch sizes from the memory plan, for LLM agents (as the trainer)."""
    if not agents.capabilities(config.agent.kind).memory_plan:
        return None
    plan = mesh_lib.plan_run(config, devices=list(mesh.devices.flat), unsharded_load=False)
    for problem in plan.problems:
        log.warning("memory plan: %s", problem)
    return plan.batch_sizes()


def _execute(runner, tasks, rollout, k: int, replicates: int, rows: Rows) -> list[list]:
    """Each distinct program of `rollout` executed `replicates` times (its replicates
    0..R-1 in the runner's order); a repeated program shares its first row's outcomes."""
    causes = rollout.causes or ("ok",) * len(rollout.programs)
    first, todo = {}, []
    for i, (program, cause) in enumerate(zip(rollout.programs, causes, strict=True)):
        if cause == "ok" and program:
            key = execution.cache_key(tasks[i // k], program)
            if key not in first:
                first[key] = i
                todo.append(i)
    start = time.perf_counter()
    # Every replicate is a new request of its program, so all rounds run at once.
    pending = [runner.submit(tasks, rollout.programs, todo, k) for _ in range(replicates)]
    got: dict[int, list] = {i: [] for i in todo}
    for p in pending:
        collected = runner.collect(p, tasks, rollout.programs, k)
        for i, out in collected.outcomes.items():
            got[i].append(out)
        rows.add("executions", collected.executions)
        rows.add("dropped", collected.counts["dropped"])
        rows.add("infra_errors", collected.counts["infra_errors"])
        rows.add("execution", collected.exec_seconds, "seconds")
    rows.add("execution_wall", time.perf_counter() - start, "seconds")
    out = []
    for i, (program, cause) in enumerate(zip(rollout.programs, causes, strict=True)):
        ok = cause == "ok" and program
        out.append(got[first[execution.cache_key(tasks[i // k], program)]] if ok else [])
    return out


def _group(built, wm, runner, chunk, key, *, k: int, replicates: int, rows: Rows) -> None:
    """Samples k programs per task of `chunk`, predicts and executes them into `rows`."""
    k_roll, k_wm = jax.random.split(key)
    t0 = time.perf_counter()
    rollout = built.agent.rollout(built.params, chunk, group_size=k, key=k_roll)
    t1 = time.perf_counter()
    out = wm.predict(built.params, chunk, rollout, key=k_wm)
    rows.add("generation", t1 - t0, "seconds")
    rows.add("world_model", time.perf_counter() - t1, "seconds")
    rows.outcomes += _execute(runner, chunk, rollout, k, replicates, rows)
    rows.tasks += [t.id for t in chunk for _ in range(k)]
    rows.labels += built.agent.describe(rollout)
    rows.causes += list(rollout.causes or ("ok",) * len(rollout.programs))
    rows.pred += np.asarray(out.mean, np.float64).tolist()
    rows.var += np.asarray(out.var, np.float64).tolist()
    rows.diagnostics.append({name: float(v) for name, v in out.diagnostics.items()})


def sample(config, workdir: str) -> tuple[Rows, dict]:
    """Samples, predicts and executes every chosen task's group; returns the rows and
    what the run was (agent, world model, environment, replicates, tasks)."""
    p = config.probe
    mesh_lib.check_mesh(config.mesh, jax.devices())
    builder.check_workdir(workdir)
    sets = builder.load_tasks(config)
    tasks = chosen_tasks(sets, p.split, p.max_tasks)
    key, model_key = jax.random.split(jax.random.key(config.seed))
    mesh = state_lib.make_mesh_from_config(config.mesh)
    built = builder.build_agent(
        config, sets, model_key, mesh=mesh, batch_sizes=_batch_sizes(config, mesh)
    )
    wm = world_models.make(config, built.agent)
    source, environment = builder.make_outcomes(config, tasks=tasks)
    rows = Rows()
    try:
        replicates = p.replicates or int(source.num_replicates)
        if replicates > source.num_replicates:
            raise ConfigError(
                f"config.probe.replicates={replicates} but the outcome source has "
                f"{source.num_replicates} (config.executor.replicates, or the replay table's)"
            )
        runner = execution.Runner(
            source, retries=config.executor.infra_retries, on_infra_error="wm_only",
            seed=config.seed,
        )  # fmt: skip
        per = max(1, config.tasks_per_step)  # Tasks per call, as a training step's.
        for start in range(0, len(tasks), per):
            chunk = tasks[start : start + per]
            step_key = jax.random.fold_in(key, start)
            _group(built, wm, runner, chunk, step_key, k=p.k, replicates=replicates, rows=rows)
            log.info("probe: %d/%d tasks", start + len(chunk), len(tasks))
    finally:
        source.close()
    run = {
        "agent": config.agent.kind, "world_model": config.world_model.kind,
        "environment": environment, "replicates": replicates,
        "source_replicates": int(source.num_replicates), "split": p.split,
        "tasks": [t.id for t in tasks], "k": int(p.k),
    }  # fmt: skip
    return rows, run


def arrays(rows: Rows, k: int) -> dict[str, np.ndarray]:
    """The [G, k] arrays of the metrics: prediction, real reward (mean over executions),
    failed (most executions not "ok"), NaN / False where a row has none."""
    n = len(rows.pred)
    real, failed = np.full(n, np.nan), np.zeros(n, bool)
    for i, outs in enumerate(rows.outcomes):
        if outs:
            real[i] = np.mean([o.reward for o in outs])
            failed[i] = np.mean([o.status == "ok" for o in outs]) < 0.5
    pred = np.where([c == "ok" for c in rows.causes], np.asarray(rows.pred), np.nan)
    return {"pred": pred.reshape(-1, k), "real": real.reshape(-1, k),
            "failed": failed.reshape(-1, k)}  # fmt: skip


def measure(run: dict, config) -> dict:
    """Whether the probe's Spearman is the regime map's q measure, and why not."""
    notes = []
    if run["environment"] != "replay":
        notes.append(
            f"the real reward is the mean of {run['replicates']} execution(s), a noisy draw "
            "of the truth: the Spearman against it is lower in expectation than against the "
            "truth"
        )
    elif run["replicates"] < run["source_replicates"]:
        notes.append(
            f"the real reward is the mean of {run['replicates']} of the table's "
            f"{run['source_replicates']} replicates, not the truth (all of them)"
        )
    notes.append(
        "the groups are the starting policy's, before any update; the map averages over "
        "its runs' updates, whose groups concentrate as the policy learns"
    )
    if config.world_model.kind == "agent" and config.agent.kind != "recipe":
        notes.append("the map was measured with the recipe agent on the built-in suite")
    same = run["environment"] == "replay" and run["replicates"] == run["source_replicates"]
    return {"same_as_map_q": same, "notes": notes}


def probe(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs the probe (see the module docstring); returns the `results.json` payload."""
    validate(config)
    start = time.perf_counter()
    rows, info = sample(config, workdir)
    p = config.probe
    a = arrays(rows, p.k)
    metrics = wm_metrics.probe_metrics(
        a["pred"], a["real"], a["failed"], folds=p.folds, bins=p.bins, seed=config.seed
    )
    asked = np.array([c == "ok" for c in rows.causes])
    counts = {
        "rows": len(rows.pred), "no_program": int(np.sum(~asked)),
        "unusable_predictions": int(np.sum(asked & ~np.isfinite(rows.pred))),
        "no_real_reward": int(np.sum(asked & ~np.isfinite(a["real"].ravel()))),
        **{k: int(v) for k, v in rows.counts.items()},
    }  # fmt: skip
    executions = max(counts.get("executions", 0), 1)
    seconds = p.execution_seconds or rows.seconds.get("execution", 0.0) / executions
    payload = {
        "config": config.to_dict(), "run": info, "counts": counts,
        "seconds": {**rows.seconds, "total": time.perf_counter() - start},
        "execution_seconds": seconds,
        "execution_seconds_from": "config.probe.execution_seconds" if p.execution_seconds
        else "the probe's own mean",
        "metrics": metrics, "measure": measure(info, config),
        "wm_diagnostics": rows.diagnostics,
        "regime": _regime(config, metrics["spearman"]["mean"], seconds),
        "programs": [
            {"task": t, "label": lab, "cause": c, "pred": _num(pr), "var": _num(v),
             "rewards": [_num(o.reward) for o in outs],
             "statuses": [o.status for o in outs]}
            for t, lab, c, pr, v, outs in zip(rows.tasks, rows.labels, rows.causes, rows.pred,
                                              rows.var, rows.outcomes, strict=True)
        ],
    }  # fmt: skip
    return payload


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _regime(config, q: float | None, seconds: float) -> dict:
    """The map's read-out, or why there is none."""
    path = os.path.expanduser(config.probe.regime)
    if not path:
        return {"available": False, "why": "none given (config.probe.regime is empty)"}
    if not seconds > 0:
        return {"available": False, "why": "no seconds per execution known (no execution "
                "was charged; set config.probe.execution_seconds)"}  # fmt: skip
    payload = regime_readout.load_map(path)
    params = config.probe.params or config.cost_model.params
    out = regime_readout.readout(payload, q=q, seconds=seconds, params=params)
    return {"available": True, "path": config.probe.regime, **out}


def run(config, workdir: str, readme: str | None = None, docs: str | None = None) -> dict:
    """Runs the probe, writes `results.json`, renders (`render`); returns the payload."""
    report_paths(SECTION, readme, docs)  # Missing pages fail now, not after the probe.
    payload = probe(config, workdir)
    write_json(os.path.join(workdir, "results.json"), payload)
    render(workdir, readme, docs)
    return payload


def render(workdir: str, readme: str | None = None, docs: str | None = None) -> str:
    """Prints the report of `workdir/results.json`, writes `report.md` beside it and, with
    a docs page (or a README beside `docs/`), its `wm-probe` section."""
    import json

    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
        payload = json.load(f)
    body = markdown(payload)
    with open(os.path.join(workdir, "report.md"), "w", encoding="utf-8") as f:
        f.write(body + "\n")
    print(body)
    _, docs = report_paths(SECTION, readme, docs)
    if docs is not None:
        write_section(docs, SECTION, body)
    return body
