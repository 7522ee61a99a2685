"""Step time with and without overlap (`config.overlap`) when execution dominates.

    python -m benchmarks.overlap [--delays 0,0.2,1] [--gen-delays 0,0.5] [--steps 6] [--json PATH]
    python -m benchmarks.overlap --quick     # one cell (0.2 s, 0.2 s), 4 steps: checks that it runs

The main job's runlocal config (the recipe agent on the built-in suite, the
replay executor, execution cache off so every step executes its anchors) with
`--tasks-per-step` tasks of `--group-size` programs per step. The replay
executor answers at once, so every program is held back `delay` seconds on a
pool of `--workers` threads, as a sandbox would hold it: a step's executions
take about ceil(programs / workers) x delay of wall clock. Without overlap a
step is generation, then the world-model pass while the programs run, then the
update; with it the next step's batch is generated while the programs run too,
so once execution dominates a step costs about its execution plus the update.

The tiny backbone generates a batch in about 10 ms, far below an LLM's seconds
to minutes and below a loaded machine's noise, so each generation delay in
`--gen-delays` is added to every rollout (a sleep inside the timed sampling,
`SlowerGeneration`): gen delay 0 is the tiny agent as it is; 0.5 s stands for
an LLM's generation, what overlap exists to hide.

The anchor for each delay is the same run without overlap (same agent, same
warm start, same delay). For each delay the two runs alternate (off, on, off,
on with `--repeats 2`), so a shared machine's load drifts alike for both. A
step's time is the wall clock between the ends of consecutive steps, steps 2
to N − 1 (step 1 compiles and samples its own batch; the last step samples
nothing ahead, so it would flatter overlap); the table gives medians over the steps of all repeats,
the ratio on / off, and the median generation seconds per step: what overlap
can hide at most. `hidden` = (off − on) / generation: 1 when all of it is
hidden, 0 when none. Compilations are cached on disk for the benchmark's runs
(each run builds its own trainer; step 1, which compiles, is not timed anyway).
"""

import argparse
import concurrent.futures
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import tiny_cpu
from wmrl_jax.train import builder, loop
from wmrl_jax.train import step as step_lib
from wmrl_jax.train.config import override


class SlowerGeneration:
    """The agent with `delay` seconds added to every `rollout` (an LLM's generation time
    on the tiny backbone); everything else is the agent's own."""

    def __init__(self, agent, delay: float):
        self._agent, self._delay = agent, float(delay)

    def __getattr__(self, name):
        return getattr(self._agent, name)

    def rollout(self, *args, **kwargs):
        time.sleep(self._delay)
        return self._agent.rollout(*args, **kwargs)


class DelayedOutcomes:
    """An outcome source answering as `inner` does, each answer `delay` seconds late, at
    most `workers` at once: a sandbox pool's wall clock without its CPU."""

    def __init__(self, inner, delay: float, workers: int):
        self.inner, self.delay = inner, float(delay)
        self.fingerprint, self.num_replicates = inner.fingerprint, inner.num_replicates
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)

    def _answer(self, task, source, replicate):
        time.sleep(self.delay)
        return self.inner.submit(task, source, replicate=replicate).result()

    def submit(self, task, source, *, replicate=0):
        return self._pool.submit(self._answer, task, source, replicate)

    def close(self):
        self._pool.shutdown(wait=True)
        self.inner.close()


def make_config(args, overlap: bool):
    return override(
        tiny_cpu.get_config("runlocal"),
        **{
            "arm": args.arm,
            "executor.kind": "replay",
            "executor.cache": False,  # every step executes its anchors
            "num_steps": args.steps,
            "tasks_per_step": args.tasks_per_step,
            "group_size": args.group_size,
            "eval_every": 10_000,  # evaluations only before and after: outside the steps timed
            "checkpoint.every": 10_000,
            "checkpoint.export_hf": False,
            "overlap": overlap,
        },
    )


def build_once(config):
    """The warm-started agent, built once and shared by every run."""
    _, model_key = jax.random.split(jax.random.key(config.seed))
    mesh = step_lib.make_mesh_from_config(config.mesh)
    built = builder.build_agent(config, builder.load_tasks(config), model_key, mesh=mesh)
    host = jax.tree.map(np.array, built.params)
    return lambda: built._replace(params=jax.tree.map(jnp.asarray, host))


def run_once(args, prebuilt, *, overlap: bool, delay: float, gen_delay: float) -> dict:
    """Step seconds (steps 2..) and per-step ledger seconds of one run."""
    config = make_config(args, overlap)
    ends, ledgers = [], []

    def hook(record):
        ends.append(time.perf_counter())
        ledgers.append(record.ledger)
        return {}

    source = DelayedOutcomes(builder.make_outcomes(config)[0], delay, args.workers)
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        built = prebuilt()
        built = built._replace(agent=SlowerGeneration(built.agent, gen_delay))
        trainer = loop.Trainer(config, workdir, outcomes=source, prebuilt=built, hooks=[hook])
        try:
            trainer.run()
        finally:
            trainer.close()
    # Steps 2 .. N - 1: step 1 compiles and samples its own batch; step N samples none ahead.
    later = ledgers[1:-1]
    return {
        "step_seconds": [b - a for a, b in itertools.pairwise(ends[:-1])],
        "gen_seconds": [x.gen_seconds for x in later],
        "wm_seconds": [x.wm_seconds for x in later],
        "train_seconds": [x.train_seconds for x in later],
        "executions": [x.executions for x in later],
    }


def measure(args, prebuilt, delay: float, gen_delay: float) -> dict:
    got = {False: [], True: []}
    parts = {"gen_seconds": [], "wm_seconds": [], "train_seconds": [], "executions": []}
    for _ in range(args.repeats):
        for overlap in (False, True):
            out = run_once(args, prebuilt, overlap=overlap, delay=delay, gen_delay=gen_delay)
            got[overlap] += out["step_seconds"]
            for k in parts:
                parts[k] += out[k]
    off, on = statistics.median(got[False]), statistics.median(got[True])
    gen = statistics.median(parts["gen_seconds"])
    programs = statistics.median(parts["executions"])
    return {
        "delay_s": delay,
        "gen_delay_s": gen_delay,
        "programs_per_step": programs,
        "exec_wall_s": math.ceil(programs / args.workers) * delay,
        "gen_s": gen,
        "wm_s": statistics.median(parts["wm_seconds"]),
        "train_s": statistics.median(parts["train_seconds"]),
        "step_s_off": off,
        "step_s_on": on,
        "ratio_on_off": on / off,
        "hidden_share_of_gen": (off - on) / gen if gen > 0 else float("nan"),
        "steps_measured": len(got[False]),
        "step_seconds_off": got[False],
        "step_seconds_on": got[True],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="0,0.2,1", help="seconds per program, comma-separated")
    parser.add_argument("--gen-delays", default="0,0.5", help="seconds added to each rollout")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--arm", default="wmrl")
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8, help="programs executing at once")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    gen_delays = [float(d) for d in args.gen_delays.split(",")]
    if args.quick:
        delays, gen_delays, args.steps, args.repeats = [0.2], [0.2], 4, 1
    scratch = tempfile.mkdtemp(prefix="overlap_bench_", dir=args.workdir)
    jax.config.update("jax_compilation_cache_dir", os.path.join(scratch, "xla"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    args.workdir = scratch
    try:
        prebuilt = build_once(make_config(args, False))
        rows = [measure(args, prebuilt, d, g) for g in gen_delays for d in delays]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"arm {args.arm}, {args.tasks_per_step} tasks x {args.group_size} programs per step, "
        f"{args.workers} programs at once, {jax.default_backend()}"
    )
    print("| added generation delay | delay / program | programs / step | execution wall / step "
          "| generation / step | step, no overlap | step, overlap | on / off "
          "| hidden / generation |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['gen_delay_s']:.2f} s | {r['delay_s']:.2f} s | {r['programs_per_step']:.0f} "
            f"| {r['exec_wall_s']:.2f} s "
            f"| {r['gen_s']:.3f} s | {r['step_s_off']:.3f} s | {r['step_s_on']:.3f} s "
            f"| {r['ratio_on_off']:.2f} | {r['hidden_share_of_gen']:.2f} |"
        )
    if args.json:
        payload = {
            "rows": rows,
            "args": vars(args),
            "platform": platform.platform(),
            "backend": jax.default_backend(),
            "load": os.getloadavg(),
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
