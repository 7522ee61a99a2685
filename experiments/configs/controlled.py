r"""The controlled study: WMRL vs real-execution GRPO on a simulated environment.

    python -m experiments.controlled --config=experiments/configs/controlled.py

Variants: ``--config=experiments/configs/controlled.py:runlocal`` (a few
seconds, for tests and smoke runs); ``:regime`` the regime map in this
environment (``python -m experiments.controlled_regime``), ``:regime_runlocal``
its tiny version. Override any field, e.g.
``--config.anchor_fraction=0.2 --config.world_model.noise=0.3``.
"""

import ml_collections

from experiments.configs import study_compute
from wmrl_jax.train.config import adaptive_rho_config, reliability_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """Returns the study config; `arg` selects a variant ("runlocal")."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.num_seeds = 10  # Paired comparisons need >= 10 (the estimators' guarantee).
    config.arms = (
        "real", "anchors_only", "wm_naive", "wm_debias", "wmrl",
        "wmrl_memory", "wmrl_local", "wmrl_active", "wmrl_plus", "wmrl_adaptive",
        "wmrl_ppi", "wmrl_weighted",
    )  # fmt: skip
    config.num_steps = 400
    config.tasks_per_step = 20
    config.group_size = 8
    config.anchor_fraction = 0.1
    config.learning_rate = 0.05
    config.clip_eps = 0.2
    config.advantage = "std"

    config.env = ml_collections.ConfigDict()
    config.env.num_tasks = 64
    config.env.num_candidates = 16
    config.env.real_noise = 0.1
    # Each sample a new program: its quality is its candidate's plus N(0, novelty²) (0:
    # candidates recur, as the replay table's recipes do).
    config.env.novelty = 0.0

    config.world_model = ml_collections.ConfigDict()
    # "additive": distort(q) + blind spot + noise·N(0, 1); "copula": distort(q) scrambled
    # within each group to the target within-group Spearman `q` (the trainer's synthetic
    # world model, `wmrl_jax.core.synthetic_wm`), plus the blind spots; `noise` unused.
    config.world_model.kind = "additive"
    config.world_model.q = 0.4
    config.world_model.offset = 0.45
    config.world_model.scale = 0.6
    config.world_model.gamma = 3.0
    config.world_model.noise = 0.15
    config.world_model.blind_spot_fraction = 0.15
    config.world_model.blind_spot_size = 0.5

    config.correction = ml_collections.ConfigDict()
    config.correction.capacity = 1024
    config.correction.decay = 1.0
    # A prior of 2x the true real-noise variance: the study does not assume
    # the user knows it exactly.
    config.correction.real_var_prior = 0.02
    config.correction.min_anchors = 16
    config.correction.local_prior_count = 2.0  # κ of the local correction (wmrl_local, _plus).

    # Active anchors (wmrl_active, wmrl_plus): the uniform share mixed into the draw.
    config.anchors = ml_collections.ConfigDict()
    config.anchors.uniform_share = 0.5
    # Adaptive ρ (wmrl_adaptive), as in the trainer's config.anchors.adaptive.
    config.anchors.adaptive = adaptive_rho_config()
    # The online reliability λ of wmrl_ppi and wmrl_weighted, as in the trainer's config.
    config.anchors.reliability = reliability_config()

    # The WM's blind-spot fraction swept in one table (where each arm wins).
    config.blind_spot_sweep = (0.0, 0.05, 0.15, 0.3)

    # The regime map in this environment (`:regime`, `python -m experiments.controlled_regime`):
    # the world-model arms at each target q against the real-execution cells, priced at
    # each execution cost and model size with the compute study's token lengths.
    config.regime = ml_collections.ConfigDict()
    config.regime.arms = ("wmrl", "wmrl_ppi")
    config.regime.q = (0.0, 0.2, 0.4, 0.6, 0.8)
    config.regime.real_groups = (5, 10)  # Beside `real` (tasks_per_step) and anchors_only.
    # Seconds per execution: 1.5 is the replay table's recorded mean; then MLE-Dojo's minutes.
    config.regime.costs = (1.5, 30.0, 300.0, 1800.0)
    config.regime.params = (1e9, 9e9)
    config.cost_model = study_compute.get_config().cost_model

    config.smooth = 20
    # Declared before any run: the paired difference of final true reward within which an
    # estimator counts as level with its control (the compute study's margin too).
    config.equivalence_margin = 0.02
    config.target_fraction = 0.95

    if arg == "runlocal":
        config.num_seeds = 2
        config.num_steps = 40
        config.env.num_tasks = 16
        config.tasks_per_step = 10
        config.smooth = 5
        config.blind_spot_sweep = (0.0, 0.15)
        # The paper's arms and the one that exercises every idea beyond it.
        config.arms = (
            "real", "anchors_only", "wm_naive", "wm_debias", "wmrl", "wmrl_plus", "wmrl_ppi",
        )  # fmt: skip
    elif arg in ("regime", "regime_runlocal"):
        # The synthetic world model of the replay map (a target within-group Spearman, no
        # blind spots) and novel programs: each sample its candidate's quality + N(0, 0.15²).
        config.world_model.kind = "copula"
        config.world_model.blind_spot_fraction = 0.0
        config.env.novelty = 0.15
        if arg == "regime_runlocal":
            config.num_seeds, config.num_steps, config.env.num_tasks = 2, 30, 16
            config.tasks_per_step, config.smooth = 10, 5
            config.regime.q, config.regime.real_groups = (0.0, 0.8), (5,)
            config.regime.costs, config.regime.params = (1.5, 300.0), (1e9,)
    elif arg:
        raise ValueError(
            f"unknown config variant {arg!r} (known: runlocal, regime, regime_runlocal)"
        )
    config.lock()
    return config
