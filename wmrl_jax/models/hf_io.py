"""Hugging Face checkpoint directories in and out: config.json + (sharded) safetensors.

Reading places each tensor straight into its target sharding: every device copies
only its own slice out of the memory-mapped file, so the whole model is never
materialised on one device (or in host memory). Writing produces the same tensor
names, dtypes, shapes and file split as the checkpoint that was read, so a saved
policy loads in any HF-compatible server; an unchanged model round-trips bit-exact.
"""

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, Sharding

from wmrl_jax.models import qwen3_5_io, safetensors_io
from wmrl_jax.models.config import Qwen3Config, config_from_dict
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config
from wmrl_jax.models.sharding import param_shardings

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
)


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """Where and how each tensor was stored, so that saving reproduces it.

    Attributes:
        files: tensor name -> file name.
        dtypes: tensor name -> safetensors dtype string ("F32", "BF16", ...).
        sharded: whether the checkpoint had an index file.
        metadata: file name -> safetensors `__metadata__`.
    """

    files: Mapping[str, str]
    dtypes: Mapping[str, str]
    sharded: bool
    metadata: Mapping[str, Mapping[str, str] | None]


def tensor_map(config: Qwen3Config | Qwen3_5Config) -> dict[str, tuple[tuple, bool]]:
    """HF tensor name -> (path in the params pure dict, transposed?)."""
    if isinstance(config, Qwen3_5Config):
        return qwen3_5_io.tensor_map(config)
    out = {"model.embed_tokens.weight": (("embed_tokens",), False)}
    out["model.norm.weight"] = (("norm", "weight"), False)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head",), True)
    linears = [f"self_attn.{n}_proj" for n in "qkvo"] + [
        f"mlp.{n}_proj" for n in ("gate", "up", "down")
    ]
    norms = ["input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"]
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for name in linears:
            path = ("layers", i, *name.split("."))
            out[prefix + name + ".weight"] = ((*path, "kernel"), True)
            if config.attention_bias and name.startswith("self_attn"):
                out[prefix + name + ".bias"] = ((*path, "bias"), False)
        for name in norms:
            out[prefix + name + ".weight"] = (("layers", i, *name.split("."), "weight"), False)
    return out


def load_config(path: str | os.PathLike) -> tuple[dict, Qwen3Config | Qwen3_5Config]:
    """The raw `config.json` dictionary and the typed config of a checkpoint directory."""
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no config.json in checkpoint directory {path!r}")
    with open(file, encoding="utf-8") as f:
        raw = json.load(f)
    return raw, config_from_dict(raw)


def _open_checkpoint(path) -> tuple[dict[str, np.ndarray], CheckpointLayout]:
    index_file, single_file = os.path.join(path, INDEX_FILE), os.path.join(path, SINGLE_FILE)
    if os.path.isfile(index_file):
        with open(index_file, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
        sharded = True
    elif os.path.isfile(single_file):
        names, weight_map, sharded = [SINGLE_FILE], None, False
    else:
        raise FileNotFoundError(
            f"no {SINGLE_FILE} or {INDEX_FILE} in checkpoint directory {path!r}"
        )
    tensors, files, dtypes, metadata = {}, {}, {}, {}
    for name in names:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"checkpoint shard {name!r} listed in {INDEX_FILE} is missing")
        header, _ = safetensors_io.read_header(file)
        metadata[name] = header.pop("__metadata__", None)
        for tensor, info in header.items():
            files[tensor], dtypes[tensor] = name, info["dtype"]
        tensors.update(safetensors_io.open_tensors(file))
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ValueError(
                f"tensors listed in {INDEX_FILE} but absent from shards: {missing[:5]}"
            )
    return tensors, CheckpointLayout(files, dtypes, sharded, metadata)


def _place(view: np.ndarray, transpose: bool, dtype, sharding: Sharding | None) -> jax.Array:
    """Copies `view` (optionally transposed) to devices, each device reading only its slice."""
    source = view.T if transpose else view
    if sharding is None:
        return jnp.asarray(np.asarray(source).astype(dtype))
    return jax.make_array_from_callback(
        source.shape, sharding, lambda index: np.asarray(source[index]).astype(dtype)
    )


def load_params(
    path: str | os.PathLike,
    config: Qwen3Config | Qwen3_5Config,
    *,
    dtype=jnp.float32,
    mesh: Mesh | None = None,
    shardings=None,
) -> tuple[dict, CheckpointLayout]:
    """Reads the safetensors of a checkpoint into a params pure dict.

    Args:
        path: checkpoint directory.
        config: its typed config.
        dtype: parameter dtype (e.g. float32 or bfloat16).
        mesh: optional (data, fsdp, tensor) mesh; params are placed with the
            rules of `wmrl_jax.models.sharding`.
        shardings: optional pytree of `Sharding`s with the params' structure;
            overrides `mesh`.

    Returns:
        (params as a nested dict of arrays, the `CheckpointLayout` read).

    Raises:
        FileNotFoundError: missing weights or shard.
        ValueError: a missing tensor, a tensor whose shape does not match the config,
            or (Qwen3.5) a tensor that is neither mapped nor under a skipped prefix.
    """
    tensors, layout = _open_checkpoint(path)
    mapping = tensor_map(config)
    if isinstance(config, Qwen3_5Config):
        _check_unmapped(path, set(tensors) - set(mapping))
    expected = expected_shapes(config)
    if shardings is None and mesh is not None:
        shapes = _nest({p: jax.ShapeDtypeStruct(s, dtype) for p, s in expected.items()})
        shardings = param_shardings(shapes, mesh)
    flat = {}
    for name, (p, transpose) in mapping.items():
        if name not in tensors:
            raise ValueError(f"checkpoint {path!r} has no tensor {name!r}")
        view = tensors[name]
        shape = view.shape[::-1] if transpose else view.shape
        if tuple(shape) != expected[p]:
            want = expected[p][::-1] if transpose else expected[p]
            raise ValueError(
                f"tensor {name!r} has shape {tuple(view.shape)}, config expects {tuple(want)}"
            )
        sharding = None if shardings is None else _get(shardings, p)
        flat[p] = _place(view, transpose, dtype, sharding)
    return _nest(flat), layout


def _check_unmapped(path, names: set[str]) -> None:
    """Logs the skipped non-language tensors; raises on any other unmapped one."""
    unknown = sorted(n for n in names if not n.startswith(qwen3_5_io.SKIPPED_PREFIXES))
    if unknown:
        raise ValueError(
            f"checkpoint {str(path)!r} has tensors this model does not map: {unknown[:5]}"
            f"{' ...' if len(unknown) > 5 else ''} ({len(unknown)} in all)"
        )
    counts = {p: sum(n.startswith(p) for n in names) for p in qwen3_5_io.SKIPPED_PREFIXES}
    if names:
        skipped = ", ".join(f"{p}* ({n})" for p, n in counts.items() if n)
        log.info("%s: language model loaded; skipped %d tensors: %s", path, len(names), skipped)


def expected_shapes(config: Qwen3Config | Qwen3_5Config) -> dict[tuple, tuple[int, ...]]:
    """Pure-dict path -> shape of every parameter ([in, out] for kernels)."""
    if isinstance(config, Qwen3_5Config):
        return qwen3_5_io.expected_shapes(config)
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = {("embed_tokens",): (c.vocab_size, c.hidden_size), ("norm", "weight"): (c.hidden_size,)}
    if not c.tie_word_embeddings:
        out[("lm_head",)] = (c.hidden_size, c.vocab_size)
    for i in range(c.num_hidden_layers):
        a, m = ("layers", i, "self_attn"), ("layers", i, "mlp")
        out.update(
            {
                (*a, "q_proj", "kernel"): (c.hidden_size, q),
                (*a, "k_proj", "kernel"): (c.hidden_size, kv),
                (*a, "v_proj", "kernel"): (c.hidden_size, kv),
                (*a, "o_proj", "kernel"): (q, c.hidden_size),
                (*a, "q_norm", "weight"): (c.head_dim,),
                (*a, "k_norm", "weight"): (c.head_dim,),
                (*m, "gate_proj", "kernel"): (c.hidden_size, c.intermediate_size),
                (*m, "up_proj", "kernel"): (c.hidden_size, c.intermediate_size),
                (*m, "down_proj", "kernel"): (c.intermediate_size, c.hidden_size),
                ("layers", i, "input_layernorm", "weight"): (c.hidden_size,),
                ("layers", i, "post_attention_layernorm", "weight"): (c.hidden_size,),
            }
        )
        if c.attention_bias:
            for n, size in (("q", q), ("k", kv), ("v", kv), ("o", c.hidden_size)):
                out[(*a, f"{n}_proj", "bias")] = (size,)
    return out


def save_checkpoint(
    path: str | os.PathLike,
    params: Mapping,
    config: Qwen3Config | Qwen3_5Config,
    raw_config: Mapping,
    layout: CheckpointLayout | None = None,
    *,
    source_dir: str | os.PathLike | None = None,
) -> None:
    """Writes params as a Hugging Face checkpoint directory.

    Args:
        path: output directory (created).
        params: params pure dict (arrays may be sharded; gathered per tensor).
        config: typed config.
        raw_config: the `config.json` dictionary to write back verbatim.
        layout: file split and dtypes to reproduce; None writes one
            `model.safetensors` in the params' dtypes.
        source_dir: optional directory whose tokenizer files are copied along, and
            whose tensors in `layout` that the model does not hold (a vision tower,
            an MTP head) are copied through unchanged.
    """
    os.makedirs(path, exist_ok=True)
    by_file: dict[str, dict[str, np.ndarray]] = {}
    mapping = tensor_map(config)
    if source_dir is not None and isinstance(config, Qwen3_5Config):
        # Without a layout (a policy rebuilt from params), the source still has them.
        files = layout.files if layout is not None else _open_checkpoint(source_dir)[1].files
        skipped = qwen3_5_io.SKIPPED_PREFIXES
        carried = sorted(n for n in set(files) - set(mapping) if n.startswith(skipped))
        if carried:
            source, _ = _open_checkpoint(source_dir)
            for name in carried:  # copied out of the memory map: path may be source_dir
                file = files[name] if layout is not None else SINGLE_FILE
                by_file.setdefault(file, {})[name] = np.array(source[name])
    for name, (p, transpose) in mapping.items():
        value = np.asarray(jax.device_get(_get(params, p)))
        if transpose:
            value = value.T
        if layout is not None and name in layout.dtypes:
            value = value.astype(safetensors_io.DTYPES[layout.dtypes[name]])
        file = layout.files.get(name, SINGLE_FILE) if layout is not None else SINGLE_FILE
        by_file.setdefault(file, {})[name] = value
    total = 0
    for file, tensors in by_file.items():
        meta = None if layout is None else layout.metadata.get(file)
        total += safetensors_io.write_tensors(
            os.path.join(path, file), tensors, meta if meta is not None else {"format": "pt"}
        )
    if layout is not None and layout.sharded:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {n: f for f, ts in sorted(by_file.items()) for n in sorted(ts)},
        }
        with open(os.path.join(path, INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(dict(raw_config), f, indent=2, sort_keys=True)
        f.write("\n")
    if source_dir is not None and os.path.abspath(source_dir) != os.path.abspath(path):
        for name in TOKENIZER_FILES:
            src = os.path.join(source_dir, name)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(path, name))


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _nest(flat: Mapping[tuple, object]) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out
