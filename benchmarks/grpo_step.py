"""The whole GRPO step -- sample, reward, reference forward, update -- against Tunix's learner.

    python -m benchmarks.grpo_step [--prompts 4] [--samples 4] [--prompt 32] [--new 32]
        [--trials 3] [--rounds 10] [--compile-ahead] [--reward-wait 0] [--skip tunix]
        [--json PATH]

One step, as a GRPO loop runs it: sample ``--samples`` completions of exactly
``--new`` tokens (no stop token can fire) for each of ``--prompts`` prompts of
``--prompt`` tokens (temperature 1, float32), score them with a reward function
on the host, take group-relative advantages, run the reference model's forward
for the KL term (k3, weight ``--kl-coef``) and ONE clipped policy-gradient
update (Adam, gradient clipped at norm 1), everything waited on. Same random
tiny Qwen3 (`benchmarks.forward`'s ``tiny`` preset: 2 layers, width 64) for
both implementations.

* ``ours``: `wmrl_jax.models.sample` on the current policy params (one prefill
  per prompt, its cache copied for the samples), the batch built from its
  tokens and sampling log-probs (`grpo_batch`), then
  `wmrl_jax.train.step.TrainStep` (reference forward inside the jitted step).
  With ``--compile-ahead`` the first step starts `TrainStep.compile_ahead`
  before sampling, so the update compiles while the sampler compiles and runs
  (a loop knows its batch shapes in advance). ``--reward-wait S`` makes every
  reward take S seconds more (both implementations), as sandbox executions do.
* ``tunix``: Tunix's ``GrpoLearner`` on an ``RLCluster`` (vanilla rollout,
  actor, rollout and reference on one one-device mesh), driven by its own
  ``train`` loop; Tunix's sampler takes text, so the prompts are drawn to
  round-trip exactly through the checkpoint's tokenizer (the same 32 tokens).

Reported: setup, the first step (tracing + compilation + the step: what a
user waits for before training runs) and the median steady step. Each of
``--trials`` trials runs in a fresh process (cold compiles), alternating whose
first step comes first. Our steady steps run *between* Tunix's (its train loop
pulls each batch from a Python generator that times the step that just ended,
then runs one of ours), so load from other processes hits both alike; ratios
are taken within a trial and their median reported. Tunix is optional and
installed apart (see the README).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.forward import anchor, make_checkpoint, tunix_model, write_json
from wmrl_jax import models
from wmrl_jax.core import grpo
from wmrl_jax.models import sharding
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib


def token_reward(completions: np.ndarray, vocab_size: int) -> np.ndarray:
    """A cheap host-side reward: the fraction of completion tokens in the vocabulary's lower half.

    Args:
      completions: int of shape [N, T].
      vocab_size: the model's vocabulary size.

    Returns:
      float32 of shape [N].
    """
    return np.mean(np.asarray(completions) < vocab_size // 2, axis=-1).astype(np.float32)


def text_reward(prompts, completions, **kwargs) -> list[float]:
    """Tunix's reward function: the fraction of ASCII letters in each completion's text."""
    del prompts, kwargs
    return [sum(c.isascii() and c.isalpha() for c in t) / max(len(t), 1) for t in completions]


_group_advantages = jax.jit(jax.vmap(grpo.group_advantages))


def grpo_batch(prompts: np.ndarray, out: models.SampleOutput, rewards: np.ndarray) -> dict:
    """The train-step batch of K sampled completions per prompt.

    Args:
      prompts: int32 of shape [B, P], no padding.
      out: `models.sample(..., num_samples=K)` output, arrays of shape [B K, N].
      rewards: float32 of shape [B K], row i K + j for sample j of prompt i.

    Returns:
      The `wmrl_jax.train.step` batch of B K sequences of P + N tokens: the
      loss on generated tokens, sampling log-probs as the old log-probs, and
      GRPO (std-normalised) advantages within each prompt's group.
    """
    b, p = prompts.shape
    tokens, logprobs, mask = (np.asarray(x) for x in (out.tokens, out.logprobs, out.mask))
    rows = tokens.shape[0]
    if rows % b or rewards.shape != (rows,):
        raise ValueError(f"{rows} sampled rows, rewards {rewards.shape}, for {b} prompts")
    k = rows // b
    zeros = np.zeros((rows, p), np.float32)
    advantages = _group_advantages(jnp.asarray(rewards.reshape(b, k)))
    return {
        "tokens": np.concatenate([np.repeat(prompts, k, axis=0), tokens], axis=1),
        "attention_mask": np.concatenate([np.ones((rows, p), np.int32), mask], axis=1),
        "loss_mask": np.concatenate([zeros, mask.astype(np.float32)], axis=1),
        "old_logprobs": np.concatenate([zeros, logprobs], axis=1),
        "advantages": advantages.reshape(rows),
    }


class OursStep:
    """Our whole GRPO step as a callable: each call samples, scores and updates once.

    Attributes:
      state: the current `TrainState` (donated to and returned by each update).
      metrics: the last update's metrics (host floats).
    """

    def __init__(self, path: str, prompts: np.ndarray, *, samples: int, new: int, kl_coef: float,
                 lr: float, seed: int = 0, compile_ahead: bool = False,
                 reward_wait: float = 0.0):  # fmt: skip
        self.model = models.from_pretrained(path, load_tokenizer=False)
        self.prompts, self.samples, self.new = np.asarray(prompts, np.int32), samples, new
        opt_config = state_lib.default_optimizer_config()
        opt_config.lr = lr
        optimizer = state_lib.make_optimizer(opt_config)
        config = step_lib.default_step_config()
        config.loss.kl_coef = kl_coef
        mesh = sharding.make_mesh(devices=jax.devices()[:1])
        self.train_step = step_lib.make_train_step(self.model.graphdef, optimizer, config, mesh)
        self.state = self.train_step.shard_state(
            state_lib.init_train_state(self.model.params, optimizer, kl_coef=kl_coef)
        )
        self.key = jax.random.key(seed)
        self.metrics: dict = {}
        self._compile_ahead = compile_ahead
        self.reward_wait = reward_wait

    def batch_shapes(self) -> dict:
        """The train batch's shapes, known before sampling: B K rows of P + N tokens."""
        rows, t = len(self.prompts) * self.samples, self.prompts.shape[1] + self.new
        return {
            k: jax.ShapeDtypeStruct((rows, t) if rank == 2 else (rows,), dtype)
            for k, (rank, dtype) in self.train_step.spec.items()
        }

    def __call__(self) -> dict:
        if self._compile_ahead:  # the update compiles while the first rollout does
            self.train_step.compile_ahead(self.state, self.batch_shapes())
            self._compile_ahead = False
        key = jax.random.fold_in(self.key, int(self.state.step))
        sample_key, step_key = jax.random.split(key)
        out = models.sample(
            self.model,
            self.prompts,
            np.ones_like(self.prompts),
            sample_key,
            max_new_tokens=self.new,
            params=self.state.params,
            eos_ids=(),
            num_samples=self.samples,
        )
        rewards = token_reward(out.tokens, self.model.config.vocab_size)
        time.sleep(self.reward_wait)  # a sandbox's execution time, if simulated
        batch = grpo_batch(self.prompts, out, rewards)
        self.state, metrics = self.train_step(self.state, batch, step_key)
        self.metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        return self.metrics


def round_trip_prompts(tokenizer, rng, *, count: int, length: int) -> np.ndarray:
    """`count` rows of `length` token ids whose decoded text encodes back to the same ids.

    Built a token at a time: a random candidate is kept when the row still
    round-trips (a random row rarely does: byte-level BPE re-merges neighbours).
    """
    pool = np.arange(3, len(tokenizer))  # past the special tokens
    rows = []
    for _ in range(count):
        row: list[int] = []
        while len(row) < length:
            candidate = [*row, int(rng.choice(pool))]
            if tokenizer.encode(tokenizer.decode(candidate), add_special_tokens=False) == candidate:
                row = candidate
        rows.append(row)
    return np.asarray(rows, np.int32)


def make_tunix(path: str, prompts: np.ndarray, *, samples: int, new: int, kl_coef: float,
               lr: float, reward_wait: float = 0.0):  # fmt: skip
    """Tunix's GRPO learner on our checkpoint, and the training input of one step."""
    import optax
    from transformers import AutoTokenizer
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    _, config = models.hf_io.load_config(path)
    actor, _ = tunix_model(path, config)
    reference, _ = tunix_model(path, config)
    tokenizer = AutoTokenizer.from_pretrained(path)
    p = prompts.shape[1]
    # Auto axes (`jax.make_mesh` now defaults to explicit ones, which Tunix's gathers refuse).
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    roles = rl_cluster_lib.Role
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=new,
        max_prompt_length=p,
        kv_cache_size=p + new + 1,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        eos_tokens=[config.vocab_size + 1],  # never produced: every completion has `new` tokens
    )
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr)),
        eval_every_n_steps=10**9,
        max_steps=10**9,
    )
    cluster = rl_cluster_lib.RLCluster(
        actor=actor,
        reference=reference,
        tokenizer=tokenizer,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=training,
            rollout_config=rollout,
        ),
    )
    algo = grpo_learner.GrpoConfig(
        num_generations=samples,
        num_iterations=1,
        beta=kl_coef,
        epsilon=0.2,
        loss_agg_mode="token-mean",
    )

    def reward(prompts, completions, **kwargs):
        time.sleep(reward_wait)  # a sandbox's execution time, if simulated
        return text_reward(prompts, completions, **kwargs)

    learner = grpo_learner.GrpoLearner(cluster, algo, reward_fns=[reward])
    text = [tokenizer.decode(row) for row in prompts]
    return learner, {"prompts": np.asarray(text)}  # one leaf: the learner repeats it per sample


def run_interleaved(learner, batch: dict, ours: OursStep, *, rounds: int, ours_first: bool) -> dict:
    """Tunix's first and `rounds` steady steps from its own train loop, ours in between.

    The learner pulls one batch per step from a generator; entering it again
    means the previous step ended (its actor params are waited on first), so
    the generator times that step, then runs and times one of ours. Unless
    `ours_first` (our first step already ran), our first step is the one that
    follows Tunix's first.
    """
    from flax import nnx

    tunix_times, ours_times, first = [], [], {}
    model = learner.rl_cluster.actor_trainer.model
    before = jax.tree_util.tree_map(np.asarray, nnx.state(model, nnx.Param))

    def feed():
        for i in range(rounds + 1):
            start = time.perf_counter()
            yield dict(batch)
            jax.block_until_ready(nnx.state(model))
            tunix_times.append(time.perf_counter() - start)
            if i == 0 and not ours_first:
                first["ours_first"] = timed(ours)
            if i < rounds:
                ours_times.append(timed(ours))

    learner.train(feed())
    after = jax.tree_util.tree_map(np.asarray, nnx.state(model, nnx.Param))
    moved = any(
        not np.array_equal(a, b)
        for a, b in zip(
            jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True
        )
    )
    if not moved:
        raise RuntimeError("Tunix's learner ran but left the actor's params unchanged")
    return {"tunix_first": tunix_times[0], "tunix": tunix_times[1:], "ours": ours_times, **first}


def timed(fn) -> float:
    """Wall seconds of one call of `fn`."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_trial(args) -> dict:
    """One trial in this process: both first steps (cold) and `args.rounds` steady steps each."""
    skip = set(filter(None, args.skip.split(",")))
    ours_first = args.order == "ours"
    out = {"load": [os.getloadavg()[0]], "tunix_note": "skipped"}
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint("tiny", tmp)
        from wmrl_jax.models.fixtures import build_tokenizer

        tokenizer = build_tokenizer()
        tokenizer.save_pretrained(tmp)
        prompts = round_trip_prompts(
            tokenizer, np.random.default_rng(0), count=args.prompts, length=args.prompt
        )
        kw = dict(samples=args.samples, new=args.new, kl_coef=args.kl_coef, lr=args.lr)
        start = time.perf_counter()
        ours = OursStep(
            tmp, prompts, **kw, compile_ahead=args.compile_ahead, reward_wait=args.reward_wait
        )
        out["ours_setup"] = time.perf_counter() - start
        tunix = None
        if "tunix" not in skip:
            start = time.perf_counter()
            tunix, out["tunix_note"] = anchor(
                make_tunix, tmp, prompts, **kw, reward_wait=args.reward_wait
            )
            out["tunix_setup"] = time.perf_counter() - start
        if ours_first or tunix is None:
            out["ours_first"] = timed(ours)
        if tunix is not None:
            learner, batch = tunix
            try:
                out |= run_interleaved(
                    learner, batch, ours, rounds=args.rounds, ours_first="ours_first" in out
                )
            except Exception as err:  # an anchor's failure is reported, not fatal
                out["tunix_note"] = f"failed: {type(err).__name__}: {str(err)[:200]}"
                out.pop("tunix", None)
        if "ours" not in out:
            out.setdefault("ours_first", timed(ours))
            out["ours"] = [timed(ours) for _ in range(args.rounds)]
        out["ours_metrics"] = ours.metrics
    out["load"].append(os.getloadavg()[0])
    return out


def _trial_subprocess(argv: list[str], order: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trial.json")
        cmd = [sys.executable, "-m", "benchmarks.grpo_step", *argv]
        cmd += ["--trials", "1", "--order", order, "--json", path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path, encoding="utf-8") as f:
            return json.load(f)["trials"][0]


def summarize(trials: list[dict]) -> dict:
    """Medians over trials of first steps, steady steps and their ratios."""
    rows = {}
    for impl in ("ours", "tunix"):
        done = [t for t in trials if t.get(impl)]
        if not done:
            continue
        rows[impl] = {
            "first_s": statistics.median(t[f"{impl}_first"] for t in done),
            "steady_s": statistics.median(statistics.median(t[impl]) for t in done),
            "steady_min_s": min(min(t[impl]) for t in done),
            "steady_max_s": max(max(t[impl]) for t in done),
            "setup_s": statistics.median(t[f"{impl}_setup"] for t in done),
        }
    both = [t for t in trials if t.get("tunix")]
    if both:
        # Ratios within each trial (same process, same minutes of load), then the median.
        rows["tunix_over_ours_steady"] = statistics.median(
            statistics.median(t["tunix"]) / statistics.median(t["ours"]) for t in both
        )
        rows["ours_over_tunix_first"] = statistics.median(
            t["ours_first"] / t["tunix_first"] for t in both
        )
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--kl-coef", type=float, default=0.04)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--rounds", type=int, default=10, help="steady steps per trial")
    parser.add_argument(
        "--trials", type=int, default=3, help="fresh processes (cold compiles); >1: subprocesses"
    )
    parser.add_argument(
        "--order", default=None, choices=["ours", "tunix"], help="whose first step runs first"
    )
    parser.add_argument(
        "--compile-ahead",
        action="store_true",
        help="ours: compile the update while sampling (`TrainStep.compile_ahead`)",
    )
    parser.add_argument(
        "--reward-wait",
        type=float,
        default=0.0,
        help="seconds each step's reward waits (both), as for sandbox executions",
    )
    parser.add_argument("--skip", default="", help="comma list of anchors to skip: tunix")
    parser.add_argument("--json", default=None)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.trials == 1:
        args.order = args.order or "ours"
        trials = [run_trial(args)]
    else:  # Each trial in a fresh process, alternating whose first step comes first.
        passed = _strip(argv, ("--trials", "--order", "--json"))
        trials = [_trial_subprocess(passed, ("ours", "tunix")[i % 2]) for i in range(args.trials)]
    rows = summarize(trials)
    loads = [x for t in trials for x in t["load"]]
    print(
        f"GRPO step, tiny Qwen3 (2 layers, width 64) float32: {args.prompts} prompts x "
        f"{args.samples} samples, prompt {args.prompt}, completion {args.new} (full length), "
        f"kl {args.kl_coef}; ours compiles the update "
        f"{'while sampling (compile_ahead)' if args.compile_ahead else 'after sampling'}; "
        f"reward wait {args.reward_wait:g} s; "
        f"{len(trials)} trial(s) x {args.rounds} steady steps; "
        f"{platform.processor() or 'cpu'} x{os.cpu_count()}, load {min(loads):.1f}-"
        f"{max(loads):.1f}; Tunix: {trials[0]['tunix_note']}"
    )
    print("| impl | setup s | first step s | steady step s (min-max) |\n|---|---|---|---|")
    for impl in ("ours", "tunix"):
        if impl in rows:
            r = rows[impl]
            print(
                f"| {impl} | {r['setup_s']:.1f} | {r['first_s']:.1f} | {r['steady_s']:.3f} "
                f"({r['steady_min_s']:.3f}-{r['steady_max_s']:.3f}) |"
            )
    if "tunix_over_ours_steady" in rows:
        steady, first = rows["tunix_over_ours_steady"], rows["ours_over_tunix_first"]
        print(
            f"steady speed, Tunix s / ours s: {steady:.2f}x (aim >= 1: "
            f"{'met' if steady >= 1 else 'missed'}); first step, ours s / Tunix s: "
            f"{first:.2f} (aim <= 0.5: {'met' if first <= 0.5 else 'missed'}); medians of "
            "per-trial ratios"
        )
    payload = {
        "benchmark": "grpo_step",
        "args": vars(args),
        "jax": jax.__version__,
        "tunix_version": _tunix_version(),
        **rows,
        "trials": trials,
    }
    write_json(args.json, payload)
    return payload


def _strip(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` without `flags` and their values (``--flag value`` or ``--flag=value``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in flags)):
            out.append(arg)
    return out


def _tunix_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("google-tunix")
    except Exception:  # not installed, or installed without metadata
        return None


if __name__ == "__main__":
    main()
