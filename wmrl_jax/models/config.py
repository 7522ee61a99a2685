"""Decoder configurations read from a Hugging Face `config.json`.

Only the fields the forward pass needs are typed; the original dictionary is kept
verbatim so that `save_pretrained` writes back the same `config.json`.
`config_from_dict` dispatches on `model_type`: "qwen3" (dense) here, "qwen3_5" and
"qwen3_5_text" (hybrid Gated DeltaNet + gated attention) in `qwen3_5_config`.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from wmrl_jax.models.qwen3_5_config import qwen3_5_config_from_dict
from wmrl_jax.models.rope import RopeConfig, rope_frequencies, rope_from_dict

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_5", "qwen3_5_text")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Architecture of a Qwen3 dense decoder (hashable, so usable as a static jit arg)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    rope: RopeConfig = RopeConfig()
    eos_token_id: tuple[int, ...] = ()
    model_type: str = "qwen3"

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads


def config_from_dict(raw: Mapping[str, Any]):
    """Builds the typed config (`Qwen3Config` or `Qwen3_5Config`) of a parsed `config.json`.

    Args:
        raw: the JSON object of a Hugging Face `config.json`.

    Returns:
        The typed configuration.

    Raises:
        ValueError: unknown `model_type`, missing fields or inconsistent head counts.
    """
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unknown model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if model_type != "qwen3":
        return qwen3_5_config_from_dict(raw)
    try:
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        eos = raw.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        config = Qwen3Config(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            rope=rope_from_dict(raw),
            eos_token_id=eos,
            model_type=model_type,
        )
    except KeyError as err:
        raise ValueError(f"config.json is missing the field {err.args[0]!r}") from err
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of {kv_heads=}")
    if raw.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported (full attention only)")
    return config


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "Qwen3Config",
    "RopeConfig",
    "config_from_dict",
    "rope_frequencies",
]
