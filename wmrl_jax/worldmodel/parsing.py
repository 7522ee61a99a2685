"""Turning a world model's free-text answer into a prediction with a variance.

An answer is parsed, never trusted: the last JSON object in the text that
holds the answer keys wins (reasoning and drafts before it are ignored),
numbers are clamped to [0, 1], and anything unusable (no JSON, missing keys,
non-numeric or non-finite values, numbers too large for a float, output
truncated mid-object, nesting deeper than the decoder allows) becomes a
prediction with NaN mean and infinite variance, which the reward correction
treats as "no prediction" instead of crashing.

The search takes time linear in the text's length, whatever the text: the
candidates are (a) every brace-free `{...}` span (disjoint, found by one
regular-expression scan) and (b) the objects starting at the last
`MAX_TAIL_STARTS` opening braces, each decoded from a window of at most
`MAX_OBJECT_CHARS` characters, so that an answer object with nested values
near the end is found too.

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
import re
from collections.abc import Sequence

import numpy as np

from wmrl_jax.worldmodel.prompts import ANSWER_KEYS

STATUSES = ("ok", "no_json", "missing_keys", "bad_value")
# Integers as floats: a 5000-digit integer is then infinite (unusable), not a ValueError.
_DECODER = json.JSONDecoder(parse_int=float)
_FLAT_OBJECT = re.compile(r"\{[^{}]*\}")
# Bounds of the nested-object search (b); an answer object is a few hundred characters.
MAX_TAIL_STARTS = 64
MAX_OBJECT_CHARS = 1 << 16


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
    if not isinstance(value, int | float):
        return None
    try:
        value = float(value)  # a 400-digit integer: OverflowError
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _decode(text: str, start: int, end: int):
    """The JSON value at `text[start:end]`'s start, or None (any failure, never raised)."""
    try:
        return _DECODER.raw_decode(text[start:end])[0]
    except (ValueError, RecursionError):  # ValueError: also too many digits for an int
        return None


def _objects(text: str) -> list[tuple[int, dict]]:
    """(start, object) of the candidate JSON objects in `text` (module docstring), any order."""
    found = []
    for match in _FLAT_OBJECT.finditer(text):
        if match.end() - match.start() <= MAX_OBJECT_CHARS:
            value = _decode(text, match.start(), match.end())
            if isinstance(value, dict):
                found.append((match.start(), value))
    position = len(text)
    for _ in range(MAX_TAIL_STARTS):
        position = text.rfind("{", 0, position)
        if position == -1:
            break
        value = _decode(text, position, position + MAX_OBJECT_CHARS)
        if isinstance(value, dict):
            found.append((position, value))
    return found


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
    objects = _objects(text)
    answers = [(start, o) for start, o in objects if all(k in o for k in ANSWER_KEYS)]
    if not answers:
        return _unusable("missing_keys" if objects else "no_json", text)
    obj = max(answers, key=lambda pair: pair[0])[1]
    p, q = _number(obj[ANSWER_KEYS[0]]), _number(obj[ANSWER_KEYS[1]])
    if p is None or q is None:
        return _unusable("bad_value", text)
    clamped = not (0.0 <= p <= 1.0 and 0.0 <= q <= 1.0)
    p, q = min(max(p, 0.0), 1.0), min(max(q, 0.0), 1.0)
    mean = p * q + (1.0 - p) * invalid_reward
    variance = p * (1.0 - p) * (q - invalid_reward) ** 2
    return WMPrediction(mean, variance, p, q, "ok", clamped=clamped, raw_text=text)


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
