r"""WMRL on MLE-Dojo with a Qwen3-4B-architecture checkpoint on one GPU host.

    python -m experiments.train --config=experiments/configs/qwen3_4b_mledojo.py \
        --config.agent.text.checkpoint=/path/to/Qwen3-4B \
        --config.tasks.path=/path/to/mle-dojo/prepared \
        --config.tasks.views=/path/to/views \
        --config.tasks.split_file=/path/to/competition.json \
        --config.tasks.metrics_file=/path/to/metrics.json --workdir=/path/to/workdir

The checkpoint is a local Hugging Face directory (config.json, safetensors,
tokenizer); nothing is downloaded. Programs run in the Docker sandbox
(`python -m wmrl_jax.sandbox.image` builds the image offline). MLE-Dojo's
metrics are never guessed: `metrics.json` maps each competition to
``{"name": ..., "direction": "higher" | "lower"}``.

Variant ``:runlocal`` keeps every code path (text agent, free-form programs,
JSON world-model answers, sharded step) at toy scale: a tiny committed
checkpoint, the built-in suite, the local executor, a few seconds on a CPU.
"""

from wmrl_jax.train.config import base_config

# Per-layer remat (and the blocked LM head) in the train step: 8,192-token sequences
# do not fit on 8 x H200 without it (`--dry_run` prints the plan with and without).
# Micro-batches: 4 (4B) or 2 (8B / 9B) sequences per device each, about half of
# the planned free memory, a margin for the estimates on a GPU backend.
SIZES = {
    "4b": dict(mesh=(1, 8, 1), micro=4, lr=1e-6, remat=True),
    "8b": dict(mesh=(1, 8, 1), micro=8, lr=5e-7, remat=True),
}


def mledojo_config(size: str, arg: str | None):
    config = base_config("text")
    s = SIZES[size]
    config.num_steps = 200
    config.tasks_per_step = 16
    config.group_size = 8
    config.eval_every = 20
    config.tasks.source = "mle_dojo"
    config.agent.text.dtype = "bfloat16"
    config.agent.text.max_prompt_tokens = 4096
    config.agent.text.max_new_tokens = 4096
    config.agent.text.wm_max_new_tokens = 512
    config.agent.text.wm_samples = 4
    config.agent.text.anchors_per_task = 2
    config.agent.text.temperature = 1.0
    config.agent.text.top_p = 1.0
    config.executor.kind = "docker"
    config.executor.workers = 32
    config.executor.timeout_s = 3600.0
    config.correction.min_anchors = 16
    config.correction.wm_var = "per_sample"
    config.optimizer.lr = s["lr"]
    config.optimizer.warmup_steps = 10
    config.optimizer.weight_decay = 0.01
    config.train.num_microbatches = s["micro"]
    config.train.num_epochs = 1
    config.train.compute_dtype = "bfloat16"
    config.train.remat = s["remat"]
    config.train.loss.kl_coef = 0.0
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = s["mesh"]
    config.checkpoint.every = 10
    config.checkpoint.keep = 3
    if arg == "runlocal":
        config.num_steps = 1
        config.tasks_per_step = 2
        config.group_size = 2
        config.eval_every = 1
        config.tasks.source = "builtin"
        config.agent.text.checkpoint = "tests/models/fixtures/qwen3_gqa1_tied"
        config.agent.text.dtype = "float32"
        config.agent.text.max_prompt_tokens = 1024  # The fixture tokenizer is byte-level.
        config.agent.text.max_new_tokens = 16
        config.agent.text.wm_max_new_tokens = 8
        config.agent.text.wm_samples = 2
        config.executor.kind = "local"
        config.executor.workers = 2
        config.executor.timeout_s = 30.0
        config.train.num_microbatches = 1
        config.train.compute_dtype = "float32"
        config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
        config.checkpoint.every = 1
    elif arg:
        raise ValueError(f"unknown config variant {arg!r} (known: runlocal)")
    config.lock()
    return config


def get_config(arg: str | None = None):
    """Returns the Qwen3-4B MLE-Dojo config; `arg` selects a variant ("runlocal")."""
    return mledojo_config("4b", arg)
