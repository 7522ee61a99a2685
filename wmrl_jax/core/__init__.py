"""Pure functions on arrays: GRPO loss, isotonic fit, fusion, reward correction.

Nothing here does I/O or knows about models, sandboxes or files; everything is
jit- and vmap-able.

Bad input raises ``ValueError`` in every module, with a message that names the
function and the argument. Array shapes and ranks are checked at entry with
chex assertions, which read static shapes only and so cost nothing under
`jax.jit` (and are raised while tracing); settings and modes are checked by
value.
"""

from wmrl_jax.core.correction import RewardCorrection, make_reward_correction
from wmrl_jax.core.correction_state import CorrectionState
from wmrl_jax.core.fusion import fusion_weight, inverse_variance_fuse
from wmrl_jax.core.grpo import (
    aggregate,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    importance_ratio,
    kl_k1,
    kl_k2,
    kl_k3,
)
from wmrl_jax.core.isotonic import IsotonicFit, isotonic_fit, isotonic_predict
from wmrl_jax.core.stats import rank_correlation

__all__ = [
    "CorrectionState",
    "IsotonicFit",
    "RewardCorrection",
    "aggregate",
    "clipped_surrogate",
    "fusion_weight",
    "group_advantages",
    "grpo_loss",
    "importance_ratio",
    "inverse_variance_fuse",
    "isotonic_fit",
    "isotonic_predict",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "make_reward_correction",
    "rank_correlation",
]
