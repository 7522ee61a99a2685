"""A synthetic world model over the recipe table: a knob for the world model's quality.

For a (task, program) the prediction is a monotone distortion of the program's
true reward (its replicate mean in the `RecipeTable`) scrambled within each
GRPO group to a target within-group Spearman q (`wmrl_jax.core.synthetic_wm`:
a Gaussian copula, ρ = 2·sin(π·q/6)), plus optionally

* blind spots: a fixed set of exactly round(blind_spot_fraction · R) of the R
  recipes per task, drawn among the task's below-median ones, over-rated by
  `blind_spot_size` every time they are seen (a persistent error that only
  anchors reveal, as in `wmrl_jax.envs.simulated`);
* failure recall: of the programs that fail (most of their replicates are not
  "ok"), a fixed share `failure_recall` is foreseen (ranked with their real,
  floor reward); the others are predicted like the group's typical program.

The distortion is `wmrl_jax.envs.simulated.distort` on the percentile part of
the reward (offset + scale · r^gamma on r clipped to [0, 1]); a failure's
negative floor passes through, so the map stays monotone.

It replaces only the predictions: the agent's own world-model pass still runs,
so the ledger charges exactly what the learned world model costs (its tokens,
rows and seconds; the modelled ledger likewise), and policy, anchors,
correction and ledger are those of every other arm. Its variance is the
noise's variance under the Gaussian approximation, (1 − ρ²)·Var(x) over the
group of distorted truths x (floored at 1e-6): what `wm_var="per_sample"`
reads. Each step it reports `q_realised` (the mean within-group Spearman of its
predictions, blind spots included, with the true rewards, over groups of at
least 3 rows that are not constant) and `q_groups` (the groups counted):
the trainer logs them as `wm/q_realised`, `wm/q_groups`; `realised_q` pools
them over a run.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.core import stats, synthetic_wm
from wmrl_jax.envs import grading, simulated
from wmrl_jax.envs.task import Task

__all__ = ["SyntheticWorldModel", "default_config", "realised_q", "validate_config"]


def default_config() -> ml_collections.ConfigDict:
    """`config.world_model.synthetic`: target quality, distortion, blind spots, recall."""
    spec = simulated.WorldModelSpec()
    c = ml_collections.ConfigDict()
    c.q = 0.4  # Target within-group Spearman with the true reward, in [-1, 1].
    c.offset, c.scale, c.gamma = spec.offset, spec.scale, spec.gamma  # The distortion.
    c.blind_spot_fraction = 0.0  # Of the R recipes per task, among the below-median ones.
    c.blind_spot_size = 0.4
    c.failure_recall = 1.0  # Share of failing programs the world model foresees.
    c.seed = 0  # Blind spots, recalled failures and the noise's stream.
    return c


def validate_config(c: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first bad field of `config.world_model.synthetic`."""
    checks = (
        ("q", c.q, -1.0 <= c.q <= 1.0, "in [-1, 1]"),
        ("scale", c.scale, c.scale > 0, "> 0 (a monotone distortion)"),
        ("gamma", c.gamma, c.gamma > 0, "> 0 (a monotone distortion)"),
        ("blind_spot_fraction", c.blind_spot_fraction, 0.0 <= c.blind_spot_fraction <= 0.5,
         "in [0, 0.5] (blind spots fall on below-median recipes)"),
        ("failure_recall", c.failure_recall, 0.0 <= c.failure_recall <= 1.0, "in [0, 1]"),
        ("seed", c.seed, 0 <= c.seed < 2**32, "in [0, 2**32)"),
    )  # fmt: skip
    for field, value, ok, rule in checks:
        if not ok:
            raise ValueError(f"config.world_model.synthetic.{field} must be {rule}, got {value}")


def realised_q(steps: Sequence[Mapping[str, float]]) -> float:
    """A run's realised q: `wm/q_realised` pooled over its steps, weighted by the groups
    each step counted (`wm/q_groups`); NaN when no step counted a group."""
    total = groups = 0.0
    for s in steps:
        n = float(s.get("wm/q_groups", 0.0))
        if n > 0:
            total, groups = total + n * float(s["wm/q_realised"]), groups + n
    return total / groups if groups else float("nan")


def _group_q(pred: np.ndarray, truth: np.ndarray, g: int) -> tuple[float, int]:
    """`(mean within-group Spearman, groups counted)`, as `stats.group_rank_correlation`."""
    corr, counted = map(np.asarray, stats.group_rank_correlations(pred, truth, g))
    return (float(corr[counted].mean()) if counted.any() else float("nan")), int(counted.sum())


class SyntheticWorldModel:
    """Predictions of a chosen within-group Spearman q over the recipe table.

    Args:
      agent: the run's agent; its world-model pass runs for the ledger's cost.
      table: the `RecipeTable` whose replicate means are the truth.
      floors: the run's reward floors (as the replay executor's).
      config: `config.world_model.synthetic` (see `default_config`).

    Example:
      >>> wm = SyntheticWorldModel(agent, table, floors, config)   # doctest: +SKIP
      >>> out = wm.predict(params, tasks, rollout, key=key)        # doctest: +SKIP
      >>> out.diagnostics["q_realised"]                            # doctest: +SKIP
    """

    def __init__(self, agent, table, floors: grading.RewardFloors, config):
        from wmrl_jax.envs.outcomes import ReplayExecutor

        validate_config(config)
        self.agent, self.table, self.floors = agent, table, floors
        self.config = ml_collections.ConfigDict(config.to_dict())
        self._replay = ReplayExecutor(table, floors=floors)  # program -> recipe index
        self._tasks: dict[str, tuple[np.ndarray, ...]] = {}
        spec = simulated.WorldModelSpec(self.config.offset, self.config.scale, self.config.gamma)
        self._spec = spec
        q = float(self.config.q)
        self._predict = jax.jit(
            lambda x, m, e, s: synthetic_wm.synthetic_predictions(x, m, e, s, q=q)
        )

    def task_view(self, task_id: str) -> tuple[np.ndarray, ...]:
        """`(truth, failed, blind, recalled)` of the task's R recipes, each of shape [R]."""
        if task_id not in self._tasks:
            c = self.config
            truth = self.table.reward(task_id, self.floors)
            ok = self.table.status[self.table.row(task_id)] == 0  # [R, K]
            failed = ok.mean(axis=1) < 0.5
            rng = np.random.default_rng([int(c.seed), zlib.crc32(task_id.encode())])
            # Below the median: a blind spot on a good recipe would hardly hurt.
            low = np.flatnonzero(truth < np.median(truth))
            count = int(round(c.blind_spot_fraction * len(truth)))
            if count > len(low):
                raise ValueError(
                    f"task {task_id!r}: {count} blind spots asked, {len(low)} recipes are "
                    "below the task's median reward"
                )
            blind = np.zeros(len(truth), bool)
            blind[rng.permutation(low)[:count]] = True
            recalled = rng.uniform(size=len(truth)) < c.failure_recall
            self._tasks[task_id] = (truth, failed, blind, recalled)
        return self._tasks[task_id]

    def rows(self, tasks: Sequence[Task], programs: Sequence[str], g: int):
        """`(truth, failed, blind, recalled)` of every row, each [N]; NaN truth where a
        row holds no program."""
        out = np.zeros((4, len(programs)))
        out[0] = np.nan
        for i, program in enumerate(programs):
            if not program:
                continue
            task = tasks[i // g]
            r = self._replay.recipe_of(task, program)
            out[:, i] = [view[r] for view in self.task_view(task.id)]
        return out[0], out[1] > 0, out[2] > 0, out[3] > 0

    def distort(self, truth: np.ndarray) -> np.ndarray:
        """The monotone distortion: `simulated.distort` on the percentile part, the
        negative floors passed through."""
        pct = np.clip(truth, 0.0, 1.0)
        return np.asarray(simulated.distort(pct, self._spec)) + np.minimum(truth, 0.0)

    def predict(self, params, tasks: Sequence[Task], rollout: Rollout, *, key) -> WMOutput:
        """Synthetic predictions for every row of `rollout`; charged as the agent's pass."""
        base = self.agent.predict(params, tasks, rollout, key=key)  # The cost, not the values.
        n = len(rollout.programs)
        g = n // len(tasks)
        truth, failed, blind, recalled = self.rows(tasks, rollout.programs, g)
        mask = np.isfinite(truth)
        x = np.where(mask, self.distort(np.where(mask, truth, 0.0)), 0.0)
        noise = jax.random.normal(jax.random.fold_in(key, int(self.config.seed)), (n,))
        shape = (n // g, g)
        mean, var = self._predict(
            jnp.asarray(x.reshape(shape), jnp.float32), jnp.asarray(mask.reshape(shape)),
            noise.reshape(shape), jnp.asarray((failed & ~recalled).reshape(shape)),
        )  # fmt: skip
        mean = np.asarray(mean, np.float32).reshape(-1)
        mean = mean + np.float32(self.config.blind_spot_size) * blind
        var = np.asarray(var, np.float32).reshape(-1)
        q, groups = _group_q(mean, truth, g)
        diagnostics = {"q_realised": q, "q_groups": float(groups)}
        return WMOutput(mean, var, base.wm_tokens, 0, diagnostics=diagnostics)
