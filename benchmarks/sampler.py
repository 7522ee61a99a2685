"""Decode throughput of `wmrl_jax.models.sample` against `transformers` generate and Tunix.

    python -m benchmarks.sampler [--preset small] [--batches 1,16,64] [--json PATH]

Same random checkpoint (see `benchmarks.forward`) for every implementation; a
byte-level BPE tokenizer is saved with it because Tunix's sampler takes text.
Each run: a batch of prompts of `--prompt` tokens, greedy decoding of exactly
`--new` tokens (no stop token can fire), float32. Tokens per second counts
generated tokens only (batch x new / wall time, prefill included). Tunix
re-tokenizes the decoded prompt text, padded to the same prompt length.

Timing as in `benchmarks.forward`: warm-up calls, then interleaved rounds and
the median per implementation.
"""

import argparse
import os
import platform
import tempfile

import jax
import numpy as np

from benchmarks.forward import (
    PRESETS,
    anchor,
    interleaved_medians,
    make_checkpoint,
    warmed,
    write_json,
)
from wmrl_jax import models


def make_ours(path: str, prompts: np.ndarray, new: int):
    model = models.from_pretrained(path, load_tokenizer=False)
    mask = np.ones_like(prompts)
    key = jax.random.key(0)

    def run():
        out = models.sample(model, prompts, mask, key, max_new_tokens=new, greedy=True, eos_ids=())
        jax.block_until_ready(out.tokens)
        assert int(out.lengths.min()) == new

    return warmed(run)


def make_torch(path: str, prompts: np.ndarray, new: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.as_tensor(prompts, dtype=torch.long)
    mask = torch.ones_like(ids)

    def run():
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        assert out.shape[1] == prompts.shape[1] + new

    return warmed(run)


def make_tunix(path: str, prompts: np.ndarray, new: int):
    from transformers import AutoTokenizer
    from tunix.generate import sampler as tunix_sampler

    from benchmarks.forward import tunix_model

    _, config = models.hf_io.load_config(path)
    model, tcfg = tunix_model(path, config)
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = [tokenizer.decode(row) for row in prompts]
    spec = dict(num_layers=tcfg.num_layers, num_kv_heads=tcfg.num_kv_heads, head_dim=tcfg.head_dim)
    probe = tunix_sampler.Sampler(model, tokenizer, tunix_sampler.CacheConfig(1, **spec))
    # Re-tokenized text may come out a token or two longer than the ids it came from.
    p = max(prompts.shape[1], *(len(probe.tokenize(t)) for t in text))
    cache = tunix_sampler.CacheConfig(cache_size=p + new + 1, **spec)
    sampler = tunix_sampler.Sampler(model, tokenizer, cache)

    def run():
        out = sampler(
            text,
            max_generation_steps=new,
            max_prompt_length=p,
            temperature=0.0,
            eos_tokens=[config.vocab_size + 1],  # never produced: decode the full budget
            pad_output=True,
        )
        assert len(out.tokens) == len(text)

    return warmed(run)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of anchors to skip: torch,tunix")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(args.preset, tmp)
        from wmrl_jax.models.fixtures import build_tokenizer

        tokenizer = build_tokenizer()
        tokenizer.save_pretrained(tmp)
        # Prompt ids drawn from the tokenizer's range so every implementation sees text.
        pool = np.arange(3, len(tokenizer))
        print(
            f"decode, preset={args.preset}, prompt={args.prompt}, new={args.new}, greedy, "
            f"float32, {platform.processor() or 'cpu'} x{os.cpu_count()}"
        )
        print("| batch | impl | s | tokens/s | ours / impl |\n|---|---|---|---|---|")
        for batch in batches:
            prompts = rng.choice(pool, size=(batch, args.prompt)).astype(np.int32)
            prepared = {"ours": (make_ours(tmp, prompts, args.new), "ok")}
            if "torch" not in skip:
                prepared["transformers"] = anchor(make_torch, tmp, prompts, args.new)
            if "tunix" not in skip:
                prepared["tunix"] = anchor(make_tunix, tmp, prompts, args.new)
            medians = interleaved_medians(
                {k: fn for k, (fn, _) in prepared.items() if fn is not None},
                repeats=args.repeats,
            )
            timed = {k: (medians.get(k), note) for k, (_, note) in prepared.items()}
            ours_tps = batch * args.new / timed["ours"][0]
            for impl, (seconds, note) in timed.items():
                row = {"batch": batch, "impl": impl}
                if seconds is None:
                    print(f"| {batch} | {impl} | - | - | {note} |")
                    row["note"] = note
                else:
                    tps = batch * args.new / seconds
                    print(
                        f"| {batch} | {impl} | {seconds:.3f} | {tps:,.0f} | {ours_tps / tps:.2f}x |"
                    )
                    row.update(seconds=seconds, tokens_per_s=tps, ours_over_impl=ours_tps / tps)
                rows.append(row)
    payload = {"benchmark": "decode", "args": vars(args), "rows": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
