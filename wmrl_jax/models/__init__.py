"""Flax decoder LMs (Qwen3 dense, Qwen3.5 hybrid), Hugging Face checkpoint I/O, a sampler.

from wmrl_jax import models
model = models.from_pretrained("path/to/qwen3", dtype="bfloat16")   # or a Qwen3.5
logits = model.logits(ids, attention_mask=mask)            # [B, T, V] float32
out = models.sample(model, ids, mask, key, max_new_tokens=64, top_p=0.95)
model.save_pretrained("path/to/out")
"""

from wmrl_jax.models.api import (
    ChatPrompt,
    Model,
    from_params,
    from_pretrained,
    left_pad,
    qwen3_config_dict,
    random_model,
    render_chat,
)
from wmrl_jax.models.config import SUPPORTED_MODEL_TYPES, Qwen3Config, config_from_dict
from wmrl_jax.models.lm_head import blocked_token_logprobs
from wmrl_jax.models.qwen3 import Qwen3, apply, apply_features, token_logprobs
from wmrl_jax.models.qwen3_5 import Qwen3_5
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config, qwen3_5_text_config_dict
from wmrl_jax.models.sampler import SampleOutput, sample

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ChatPrompt",
    "Model",
    "Qwen3",
    "Qwen3Config",
    "Qwen3_5",
    "Qwen3_5Config",
    "SampleOutput",
    "apply",
    "apply_features",
    "blocked_token_logprobs",
    "config_from_dict",
    "from_params",
    "from_pretrained",
    "left_pad",
    "qwen3_5_text_config_dict",
    "qwen3_config_dict",
    "random_model",
    "render_chat",
    "sample",
    "token_logprobs",
]
