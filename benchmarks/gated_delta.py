"""Gated DeltaNet speed: chunked vs token-by-token, against `transformers`, and decoding.

    python -m benchmarks.gated_delta [--seqs 512,2048,8192] [--skip torch] [--json PATH]

Three tables, each timed in interleaved rounds (one call of every contender per
round, the median reported, compilation excluded by a warm-up call):

1. kernel: `gated_delta_chunked` (chunk 64) against `gated_delta_recurrent`
   (a `lax.scan` over tokens) and the PyTorch chunked fallback of `transformers`
   (`torch_chunk_gated_delta_rule`), forward and forward+backward tokens/s on
   the same float32 inputs [1, T, H=4, D=64], for each T in `--seqs`; and the
   forward of the sampler's prefill form (`per_chunk=True`: each chunk's terms
   built inside the scan) against the training form's, and the training form's
   forward+backward against the same with the loop across chunks differentiated
   by autodiff of a `lax.scan` (`backward="autodiff"`: `written_vs_autodiff`);
2. model: the forward of a tiny random Qwen3.5 (`--preset`) in Flax against
   `transformers`' `Qwen3_5ForCausalLM` (eager attention, the same chunked
   fallback) on the same checkpoint, tokens/s at batch 1 x 512;
3. decode: `models.sample` tokens/s (prompt 64, 64 new tokens, greedy) at
   batch 1, 16 and 64 on the same model.

The anchors are optional: `pip install torch==2.13.0` for `transformers`.
"""

import argparse
import functools
import json
import os
import platform
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.forward import interleaved_medians, warmed, write_json
from wmrl_jax import models
from wmrl_jax.models.gated_delta import gated_delta_chunked, gated_delta_recurrent, l2_normalize

PRESETS = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    ),
    # Qwen3.5-0.8B's text shapes (for accelerators).
    "qwen3_5_0p8b": dict(
        vocab_size=248320,
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        tie_word_embeddings=True,
    ),
}


def _rounds(fns: dict, repeats: int) -> dict:
    """Median seconds per call of each function, warmed up, timed in interleaved rounds."""
    return interleaved_medians({n: warmed(fn) for n, fn in fns.items()}, repeats=repeats)


def _inputs(t: int, heads: int = 4, dim: int = 64):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, t, heads, dim)).astype(np.float32)
    k = rng.normal(size=(1, t, heads, dim)).astype(np.float32)
    v = rng.normal(size=(1, t, heads, dim)).astype(np.float32)
    g = -rng.uniform(0, 1, size=(1, t, heads)).astype(np.float32)
    beta = rng.uniform(size=(1, t, heads)).astype(np.float32)
    return q, k, v, g, beta


def _jax_kernel(fn, arrays):
    q, k, v, g, beta = (jnp.asarray(a) for a in arrays)
    q, k = l2_normalize(q) * q.shape[-1] ** -0.5, l2_normalize(k)
    fwd = jax.jit(lambda *a: fn(*a)[0])
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a)[0] ** 2), argnums=(0, 1, 2, 3, 4)))
    return (
        lambda: jax.block_until_ready(fwd(q, k, v, g, beta)),
        lambda: jax.block_until_ready(grad(q, k, v, g, beta)),
    )


def _torch_kernel(arrays):
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5 as ref

    fn = getattr(ref.torch_chunk_gated_delta_rule, "__wrapped__", ref.torch_chunk_gated_delta_rule)
    q, k, v, g, beta = (torch.as_tensor(a) for a in arrays)

    def forward():
        with torch.no_grad():
            fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)

    def backward():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        a, b, c, d, e = leaves
        out, _ = fn(a, b, c, g=d, beta=e, use_qk_l2norm_in_kernel=True)
        (out**2).sum().backward()

    return forward, backward


def kernel_table(seqs, repeats: int, skip: set) -> list[dict]:
    rows = []
    for t in seqs:
        arrays = _inputs(t)
        chunked, recurrent = (
            _jax_kernel(gated_delta_chunked, arrays),
            _jax_kernel(gated_delta_recurrent, arrays),
        )
        per_chunk = functools.partial(gated_delta_chunked, per_chunk=True)  # the prefill's form
        fwd = {"chunked": chunked[0], "recurrent": recurrent[0]}
        fwd["per_chunk"] = _jax_kernel(per_chunk, arrays)[0]
        bwd = {"chunked": chunked[1], "recurrent": recurrent[1]}
        # The loop across chunks differentiated by autodiff of a `lax.scan` (before
        # `_chunk_scan`'s written-out backward): the same arithmetic, more memory on a GPU.
        autodiff = functools.partial(gated_delta_chunked, backward="autodiff")
        bwd["autodiff_scan"] = _jax_kernel(autodiff, arrays)[1]
        if "torch" not in skip:
            torch_fns = _torch_kernel(arrays)
            fwd["torch_chunked"], bwd["torch_chunked"] = torch_fns
        for mode, fns in (("forward", fwd), ("forward+backward", bwd)):
            secs = _rounds(fns, repeats)
            row = {"T": t, "mode": mode, **{f"{n}_tok_s": t / s for n, s in secs.items()}}
            row["chunked_vs_recurrent"] = secs["recurrent"] / secs["chunked"]
            if "per_chunk" in secs:
                row["per_chunk_vs_chunked"] = secs["chunked"] / secs["per_chunk"]
            if "autodiff_scan" in secs:
                row["written_vs_autodiff"] = secs["autodiff_scan"] / secs["chunked"]
            if "torch_chunked" in secs:
                row["chunked_vs_torch"] = secs["torch_chunked"] / secs["chunked"]
            rows.append(row)
            print(json.dumps(row))
    return rows


def model_table(path: str, repeats: int, skip: set, seq: int = 512) -> dict:
    model = models.from_pretrained(path, load_tokenizer=False)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, (1, seq))
    fns = {"flax": lambda: jax.block_until_ready(model.logits(ids))}
    if "torch" not in skip:
        import torch
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        tids = torch.as_tensor(ids)

        def torch_forward():
            with torch.no_grad():
                reference(input_ids=tids)

        fns["torch"] = torch_forward
    secs = _rounds(fns, repeats)
    row = {"seq": seq, **{f"{n}_tok_s": seq / s for n, s in secs.items()}}
    if "torch" in secs:
        row["flax_vs_torch"] = secs["torch"] / secs["flax"]
    print(json.dumps(row))
    return row


def decode_table(path: str, repeats: int, batches=(1, 16, 64), prompt=64, new=64) -> list[dict]:
    model = models.from_pretrained(path, load_tokenizer=False)
    rows = []
    for b in batches:
        ids = np.random.default_rng(b).integers(0, model.config.vocab_size, (b, prompt))
        mask = np.ones_like(ids)

        def run(ids=ids, mask=mask):
            out = models.sample(
                model, ids, mask, jax.random.key(0), max_new_tokens=new, greedy=True, eos_ids=()
            )
            jax.block_until_ready(out.tokens)

        secs = _rounds({"decode": run}, repeats)["decode"]
        row = {"batch": b, "prompt": prompt, "new": new, "tok_s": b * new / secs}
        rows.append(row)
        print(json.dumps(row))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="512,2048,8192")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip", default="", help="comma-separated anchors to skip: torch")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if "torch" not in skip:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: the transformers anchor is missing")
            skip.add("torch")
    load_before = os.getloadavg()
    seqs = [int(s) for s in args.seqs.split(",")]
    result = {"kernel": kernel_table(seqs, args.repeats, skip)}
    with tempfile.TemporaryDirectory() as tmp:
        raw = models.qwen3_5_text_config_dict(**PRESETS[args.preset])
        models.random_model(raw, jax.random.key(0)).save_pretrained(tmp)
        result["model"] = model_table(tmp, args.repeats, skip)
        result["decode"] = decode_table(tmp, args.repeats)
    result["platform"] = {
        "machine": platform.machine(),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    write_json(args.json, result)


if __name__ == "__main__":
    main()
