"""The controlled study: GRPO on a simulated research environment, one run per arm.

A softmax policy over the candidate solutions of each task is trained with
`wmrl_jax.core.grpo` on rewards from one of the arms of
`wmrl_jax.train.arms.ARMS` (the same table the trainer reads): ``real``
(every group executed), ``anchors_only`` (only the anchor groups, executed,
and nothing else), ``wm_naive`` (uncorrected predictions), ``wm_debias``
(Online Debiasing; anchors use their real score) and ``wmrl`` (plus
Inverse-Variance Denoising on anchors), and the arms beyond the paper:
``wmrl_memory`` (remembered means of executed candidates), ``wmrl_local``
(the local correction; a candidate's features are its index, so "near" is
"same task" and "same candidate"), ``wmrl_active`` (anchor groups drawn by the
rank of their best debiased prediction, weighted 1/π in the map),
``wmrl_plus`` (all three) and ``wmrl_adaptive`` (as many anchor groups as
the WM's out-of-sample error drift asks for, `wmrl_jax.core.rho`), and two
that change the advantages (`wmrl_jax.core.ppi`): ``wmrl_ppi``
(prediction-powered GRPO: the anchors' real advantages plus λ times a
zero-mean WM control variate) and ``wmrl_weighted`` (``wmrl`` with its
WM-scored groups' advantages scaled by the online reliability λ).

Programs recur by default: a task's K candidates are the whole space, as in the
replay table. With ``config.env.novelty`` > 0 every sample is a new program
around its candidate (the candidate is its idea): its true quality is the
candidate's plus fresh zero-mean noise of that standard deviation, which its
real executions and the world model see and a memory of earlier executions of
the candidate does not; the policy's expected true reward is unchanged (the
candidates' qualities).

One arm for all seeds is a single jitted function of a key (a `lax.scan`
over steps, `jax.vmap` over seeds). Because the ground truth is known, every
step records the policy's expected true reward and the error of the rewards
fed to GRPO, and the squared distance of the arm's gradient from real GRPO's
on the same batch (all groups' real rewards); `summarize` turns that into the
study's table, including the real executions each arm spends to reach the
final reward of ``real``.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from wmrl_jax.core import arms as arms_lib
from wmrl_jax.core import correction as correction_lib
from wmrl_jax.core import grpo
from wmrl_jax.core import ppi as ppi_lib
from wmrl_jax.core import rho as rho_lib
from wmrl_jax.core.stats import group_rank_correlation, masked_mean
from wmrl_jax.envs import simulated
from wmrl_jax.studies.analysis import finite, reach
from wmrl_jax.studies.smoothing import trailing_mean

# The key stream (folded into a step's key) of the novel programs' own quality: apart
# from the step's five, so that a run without novelty draws exactly what it always drew.
NOVELTY_STREAM = 1_000_003


def program_quality(step_key: jax.Array, candidate: jax.Array, novelty: float) -> jax.Array:
    """The true quality of each sampled program: its candidate's, plus (novelty > 0: each
    sample a new program) fresh N(0, novelty²) from the step key's novelty stream."""
    if not novelty:  # Static: a run without novelty draws nothing more.
        return candidate
    fresh = jax.random.normal(jax.random.fold_in(step_key, NOVELTY_STREAM), candidate.shape)
    return candidate + novelty * fresh


class _Carry(NamedTuple):
    logits: jax.Array
    opt_state: optax.OptState
    correction: correction_lib.CorrectionState
    mem_sum: jax.Array  # [T, K] sum of real rewards of executed candidates (anchor memory)
    mem_count: jax.Array  # [T, K] their executions
    rho: rho_lib.RhoState  # the WM's out-of-sample error on anchors (adaptive ρ)
    reliability: ppi_lib.ReliabilityState  # real vs WM advantages on anchors (ppi, weighted)


def _masked_var(x, mask):
    count = jnp.maximum(jnp.sum(mask), 1)
    mean = jnp.sum(jnp.where(mask, x, 0)) / count
    return jnp.where(
        jnp.sum(mask) > 1, jnp.sum(jnp.where(mask, (x - mean) ** 2, 0)) / count, jnp.nan
    )


def _policy_loss(logits, tasks, actions, advantages, rows, *, clip_eps: float):
    """GRPO loss of the softmax policy over candidates; `rows` [B, G] masks the loss."""
    logp_all = jax.nn.log_softmax(logits[tasks], axis=-1)  # [B, K]
    logp = jnp.take_along_axis(logp_all, actions, axis=-1)  # [B, G]
    logp = logp.reshape(-1, 1)
    return grpo.grpo_loss(
        logp,
        jax.lax.stop_gradient(logp),
        None,
        advantages.reshape(-1),
        rows.reshape(-1, 1),
        clip_low=clip_eps,
    )


def _fed_rewards(arm: arms_lib.Arm, correction, state, pred, real, anchor, rows: dict):
    """`(fed, valid, debiased WM, state')`, each [B, G], for `arm`: `core.arms.fed_rewards`,
    as the trainer feeds them (the WM's variances are unknown to the study: ones).

    `rows` holds the update's per-row extras (anchor weights, task ids and
    features, remembered means), each flattened over [B·G].
    """
    b, g = pred.shape
    fed = arms_lib.fed_rewards(
        arm, correction, state, pred.reshape(-1), jnp.ones(b * g),
        jnp.where(anchor, real, jnp.nan).reshape(-1), anchor.reshape(-1), **rows,
    )  # fmt: skip
    debiased = correction.debias(fed.state, pred)
    return fed.rewards.reshape(b, g), fed.valid.reshape(b, g), debiased, fed.state


def _wm_prediction(key, quality, blind_spot, spec: simulated.WorldModelSpec, wm_cfg):
    """[B, G] predictions: additive noise, or scrambled to within-group Spearman q."""
    if wm_cfg.kind not in ("additive", "copula") or not -1.0 <= wm_cfg.q <= 1.0:
        raise ValueError(
            "config.world_model needs kind 'additive' or 'copula' and q in [-1, 1], got "
            f"kind={wm_cfg.kind!r}, q={wm_cfg.q}"
        )
    if wm_cfg.kind == "copula":
        return simulated.wm_prediction_at_q(key, quality, blind_spot, spec, q=wm_cfg.q)
    return simulated.wm_prediction(key, quality, blind_spot, spec)


def _group_score(policy: str, correction, carry, pred):
    """[B]: the anchor policy's score of each group: its best debiased prediction (the
    policy's next exploit) for "active", its mean WM variance (ones here) for "uncertain"."""
    if policy == "active":
        return jnp.max(correction.debias(carry.correction, pred), axis=1)
    if policy == "uncertain":
        return jnp.ones(pred.shape[0])
    return None


def _row_extras(arm, carry, tasks, actions, weights, g: int) -> dict:
    """The correction update's per-row extras for `arm` (flattened [B·G])."""
    rows = {"anchor_weight": jnp.repeat(weights, g)}
    if arm.local:
        rows["task"] = jnp.repeat(tasks, g)
        rows["features"] = actions.reshape(-1, 1)
    if arm.memory:
        count = carry.mem_count[tasks[:, None], actions].reshape(-1)
        total = carry.mem_sum[tasks[:, None], actions].reshape(-1)
        rows["known_real"] = jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)
        rows["known_count"] = count
    return rows


def _advantages(arm, estimate, adv_fn, reliability, fed, valid, real, wm, anchor, weights):
    """`(advantages, valid, reliability', λ)` of `arm`, each [B, G] but the last two.

    `wm` holds the debiased predictions under the map *before* this step's anchors
    (out of sample); `estimate` is `core.ppi.advantages` bound to the arm's estimator
    and settings, `adv_fn` the group advantage function.
    """
    b, g = fed.shape
    if not arm.world_model and arm.executes != "all":  # the executed groups alone
        return jax.vmap(lambda r, m: adv_fn(r, mask=m))(fed, valid), valid, reliability, jnp.nan
    if arm.estimator != "grpo":
        out = estimate(
            reliability, fed=fed, valid=valid, real=jnp.where(anchor, real, jnp.nan), wm=wm,
            anchor=anchor, weights=jnp.broadcast_to(weights[:, None], (b, g)),
        )  # fmt: skip
        return out.advantages, valid, out.state, out.lam
    # `valid` is all true here: the simulated WM always predicts. Without a mask the
    # group statistics are those the study has always computed (to the bit).
    return jax.vmap(adv_fn)(fed), jnp.ones((b, g), bool), reliability, jnp.nan


def _step_outputs(policy, env, quality, fed, debiased, real, pred, anchor, masked: bool):
    error = fed - quality
    return {
        "true_reward": jnp.mean(jnp.sum(policy * env.quality, axis=-1)),
        "executions": jnp.sum(anchor).astype(jnp.float32),
        "bias": masked_mean(error, anchor, empty=0.0) if masked else jnp.mean(error),
        "error_var": _masked_var(error, anchor) if masked else jnp.var(error),
        "anchor_var_real": _masked_var(real - quality, anchor),
        "anchor_var_debiased": _masked_var(debiased - quality, anchor),
        "anchor_var_fed": _masked_var(error, anchor),
        "raw_bias": jnp.mean(pred - quality),
        "debiased_bias": jnp.mean(debiased - quality),
        # The WM's realised within-group Spearman with the truth (blind spots included).
        "wm_q_realised": group_rank_correlation(
            pred.reshape(-1), quality.reshape(-1), pred.shape[1]
        ),
    }


def run_arm(config: ml_collections.ConfigDict, arm: str, key: jax.Array) -> dict:
    """Trains one arm for one seed; pure, jit- and vmap-able over `key`.

    Args:
      config: the study config (see `experiments/configs/controlled.py`).
      arm: a name in `wmrl_jax.train.arms.ARMS` (static).
      key: a PRNG key; the environment and the run derive from it.

    Returns:
      A dict of per-step arrays of shape [num_steps]: ``true_reward`` (the
      policy's expected true quality, over all tasks), ``executions``,
      ``bias`` and ``error_var`` (mean and variance of fed reward minus true
      quality, over the rows the arm trains on), and on anchor samples
      ``anchor_var_real``, ``anchor_var_debiased``, ``anchor_var_fed``; and the
      mean error of the raw and the debiased WM stream over all samples,
      ``raw_bias`` and ``debiased_bias``; ``grad_error`` and ``grad_real``,
      the squared distance of the arm's gradient from real GRPO's on the same
      batch and the latter's squared norm; ``reliability`` (the λ of
      `wmrl_jax.core.ppi` the step used) and ``wm_correlation`` (the
      within-group correlation of real and WM advantages on anchors so far),
      NaN for arms that form no such estimate.
    """
    arm_spec = arms_lib.get(arm)
    env_cfg, wm_cfg = config.env, config.world_model
    k_env, k_run = jax.random.split(key)
    env = simulated.make_env(
        k_env,
        num_tasks=env_cfg.num_tasks,
        num_candidates=env_cfg.num_candidates,
        blind_spot_fraction=wm_cfg.blind_spot_fraction,
        blind_spot_size=wm_cfg.blind_spot_size,
    )
    spec = simulated.WorldModelSpec(wm_cfg.offset, wm_cfg.scale, wm_cfg.gamma, wm_cfg.noise)
    novelty = float(env_cfg.novelty)
    if not novelty >= 0:
        raise ValueError(f"config.env.novelty must be >= 0, got {novelty}")
    b, g = config.tasks_per_step, config.group_size
    # WM-free arms that do not execute every group train on the executed groups alone.
    masked = not arm_spec.world_model and arm_spec.executes != "all"
    anchor_policy = arms_lib.anchor_policy(arm_spec, "random")
    optimizer = optax.adam(config.learning_rate)
    correction = arms_lib.correction_for(
        arm_spec,
        capacity=config.correction.capacity,
        decay=config.correction.decay,
        real_var_prior=config.correction.real_var_prior,
        min_anchors=config.correction.min_anchors,
        local_features=1,  # the candidate's index
        local_prior_count=config.correction.local_prior_count,
    )
    adv_fn = functools.partial(grpo.group_advantages, mode=config.advantage)
    adaptive = config.anchors.adaptive
    rho_fraction = functools.partial(
        rho_lib.fraction,
        base=arms_lib.adaptive_base(arm_spec, num_groups=b, fraction=config.anchor_fraction),
        low=adaptive.rho_min,
        high=adaptive.rho_max, gain=adaptive.gain, warmup_steps=adaptive.warmup_steps,
    )  # fmt: skip
    rho_update = functools.partial(
        rho_lib.update, fast_halflife=adaptive.fast_halflife,
        slow_halflife=adaptive.slow_halflife,
    )  # fmt: skip
    loss_fn = functools.partial(_policy_loss, clip_eps=config.clip_eps)
    grad_fn = jax.grad(loss_fn, has_aux=True)
    estimate = functools.partial(
        ppi_lib.advantages, arm_spec.estimator, mode=config.advantage,
        decay=config.anchors.reliability.decay, warmup_rows=config.anchors.reliability.warmup_rows,
    )  # fmt: skip

    def step(carry: _Carry, step_key):
        k_task, k_act, k_real, k_wm, k_anchor = jax.random.split(step_key, 5)
        tasks = jax.random.choice(k_task, env_cfg.num_tasks, (b,), replace=False)
        actions = jax.random.categorical(k_act, carry.logits[tasks], shape=(g, b)).T  # [B, G]
        quality = program_quality(step_key, env.quality[tasks[:, None], actions], novelty)
        real = simulated.real_reward(k_real, quality, noise=env_cfg.real_noise)
        pred = _wm_prediction(k_wm, quality, env.blind_spot[tasks[:, None], actions], spec, wm_cfg)
        count = arms_lib.anchor_count(
            arm_spec, k_anchor, num_groups=b, fraction=config.anchor_fraction,
            rho_fraction=rho_fraction(carry.rho),
        )  # fmt: skip
        anchor_groups, weights = arms_lib.choose_anchors(
            k_anchor, count, num_groups=b, policy=anchor_policy,
            group_score=_group_score(anchor_policy, correction, carry, pred),
            uniform_share=config.anchors.uniform_share,
        )  # fmt: skip
        anchor = jnp.broadcast_to(anchor_groups[:, None], (b, g))
        rows = _row_extras(arm_spec, carry, tasks, actions, weights, g)
        fed, valid, debiased, state = _fed_rewards(
            arm_spec, correction, carry.correction, pred, real, anchor, rows
        )
        advantages, valid, reliability, lam = _advantages(
            arm_spec, estimate, adv_fn, carry.reliability, fed, valid, real,
            correction.debias(carry.correction, pred), anchor, weights,
        )  # fmt: skip
        grads, _ = grad_fn(carry.logits, tasks, actions, advantages, valid)
        full, _ = grad_fn(carry.logits, tasks, actions, jax.vmap(adv_fn)(real), jnp.ones((b, g)))
        updates, opt_state = optimizer.update(grads, carry.opt_state, carry.logits)
        policy = jax.nn.softmax(carry.logits, axis=-1)
        outputs = _step_outputs(policy, env, quality, fed, debiased, real, pred, anchor, masked)
        outputs.update(
            grad_error=jnp.sum((grads - full) ** 2), grad_real=jnp.sum(full**2),
            reliability=jnp.float32(lam),
            wm_correlation=jnp.where(
                arm_spec.estimator == "grpo", jnp.nan, ppi_lib.correlation(reliability)
            ),
        )  # fmt: skip
        at = (tasks[:, None], actions)
        mem_sum = carry.mem_sum.at[at].add(jnp.where(anchor, real, 0.0))
        mem_count = carry.mem_count.at[at].add(anchor.astype(jnp.float32))
        new_logits = optax.apply_updates(carry.logits, updates)
        drift = carry.rho
        if arm_spec.adaptive_rho:  # Out of sample: the map before this step's anchors.
            before = correction.debias(carry.correction, pred)
            drift = rho_update(drift, (real - before).reshape(-1), anchor.reshape(-1))
        return _Carry(new_logits, opt_state, state, mem_sum, mem_count, drift, reliability), outputs

    logits = jnp.zeros((env_cfg.num_tasks, env_cfg.num_candidates))
    zeros = jnp.zeros_like(logits)
    carry = _Carry(
        logits, optimizer.init(logits), correction.init(), zeros, zeros, rho_lib.init(),
        ppi_lib.init(),
    )  # fmt: skip
    _, outputs = jax.lax.scan(step, carry, jax.random.split(k_run, config.num_steps))
    return outputs


def run_study(config: ml_collections.ConfigDict) -> dict[str, dict[str, np.ndarray]]:
    """Runs every arm in `config.arms` over `config.num_seeds` seeds.

    Returns:
      `{arm: {metric: array of shape [num_seeds, num_steps]}}` as numpy.
    """
    keys = jax.random.split(jax.random.key(config.seed), config.num_seeds)
    results = {}
    for arm in config.arms:
        # Same seeds for every arm: arms differ only in the rewards they feed.
        run = jax.jit(jax.vmap(functools.partial(run_arm, config, arm)))
        results[arm] = {k: np.asarray(v) for k, v in run(keys).items()}
    return results


def _nanmean(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def summarize(results: dict, config: ml_collections.ConfigDict) -> dict:
    """Reduces per-step results to the study's table.

    The target is the final expected true reward of ``real`` (mean over seeds,
    smoothed over `config.smooth` steps), scaled by `config.target_fraction`
    of its gain over the start. For each arm: where its smoothed mean curve
    reaches it (the studies' one definition, `analysis.reach`: interpolated
    between steps), in steps and in the real executions spent until then.
    """
    summary = {}
    target = None
    if "real" in results:
        curve = trailing_mean(results["real"]["true_reward"].mean(0), config.smooth)
        target = curve[0] + config.target_fraction * (curve[-1] - curve[0])
    for arm, out in results.items():
        seeds = out["true_reward"].shape[0]
        final = out["true_reward"][:, -config.smooth :].mean(1)
        curve = trailing_mean(out["true_reward"].mean(0), config.smooth)
        executions = np.cumsum(out["executions"].mean(0))
        quarter = max(1, out["bias"].shape[1] // 4)
        half = out["bias"].shape[1] // 2
        late = out["true_reward"][:, -quarter:].mean(1) - out["true_reward"][
            :, -2 * quarter : -quarter
        ].mean(1)
        row = {
            "final_true_reward": float(final.mean()),
            "final_true_reward_seeds": final.tolist(),
            # Still rising or flat: the last quarter's mean over the one before, per seed.
            "late_gain": float(late.mean()),
            "late_gain_se": float(late.std(ddof=1) / np.sqrt(seeds)) if seeds > 1 else 0.0,
            "final_true_reward_se": float(final.std(ddof=1) / np.sqrt(seeds)) if seeds > 1 else 0.0,
            "total_executions": float(executions[-1]),
            "bias_first_quarter": _nanmean(out["bias"][:, :quarter]),
            "bias_last_quarter": _nanmean(out["bias"][:, -quarter:]),
            "abs_bias_last_quarter": float(np.abs(_nanmean(out["bias"][:, -quarter:]))),
            "error_var": _nanmean(out["error_var"]),
            "anchor_var_real": _nanmean(out["anchor_var_real"]),
            "anchor_var_debiased": _nanmean(out["anchor_var_debiased"]),
            "anchor_var_fed": _nanmean(out["anchor_var_fed"]),
            "raw_wm_bias_last_half": _nanmean(out["raw_bias"][:, half:]),
            "debiased_wm_bias_last_half": _nanmean(out["debiased_bias"][:, half:]),
            "wm_q_realised": _nanmean(out["wm_q_realised"]),
            # Mean squared distance of the arm's gradient from real GRPO's on the same batch,
            # over the mean squared norm of the latter; λ and r (`core.ppi`), last quarter.
            "gradient_error": _nanmean(out["grad_error"]) / _nanmean(out["grad_real"]),
            "reliability_last_quarter": _nanmean(out["reliability"][:, -quarter:]),
            "wm_correlation_last_quarter": _nanmean(out["wm_correlation"][:, -quarter:]),
        }
        if target is not None:
            row["target"] = float(target)
            row["step_to_target"] = finite(reach(np.arange(len(curve)), curve, target))
            row["executions_to_target"] = finite(reach(executions, curve, target))
        summary[arm] = row
    real_cost = summary.get("real", {}).get("executions_to_target")
    for arm, row in summary.items():
        cost = row.get("executions_to_target")
        row["execution_ratio_vs_real"] = real_cost / cost if real_cost and cost else None
        if "real" in results and arm != "real" and row["total_executions"] > 0:
            # Equal-reward view: what real-execution GRPO spends to first reach
            # this arm's final reward, against what this arm spent in all.
            curve = trailing_mean(results["real"]["true_reward"].mean(0), config.smooth)
            spent = np.cumsum(results["real"]["executions"].mean(0))
            same = finite(reach(spent, curve, row["final_true_reward"]))
            row["real_executions_for_same_reward"] = same
            row["execution_saving_at_same_reward"] = (
                same / row["total_executions"] if same is not None else None
            )
    return summary


def format_table(summary: dict) -> str:
    """A markdown table of the study's headline numbers."""

    def fmt(value, spec=".3f"):
        if value is None:
            return "not reached"
        if isinstance(value, float) and not np.isfinite(value):
            return "n/a"
        return format(value, spec)

    lines = [
        "| arm | final true reward (± s.e.) | executions | bias first → last quarter "
        "| anchor error var: real / debiased WM / fed | executions to real's final "
        "| real executions for same reward (saving) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, row in summary.items():
        same = row.get("real_executions_for_same_reward")
        saving = row.get("execution_saving_at_same_reward")
        lines.append(
            f"| {arm} | {row['final_true_reward']:.3f} ± {row['final_true_reward_se']:.3f} "
            f"| {row['total_executions']:.0f} "
            f"| {fmt(row['bias_first_quarter'], '+.3f')} → {fmt(row['bias_last_quarter'], '+.3f')} "
            f"| {fmt(row['anchor_var_real'], '.4f')} / {fmt(row['anchor_var_debiased'], '.4f')} "
            f"/ {fmt(row['anchor_var_fed'], '.4f')} "
            f"| {fmt(row.get('executions_to_target'), '.0f')} "
            f"| {'—' if same is None and saving is None else fmt(same, '.0f')}"
            f"{f' ({saving:.1f}×)' if saving else ''} |"
        )
    return "\n".join(lines)


def run_sweep(config: ml_collections.ConfigDict, known: dict | None = None) -> dict[float, dict]:
    """The study at each WM blind-spot fraction of `config.blind_spot_sweep`.

    Args:
      config: the study config.
      known: `{fraction: summary}` already run (the main study's), not rerun.

    Returns `{fraction: summary}` (`summarize` of every arm at that fraction).
    """
    out = {}
    for fraction in config.blind_spot_sweep:
        if known and float(fraction) in known:
            out[float(fraction)] = known[float(fraction)]
            continue
        swept = copy.deepcopy(config)
        with swept.unlocked():
            swept.world_model.blind_spot_fraction = float(fraction)
        out[float(fraction)] = summarize(run_study(swept), swept)
    return out


def winners(summary: dict, *, z: float = 2.0) -> list[str]:
    """The arms whose final true reward is within `z` standard errors (of the difference)
    of the best arm's: the winners, tied where the seeds cannot separate them."""
    best = max(summary, key=lambda a: summary[a]["final_true_reward"])
    top, top_se = summary[best]["final_true_reward"], summary[best]["final_true_reward_se"]
    return [
        arm
        for arm, row in summary.items()
        if top - row["final_true_reward"] <= z * np.hypot(top_se, row["final_true_reward_se"])
    ]


def format_sweep(sweep: dict[float, dict]) -> str:
    """One markdown table: final true reward per arm (rows: blind-spot fraction) and the
    winners (best final reward, and every arm within two standard errors of it), over
    all arms and over those that execute no more than `wmrl` (equal executions)."""
    arms = list(next(iter(sweep.values())))
    spent = next(iter(sweep.values()))
    budget = spent["wmrl"]["total_executions"] if "wmrl" in spent else math.inf
    # Arms whose executions depend on the WM (adaptive ρ) give them in each cell.
    varies = {a for a in arms if len({round(s[a]["total_executions"]) for s in sweep.values()}) > 1}
    lines = [
        "Real executions per seed: "
        + ", ".join(
            f"{a} {spent[a]['total_executions']:.0f}" if a not in varies else f"{a} in its cells"
            for a in arms
        )
        + ".",
        "",
        "| WM blind spots | " + " | ".join(arms) + " | wins (within 2 s.e. of the best) "
        "| wins among the arms executing no more than `wmrl` |",
        "|---|" + "---|" * (len(arms) + 2),
    ]
    for fraction, summary in sweep.items():
        cells = [
            f"{summary[a]['final_true_reward']:.3f} ± {summary[a]['final_true_reward_se']:.3f}"
            + (f" ({summary[a]['total_executions']:.0f} executions)" if a in varies else "")
            for a in arms
        ]
        cheap = {a: r for a, r in summary.items() if r["total_executions"] <= budget}
        lines.append(
            f"| {fraction:.0%} | " + " | ".join(cells) + f" | {', '.join(winners(summary))} "
            f"| {', '.join(winners(cheap)) if cheap else '—'} |"
        )
    return "\n".join(lines)
