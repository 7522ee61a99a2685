"""Partition rules for the decoder's params and KV cache on a (data, fsdp, tensor) mesh.

Megatron-style tensor parallelism: column-parallel q/k/v, gate and up (output dim
on `tensor`), row-parallel o and down (input dim on `tensor`); the other dim of
every matrix is sharded on `fsdp` (ZeRO-3-like gathering by XLA). Norm weights
are replicated. The batch is split over (`data`, `fsdp`). A mesh axis is dropped
from a dim it does not divide, so tiny test models still shard.
"""

from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")

# Leaf rules keyed by (module name, leaf name); None means any module.
_RULES = {
    ("q_proj", "kernel"): ("fsdp", "tensor"),
    ("k_proj", "kernel"): ("fsdp", "tensor"),
    ("v_proj", "kernel"): ("fsdp", "tensor"),
    ("q_proj", "bias"): ("tensor",),
    ("k_proj", "bias"): ("tensor",),
    ("v_proj", "bias"): ("tensor",),
    ("o_proj", "kernel"): ("tensor", "fsdp"),
    ("o_proj", "bias"): (None,),
    ("gate_proj", "kernel"): ("fsdp", "tensor"),
    ("up_proj", "kernel"): ("fsdp", "tensor"),
    ("down_proj", "kernel"): ("tensor", "fsdp"),
    (None, "embed_tokens"): ("tensor", "fsdp"),
    (None, "lm_head"): ("fsdp", "tensor"),
}


def make_mesh(
    data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence | None = None
) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all), e.g. make_mesh(2, 2, 2)."""
    devices = jax.devices() if devices is None else list(devices)
    if data * fsdp * tensor != len(devices):
        raise ValueError(f"mesh {data}x{fsdp}x{tensor} does not match {len(devices)} devices")
    return Mesh(np.asarray(devices).reshape(data, fsdp, tensor), MESH_AXES)


def _fit(spec: Sequence, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Drops mesh axes that do not divide their dim."""
    out = []
    for axes, dim in zip(spec, shape, strict=True):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        size = int(np.prod([mesh.shape[a] for a in names], dtype=np.int64))
        out.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*out)


def param_spec(path: Sequence, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Partition spec of one param given its path in the params pure dict."""
    names = [str(p) for p in path]
    rule = _RULES.get((names[-2] if len(names) > 1 else None, names[-1]))
    if rule is None:
        rule = _RULES.get((None, names[-1]), (None,) * len(shape))
    if len(rule) != len(shape):
        rule = (None,) * len(shape)
    return _fit(rule, shape, mesh)


def param_shardings(params_shapes: Mapping, mesh: Mesh):
    """NamedShardings with the structure of a params pure dict (of arrays or shape structs)."""

    def one(path, leaf):
        keys = [getattr(k, "key", getattr(k, "idx", k)) for k in path]
        return NamedSharding(mesh, param_spec(keys, leaf.shape, mesh))

    return jax.tree_util.tree_map_with_path(one, params_shapes)


def cache_spec(shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """One layer's KV cache [B, K, S, D]: batch over (data, fsdp), kv heads over tensor."""
    return _fit((BATCH, "tensor", None, None), shape, mesh)


def batch_spec(shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Token arrays [B, ...]: batch over (data, fsdp)."""
    return _fit((BATCH,) + (None,) * (len(shape) - 1), shape, mesh)
