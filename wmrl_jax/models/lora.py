"""Low-rank adapters (LoRA) on the decoders' projections: attach, split, merge, count.

A targeted projection `Linear` (`models.qwen3`) computes y = x W + s (x A) B with
W [in, out] frozen, A [in, r] and B [r, out] trained and s = alpha / r (Hu et al.
2021, "LoRA"). The adapter is Flax's own `nnx.LoRA` module, set as the projection's
`lora` attribute, so its params are `nnx.LoRAParam` variables at
``.../<projection>/lora/lora_a`` and ``.../lora_b``; that variable type is what
`partition` splits the params by. B starts at zero, so a fresh adapter changes no
logit; A starts as `nn.Linear`'s default in PyTorch (uniform, bound 1/sqrt(in)).

Targets are projection names. Qwen3 and Qwen3.5's attention layers have q_proj,
k_proj, v_proj and o_proj (Qwen3.5's q_proj also makes the output gate), both
have the SwiGLU gate_proj, up_proj and down_proj, and Qwen3.5's Gated DeltaNet
layers have in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (the last two map the
hidden state to one value per head: beta and the decay) and out_proj. The
embedding, the LM head, norms, the depthwise conv and the per-head decay
parameters are not targetable.

Sharding (`models.sharding`): A takes its projection kernel's rule on the input
dim and B on the output dim, the rank dim is replicated; e.g. q_proj's kernel is
("fsdp", "tensor"), so A is ("fsdp", None) and B is (None, "tensor").

Example:
    >>> graphdef, params = attach(model.graphdef, model.params, rank=16, alpha=32.0,
    ...                           targets=DEFAULT_TARGETS, key=jax.random.key(0))
    >>> adapters, base = partition(params)          # train `adapters`, freeze `base`
    >>> graphdef0, merged = merge(graphdef, params)  # W + s A B, the base's graph
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl_jax.models import memory as model_memory
from wmrl_jax.models import sharding
from wmrl_jax.models.qwen3 import Linear

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
DELTA_NET = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
TARGETS = ATTENTION + MLP + DELTA_NET
# Every attention, MLP and Gated DeltaNet projection but the per-head b and a.
DEFAULT_TARGETS = ATTENTION + MLP + ("in_proj_qkv", "in_proj_z", "out_proj")


def check(*, rank: int, alpha: float, targets: Sequence[str]) -> None:
    """Raises ValueError on a LoRA config `attach` cannot use (rank 0 means off)."""
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"lora rank must be an int >= 0, got {rank!r}")
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"lora alpha must be a finite number > 0, got {alpha!r}")
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        raise ValueError(f"lora targets must be a non-empty subset of {TARGETS}, got {targets!r}")


def _targeted(module: nnx.Module, targets: Sequence[str]) -> list[tuple[tuple, Linear]]:
    return [
        (path, node)
        for path, node in nnx.iter_graph(module)
        if isinstance(node, Linear) and path and path[-1] in targets
    ]


def attach(
    graphdef, params, *, rank: int, alpha: float, targets: Sequence[str], key, mesh=None
) -> tuple[nnx.GraphDef, nnx.State]:
    """The model with a fresh adapter (B = 0) on every targeted projection.

    Args:
        graphdef, params: a split `Qwen3` or `Qwen3_5` without adapters.
        rank: r >= 1.
        alpha: the scale's numerator, s = alpha / r.
        targets: projection names (`TARGETS`); those the architecture lacks are
            skipped, but at least one must exist.
        key: PRNG key for A.
        mesh: optional mesh; the adapters are placed by `models.sharding`'s rules.

    Returns:
        (graphdef, params) of the adapted model; the base arrays are shared, not copied.
    """
    check(rank=rank, alpha=alpha, targets=targets)
    if rank < 1:
        raise ValueError("attach needs rank >= 1 (rank 0 is no adapter)")
    model = nnx.merge(graphdef, params)
    if has_adapters(params):
        raise ValueError("the model already has adapters")
    found = _targeted(model, targets)
    if not found:
        raise ValueError(f"no projection of this model is named in lora targets {targets!r}")
    rngs = nnx.Rngs(params=key)
    a_init = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
    for _, linear in found:
        d_in, d_out = linear.kernel.shape
        dtype = linear.kernel.dtype
        lora = nnx.LoRA(d_in, rank, d_out, param_dtype=dtype, a_initializer=a_init, rngs=rngs)
        lora.scale = float(alpha) / rank
        linear.lora = lora
    graphdef, params = nnx.split(model)
    if mesh is not None:
        adapters, base = partition(params)
        shardings = sharding.param_shardings(nnx.to_pure_dict(adapters), mesh)
        nnx.replace_by_pure_dict(adapters, jax.device_put(nnx.to_pure_dict(adapters), shardings))
        params = combine(adapters, base)
    return graphdef, params


def has_adapters(params) -> bool:
    """Whether an `nnx.State` of params holds any adapter (`nnx.LoRAParam`)."""
    if not isinstance(params, nnx.State):
        return False
    return bool(jax.tree_util.tree_leaves(nnx.filter_state(params, nnx.LoRAParam)))


def partition(params) -> tuple[nnx.State, nnx.State]:
    """(adapters, everything else) of an adapted model's params; no copies."""
    return nnx.split_state(params, nnx.LoRAParam, ...)


def combine(adapters, base) -> nnx.State:
    """The inverse of `partition`: the whole params state again."""
    return nnx.merge_state(base, adapters)


def base_only(params) -> nnx.State:
    """The frozen base as a model: every adapter replaced by zeros (s x A 0 = 0 exactly).

    Under jit the zeros are the adapters' size; the base arrays are the same
    buffers, so a KL reference costs no second copy of the weights.
    """
    adapters, base = partition(params)
    return combine(jax.tree_util.tree_map(jnp.zeros_like, adapters), base)


def merge(graphdef, params) -> tuple[nnx.GraphDef, nnx.State]:
    """The adapted model folded into plain projections: W + s A B (in float32, cast back).

    Returns:
        (graphdef, params) of the model without adapters (the graph `api.abstract_split`
        builds for its config), ready for `hf_io` export. `params` is not changed.
    """
    model = nnx.merge(graphdef, params)
    for _, linear in _targeted(model, TARGETS):
        if linear.lora is None:
            continue
        lora, kernel = linear.lora, linear.kernel[...]
        delta = jnp.dot(lora.lora_a[...].astype(jnp.float32), lora.lora_b[...].astype(jnp.float32))
        merged = kernel.astype(jnp.float32) + lora.scale * delta
        linear.kernel = nnx.Param(merged.astype(kernel.dtype))
        linear.lora = None
    return nnx.split(model)


def adapter_shapes(config, *, rank: int, targets: Sequence[str]) -> dict[tuple, tuple[int, ...]]:
    """Every adapter param's shape, keyed by its path (as `memory.param_shapes`)."""
    out = {}
    for path, shape in model_memory.param_shapes(config).items():
        if len(path) >= 2 and path[-1] == "kernel" and path[-2] in targets:
            d_in, d_out = shape
            out[(*path[:-1], "lora", "lora_a")] = (d_in, rank)
            out[(*path[:-1], "lora", "lora_b")] = (rank, d_out)
    return out


def adapter_elements(config, *, rank: int, targets: Sequence[str], mesh: Mapping[str, int]):
    """(all adapter elements, those one device holds) under `models.sharding`'s rules."""
    abstract = model_memory.abstract_mesh(mesh)
    shapes = adapter_shapes(config, rank=rank, targets=targets)
    total = sum(math.prod(s) for s in shapes.values())
    per_device = sum(
        model_memory.shard_elements(s, sharding.param_spec(p, s, abstract), abstract)
        for p, s in shapes.items()
    )
    return total, per_device


def adapter_activation_bytes(
    config, *, rank: int, targets: Sequence[str], tokens: int, dtype_bytes: int, remat: bool
) -> int:
    """Bytes one training sequence keeps for the adapters' backward pass: each adapted
    projection's x A, [tokens, r], in every layer (or, with per-layer remat, in the
    largest layer only, as the layer's other residuals)."""
    per_layer: dict[int, int] = {}
    for path in adapter_shapes(config, rank=rank, targets=targets):
        if path[-1] == "lora_a":
            per_layer[path[1]] = per_layer.get(path[1], 0) + tokens * rank * dtype_bytes
    if not per_layer:
        return 0
    return max(per_layer.values()) if remat else sum(per_layer.values())
