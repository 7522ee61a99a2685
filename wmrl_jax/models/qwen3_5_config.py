"""Configuration of Qwen3.5 (hybrid Gated DeltaNet + gated attention) from a `config.json`.

Two layouts exist: the published vision-language checkpoints (`model_type`
"qwen3_5") nest the language model's fields under `text_config` and keep
`tie_word_embeddings` at the top level; text-only checkpoints ("qwen3_5_text")
are flat. Both reduce to one `Qwen3_5Config`.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from wmrl_jax.models.rope import RopeConfig

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """Architecture of a Qwen3.5 decoder (hashable, so usable as a static jit arg).

    Attributes:
        vocab_size, hidden_size, intermediate_size, num_hidden_layers: sizes.
        num_attention_heads, num_key_value_heads, head_dim: gated-attention heads.
        layer_types: per layer, "linear_attention" (Gated DeltaNet) or "full_attention".
        linear_conv_kernel_dim: causal depthwise conv width of the GDN layers.
        linear_key_head_dim, linear_value_head_dim: GDN key / value head sizes.
        linear_num_key_heads, linear_num_value_heads: GDN head counts (values may
            outnumber keys; each key head serves consecutive value heads).
        rms_norm_eps: RMSNorm epsilon.
        tie_word_embeddings: LM head shares the embedding matrix.
        rope: rotary parameters (default RoPE; multimodal sections reduce to 1-D
            positions for text).
        partial_rotary_factor: fraction of `head_dim` that is rotated.
        eos_token_id: stop ids.
        model_type: "qwen3_5" (vision-language layout) or "qwen3_5_text".
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope: RopeConfig = RopeConfig()
    partial_rotary_factor: float = 0.25
    eos_token_id: tuple[int, ...] = ()
    model_type: str = "qwen3_5_text"

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head of the attention layers."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def rotary_dim(self) -> int:
        """Rotated dims per attention head: int(head_dim * partial_rotary_factor)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN conv: q, k and v concatenated."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def language_prefix(self) -> str:
        """Checkpoint name prefix of the language model's tensors."""
        return "model.language_model." if self.model_type == "qwen3_5" else "model."


def default_layer_types(num_layers: int, interval: int = 4) -> tuple[str, ...]:
    """Every `interval`-th layer full attention, the others linear (the reference default)."""
    return tuple(
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(num_layers)
    )


def _rope(text: Mapping[str, Any]) -> tuple[RopeConfig, float]:
    params = text.get("rope_parameters")
    if params is None:  # legacy: rope_theta (+ rope_scaling) at the top level
        params = dict(text.get("rope_scaling") or {})
        params.setdefault("rope_theta", text.get("rope_theta", 10000.0))
    params = dict(params)
    rope_type = params.get("rope_type", params.get("type", "default"))
    # "mrope" is default RoPE over (t, h, w) sections; text positions make them equal.
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"qwen3_5: unsupported rope_type {rope_type!r}; supported: 'default'")
    if "rope_theta" not in params:
        raise ValueError("qwen3_5: rope_parameters has no rope_theta")
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    return RopeConfig(theta=float(params["rope_theta"])), float(factor)


def qwen3_5_config_from_dict(raw: Mapping[str, Any]) -> Qwen3_5Config:
    """Builds a `Qwen3_5Config` from a parsed "qwen3_5" or "qwen3_5_text" `config.json`.

    Raises:
        ValueError: missing fields, unknown layer types or inconsistent head counts.
    """
    model_type = raw.get("model_type")
    if model_type == "qwen3_5":
        if not isinstance(raw.get("text_config"), Mapping):
            raise ValueError("qwen3_5 config.json has no text_config object")
        text = raw["text_config"]
        # The vision-language model ties (or not) from its top-level flag, default False.
        tie = bool(raw.get("tie_word_embeddings", False))
    else:
        text = raw
        tie = bool(raw.get("tie_word_embeddings", False))
    try:
        layers = int(text["num_hidden_layers"])
        layer_types = text.get("layer_types")
        if layer_types is None:
            layer_types = default_layer_types(layers, int(text.get("full_attention_interval", 4)))
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        rope, factor = _rope(text)
        config = Qwen3_5Config(
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            layer_types=tuple(layer_types),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
            linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=tie,
            rope=rope,
            partial_rotary_factor=factor,
            eos_token_id=eos,
            model_type=model_type,
        )
    except KeyError as err:
        raise ValueError(f"config.json is missing the field {err.args[0]!r}") from err
    c = config
    if len(c.layer_types) != layers or set(c.layer_types) - set(LAYER_TYPES):
        raise ValueError(
            f"layer_types must list {layers} entries from {LAYER_TYPES}, got {c.layer_types}"
        )
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of {kv_heads=}")
    if c.linear_num_value_heads % c.linear_num_key_heads:
        raise ValueError(
            f"linear_num_value_heads={c.linear_num_value_heads} is not a multiple of "
            f"linear_num_key_heads={c.linear_num_key_heads}"
        )
    if c.rotary_dim % 2 or not 0 < c.rotary_dim <= c.head_dim:
        raise ValueError(f"partial_rotary_factor={factor} gives an odd or empty rotary dim")
    if text.get("attention_bias"):
        raise ValueError("qwen3_5: attention_bias=true is not supported")
    if text.get("hidden_act", "silu") != "silu":
        raise ValueError(f"qwen3_5: hidden_act must be 'silu', got {text['hidden_act']!r}")
    return config


def qwen3_5_text_config_dict(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    linear_num_key_heads: int,
    linear_num_value_heads: int,
    linear_key_head_dim: int,
    linear_value_head_dim: int,
    linear_conv_kernel_dim: int = 4,
    layer_types: list[str] | None = None,
    tie_word_embeddings: bool = False,
    rope_theta: float = 10_000_000.0,
    partial_rotary_factor: float = 0.25,
    eos_token_id: int | None = None,
    dtype: str = "float32",
) -> dict:
    """A Hugging Face `config.json` dictionary for a text-only Qwen3.5 ("qwen3_5_text").

    Example:
        >>> raw = qwen3_5_text_config_dict(vocab_size=512, hidden_size=64,
        ...     intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        ...     num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        ...     linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
        >>> models.random_model(raw, jax.random.key(0)).save_pretrained("/tmp/tiny_qwen3_5")
    """
    layer_types = default_layer_types(num_hidden_layers) if layer_types is None else layer_types
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "layer_types": list(layer_types),
        "linear_conv_kernel_dim": linear_conv_kernel_dim,
        "linear_key_head_dim": linear_key_head_dim,
        "linear_value_head_dim": linear_value_head_dim,
        "linear_num_key_heads": linear_num_key_heads,
        "linear_num_value_heads": linear_num_value_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": rope_theta,
            "partial_rotary_factor": partial_rotary_factor,
        },
        "eos_token_id": eos_token_id,
        "dtype": dtype,
    }
