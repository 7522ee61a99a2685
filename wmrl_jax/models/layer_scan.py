"""A decoder's layers under `lax.scan` for a rematerialised training pass.

With per-layer remat (`jax.checkpoint` of each layer) written as a Python loop,
JAX keeps only each layer's input for the backward pass, but XLA is free to
schedule the recomputations anywhere after those inputs exist, and it runs them
early: several layers' rebuilt activations are then alive together and the
train step's temporaries grow per layer by about a whole layer's residuals, as
if there were no remat (a tiny Qwen3 on 4 CPU devices: 8.5 MiB per layer with
and without remat; a 4-layer Qwen3-4B on 8 H200s: 10.2 GiB per layer, for the
0.23 GiB a remat plan counts). Under `lax.scan` the backward pass is a loop too,
and each of its iterations rebuilds one layer (one group of layers) only, so
what stays alive is what the memory plan counts: one input per layer, one
layer's working set.

The params stay per layer (the public tree, HF loading, checkpoints, LoRA and
the sharding rules are unchanged); the scan runs over a stacked view built in
the forward pass: one [L, ...] copy of the layers' params per device, in the
compute dtype, which `train.memory` counts. Layers that differ (Qwen3.5's three
Gated DeltaNet layers and one attention layer) are scanned as groups of the
layer pattern's period: group g holds layers g p, ..., g p + p - 1, each under
its own `jax.checkpoint`.

Under a mesh in context (`jax.sharding.use_abstract_mesh`, as the train step sets
it) each layer gathers its weights over `fsdp` inside its checkpoint and keeps
the batch split (`sharding.gather_for_use`); without that XLA's partitioner
gathered the batch instead (Qwen3-4B compiled for 8 H200s: 42.3 GiB of temporaries per
device, 19.8 with it).

Example:
    >>> x = scan_layers(model.layers, x, cos, sin, mask, query_block=qb, policy=policy)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl_jax.models import sharding


def period(layers) -> int:
    """The smallest p dividing L with layer i built as layer i mod p (at most L).

    Layers are alike when their `nnx.GraphDef`s are equal (same module structure,
    same static fields, e.g. Qwen3.5's layer type, same LoRA targets).
    """
    graphdefs = [nnx.split(layer)[0] for layer in layers]
    n = len(graphdefs)
    return next(
        p for p in range(1, n + 1)
        if n % p == 0 and all(graphdefs[i] == graphdefs[i % p] for i in range(p, n))
    )  # fmt: skip


def apply_layer(graphdef, query_block: int, state, x, *args):
    """One layer's forward: (hidden states, its cache output).

    Under a mesh in context its weights are gathered over `fsdp` here and the batch
    stays split (`sharding.gather_for_use`); inside a checkpoint, the backward pass
    then gathers them again rather than keeping them (FSDP). No-op without one.
    """
    state = sharding.gather_for_use(state)
    return nnx.merge(graphdef, state)(sharding.batch_split(x), *args, query_block=query_block)


def _layer(graphdef, query_block: int, state, x, *args):
    """One layer's output hidden states (its cache output, unused in training, dropped)."""
    return apply_layer(graphdef, query_block, state, x, *args)[0]


def scan_layers(layers, x, *args, query_block: int, policy):
    """`x` through every layer, in order, as one `lax.scan` over groups of a period.

    Args:
        layers: the decoder's layers (an `nnx.List` of blocks).
        x: hidden states [B, T, hidden].
        *args: the blocks' other positional inputs, the same for every layer
            (rotary tables, masks; no cache).
        query_block: queries per attention block.
        policy: the `jax.checkpoint` policy of each layer.

    Returns:
        The last layer's output [B, T, hidden]. Layers with no shorter period are
        one group, scanned once (a Python loop of checkpointed layers).
    """
    p = period(layers)
    states = [nnx.split(layer)[1] for layer in layers]
    stacked = [jax.tree.map(lambda *xs: jnp.stack(xs), *states[j::p]) for j in range(p)]
    calls = [
        jax.checkpoint(
            functools.partial(_layer, nnx.split(layers[j])[0], query_block), policy=policy
        )
        for j in range(p)
    ]

    def group(x, group_states):
        for call, state in zip(calls, group_states, strict=True):
            x = call(state, x, *args)
        return sharding.batch_split(x), None

    x, _ = jax.lax.scan(group, x, stacked)
    return x
