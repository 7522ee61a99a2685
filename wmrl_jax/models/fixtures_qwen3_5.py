"""Builds tiny random Qwen3.5 checkpoints and reference outputs from the PyTorch model.

    python -m wmrl_jax.models.fixtures --out tests/models/fixtures   # builds these too

Needs `torch` and a `transformers` with `models.qwen3_5` (the tests do not).
Two checkpoints, each with config.json, safetensors, the fixtures' tokenizer and
`reference.npz`:

* "qwen3_5_vl_tied": the published vision-language layout (`model_type`
  "qwen3_5", `model.language_model.*`, a tiny vision tower `model.visual.*` and
  `mtp.*` tensors added after saving), tied embeddings, default `layer_types`;
* "qwen3_5_text_untied": text-only (`qwen3_5_text`), untied, an explicit
  non-default `layer_types`, GQA 4, more GDN value heads than key heads, key and
  value head dims that differ, conv kernel 3, partial rotary factor 0.5, and
  sharded safetensors with an index.

`reference.npz` holds `input_ids` [2, T] (T > 64, so a chunk boundary is
crossed) with `logits_fp32` and `logits_bf16` (bfloat16 bits, uint16) [2, T, V];
a left-padded batch `padded_ids` / `padded_mask` [2, T] (row 0 is `input_ids[0]`,
row 1 the first 67 tokens of `input_ids[1]`) with the reference's logits on
row 1's real positions, `padded_logits_fp32` [67, V] (positions from the mask);
and `greedy_prompt` [1, 70] with a 32-token greedy continuation `greedy_tokens`
computed by repeated full forward passes.
"""

import json
import os

import numpy as np

SEQ_LEN = 104
PADDED_LENGTHS = (104, 67)
GREEDY_PROMPT = 70
GREEDY_NEW = 32

TEXT_VL = dict(
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
)
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=64,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    num_position_embeddings=16,
)
TEXT_UNTIED = dict(
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=5,
    layer_types=[
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
    ],
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=24,
    linear_conv_kernel_dim=3,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
)
FIXTURES = ("qwen3_5_vl_tied", "qwen3_5_text_untied")


def _perturb(model, seed: int) -> None:
    """Moves every weight off its initialisation, keeping activations O(1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("linear_attn.norm.weight"):  # plain w * x (gated norm)
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("norm.weight") and "visual" not in name:  # (1 + w) * x
                p.copy_(0.3 * noise)
            elif name.endswith("A_log"):  # decays exp(g) between ~0.4 and ~0.99 per token
                p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 0.9 + 0.05))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * noise)
            elif name.endswith("conv1d.weight"):
                p.copy_(noise / np.sqrt(p.shape[-1]))
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / np.sqrt(np.prod(p.shape[1:])))


def _add_mtp(path: str, hidden: int, seed: int) -> None:
    """Appends `mtp.*` tensors (as published checkpoints carry) to the safetensors file."""
    from wmrl_jax.models import safetensors_io

    file = os.path.join(path, "model.safetensors")
    meta = safetensors_io.read_metadata(file)
    tensors = {k: np.array(v) for k, v in safetensors_io.open_tensors(file).items()}
    rng = np.random.default_rng(seed)
    tensors["mtp.fc.weight"] = rng.normal(size=(hidden, 2 * hidden)).astype(np.float32)
    tensors["mtp.norm.weight"] = rng.normal(size=(hidden,)).astype(np.float32)
    safetensors_io.write_tensors(file, tensors, meta)


def _model(name: str, tokenizer, seed: int):
    import torch
    from transformers import (
        Qwen3_5Config,
        Qwen3_5ForCausalLM,
        Qwen3_5ForConditionalGeneration,
        Qwen3_5TextConfig,
    )

    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    if name == "qwen3_5_vl_tied":
        text = dict(TEXT_VL, vocab_size=len(tokenizer), rms_norm_eps=1e-6, **ids)
        config = Qwen3_5Config(text_config=text, vision_config=VISION, tie_word_embeddings=True)
        config.text_config.tie_word_embeddings = True
        config._attn_implementation = "eager"
        config.text_config._attn_implementation = "eager"
        return Qwen3_5ForConditionalGeneration(config).float().eval()
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        **ids,
        **TEXT_UNTIED,
    )
    config._attn_implementation = "eager"
    return Qwen3_5ForCausalLM(config).float().eval()


def _logits(model, ids, mask=None):
    import torch

    ids = torch.as_tensor(ids)
    if mask is None:
        mask = torch.ones_like(ids)
    mask = torch.as_tensor(mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions)
    return out.logits.float().numpy()


def build_one(name: str, out_dir: str, tokenizer, seed: int) -> dict:
    """Builds one checkpoint directory with its reference outputs; returns a summary."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

    model = _model(name, tokenizer, seed)
    _perturb(model, seed)
    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    for file in os.listdir(path):
        os.remove(os.path.join(path, file))
    vl = name == "qwen3_5_vl_tied"
    model.save_pretrained(path, **({} if vl else {"max_shard_size": "150KB"}))
    tokenizer.save_pretrained(path)
    if vl:
        _add_mtp(path, TEXT_VL["hidden_size"], seed)
        loader = Qwen3_5ForConditionalGeneration
    else:
        loader = AutoModelForCausalLM
    reloaded = loader.from_pretrained(path, attn_implementation="eager").float().eval()

    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    ids = rng.integers(0, vocab, size=(2, SEQ_LEN))
    logits32 = _logits(reloaded, ids)
    np.testing.assert_allclose(logits32, _logits(model, ids), atol=1e-6)
    half = loader.from_pretrained(path, attn_implementation="eager", dtype=torch.bfloat16)
    logits16 = _logits(half.eval(), ids)

    width = max(PADDED_LENGTHS)
    padded = np.full((2, width), tokenizer.pad_token_id)
    mask = np.zeros((2, width), np.int64)
    for row, n in enumerate(PADDED_LENGTHS):
        padded[row, width - n :], mask[row, width - n :] = ids[row, :n], 1
    padded_logits = _logits(reloaded, padded, mask)
    # Padding must not change real positions; the reference itself moves by ~4e-5
    # (its chunks start at other tokens, so float32 rounding differs).
    for row, n in enumerate(PADDED_LENGTHS):
        np.testing.assert_allclose(padded_logits[row, width - n :], logits32[row, :n], atol=1e-4)

    seq = torch.as_tensor(ids[:1, :GREEDY_PROMPT])
    with torch.no_grad():
        for _ in range(GREEDY_NEW):
            nxt = reloaded(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    np.savez_compressed(
        os.path.join(path, "reference.npz"),
        input_ids=ids.astype(np.int32),
        logits_fp32=logits32.astype(np.float32),
        logits_bf16=_bf16_bits(logits16),
        padded_ids=padded.astype(np.int32),
        padded_mask=mask.astype(np.int32),
        padded_logits_fp32=padded_logits[1, width - PADDED_LENGTHS[1] :].astype(np.float32),
        greedy_prompt=ids[:1, :GREEDY_PROMPT].astype(np.int32),
        greedy_tokens=seq[0, GREEDY_PROMPT:].numpy().astype(np.int32),
    )
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        model_type = json.load(f)["model_type"]
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"name": name, "bytes": size, "files": sorted(os.listdir(path)), "type": model_type}


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values that are exact bfloat16 numbers -> their uint16 bit patterns."""
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16).view(np.uint16)
