"""The `text` agent kind: a Hugging Face chat LLM (Qwen3) as policy and world model.

Modules: `prompts` (the solver's instructions, the solver and world-model
prompts fitted to fixed token budgets), `generation` (fixed-shape sampler
calls and decoding), `agent` (`TextAgent`, the `Agent` protocol: rollouts,
world-model predictions, in-context anchors). Episodes (`turns` > 1) are
`wmrl_jax.agents.text.episodes`; finding the program in an answer is
`wmrl_jax.agents.programs`. This module is the kind's registry entry:
`default_config`, `validate_config`, `make_agent`, `CAPABILITIES`, and
`memory_workload` (what the memory plan needs from this kind).
"""

from __future__ import annotations

import os

import jax
import ml_collections

from wmrl_jax.agents.base import AgentContext, Built, Capabilities

CAPABILITIES = Capabilities(aux_loss=False, replayable=False, memory_plan=True, lora=True)


def default_config() -> ml_collections.ConfigDict:
    """`config.agent.text`: the checkpoint, lengths and sampling of a `TextAgent`."""
    c = ml_collections.ConfigDict()
    c.checkpoint = ""  # A local Hugging Face directory (config.json, safetensors, tokenizer).
    c.dtype = "float32"
    c.max_prompt_tokens = 1024
    c.max_new_tokens = 512
    c.wm_max_new_tokens = 128
    c.wm_samples = 4
    c.temperature = 1.0
    c.top_p = 1.0
    c.top_k = 0
    c.anchors_per_task = 0  # Executed anchors shown in later WM prompts.
    c.enable_thinking = False  # Qwen3 chat template switch.
    # Episodes (wmrl_jax.agents.text.episodes): 1 = one program per sample; K > 1 = up to K
    # messages of max_new_tokens each, with tool calls answered in between.
    c.turns = 1
    c.tool_max_tokens = 256  # E: tokens of one environment message in the transcript.
    c.tools = ml_collections.ConfigDict()
    c.tools.executor = "auto"  # "auto" (Docker if it can run, else local), "docker", "local".
    c.tools.image = ""  # Docker image ("" = the default sandbox image).
    c.tools.workers = 4  # Tool calls run at once.
    c.tools.info_timeout_s = 30.0  # Wall-clock budget of one `info` call.
    c.tools.validate_timeout_s = 120.0  # Wall-clock budget of one `validate` call.
    c.tools.validate_rows = 100  # Records per CSV file in the validation sample.
    return c


TOOL_EXECUTORS = ("auto", "docker", "local")


def memory_workload(config: ml_collections.ConfigDict) -> dict:
    """What `config.agent.text` decides of a memory plan's `train.memory.Workload`.

    An episode of K messages is planned as one generation at its longest prompt (the
    last message's), so prompt + new is the train row (K = 1: the single-turn lengths).
    """
    from wmrl_jax.agents.text import episodes

    lengths = episodes.sequence_lengths(config)
    return {
        "param_dtype": config.dtype,
        "prompt_tokens": lengths["prompt"],
        "new_tokens": lengths["new"],
        "anchors_per_task": config.anchors_per_task,
        "wm_samples": config.wm_samples,
        "wm_new_tokens": config.wm_max_new_tokens,
        "wm_prompt_tokens": config.get("wm_max_prompt_tokens") or None,
    }


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first bad field of `config.agent.text`."""
    if not config.checkpoint:
        raise ValueError("config.agent.text.checkpoint must name a local Hugging Face directory")
    for field in ("max_prompt_tokens", "max_new_tokens", "wm_max_new_tokens", "wm_samples"):
        if not config[field] >= 1:
            raise ValueError(f"config.agent.text.{field} must be >= 1, got {config[field]}")
    if not config.temperature > 0 or not 0 < config.top_p <= 1 or config.top_k < 0:
        raise ValueError(
            "config.agent.text needs temperature > 0, 0 < top_p <= 1, top_k >= 0; got "
            f"{config.temperature}, {config.top_p}, {config.top_k}"
        )
    if config.anchors_per_task < 0:
        raise ValueError(
            f"config.agent.text.anchors_per_task must be >= 0, got {config.anchors_per_task}"
        )
    for field in ("turns", "tool_max_tokens"):
        if not config[field] >= 1:
            raise ValueError(f"config.agent.text.{field} must be >= 1, got {config[field]}")
    tools = config.tools
    if tools.executor not in TOOL_EXECUTORS:
        raise ValueError(
            f"config.agent.text.tools.executor must be one of {TOOL_EXECUTORS}, "
            f"got {tools.executor!r}"
        )
    for field in ("info_timeout_s", "validate_timeout_s", "validate_rows", "workers"):
        if not tools[field] > 0:
            raise ValueError(f"config.agent.text.tools.{field} must be > 0, got {tools[field]}")


def make_agent(config: ml_collections.ConfigDict, context: AgentContext) -> Built:
    """A `TextAgent` over the checkpoint at `config.checkpoint` (nothing is downloaded)."""
    from wmrl_jax.agents.text.agent import TextAgent
    from wmrl_jax.agents.text.episodes import make_tools
    from wmrl_jax.models import api

    validate_config(config)
    if config.turns > 1 and jax.process_count() > 1:
        raise ValueError(
            "config.agent.text.turns > 1 runs tool calls on every process, whose answers "
            "(timings, output) may differ and split the processes' rollouts; run episodes "
            "in one process"
        )
    tools = make_tools(config.tools) if config.turns > 1 else None
    # Straight into the mesh's shardings: no unsharded copy on the first device.
    model = api.from_pretrained(
        os.path.expanduser(config.checkpoint), dtype=config.dtype, mesh=context.mesh
    )
    graphdef, params = model.graphdef, model.params
    if context.lora:  # The policy (and the world model) are the frozen base plus adapters.
        from wmrl_jax.models import lora

        key = jax.random.fold_in(context.key, 1)
        graphdef, params = lora.attach(graphdef, params, key=key, mesh=context.mesh, **context.lora)
    sizes = dict(context.batch_sizes or {})
    agent = TextAgent(
        graphdef,
        model.tokenizer,
        max_prompt_tokens=config.max_prompt_tokens,
        max_new_tokens=config.max_new_tokens,
        wm_max_new_tokens=config.wm_max_new_tokens,
        wm_samples=config.wm_samples,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        anchors_per_task=config.anchors_per_task,
        invalid_reward=context.floors.invalid,
        batch_size=sizes.get("rollout"),
        wm_batch_size=sizes.get("wm"),
        mesh=context.mesh,
        chat_template_kwargs={"enable_thinking": bool(config.enable_thinking)},
        turns=config.turns,
        tool_max_tokens=config.tool_max_tokens,
        tools=tools,
    )
    return Built(agent, params, graphdef, model.raw_config, {})
