"""Fixed-shape generation for the text agent: left padding, chunked sampler calls, decoding.

Shapes stay fixed for a fixed config, so neither the sampler nor the train step
recompiles between steps: prompts are left padded to a fixed length (the solver
prompt's P, the WM prompt's length, or an episode's growing prefix), and with
`batch_size` every generation call is cut into equal chunks (the last one
padded with copies of a real row, whose outputs are dropped). Without it, one
call of `call_rows` rows, so that asking for fewer rows does not recompile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from wmrl_jax.models.api import left_pad


class ModelView(NamedTuple):
    """What `models.sample` reads from a model, for a graphdef held without its params."""

    graphdef: Any
    params: Any
    config: Any = None


def default_stop_ids(tokenizer) -> tuple[int, ...]:
    """The tokenizer's EOS, <|im_end|> and <|endoftext|> (those it has), sorted."""
    ids = {tokenizer.eos_token_id}
    vocab = tokenizer.get_vocab()
    ids |= {vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab}
    return tuple(sorted(i for i in ids if i is not None))


def generate(
    sample_fn: Callable,
    graphdef,
    params,
    prompts: list[list[int]],
    length: int,
    repeat: int,
    key,
    *,
    pad_id: int,
    stop_ids: Sequence[int],
    batch_size: int | None = None,
    call_rows: int | None = None,
    mesh=None,
    **kw,
):
    """Left pads `prompts` to `length`, repeats each row `repeat` times, samples.

    Args:
      sample_fn: the sampler (`models.sample`).
      graphdef: the model's `nnx.GraphDef`; `params` its parameters.
      prompts: R / `repeat` prompts of token ids, each at most `length` long.
      length: the padded prompt length.
      repeat: samples per prompt (rows are prompt-major).
      key: PRNG key; chunk c samples with `fold_in(key, c)`.
      pad_id, stop_ids: the padding token and the stop tokens.
      batch_size: rows per sampler call (None: one call).
      call_rows: rows of that one call without `batch_size` (default: R).
      mesh: optional mesh for the sampler's KV cache.
      **kw: the sampler's options (max_new_tokens, temperature, greedy, ...).

    Returns:
      (prompt ids [R, length], prompt mask [R, length], SampleOutput as numpy [R, M]).
    """
    ids, mask = left_pad(prompts, pad_id, length)
    ids, mask = np.repeat(ids, repeat, axis=0), np.repeat(mask, repeat, axis=0)
    rows = ids.shape[0]
    size = batch_size or max(rows, call_rows or 0)
    chunks = []
    for c, start in enumerate(range(0, rows, size)):
        take = np.arange(start, start + size)
        take = np.where(take < rows, take, rows - 1)  # pad the last chunk with a real row
        out = sample_fn(
            ModelView(graphdef, params),
            ids[take],
            mask[take],
            jax.random.fold_in(key, c),
            params=params,
            eos_ids=stop_ids,
            pad_id=pad_id,
            mesh=mesh,
            **kw,
        )
        n = min(size, rows - start)
        chunks.append([np.asarray(x)[:n] for x in out])
    out = type(out)(*(np.concatenate(parts) for parts in zip(*chunks, strict=True)))
    return ids, mask, out


def decode(tokenizer, tokens: np.ndarray, mask: np.ndarray, stop_ids: Sequence[int]) -> list[str]:
    """Text of each row's tokens under `mask` ([R, M] each), stop tokens left out."""
    stops = set(stop_ids)
    rows = [
        [int(t) for t, m in zip(r, k, strict=True) if m and t not in stops]
        for r, k in zip(tokens, mask, strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
