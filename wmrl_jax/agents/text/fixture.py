r"""Builds the tuned tiny text checkpoint on which the text agent's success path runs.

    python -m wmrl_jax.agents.text.fixture --out tests/agents/fixtures/qwen3_text_tuned

The committed random checkpoint `tests/models/fixtures/qwen3_gqa1_tied` (Qwen3,
2 layers, width 64, the 384-token byte-level BPE tokenizer) writes gibberish:
in the main job every sample holds no program and every world-model answer is
unparseable, so nothing downstream of parsing ever runs. This module fine-tunes
that checkpoint (our Flax model and optax, on a CPU) on the agent's own prompts,
`TextAgent.solver_prompt_ids` and `TextAgent.wm_prompt_ids` at the lengths of
the text-agent ``runlocal`` config (`AgentShape`), over the built-in suite:

* as the policy, to answer every task's solver prompt with one fenced Python
  program: a short tree-ensemble solution (`PROGRAM`) whose estimator family
  and ``max_depth`` are drawn from `FAMILIES` and `DEPTHS`, taught as a
  distribution so that a group of samples holds different programs with
  different scores (``max_depth=0`` is a program that crashes);
* as the world model, to answer the WM prompt of a train task with the JSON
  object the parser reads, ``{"valid_probability": p, "percentile": q}``,
  where ``p`` and ``q`` are what that variant really earned: every variant is
  executed on every train task (local-process sandbox, graded as in training)
  and ``q`` is its mean percentile, answered with a jitter of ±0.05 (sampled
  answers differ; their spread is the predictive variance). Where the agent
  keeps in-context anchors, a third of the WM prompts show one or two.

The build is deterministic given ``--seed`` (data order; the programs seed
their estimators). It costs 110 executions and 150 steps of 2 + 2 sequences
of 1,280-1,536 tokens: about 35 minutes on two cores shared with other jobs
(5 to measure, 29 to tune), a third of that on an idle pair. Next to the
checkpoint it writes ``fixture.json``: the settings, every variant with its
real outcomes and taught answer, the loss curve, a digest of the prompts it
was tuned on, and a check that samples the tuned model through
`TextAgent.rollout` and `TextAgent.predict`.

Rebuild it whenever the agent's prompts, the built-in suite, the ``runlocal``
lengths or this file change (`tests/agents/test_text_e2e.py` names a stale one):

    python -m wmrl_jax.agents.text.fixture --out tests/agents/fixtures/qwen3_text_tuned
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl_jax.agents.programs import find_program
from wmrl_jax.agents.text.agent import TextAgent
from wmrl_jax.worldmodel.prompts import AnchorExample

BASE = "tests/models/fixtures/qwen3_gqa1_tied"

PROGRAM = """import os
import numpy as np
from sklearn import ensemble as E

os.chdir(os.environ["WMRL_INPUT_DIR"])
L = lambda f: np.loadtxt(f, delimiter=",", skiprows=1)
a, t = L("train.csv"), L("test.csv")
h = open("sample_submission.csv").readline().strip()
c = "p_0" in h
m = getattr(E, "{family}" + ("Classifier" if c else "Regressor"))
m = m(50, max_depth={depth}, random_state=0).fit(a[:, 1:-1], a[:, -1])
p = m.predict_proba(t[:, 1:]) if c else m.predict(t[:, 1:])[:, None]
o = os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv")
np.savetxt(o, np.c_[t[:, 0], p], delimiter=",", header=h, comments="", fmt="%g")
"""
# Sampling probabilities of the two choices; the policy learns their product.
FAMILIES = {"RandomForest": 0.5, "ExtraTrees": 0.5}
DEPTHS = {0: 0.1, 1: 0.2, 2: 0.2, 4: 0.25, 8: 0.25}
JITTER = (-0.05, 0.0, 0.05)


@dataclasses.dataclass(frozen=True)
class AgentShape:
    """The text agent settings the checkpoint is tuned for (the ``runlocal`` config's)."""

    max_prompt_tokens: int = 768
    max_new_tokens: int = 512
    wm_max_new_tokens: int = 48
    anchors_per_task: int = 0
    # Sampling at 1.0, the tuned model strays from the program it was taught in most
    # samples (a per-token NLL of 0.02 over 500 tokens); at 0.3 most samples are valid.
    temperature: float = 0.3

    def agent(self, graphdef, tokenizer) -> TextAgent:
        """A `TextAgent` as `text.make_agent` builds it (2 WM samples); `graphdef` may be
        None for an agent that only builds prompts."""
        return TextAgent(
            graphdef,
            tokenizer,
            max_prompt_tokens=self.max_prompt_tokens,
            max_new_tokens=self.max_new_tokens,
            wm_max_new_tokens=self.wm_max_new_tokens,
            wm_samples=2,
            temperature=self.temperature,
            top_p=1.0,
            top_k=0,
            anchors_per_task=self.anchors_per_task,
            chat_template_kwargs={"enable_thinking": False},
        )


class Variant(NamedTuple):
    """One program the policy is taught, with its sampling probability."""

    family: str
    depth: int
    probability: float

    @property
    def name(self) -> str:
        return f"{self.family}-depth{self.depth}"

    @property
    def source(self) -> str:
        return PROGRAM.format(family=self.family, depth=self.depth)


def variants() -> list[Variant]:
    """Every (family, depth) program, with probability the product of the two choices."""
    return [Variant(f, d, pf * pd) for f, pf in FAMILIES.items() for d, pd in DEPTHS.items()]


def solver_answer(source: str) -> str:
    """The policy's answer text: the program in one fenced block."""
    return f"```python\n{source}```"


def wm_answer(valid_probability: float, percentile: float) -> str:
    """The world model's answer text, the JSON object `parse_wm_answer` reads."""
    return json.dumps(
        {"valid_probability": round(valid_probability, 2), "percentile": round(percentile, 2)}
    )


def measure(tasks: Sequence, programs: Sequence[Variant], *, workers: int) -> dict:
    """Executes every variant on every task (local-process sandbox) and grades it.

    Returns:
        {variant name: {task id: Outcome}}.
    """
    from wmrl_jax.envs.outcomes import SandboxOutcomes
    from wmrl_jax.sandbox.local import LocalExecutor

    outcomes = SandboxOutcomes(LocalExecutor(timeout_s=120.0, max_workers=workers))
    try:
        futures = {(v.name, t.id): outcomes.submit(t, v.source) for v in programs for t in tasks}
        done = {key: f.result() for key, f in futures.items()}
    finally:
        outcomes.close()
    return {v.name: {t.id: done[v.name, t.id] for t in tasks} for v in programs}


def targets(measured: dict) -> dict[str, tuple[float, float]]:
    """{variant name: (valid fraction, mean percentile of its valid runs, 0 if none)}."""
    out = {}
    for name, by_task in measured.items():
        pct = [o.percentile for o in by_task.values() if o.status == "ok"]
        out[name] = (len(pct) / len(by_task), float(np.mean(pct)) if pct else 0.0)
    return out


class Examples:
    """Draws (prompt ids, completion ids) training pairs from the agent's real prompts.

    Args:
        agent: the `TextAgent` whose prompt builders make the prompts.
        solver_tasks: tasks whose solver prompt is answered with a program.
        wm_tasks: tasks whose WM prompts are answered (ids in `measured`).
        measured: `measure`'s outcomes, for the answers and the anchors.
        rng: numpy Generator, the only source of randomness.
    """

    def __init__(self, agent: TextAgent, solver_tasks, wm_tasks, measured: dict, rng):
        self.agent, self.solver_tasks, self.wm_tasks = agent, list(solver_tasks), list(wm_tasks)
        self.measured, self.rng = measured, rng
        self.variants = variants()
        self.probs = np.array([v.probability for v in self.variants])
        self.targets = targets(measured)
        self.end = (
            [agent.stop_ids[0]]
            if agent.tokenizer.eos_token_id is None
            else [agent.tokenizer.eos_token_id]
        )
        self._encode = functools.cache(
            lambda text: tuple(agent.tokenizer(text, add_special_tokens=False)["input_ids"])
        )

    def _variant(self) -> Variant:
        return self.variants[self.rng.choice(len(self.variants), p=self.probs)]

    def solver(self) -> tuple[list[int], list[int]]:
        task = self.solver_tasks[self.rng.integers(len(self.solver_tasks))]
        answer = self._encode(solver_answer(self._variant().source))
        return self.agent.solver_prompt_ids(task), [*answer, *self.end]

    def wm(self) -> tuple[list[int], list[int]]:
        task = self.wm_tasks[self.rng.integers(len(self.wm_tasks))]
        variant = self._variant()
        shown = []
        # A third of the prompts show one or two anchors, where the agent keeps any.
        most = min(2, self.agent.anchors_per_task)
        weights = [1.0] if most == 0 else [2 / 3, *[1 / 3 / most] * most]
        for _ in range(self.rng.choice(most + 1, p=weights)):
            other = self._variant()
            o = self.measured[other.name][task.id]
            valid = o.status == "ok"
            shown.append(AnchorExample(other.source, valid, o.percentile if valid else 0.0))
        p, q = self.targets[variant.name]
        q = float(np.clip(q + self.rng.choice(JITTER), 0.0, 1.0)) if p > 0 else 0.0
        prompt = self.agent.wm_prompt_ids(task, variant.source, anchors=shown)
        return prompt, [*self._encode(wm_answer(p, q)), *self.end]


def suite_tasks() -> list:
    """The built-in core suite (seed 0), the tasks of the ``runlocal`` config."""
    from wmrl_jax.envs import builtin
    from wmrl_jax.envs.task import load_task

    root = builtin.cached_suite(seed=0)
    paths = [os.path.join(root, d) for d in sorted(os.listdir(root))]
    return [load_task(p) for p in paths if os.path.isdir(p)]


def prompt_sample(shape: AgentShape, base: str = BASE) -> dict[str, list[int]]:
    """Prompt ids the tuning saw: every task's solver prompt and, on train tasks, a WM
    prompt without and with an anchor. A change of the agent's prompts changes them."""
    from wmrl_jax.models.api import load_tokenizer_from

    agent = shape.agent(None, load_tokenizer_from(base))
    first, second = variants()[:2]
    anchor = AnchorExample(second.source, True, 0.5)
    out = {}
    for task in suite_tasks():
        out[f"solver/{task.id}"] = agent.solver_prompt_ids(task)
        if task.split == "train":
            out[f"wm/{task.id}"] = agent.wm_prompt_ids(task, first.source, anchors=[])
            out[f"wm_anchor/{task.id}"] = agent.wm_prompt_ids(task, first.source, [anchor])
    return out


def prompts_digest(shape: AgentShape, base: str = BASE) -> str:
    """sha256 of `prompt_sample` (stored in fixture.json, checked by the tests)."""
    sample = json.dumps(prompt_sample(shape, base), sort_keys=True)
    return hashlib.sha256(sample.encode()).hexdigest()


def pack(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int, multiple: int = 256):
    """Left-padded `(ids, mask, weight)` int32 / int32 / float32 arrays of shape [B, T].

    T is the longest prompt + completion rounded up to `multiple` (few shapes, few
    compilations); `weight` is 1 on completion tokens, the ones the loss predicts.
    Positions come from the mask, so the padding does not move them.
    """
    longest = max(len(p) + len(c) for p, c in pairs)
    t = -(-longest // multiple) * multiple
    ids = np.full((len(pairs), t), pad_id, np.int32)
    mask = np.zeros((len(pairs), t), np.int32)
    weight = np.zeros((len(pairs), t), np.float32)
    for i, (p, c) in enumerate(pairs):
        n = len(p) + len(c)
        ids[i, t - n :] = [*p, *c]
        mask[i, t - n :] = 1
        weight[i, t - len(c) :] = 1.0
    return ids, mask, weight


def completion_nll(graphdef, params, ids, mask, weight) -> jax.Array:
    """Mean negative log-likelihood of the weighted tokens, [B, T] inputs -> scalar."""
    from wmrl_jax.models import apply, token_logprobs

    logits = apply(graphdef, params, ids[:, :-1], mask[:, :-1])
    logp = token_logprobs(logits, ids[:, 1:])
    w = weight[:, 1:]
    return -jnp.sum(logp * w) / jnp.maximum(jnp.sum(w), 1.0)


def make_train_step(graphdef, tx: optax.GradientTransformation):
    """`step(params, opt_state, solver, wm) -> (params, opt_state, (solver_nll, wm_nll))`.

    `solver` and `wm` are `pack` triples; each kind's per-token mean counts once, so
    the short WM answers weigh as much as the long programs.
    """

    def loss(params, solver, wm):
        a, b = completion_nll(graphdef, params, *solver), completion_nll(graphdef, params, *wm)
        return a + b, (a, b)

    @jax.jit
    def step(params, opt_state, solver, wm):
        (_, parts), grads = jax.value_and_grad(loss, has_aux=True)(params, solver, wm)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, parts

    return step


def check(agent: TextAgent, params, train_tasks, heldout_tasks, *, seed: int) -> dict:
    """Samples the tuned model the way the trainer does and counts what parses.

    Also asks the world model about every variant on the first train task
    (`wm_by_variant`: its mean predicted reward per variant, sampled as in training).
    """
    from wmrl_jax.agents.base import Rollout

    key = jax.random.key(seed)
    ro = agent.rollout(params, train_tasks, group_size=4, key=jax.random.fold_in(key, 0))
    wm = agent.predict(params, train_tasks, ro, key=jax.random.fold_in(key, 1))
    failures = agent.last_answer_failures
    greedy = agent.greedy_programs(params, heldout_tasks)
    ok = [p for p, c in zip(ro.programs, ro.causes, strict=True) if c == "ok"]
    every = variants()
    asked = Rollout([v.source for v in every], {}, 0)
    by_variant = agent.predict(params, train_tasks[:1], asked, key=jax.random.fold_in(key, 2))
    return {
        "rollout_rows": len(ro.programs),
        "rollout_programs": len(ok),
        "distinct_programs": len(set(ok)),
        "wm_answers": len(ok) * agent.wm_samples,
        "wm_unusable_answers": failures,
        "wm_means": [_rounded(m) for m in wm.mean],
        "wm_by_variant": {v.name: _rounded(m) for v, m in zip(every, by_variant.mean, strict=True)},
        "greedy_programs": sum(find_program(p).ok for p in greedy),
        "greedy_rows": len(greedy),
    }


def _rounded(value) -> float | None:
    return None if np.isnan(value) else round(float(value), 3)


def tune(model, examples: Examples, *, steps: int, batch: int, lr: float, log=print):
    """Fine-tunes `model`'s params on `examples`; returns (params, [(step, nlls), ...]).

    AdamW (no weight decay) with linear warmup over 5% of the steps and cosine decay
    to lr / 10, gradients clipped at norm 1; each step sees `batch` solver and `batch`
    WM examples.
    """
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 20, 1), steps, lr / 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
    params, pad = model.params, examples.agent.pad_id
    opt_state = tx.init(params)
    step = make_train_step(model.graphdef, tx)
    history, start = [], time.time()
    for i in range(steps):
        solver = pack([examples.solver() for _ in range(batch)], pad)
        wm = pack([examples.wm() for _ in range(batch)], pad)
        params, opt_state, (a, b) = step(params, opt_state, solver, wm)
        if i % 20 == 0 or i == steps - 1:
            history.append((i, round(float(a), 5), round(float(b), 5)))
            log(f"step {i}: solver nll {float(a):.4f}, wm nll {float(b):.4f}, "
                f"{time.time() - start:.0f} s")  # fmt: skip
    return params, history


def build(
    out: str, *, base: str = BASE, steps: int = 150, batch: int = 2, lr: float = 5e-3,
    seed: int = 0, workers: int = 2, shape: AgentShape = AgentShape(),
) -> dict:  # fmt: skip
    """Tunes `base` and writes the checkpoint and `fixture.json` to `out`; returns the record.

    Args:
        out: output directory (replaced files: the checkpoint's and fixture.json).
        base: the checkpoint to start from (its tokenizer is kept).
        steps: optimizer steps, each on `batch` solver and `batch` WM examples.
        lr: peak learning rate (AdamW, warmup then cosine decay).
        seed: data order and check sampling.
        workers: parallel executions when measuring the variants.
        shape: the agent lengths to tune for.
    """
    from wmrl_jax import models

    start = time.time()
    tasks = suite_tasks()
    train = [t for t in tasks if t.split == "train"]
    measured = measure(train, variants(), workers=workers)
    model = models.from_pretrained(base)
    agent = shape.agent(model.graphdef, model.tokenizer)
    examples = Examples(agent, tasks, train, measured, np.random.default_rng(seed))
    params, history = tune(model, examples, steps=steps, batch=batch, lr=lr)
    tuned = models.from_params(
        model.config,
        jax.tree.map(np.asarray, _pure(params)),
        raw_config=model.raw_config,
        tokenizer=model.tokenizer,
        layout=model.layout,
        source_dir=base,
    )
    os.makedirs(out, exist_ok=True)
    tuned.save_pretrained(out)
    settings = dict(base=base, seed=seed, steps=steps, batch=batch, lr=lr)
    return write_record(out, measured, history, settings, shape, seconds=time.time() - start)


def write_record(
    out: str, measured: dict, history: list, settings: dict, shape: AgentShape, *, seconds: float
) -> dict:
    """Checks the checkpoint in `out` and writes `out/fixture.json`; returns the record."""
    from wmrl_jax import models

    tasks = suite_tasks()
    train = [t for t in tasks if t.split == "train"]
    heldout = [t for t in tasks if t.split == "held-out"]
    tuned = models.from_pretrained(out)
    taught = targets(measured)
    record = {
        **settings,
        "shape": dataclasses.asdict(shape),
        "variants": [
            {
                "name": v.name,
                "probability": v.probability,
                "taught_answer": wm_answer(*taught[v.name]),
                "outcomes": {
                    tid: [o.status, round(o.percentile, 4) if o.status == "ok" else None]
                    for tid, o in measured[v.name].items()
                },
            }
            for v in variants()
        ],
        "nll_history": history,
        "prompts_digest": prompts_digest(shape, settings["base"]),
        "check": check(
            shape.agent(tuned.graphdef, tuned.tokenizer),
            tuned.params,
            train[:4],
            heldout,
            seed=settings["seed"],
        ),
        "build_seconds": round(seconds, 1),
    }
    with open(os.path.join(out, "fixture.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")
    return record


def _pure(params):
    from flax import nnx

    return nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/agents/fixtures/qwen3_text_tuned")
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    record = build(
        args.out, base=args.base, steps=args.steps, batch=args.batch, lr=args.lr,
        seed=args.seed, workers=args.workers,
    )  # fmt: skip
    print(json.dumps(record["check"]), f"{record['build_seconds']} s")


if __name__ == "__main__":
    main()
