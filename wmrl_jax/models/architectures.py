"""Published architectures by name, for planning without a checkpoint at hand.

The language-model fields of each release's `config.json` (Qwen3 dense; Qwen3.5
hybrid, whose vision tower and MTP head the trainer does not load), built with
the same dictionary helpers the fixtures use, so `config_from_dict` reads them
as it reads a real checkpoint. Used by `--dry_run` to plan a run's memory before
the weights are copied onto the machine.

Example:
    >>> config = architectures.get("qwen3.5-9b")
    >>> config.hidden_size, config.layer_types[:4]
    (4096, ('linear_attention', 'linear_attention', 'linear_attention', 'full_attention'))
"""

from __future__ import annotations

import json
import os

from wmrl_jax.models.api import qwen3_config_dict
from wmrl_jax.models.config import Qwen3Config, config_from_dict
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config, qwen3_5_text_config_dict

_QWEN3 = dict(vocab_size=151936, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
_QWEN3_5 = dict(
    vocab_size=248320,
    num_hidden_layers=32,  # three Gated DeltaNet layers, then one gated attention, x 8
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)

KNOWN = {
    "qwen3-4b": qwen3_config_dict(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        tie_word_embeddings=True, **_QWEN3,
    ),
    "qwen3-8b": qwen3_config_dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        tie_word_embeddings=False, **_QWEN3,
    ),
    "qwen3.5-4b": qwen3_5_text_config_dict(
        hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True, **_QWEN3_5
    ),
    "qwen3.5-9b": qwen3_5_text_config_dict(
        hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False, **_QWEN3_5
    ),
}  # fmt: skip


def names() -> tuple[str, ...]:
    """The known architecture names."""
    return tuple(KNOWN)


def get(name: str) -> Qwen3Config | Qwen3_5Config:
    """The typed config of a known architecture ("qwen3-4b", "qwen3.5-9b", ...).

    Raises:
        KeyError: an unknown name (the message lists the known ones).
    """
    key = name.strip().lower().replace("_", "-")
    if key not in KNOWN:
        raise KeyError(f"unknown architecture {name!r}; known: {', '.join(KNOWN)}")
    return config_from_dict(KNOWN[key])


def resolve(source: str) -> Qwen3Config | Qwen3_5Config:
    """A known architecture's name, or a checkpoint directory (or its `config.json`).

    Only `config.json` is read; no weights are touched.

    Raises:
        ValueError: neither a known name nor a readable `config.json`.
    """
    if source.strip().lower().replace("_", "-") in KNOWN:
        return get(source)
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"{source!r} is neither a known architecture ({', '.join(KNOWN)}) nor a checkpoint "
            "directory with a config.json"
        )
    with open(path) as f:
        return config_from_dict(json.load(f))
