"""Rotary position embeddings: their parameters, read from either `config.json` form,
and their frequencies (default RoPE and YaRN).

Shared by the dense (`config`) and hybrid (`qwen3_5_config`) configurations, so neither
imports the other for it.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters, normalised from either config form.

    Attributes:
        theta: base wavelength.
        rope_type: "default" or "yarn".
        factor: YaRN context extension factor.
        original_max_position_embeddings: pre-training context length (YaRN).
        beta_fast: YaRN extrapolation boundary (in rotations).
        beta_slow: YaRN interpolation boundary (in rotations).
        attention_factor: YaRN cos/sin scale; None derives it from `factor`.
        truncate: whether YaRN rounds the correction range to whole dims.
    """

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True


def rope_from_dict(raw: Mapping[str, Any]) -> RopeConfig:
    """Reads `rope_parameters` (new form) or `rope_theta` + `rope_scaling` (legacy form)."""
    params = raw.get("rope_parameters")
    if params is not None and "rope_theta" not in params and raw.get("rope_theta") is None:
        raise ValueError("rope_parameters has no rope_theta")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    params = dict(params)
    params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'yarn'")
    if rope_type == "default":
        return RopeConfig(theta=float(params["rope_theta"]))
    original = params.get("original_max_position_embeddings")
    if original is None:
        original = raw.get("original_max_position_embeddings", raw.get("max_position_embeddings"))
    factor = params.get("factor")
    if factor is None:
        factor = raw["max_position_embeddings"] / original
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None and mscale and mscale_all_dim:
        attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return RopeConfig(
        theta=float(params["rope_theta"]),
        rope_type="yarn",
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=None if attention_factor is None else float(attention_factor),
        truncate=bool(params.get("truncate", True)),
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies and cos/sin scale of the rotary embedding.

    YaRN (Peng et al., 2023, arXiv:2309.00071) blends interpolated and
    extrapolated frequencies with a linear ramp over the dims between the
    correction bounds, and scales cos/sin by `0.1 ln(factor) + 1`.

    Args:
        rope: rotary parameters.
        head_dim: size of one attention head.

    Returns:
        `(inv_freq, scale)`: float32 array of shape [head_dim // 2] and a float.
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    pos_freqs = np.float32(rope.theta) ** exponents
    inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    factor = rope.factor
    scale = rope.attention_factor if rope.attention_factor is not None else _yarn_mscale(factor)
    original = rope.original_max_position_embeddings

    def correction_dim(rotations):
        return (
            head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
    inv_freq = interpolation * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq.astype(np.float32), float(scale)
