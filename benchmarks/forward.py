"""Forward+backward throughput of the Flax Qwen3 against `transformers` (PyTorch) and Tunix.

    python -m benchmarks.forward [--preset small] [--batch 8] [--seq 128] [--json PATH]
    python -m benchmarks.forward --seq 2048 --batch 2 --variants --skip torch,tunix

All runs use the same random checkpoint, written once to a temporary directory
and read by each implementation. One step is the mean next-token cross-entropy
of a [batch, seq] batch and its gradient with respect to every parameter, in
float32. Reported: tokens per second (batch x seq / step time) and the ratio of
ours to each anchor. An anchor that is not installed is reported as missing
(PyTorch: `pip install torch`; Tunix: `pip install google-tunix`).

``--variants`` adds our own earlier and leaner paths as anchors of the same run:
``ours_dense_attention`` (one query block as long as the sequence: the [H, T, T]
scores whole, the attention before `models.attention` blocked it) and
``ours_remat`` (per-layer remat and the blocked LM head, the train step's
``remat=True``), each with XLA's temporary bytes of the compiled step.

Timing: one warm-up step each (compilation excluded), then `--repeats` rounds
that time every implementation once, interleaved so that load from other
processes hits all alike; the median per implementation is reported. Each step
is waited on (`block_until_ready`).
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax import models
from wmrl_jax.models import lm_head, qwen3
from wmrl_jax.models.attention import QUERY_BLOCK

PRESETS = {
    # Small enough for a 2-core CPU, large enough that compute dominates dispatch.
    "small": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    # Qwen3-0.6B's shapes (for accelerators).
    "qwen3_0p6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
}


def make_checkpoint(preset: str, directory: str, *, dtype: str = "float32") -> str:
    """Writes a random checkpoint of `preset` into `directory`; returns its path."""
    raw = models.qwen3_config_dict(**PRESETS[preset], dtype=dtype)
    models.random_model(raw, jax.random.key(0), dtype=dtype).save_pretrained(directory)
    return directory


def interleaved_medians(fns: dict[str, Callable[[], object]], *, repeats: int) -> dict:
    """Median wall time of each warmed-up callable, timed in interleaved rounds.

    Round r times every implementation once, so load from other processes on a
    shared machine hits all of them alike instead of whichever ran during a spike.
    """
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def warmed(fn: Callable[[], object]) -> Callable[[], object]:
    """Calls `fn` once (compilation, first-touch allocations) and returns it."""
    fn()
    return fn


def param_count(model) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(model.params))


def flops_per_token(config, seq: int) -> float:
    """Model FLOPs of forward+backward per token: 6 N (matmul params) + causal attention.

    N excludes the embedding lookup (a gather); a tied head counts once. Attention
    is 6 x 2 x layers x heads x head_dim x seq / 2 (QK^T and PV, causal half).
    """
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    matmul = c.num_hidden_layers * per_layer + c.hidden_size * c.vocab_size
    attention = 6 * c.num_hidden_layers * q * seq
    return 6.0 * matmul + attention


def make_ours(
    path: str,
    ids: np.ndarray,
    *,
    dtype: str = "float32",
    query_block: int = QUERY_BLOCK,
    remat: bool = False,
    temp_bytes: dict | None = None,
) -> Callable[[], object]:
    """Our step; `query_block`, `remat` select the path, `temp_bytes` gets XLA's temporaries."""
    model = models.from_pretrained(path, dtype=dtype, load_tokenizer=False)
    tokens = jnp.asarray(ids)

    def loss(params):
        if remat:
            features, head = qwen3.apply_features(
                model.graphdef, params, tokens[:, :-1], remat=True, query_block=query_block
            )
            return -lm_head.blocked_token_logprobs(features, head, tokens[:, 1:])[0].mean()
        logits = models.apply(model.graphdef, params, tokens[:, :-1], query_block=query_block)
        return -models.token_logprobs(logits, tokens[:, 1:]).mean()

    step = jax.jit(jax.value_and_grad(loss))
    if temp_bytes is not None:
        analysis = step.lower(model.params).compile().memory_analysis()
        temp_bytes["temp_bytes"] = int(analysis.temp_size_in_bytes)
    return warmed(lambda: jax.block_until_ready(step(model.params)))


def make_torch(path: str, ids: np.ndarray) -> Callable[[], object]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    tokens = torch.as_tensor(ids, dtype=torch.long)

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        return loss.item()

    return warmed(step)


def tunix_model(path: str, config, *, dtype=jnp.float32):
    """Tunix's Qwen3 with our checkpoint's weights, or raises ImportError."""
    from tunix.models.qwen3 import model as tunix_qwen3
    from tunix.models.qwen3 import params as tunix_params

    tcfg = tunix_qwen3.ModelConfig(
        num_layers=config.num_hidden_layers,
        vocab_size=config.vocab_size,
        embed_dim=config.hidden_size,
        hidden_dim=config.intermediate_size,
        num_heads=config.num_attention_heads,
        head_dim=config.head_dim,
        num_kv_heads=config.num_key_value_heads,
        rope_theta=int(config.rope.theta),
        norm_eps=config.rms_norm_eps,
        use_tied_embedding=config.tie_word_embeddings,
        dtype=dtype,
        param_dtype=dtype,
    )
    # Tunix's sharding annotations are for a ("fsdp", "tp") mesh; one device needs none.
    model = tunix_params.create_model_from_safe_tensors(path, tcfg, mesh=None, dtype=dtype)
    return model, tcfg


def make_tunix(path: str, ids: np.ndarray) -> Callable[[], object]:
    from flax import nnx

    _, config = models.hf_io.load_config(path)
    model, _ = tunix_model(path, config)
    tokens = jnp.asarray(ids)
    inputs = tokens[:, :-1]
    t = inputs.shape[1]
    positions = jnp.broadcast_to(jnp.arange(t), inputs.shape)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (inputs.shape[0], t, t))

    @nnx.jit
    def step(model):
        def loss(model):
            logits, _ = model(inputs, positions, None, mask)
            return -models.token_logprobs(logits, tokens[:, 1:]).mean()

        return nnx.value_and_grad(loss)(model)

    return warmed(lambda: jax.block_until_ready(step(model)))


def anchor(fn, *args, **kwargs):
    """Prepares an anchor; returns (its timed callable or None, note)."""
    try:
        return fn(*args, **kwargs), "ok"
    except ImportError as err:
        return None, f"not installed ({err.name or err})"
    except Exception as err:  # an anchor's failure is reported, not fatal
        return None, f"failed: {type(err).__name__}: {str(err)[:200]}"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--skip", default="", help="comma list of anchors to skip: torch,tunix")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="device peak, to report MFU"
    )
    parser.add_argument(
        "--variants", action="store_true", help="also time ours_dense_attention and ours_remat"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_checkpoint(args.preset, tmp, dtype=args.dtype)
        _, config = models.hf_io.load_config(path)
        vocab = PRESETS[args.preset]["vocab_size"]
        ids = rng.integers(0, vocab, size=(args.batch, args.seq + 1)).astype(np.int32)
        tokens = args.batch * args.seq
        n_params = param_count(models.from_pretrained(path, load_tokenizer=False))
        temps = {name: {} for name in ("ours", "ours_dense_attention", "ours_remat")}
        prepared = {
            "ours": (make_ours(path, ids, dtype=args.dtype, temp_bytes=temps["ours"]), "ok")
        }
        if args.variants:
            for name, kw in (
                ("ours_dense_attention", dict(query_block=args.seq)),
                ("ours_remat", dict(remat=True)),
            ):
                fn = make_ours(path, ids, dtype=args.dtype, temp_bytes=temps[name], **kw)
                prepared[name] = (fn, "ok")
        if "torch" not in skip:
            prepared["transformers"] = anchor(make_torch, path, ids)
        if "tunix" not in skip:
            prepared["tunix"] = anchor(make_tunix, path, ids)
        medians = interleaved_medians(
            {k: fn for k, (fn, _) in prepared.items() if fn is not None}, repeats=args.repeats
        )
        results = {k: (medians.get(k), note) for k, (_, note) in prepared.items()}
    ours_tps = tokens / results["ours"][0]
    model_flops = flops_per_token(config, args.seq) * ours_tps
    rows = {"ours_model_tflops": model_flops / 1e12}
    mfu = "" if args.peak_tflops is None else f", MFU {model_flops / 1e12 / args.peak_tflops:.1%}"
    print(
        f"forward+backward, preset={args.preset} ({n_params / 1e6:.2f}M params), "
        f"batch={args.batch} seq={args.seq} {args.dtype}, {platform.processor() or 'cpu'} "
        f"x{os.cpu_count()}"
    )
    print("| impl | step s | tokens/s | ours / impl | XLA temp GiB |\n|---|---|---|---|---|")
    for impl, (seconds, note) in results.items():
        if seconds is None:
            print(f"| {impl} | - | - | {note} | - |")
            rows[impl] = {"note": note}
            continue
        tps = tokens / seconds
        temp = temps.get(impl, {}).get("temp_bytes")
        shown = "-" if temp is None else f"{temp / 2**30:.3f}"
        print(f"| {impl} | {seconds:.4f} | {tps:,.0f} | {ours_tps / tps:.2f}x | {shown} |")
        rows[impl] = {"seconds": seconds, "tokens_per_s": tps, "ours_over_impl": ours_tps / tps}
        if temp is not None:
            rows[impl]["temp_bytes"] = temp
    print(f"ours: {model_flops / 1e9:,.1f} model GFLOP/s (6N + attention){mfu}")
    payload = {"benchmark": "forward_backward", "args": vars(args), "params": n_params, **rows}
    write_json(args.json, payload)
    return payload


def write_json(path: str | None, payload: dict) -> None:
    """Writes `payload` to `path` as JSON (creating its directory); no-op without a path."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)


if __name__ == "__main__":
    main()
