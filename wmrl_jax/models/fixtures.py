"""Builds tiny random Qwen3 checkpoints and reference outputs from the PyTorch model.

    python -m wmrl_jax.models.fixtures --out tests/models/fixtures

The Qwen3.5 checkpoints come from `fixtures_qwen3_5`, built by the same command.

Needs `torch` and `transformers` (the tests that use the committed output do not).
Every checkpoint directory holds config.json, safetensors, a byte-level BPE
tokenizer with a ChatML chat template, and `reference.npz`:

* `input_ids` [2, T] (T > 64) and `logits_fp32` / `logits_bf16` [2, T, V] from
  the reference forward in float32 and bfloat16;
* `greedy_prompt` [1, P] and `greedy_tokens` [32]: a greedy continuation
  (no stop token) computed by repeated full forward passes.

Every weight is perturbed away from its initialisation: norm weights scatter
around 1 (weights of exactly 1 would hide a wrong RMSNorm convention), biases
are non-zero, matrices are scaled to keep activations O(1).
"""

import argparse
import json
import os

import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 384
SEQ_LEN = 72
GREEDY_PROMPT = 12
GREEDY_NEW = 32

# name -> (Qwen3 config kwargs, config.json rewrite: "legacy" rope keys or None, shard size)
FIXTURES = {
    # GQA ratio 1, tied embeddings, default RoPE written in the legacy top-level form.
    "qwen3_gqa1_tied": (
        dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=16,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        "legacy",
        None,
    ),
    # GQA ratio 2, untied, head_dim (24) != hidden / heads (16), new rope_parameters form.
    "qwen3_gqa2_untied": (
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        None,
        None,
    ),
    # GQA ratio 4, YaRN (new form), attention biases, sharded safetensors with an index.
    "qwen3_gqa4_yarn": (
        dict(
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=12,
            tie_word_embeddings=False,
            attention_bias=True,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        None,
        "100KB",
    ),
    # YaRN written in the legacy `rope_theta` + `rope_scaling` form.
    "qwen3_yarn_legacy": (
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
            max_position_embeddings=128,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 50000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
            },
        ),
        "legacy",
        None,
    ),
}


def _corpus() -> list[str]:
    rng = np.random.default_rng(0)
    words = (
        "the model trains a solution program data metric score task submission python import "
        "numpy pandas sklearn def return for in range if else print accuracy loss learning "
        "rate batch epoch feature column value train test split fit predict csv file read "
        "write mean std sum max min agent world reward policy group anchor sample token"
    ).split()
    lines = []
    for _ in range(400):
        lines.append(" ".join(rng.choice(words, size=int(rng.integers(4, 14)))))
        lines.append(f"x = np.mean(y[{rng.integers(100)}:]) * {rng.uniform():.3f}")
    return lines


def build_tokenizer():
    """A byte-level BPE tokenizer with ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def _perturb(model, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                # Tied heads reuse it: unit-variance logits need 1/sqrt(hidden).
                p.copy_(noise / np.sqrt(p.shape[1]))
            else:
                p.copy_(noise / np.sqrt(p.shape[1]))


def _to_legacy(path: str) -> None:
    """Rewrites config.json's rope keys into `rope_theta` (+ `rope_scaling`)."""
    file = os.path.join(path, "config.json")
    with open(file, encoding="utf-8") as f:
        raw = json.load(f)
    rope = dict(raw.pop("rope_parameters"))
    raw["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type")
    raw["rope_scaling"] = None if rope_type == "default" else {"type": rope_type, **rope}
    with open(file, "w", encoding="utf-8") as f:
        json.dump(raw, f, indent=2, sort_keys=True)


def build_one(name: str, out_dir: str, tokenizer, seed: int) -> dict:
    """Builds one checkpoint directory with its reference outputs; returns a summary."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    kwargs, rewrite, shard = FIXTURES[name]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float().eval()
    _perturb(model, seed)
    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    for file in os.listdir(path):
        os.remove(os.path.join(path, file))
    save_kwargs = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(path, **save_kwargs)
    tokenizer.save_pretrained(path)
    if rewrite == "legacy":
        _to_legacy(path)

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, len(tokenizer), size=(2, SEQ_LEN))
    reloaded = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        logits32 = reloaded(torch.as_tensor(ids)).logits.float().numpy()
        ref = model(torch.as_tensor(ids)).logits.float().numpy()
        # The written config (legacy or not) must mean the same model.
        np.testing.assert_allclose(logits32, ref, atol=1e-6)
        logits16 = reloaded.to(torch.bfloat16)(torch.as_tensor(ids)).logits.float().numpy()
        seq = torch.as_tensor(ids[:1, :GREEDY_PROMPT])
        for _ in range(GREEDY_NEW):
            nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    greedy = seq[0, GREEDY_PROMPT:].numpy()
    np.savez(
        os.path.join(path, "reference.npz"),
        input_ids=ids.astype(np.int32),
        logits_fp32=logits32.astype(np.float32),
        logits_bf16=logits16.astype(np.float32),
        greedy_prompt=ids[:1, :GREEDY_PROMPT].astype(np.int32),
        greedy_tokens=greedy.astype(np.int32),
    )
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"name": name, "bytes": size, "files": sorted(os.listdir(path))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/models/fixtures")
    parser.add_argument("--only", nargs="*", default=None, help="fixture names to rebuild")
    args = parser.parse_args(argv)
    from wmrl_jax.models import fixtures_qwen3_5

    tokenizer = build_tokenizer()
    builders = [(name, build_one) for name in FIXTURES]
    builders += [(name, fixtures_qwen3_5.build_one) for name in fixtures_qwen3_5.FIXTURES]
    for seed, (name, build) in enumerate(builders):
        if args.only and name not in args.only:
            continue
        summary = build(name, args.out, tokenizer, seed)
        print(f"{summary['name']}: {summary['bytes'] / 1e6:.2f} MB, {summary['files']}")


if __name__ == "__main__":
    main()
