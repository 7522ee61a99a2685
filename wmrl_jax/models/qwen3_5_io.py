"""Checkpoint names and shapes of Qwen3.5 language-model tensors.

Vision-language checkpoints ("qwen3_5") hold the language model under
`model.language_model.*` next to the vision tower (`model.visual.*`) and the
multi-token-prediction head (`mtp.*`); text-only ones ("qwen3_5_text") under
`model.*`. The LM head is `lm_head.weight` in both. Tensors under
`SKIPPED_PREFIXES` are not loaded; `hf_io.save_checkpoint` copies them through.
"""

from wmrl_jax.models.qwen3_5_config import Qwen3_5Config

SKIPPED_PREFIXES = ("model.visual.", "mtp.")
_GDN_LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


def tensor_map(config: Qwen3_5Config) -> dict[str, tuple[tuple, bool]]:
    """HF tensor name -> (path in the params pure dict, transposed?)."""
    prefix = config.language_prefix
    out = {
        prefix + "embed_tokens.weight": (("embed_tokens",), False),
        prefix + "norm.weight": (("norm", "weight"), False),
    }
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head",), True)
    for i, kind in enumerate(config.layer_types):
        layer = f"{prefix}layers.{i}."
        names = [f"mlp.{n}_proj" for n in ("gate", "up", "down")]
        plain = ["input_layernorm.weight", "post_attention_layernorm.weight"]
        if kind == "linear_attention":
            names += [f"linear_attn.{n}" for n in _GDN_LINEARS]
            plain += [
                f"linear_attn.{n}" for n in ("conv1d.weight", "dt_bias", "A_log", "norm.weight")
            ]
        else:
            names += [f"self_attn.{n}_proj" for n in "qkvo"]
            plain += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        for name in names:
            out[f"{layer}{name}.weight"] = (("layers", i, *name.split("."), "kernel"), True)
        for name in plain:
            out[layer + name] = (("layers", i, *name.split(".")), False)
    return out


def expected_shapes(config: Qwen3_5Config) -> dict[tuple, tuple[int, ...]]:
    """Pure-dict path -> shape of every parameter ([in, out] for kernels)."""
    c = config
    h, f = c.hidden_size, c.intermediate_size
    out = {("embed_tokens",): (c.vocab_size, h), ("norm", "weight"): (h,)}
    if not c.tie_word_embeddings:
        out[("lm_head",)] = (h, c.vocab_size)
    for i, kind in enumerate(c.layer_types):
        layer = ("layers", i)
        out.update(
            {
                (*layer, "mlp", "gate_proj", "kernel"): (h, f),
                (*layer, "mlp", "up_proj", "kernel"): (h, f),
                (*layer, "mlp", "down_proj", "kernel"): (f, h),
                (*layer, "input_layernorm", "weight"): (h,),
                (*layer, "post_attention_layernorm", "weight"): (h,),
            }
        )
        if kind == "linear_attention":
            a, heads = (*layer, "linear_attn"), c.linear_num_value_heads
            out.update(
                {
                    (*a, "in_proj_qkv", "kernel"): (h, c.conv_dim),
                    (*a, "in_proj_z", "kernel"): (h, c.linear_value_dim),
                    (*a, "in_proj_b", "kernel"): (h, heads),
                    (*a, "in_proj_a", "kernel"): (h, heads),
                    (*a, "out_proj", "kernel"): (c.linear_value_dim, h),
                    (*a, "conv1d", "weight"): (c.conv_dim, 1, c.linear_conv_kernel_dim),
                    (*a, "dt_bias"): (heads,),
                    (*a, "A_log"): (heads,),
                    (*a, "norm", "weight"): (c.linear_value_head_dim,),
                }
            )
        else:
            a = (*layer, "self_attn")
            q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
            out.update(
                {
                    (*a, "q_proj", "kernel"): (h, 2 * q),
                    (*a, "k_proj", "kernel"): (h, kv),
                    (*a, "v_proj", "kernel"): (h, kv),
                    (*a, "o_proj", "kernel"): (q, h),
                    (*a, "q_norm", "weight"): (c.head_dim,),
                    (*a, "k_norm", "weight"): (c.head_dim,),
                }
            )
    return out
