"""Typed views of the config sections that travel: agent, anchors, correction, executor.

The user-facing config stays an `ml_collections.ConfigDict` (``--config.x.y=``
flags, locked against typos, `wmrl_jax.train.config`). At the boundary (the
trainer's build, `builder`) each section a part needs far from the boundary is
read once into a frozen dataclass and handed on, so that the parts downstream
receive the few fields they use, named and typed, not the whole bag:

* `AnchorsSection`: ρ, the anchor policy and its score, adaptive ρ, the reliability λ
  (read by `rewards.Rewarder`);
* `CorrectionSection`: the reward correction's settings (`builder.make_correction`);
* `ExecutorSection`: how programs run (`builder.make_outcomes`, `execution.Runner`,
  the evaluations);
* `AgentSection`: the agent's kind, its sub-config, and the world model's weights.

Each view names every field of its section: a field added to the config but not
to its view (or the reverse) fails `of` with the field named, so the two cannot
drift apart silently.

Example:
    >>> anchors = AnchorsSection.of(config)
    >>> anchors.fraction, anchors.adaptive.rho_max
    (0.1, 0.3)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

__all__ = [
    "AdaptiveRhoSection",
    "AgentSection",
    "AnchorsSection",
    "CorrectionSection",
    "ExecutorSection",
    "ReliabilitySection",
]


def _read(cls, node: ml_collections.ConfigDict, where: str, **given: Any):
    """`cls` from the fields of `node` (those in `given` read by the caller), every field
    of both named.

    Raises:
      ValueError: `node` lacks a field of `cls`, or holds one `cls` does not name.
    """
    names = {f.name for f in dataclasses.fields(cls)} - set(given)
    keys = set(node.keys()) - set(given)
    if names - keys or keys - names:
        raise ValueError(
            f"config.{where} does not match {cls.__name__}: missing {sorted(names - keys)}, "
            f"unknown {sorted(keys - names)}"
        )
    return cls(**{name: node[name] for name in names}, **given)


@dataclasses.dataclass(frozen=True)
class AdaptiveRhoSection:
    """`config.anchors.adaptive`: ρ_t's bounds, error half-lives, gain and warm-up
    (`wmrl_jax.core.rho`)."""

    rho_min: float
    rho_max: float
    fast_halflife: float
    slow_halflife: float
    gain: float
    warmup_steps: int


@dataclasses.dataclass(frozen=True)
class ReliabilitySection:
    """`config.anchors.reliability`: the online λ's decay and warm-up (`wmrl_jax.core.ppi`)."""

    decay: float
    warmup_rows: float


@dataclasses.dataclass(frozen=True)
class AnchorsSection:
    """Which groups are executed: `config.anchor_fraction`, `config.anchor_policy` and
    `config.anchors`.

    Attributes:
      fraction: ρ, the share of groups executed (at least one).
      policy: the config's anchor policy ("random", "uncertain", "active"); an arm
        may set its own (`arms.anchor_policy`).
      score: what the "active" policy scores a group by ("exploit", "uncertainty").
      uniform_share: the "active" policy's uniform share.
      adaptive: adaptive ρ's settings.
      reliability: the online reliability λ's settings.
    """

    fraction: float
    policy: str
    score: str
    uniform_share: float
    adaptive: AdaptiveRhoSection
    reliability: ReliabilitySection

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> AnchorsSection:
        a = config.anchors
        return _read(
            cls, a, "anchors", fraction=config.anchor_fraction, policy=config.anchor_policy,
            adaptive=_read(AdaptiveRhoSection, a.adaptive, "anchors.adaptive"),
            reliability=_read(ReliabilitySection, a.reliability, "anchors.reliability"),
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CorrectionSection:
    """`config.correction`: the reward correction's settings (`core.correction`)."""

    capacity: int
    decay: float
    real_var_prior: float
    min_anchors: int
    wm_var: str
    local_prior_count: float

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> CorrectionSection:
        return _read(cls, config.correction, "correction")

    def kwargs(self) -> dict[str, Any]:
        """The settings as `arms.make_correction`'s keywords."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ExecutorSection:
    """`config.executor`: where and how programs run (see `train.config.base_config`)."""

    kind: str
    image: str
    workers: int
    timeout_s: float
    infra_retries: int
    max_infra_steps: int
    on_infra_error: str
    deadline_s: float
    ray_address: str
    ray_node_resource: str
    engines: str
    table: str
    cache: bool
    replicates: int
    gpus: str
    gpus_per_program: int
    gpu_memory_fraction: float

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> ExecutorSection:
        return _read(cls, config.executor, "executor")


@dataclasses.dataclass(frozen=True)
class AgentSection:
    """`config.agent`: the agent's kind, its own sub-config, and the world model's weights.

    Attributes:
      kind: the agent kind (`wmrl_jax.agents.kinds()`).
      wm_params: "current" (the policy's params, as they train) or "initial" (the
        starting backbone's, frozen).
      settings: the kind's sub-config (`config.agent.<kind>`), handed to its factory.
    """

    kind: str
    wm_params: str
    settings: ml_collections.ConfigDict

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> AgentSection:
        a = config.agent
        return cls(kind=a.kind, wm_params=a.wm_params, settings=a[a.kind])
