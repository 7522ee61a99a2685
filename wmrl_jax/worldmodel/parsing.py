"""Turning a world model's free-text answer into a prediction with a variance.

An answer is parsed, never trusted: the last JSON object in the text that
holds the answer keys wins (reasoning and drafts before it are ignored),
numbers are clamped to [0, 1], and anything unusable (no JSON, missing keys,
non-numeric or non-finite values, output truncated mid-object) becomes a
prediction with NaN mean and infinite variance, which the reward correction
treats as "no prediction" instead of crashing.

The predicted reward is on the real reward's scale: with validity probability
`p`, percentile `q` and the reward of an invalid submission `f`,

    mean = p q + (1 - p) f,    variance = p (1 - p) (q - f)^2,

the mean and variance of the Bernoulli mixture the answer describes. Several
sampled answers combine by the law of total variance (`combine`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np

from wmrl_jax.worldmodel.prompts import ANSWER_KEYS

STATUSES = ("ok", "no_json", "missing_keys", "bad_value")
_DECODER = json.JSONDecoder()


@dataclasses.dataclass(frozen=True)
class WMPrediction:
    """One parsed world-model prediction.

    Attributes:
      mean: predicted reward (NaN when unusable).
      variance: its variance (inf when unusable).
      valid_probability: parsed probability of a valid submission, or NaN.
      percentile: parsed leaderboard percentile, or NaN.
      status: one of `STATUSES`; "ok" means usable.
      clamped: whether a number was outside [0, 1] and clamped.
      samples: number of answers behind this prediction (after `combine`).
      raw_text: the answer text (the last one, after `combine`).
    """

    mean: float
    variance: float
    valid_probability: float
    percentile: float
    status: str
    clamped: bool = False
    samples: int = 1
    raw_text: str = ""

    @property
    def usable(self) -> bool:
        return self.status == "ok"


def _unusable(status: str, text: str) -> WMPrediction:
    return WMPrediction(math.nan, math.inf, math.nan, math.nan, status, raw_text=text)


def _number(value) -> float | None:
    """A finite float from a JSON number or numeric string ("0.7", "70%"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        scale = 100.0 if text.endswith("%") else 1.0
        try:
            value = float(text.rstrip("%")) / scale
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _answer_objects(text: str):
    """JSON objects in `text` that hold the answer keys, last first."""
    position = text.rfind("{")
    while position != -1:
        try:
            value, _ = _DECODER.raw_decode(text, position)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and all(k in value for k in ANSWER_KEYS):
            yield value
        position = text.rfind("{", 0, position)


def parse_wm_answer(text: str, *, invalid_reward: float = 0.0) -> WMPrediction:
    """Parses one WM answer (see the module docstring).

    Args:
      text: the generated answer.
      invalid_reward: the reward of an invalid submission, on the real
        reward's scale (the environment's configured floor).

    Returns:
      A `WMPrediction`; never raises on any text.

    Example:
      >>> p = parse_wm_answer('Looks fine. {"valid_probability": 1, "percentile": 0.8}')
      >>> p.mean, p.variance, p.status
      (0.8, 0.0, 'ok')
    """
    for obj in _answer_objects(text):
        p, q = _number(obj[ANSWER_KEYS[0]]), _number(obj[ANSWER_KEYS[1]])
        if p is None or q is None:
            return _unusable("bad_value", text)
        clamped = not (0.0 <= p <= 1.0 and 0.0 <= q <= 1.0)
        p, q = min(max(p, 0.0), 1.0), min(max(q, 0.0), 1.0)
        mean = p * q + (1.0 - p) * invalid_reward
        variance = p * (1.0 - p) * (q - invalid_reward) ** 2
        return WMPrediction(mean, variance, p, q, "ok", clamped=clamped, raw_text=text)
    return _unusable("missing_keys" if _has_object(text) else "no_json", text)


def _has_object(text: str) -> bool:
    position = text.find("{")
    while position != -1:
        try:
            if isinstance(_DECODER.raw_decode(text, position)[0], dict):
                return True
        except json.JSONDecodeError:
            pass
        position = text.find("{", position + 1)
    return False


def combine(predictions: Sequence[WMPrediction]) -> WMPrediction:
    """Combines K sampled answers for one program by the law of total variance.

    mean = E_k[mean_k]; variance = E_k[variance_k] + Var_k[mean_k] (ddof=1)
    over the usable answers. With none usable, the result is unusable.

    Example:
      >>> a = parse_wm_answer('{"valid_probability": 1, "percentile": 0.6}')
      >>> b = parse_wm_answer('{"valid_probability": 1, "percentile": 0.8}')
      >>> round(combine([a, b]).mean, 6), round(combine([a, b]).variance, 6)
      (0.7, 0.02)
    """
    if not predictions:
        raise ValueError("combine needs at least one prediction")
    usable = [p for p in predictions if p.usable]
    last = predictions[-1].raw_text
    if not usable:
        return dataclasses.replace(predictions[-1], samples=len(predictions))
    means = np.array([p.mean for p in usable])
    between = float(np.var(means, ddof=1)) if len(usable) > 1 else 0.0
    return WMPrediction(
        mean=float(means.mean()),
        variance=float(np.mean([p.variance for p in usable])) + between,
        valid_probability=float(np.mean([p.valid_probability for p in usable])),
        percentile=float(np.mean([p.percentile for p in usable])),
        status="ok",
        clamped=any(p.clamped for p in usable),
        samples=len(predictions),
        raw_text=last,
    )


def to_arrays(predictions: Sequence[WMPrediction]) -> tuple[np.ndarray, np.ndarray]:
    """`(mean, variance)` float32 arrays of shape [N] for the reward correction."""
    mean = np.array([p.mean for p in predictions], np.float32)
    variance = np.array([p.variance for p in predictions], np.float32)
    return mean, variance
