"""Fields shared by every training config; each config file overrides what differs."""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
    """The default training config (the tiny CPU main job's values)."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    # "real" (every group executed: real-execution GRPO), "wm_naive",
    # "wm_debias" or "wmrl" (debiasing + inverse-variance denoising).
    config.arm = "wmrl"
    config.num_steps = 40
    config.tasks_per_step = 6
    config.group_size = 8
    config.anchor_fraction = 0.1  # ρ; at least one group per step.
    config.anchor_policy = "random"  # or "uncertain" (largest WM variance first).
    config.advantage = "std"
    config.eval_every = 10
    # Held-out programs per task: 0 = one greedy program; K > 0 = K policy samples
    # (the expected percentile; the same draws at every evaluation).
    config.eval_samples = 0

    config.tasks = ml_collections.ConfigDict()
    config.tasks.source = "builtin"  # "builtin", "dir" or "mle_dojo".
    config.tasks.suite_seed = 0
    config.tasks.path = ""
    config.tasks.views = ""
    config.tasks.split_file = ""
    config.tasks.metrics_file = ""

    config.agent = ml_collections.ConfigDict()
    config.agent.kind = "recipe"  # or "text" (a Hugging Face checkpoint).
    config.agent.hidden_size = 64
    config.agent.num_layers = 2
    config.agent.num_heads = 4
    config.agent.temperature = 1.0
    config.agent.min_mass = 0.05
    # The world model's weights: "current" (the policy's, as it trains) or "initial"
    # (the warm-started backbone, frozen).
    config.agent.wm_params = "current"
    config.agent.checkpoint = ""
    config.agent.dtype = "float32"
    config.agent.max_prompt_tokens = 1024
    config.agent.max_new_tokens = 512
    config.agent.wm_max_new_tokens = 128
    config.agent.wm_samples = 4
    config.agent.top_p = 1.0
    config.agent.top_k = 0
    config.agent.anchors_per_task = 0  # Executed anchors shown in later WM prompts (text agent).
    config.agent.enable_thinking = False  # Qwen3 chat template switch (text agent).

    config.warm_start = ml_collections.ConfigDict()
    config.warm_start.steps = 150
    config.warm_start.batch_size = 256
    config.warm_start.lr = 3e-3
    config.warm_start.temperature = 0.1

    config.executor = ml_collections.ConfigDict()
    config.executor.kind = "auto"  # Docker when an engine answers, else local; or "replay".
    config.executor.image = ""
    config.executor.workers = 2
    config.executor.timeout_s = 120.0
    config.executor.infra_retries = 2
    config.executor.on_infra_error = "wm_only"  # or "raise".
    config.executor.table = ""  # Recipe table for replay / warm-start; "" = the committed one.

    config.rewards = ml_collections.ConfigDict()
    config.rewards.invalid = -0.25
    config.rewards.error = -0.5
    config.rewards.timeout = -0.75

    config.correction = ml_collections.ConfigDict()
    config.correction.capacity = 512
    config.correction.decay = 1.0
    config.correction.real_var_prior = 1e-3
    config.correction.min_anchors = 8
    config.correction.wm_var = "global"

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.lr = 1e-3
    config.optimizer.warmup_steps = 5
    config.optimizer.total_steps = -1  # Optimizer updates; -1: num_steps * train.num_epochs.
    config.optimizer.end_lr_ratio = 0.1
    config.optimizer.decay = "cosine"  # or "linear".
    config.optimizer.weight_decay = 0.0
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-8
    config.optimizer.clip_norm = 1.0

    config.train = ml_collections.ConfigDict()
    config.train.num_microbatches = 1
    config.train.num_epochs = 2
    config.train.compute_dtype = "float32"
    config.train.loss = ml_collections.ConfigDict()
    config.train.loss.clip_low = 0.2
    config.train.loss.clip_high = 0.28
    config.train.loss.kl_coef = 0.0
    config.train.loss.kl_estimator = "k3"
    config.train.loss.aggregation = "token_mean"  # or "seq_mean_token_mean", "seq_sum_norm".
    config.train.loss.norm_constant = 1.0  # Only read by "seq_sum_norm".
    # Weight of the world model's next-token loss on executed samples (the score-bin
    # token of their real reward); 0 turns it off (and the text agent needs 0).
    config.train.loss.aux_coef = 1.0

    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = 1
    config.mesh.fsdp = 1
    config.mesh.tensor = 1

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.every = 10
    config.checkpoint.keep = 2
    config.checkpoint.export_hf = True  # The final policy as a Hugging Face directory.
    return config
