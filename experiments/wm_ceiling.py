r"""The world model's information ceiling: how well can anything rank a group's programs?

On the held-out tasks of the grown suite, within groups of `--group-size`
recipes drawn uniformly (the size of the policy's groups), the within-group
Spearman correlation with the true reward of:

- one real execution: replicate 0's reward;
- a recipe prior: each recipe's mean reward over the fitting tasks (no observation);
- the best cross-task predictor we have: gradient boosting on (observation, recipe slots);
- the learned world model: the recipe LM warm-started on the fitting tasks' table
  rewards (`lm.warm_start`), read out with `lm.wm_predict`, out of sample;

each with the shape-only observation (the 7 tokens the prompt had before the
landmarks; for the LM, the new tokens held constant) and the full observation.
The fitting tasks are the pretrain and training tasks; the true reward of a
held-out recipe is the mean of replicates 1..K-1, so one execution (replicate 0)
is not compared with itself. Everything reads the recipe table; nothing executes.

    python -m experiments.wm_ceiling [--groups 200] [--wm-steps 600] [--docs docs/tasks.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence

import jax
import numpy as np

from wmrl_jax import readme
from wmrl_jax.agents.recipe import lm
from wmrl_jax.agents.recipe import vocab as rv
from wmrl_jax.core import stats
from wmrl_jax.envs import recipes, suite, tabular
from wmrl_jax.envs.task import load_task
from wmrl_jax.models import api

SECTION = "wm-ceiling"
SHAPE_GROUPS = tuple(name for name, _ in rv.FEATURE_GROUPS[:7])


def observations(seed: int = 0) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Feature buckets and split of every grown-suite task (data written to a temp dir)."""
    feats, split = {}, {}
    with tempfile.TemporaryDirectory() as root:
        for spec in suite.suite_specs("grown"):
            task = load_task(suite.write_task(spec, root, seed=seed)[0])
            feats[task.id], split[task.id] = rv.task_features(task), task.split
    return feats, split


def group_spearman(pred: np.ndarray, truth: np.ndarray, groups: np.ndarray) -> float:
    """Mean Spearman correlation within each row of `groups` (recipe indices [G, k]);
    groups where either side is constant are skipped (`stats.group_rank_correlation`,
    the measure of the regime map and of `python -m experiments.wm_probe`)."""
    k = groups.shape[1]
    return float(stats.group_rank_correlation(pred[groups].ravel(), truth[groups].ravel(), k))


def _design(feats: dict[str, int], groups: Sequence[str]) -> np.ndarray:
    slots = np.asarray([tuple(recipes.recipe_from_index(i)) for i in range(recipes.NUM_RECIPES)])
    obs = np.tile([feats[g] for g in groups], (len(slots), 1))
    return np.concatenate([obs, slots], axis=1).astype(np.float64)


def boosting(feats, fit, evaluate, rewards, groups: Sequence[str]) -> dict[str, np.ndarray]:
    """Gradient boosting on (observation groups, recipe slots) -> reward, fitted on `fit`."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    x = np.concatenate([_design(feats[t], groups) for t in fit])
    y = np.concatenate([rewards[t] for t in fit])
    model = HistGradientBoostingRegressor(max_iter=300, learning_rate=0.05, random_state=0)
    with threadpool_limits(1):  # OpenMP threads on a busy machine cost more than they give
        model.fit(x, y)
        return {t: model.predict(_design(feats[t], groups)) for t in evaluate}


def _prompt(vocab: rv.RecipeVocab, feats: dict[str, int], *, shape_only: bool) -> np.ndarray:
    ids = [
        vocab.feature_offset(name) + (feats[name] if name in SHAPE_GROUPS or not shape_only else 0)
        for name, _ in rv.FEATURE_GROUPS
    ]
    return np.asarray([rv.BOS, *ids, rv.RECIPE], np.int32)


def world_model(feats, fit, evaluate, rewards, *, shape_only: bool, steps: int, seed: int):
    """The recipe LM warm-started on the `fit` tasks' rewards; its predicted means."""
    vocab = rv.RecipeVocab()
    raw = lm.make_backbone(vocab, hidden_size=64, num_layers=2, num_heads=4)
    init_key, key = jax.random.split(jax.random.key(seed))
    model = api.random_model(raw, init_key)
    prompts = np.stack([_prompt(vocab, feats[t], shape_only=shape_only) for t in fit])
    data = lm.warm_start_data(vocab, prompts, np.stack([rewards[t] for t in fit]))
    params, _ = lm.warm_start(
        model.graphdef, model.params, data, vocab=vocab, steps=steps, batch_size=256, lr=3e-3,
        key=key,
    )  # fmt: skip
    tokens = rv.all_recipe_tokens(vocab)
    out = {}
    for t in evaluate:
        prompt = np.tile(_prompt(vocab, feats[t], shape_only=shape_only), (len(tokens), 1))
        mean, _, _ = lm.wm_predict(model.graphdef, params, prompt, tokens, vocab=vocab)
        out[t] = np.asarray(mean, np.float64)
    return out


def ceiling(args, log=sys.stderr) -> list[tuple[str, str, float, float]]:
    """Rows (predictor, observation, mean within-group Spearman over held-out tasks, s.e.)."""
    table = tabular.RecipeTable.load(args.table or None)
    feats, split = observations(args.suite_seed)
    fit = [t for t in table.task_ids if split[t] != "held-out"]
    evaluate = [t for t in table.task_ids if split[t] == "held-out"]
    per_rep = {t: table.replicate_reward(t) for t in table.task_ids}
    rewards = {t: r.mean(axis=1) for t, r in per_rep.items()}
    truth = {t: per_rep[t][:, 1:].mean(axis=1) for t in evaluate}
    rng = np.random.default_rng(args.seed)
    groups = {
        t: np.stack(
            [rng.choice(recipes.NUM_RECIPES, args.group_size, replace=False)
             for _ in range(args.groups)]
        )
        for t in evaluate
    }  # fmt: skip
    prior = np.mean([rewards[t] for t in fit], axis=0)
    preds = [
        ("one real execution", "-", {t: per_rep[t][:, 0] for t in evaluate}),
        ("recipe prior (mean over fitting tasks)", "none", dict.fromkeys(evaluate, prior)),
    ]
    all_groups = tuple(name for name, _ in rv.FEATURE_GROUPS)
    for label, names in (("shape", SHAPE_GROUPS), ("shape + landmarks", all_groups)):
        start = time.perf_counter()
        preds.append(("gradient boosting", label, boosting(feats, fit, evaluate, rewards, names)))
        print(f"boosting on {label}: {time.perf_counter() - start:.0f} s", file=log)
    for label, shape_only in (("shape", True), ("shape + landmarks", False)):
        for seed in range(args.wm_seeds):
            start = time.perf_counter()
            p = world_model(
                feats, fit, evaluate, rewards, shape_only=shape_only, steps=args.wm_steps,
                seed=seed,
            )  # fmt: skip
            preds.append((f"learned world model (seed {seed})", label, p))
            print(f"world model on {label}: {time.perf_counter() - start:.0f} s", file=log)
    rows = []
    for name, obs, pred in preds:
        per_task = [group_spearman(pred[t], truth[t], groups[t]) for t in evaluate]
        se = np.std(per_task, ddof=1) / np.sqrt(len(per_task))
        rows.append((name, obs, float(np.mean(per_task)), float(se)))
    return rows


def markdown(rows, args) -> str:
    lines = [
        "| predictor | observation | within-group Spearman | s.e. |",
        "|---|---|---:|---:|",
        *(f"| {n} | {o} | {m:.3f} | {s:.3f} |" for n, o, m, s in rows),
        "",
        f"Held-out tasks of the grown suite (12), {args.groups} uniform groups of "
        f"{args.group_size} recipes per task; mean over tasks of the mean within-group "
        "Spearman correlation with the mean of replicates 1..K-1, and its standard error "
        f"over tasks. Fitted on the 44 pretrain and training tasks; the world model is "
        f"warm-started for {args.wm_steps} steps. Generated by "
        f"`python -m experiments.wm_ceiling --groups {args.groups} --wm-steps {args.wm_steps} "
        f"--wm-seeds {args.wm_seeds} --docs docs/tasks.md`.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="", help="recipe table ('' = the committed one)")
    parser.add_argument("--suite-seed", type=int, default=0)
    parser.add_argument("--groups", type=int, default=200, help="groups per held-out task")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--wm-steps", type=int, default=600)
    parser.add_argument("--wm-seeds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="seed of the groups")
    parser.add_argument("--docs", default=None, help=f"rewrite this page's {SECTION} section")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.group_size < 2 or args.wm_steps < 1 or args.wm_seeds < 0:
        parser.error("need --groups >= 1, --group-size >= 2, --wm-steps >= 1, --wm-seeds >= 0")
    body = markdown(ceiling(args), args)
    print(body)
    if args.docs:
        readme.write_section(args.docs, SECTION, body)


if __name__ == "__main__":
    main()
