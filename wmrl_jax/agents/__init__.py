"""Agents: the backbones the trainer drives, behind one protocol and one registry.

A kind is a module with four members:

* `default_config() -> ml_collections.ConfigDict`: its sub-config, which a
  training config holds as `config.agent.<kind>`;
* `validate_config(config)`: raises ValueError naming the bad field of that
  sub-config (run before any work);
* `make_agent(config, context: AgentContext) -> Built`: the factory, given
  that sub-config and the run-wide context;
* `CAPABILITIES`: a `Capabilities` record the config validator reads;
* with `CAPABILITIES.memory_plan`, `memory_workload(config) -> dict`: the
  sequence lengths, dtype and world-model sampling of that sub-config, as the
  fields of `wmrl_jax.train.memory.Workload` (the plan never reads a kind's
  sub-config itself); its length knobs are `max_prompt_tokens`,
  `max_new_tokens` and `anchors_per_task`.

Registered kinds:

* `recipe` (`wmrl_jax.agents.recipe`): a tiny Qwen3-architecture backbone
  over the recipe vocabulary (the CPU main job, the compute study);
* `text` (`wmrl_jax.agents.text`): a Hugging Face chat LLM writing free-form
  programs and answering the world-model prompt in JSON.

Adding a kind: write its module and add one line to `_KINDS`.

Example:
    >>> from wmrl_jax import agents
    >>> cfg = agents.default_config("recipe")
    >>> built = agents.make("recipe", cfg, context)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib

import ml_collections

from wmrl_jax.agents.base import Agent, AgentContext, Built, Capabilities, Rollout, WMOutput

__all__ = [
    "Agent",
    "AgentContext",
    "Built",
    "Capabilities",
    "Rollout",
    "WMOutput",
    "capabilities",
    "default_config",
    "kinds",
    "make",
    "memory_workload",
    "validate",
]

# kind -> module; modules are imported on first use (the text agent pulls in transformers).
_KINDS = {
    "recipe": "wmrl_jax.agents.recipe",
    "text": "wmrl_jax.agents.text",
}


def kinds() -> tuple[str, ...]:
    """The registered agent kinds."""
    return tuple(_KINDS)


def _module(kind: str):
    if kind not in _KINDS:
        raise ValueError(f"unknown agent kind {kind!r}; known: {kinds()}")
    return importlib.import_module(_KINDS[kind])


def default_config(kind: str) -> ml_collections.ConfigDict:
    """The default sub-config of `kind` (what `config.agent.<kind>` holds)."""
    return _module(kind).default_config()


def capabilities(kind: str) -> Capabilities:
    """The `Capabilities` of `kind`."""
    return _module(kind).CAPABILITIES


def validate(kind: str, config: ml_collections.ConfigDict) -> None:
    """Checks `config.agent.<kind>`; raises ValueError naming the first bad field."""
    _module(kind).validate_config(config)


def make(kind: str, config: ml_collections.ConfigDict, context: AgentContext, **kwargs) -> Built:
    """Builds an agent of `kind` from its sub-config and the run's context.

    `kwargs` are the kind's own extras (e.g. the recipe kind's preloaded `table`).
    """
    return _module(kind).make_agent(config, context, **kwargs)


def memory_workload(kind: str, config: ml_collections.ConfigDict) -> dict:
    """What `config.agent.<kind>` decides of a memory plan (see the module docstring).

    Raises:
      ValueError: `kind` has no memory plan.
    """
    if not capabilities(kind).memory_plan:
        raise ValueError(f"agent kind {kind!r} has no memory plan")
    return _module(kind).memory_workload(config)
