"""Prompts and readouts that turn the backbone into a world model (WM).

* `render_wm_prompt` / `mask_file_names`: chat messages for a real LLM WM.
* `parse_wm_answer` / `combine` / `to_arrays`: robust parsing of its answers
  into predictions with variances (unusable answers: NaN mean, inf variance);
  `failure_counts`: why answers were unusable, per cause, over a batch.
* `score_bin_readout`: expected score and variance from score-bin tokens,
  for small models.
"""

from wmrl_jax.worldmodel.parsing import (
    FAILURE_STATUSES,
    STATUSES,
    WMPrediction,
    combine,
    failure_counts,
    parse_wm_answer,
    to_arrays,
)
from wmrl_jax.worldmodel.prompts import (
    ANSWER_KEYS,
    AnchorExample,
    mask_file_names,
    render_wm_prompt,
)
from wmrl_jax.worldmodel.readout import bin_centres, score_bin_readout

__all__ = [
    "ANSWER_KEYS",
    "FAILURE_STATUSES",
    "STATUSES",
    "AnchorExample",
    "WMPrediction",
    "bin_centres",
    "combine",
    "failure_counts",
    "mask_file_names",
    "parse_wm_answer",
    "render_wm_prompt",
    "score_bin_readout",
    "to_arrays",
]
