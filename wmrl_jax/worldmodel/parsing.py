"""Turning a world model's free-text answer into a prediction with a variance.

An answer is parsed, never trusted: the last JSON object in the text that
holds the answer keys and is not quoted (below) wins (reasoning and drafts
before it are ignored), numbers are clamped to [0, 1], and anything unusable
becomes a prediction with NaN mean and infinite variance, which the reward
correction treats as "no prediction" instead of crashing. Why an answer is
unusable is its status (`FAILURE_STATUSES`), counted over a batch by
`failure_counts`:

* "no_json": no object at all (prose only);
* "truncated": no complete answer, and the text ends inside an object (an
  opening brace after the last closing one: the token budget cut it);
* "missing_keys": objects, none with both answer keys outside a quote;
* "bad_value": the answer object's values are not numbers (text, booleans,
  NaN, infinities, numbers too large for a float).

What is tolerated, as chat models write it:

* prose, reasoning and code fences around the object;
* numbers as strings, "0.7";
* percentages with a percent sign, "70%" or 70% (= 0.70). A bare 70 is a
  number outside [0, 1]: it is clamped to 1 and the prediction is flagged
  `clamped` (reported as a count), not read as a percentage, because no
  threshold tells a percentage from an out-of-range probability;
* in objects without nested braces, Python- or JavaScript-style syntax:
  single-quoted strings, unquoted keys, a trailing comma, True / False /
  None. These are the drifts seen from small chat models; each costs one
  anchored token scan of a span that strict JSON already rejected, so the
  work stays linear.

Nothing else is guessed (no key synonyms, no "key: value" lines outside
braces): a wrong guess would feed the reward correction a number the model
did not mean.

Quotes. An object inside a fenced code block is quoted (the world model
echoing the judged program, which may print an answer-shaped JSON of its
own) and never the answer, unless the block holds nothing but one object
(its stripped body starts with ``{`` and ends with ``}``): that is the answer
written in a ```` ```json ```` fence. Fences are read as
`wmrl_jax.agents.programs` reads them: a run of three or more backticks or
tildes at a line start opens a block, a line holding only a run of the same
character at least as long closes it, a block left open runs to the end of
the text, and a backtick opener with a Python tag may end a line of prose.

The search takes time linear in the text's length, whatever the text: the
fences are found by one scan whose pattern cannot backtrack across a line, the
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

import ast
import bisect
import collections
import dataclasses
import json
import math
import re
import warnings
from collections.abc import Iterable, Sequence

import numpy as np

from wmrl_jax.worldmodel.prompts import ANSWER_KEYS

STATUSES = ("ok", "no_json", "truncated", "missing_keys", "bad_value")
FAILURE_STATUSES = STATUSES[1:]
# Integers as floats: a 5000-digit integer is then infinite (unusable), not a ValueError.
_DECODER = json.JSONDecoder(parse_int=float)
_FLAT_OBJECT = re.compile(r"\{[^{}]*\}")
# A fence line (module docstring); no quantifier crosses a line end.
_FENCE = re.compile(
    r"^[ \t]*(?P<run>`{3,}|~{3,})(?P<info>[^\n]*)$"
    r"|(?P<mid>```)(?:python|py)(?:\d[\d.]*)?[ \t]*\r?$",
    re.MULTILINE | re.IGNORECASE,
)
# Bounds of the nested-object search (b); an answer object is a few hundred characters.
MAX_TAIL_STARTS = 64
MAX_OBJECT_CHARS = 1 << 16
# Numbers and the patterns around them are deterministic: wherever a quantifier may stop
# or go on, the characters it repeats and those that may follow are disjoint, so no
# text can be split two ways and a failed match backs off one character at a time
# (linear). `\d+\.?\d*` was not: a run of n digits splits n ways, quadratic when the
# match fails after it (20,000 digits then took 50 s).
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUMBER_TEXT = re.compile(rf"\s*({_NUMBER})\s*(?:(%)\s*)?")
# One token of a lenient object, matched anchored at a position. Each alternative
# starts with a distinct character class and is deterministic (as `_NUMBER`), so
# a match costs at most the token's length.
_TOKEN = re.compile(
    rf"""\s*(?:
      (?P<dq>"(?:[^"\\\n]|\\.)*")
    | (?P<sq>'(?:[^'\\\n]|\\.)*')
    | (?P<num>{_NUMBER}(?:[ \t]*%)?)
    | (?P<word>[A-Za-z_]\w*)
    | (?P<punct>[{{}}:,])
    )""",
    re.VERBOSE,
)
_WORDS = {"true": True, "True": True, "false": False, "False": False, "null": None,
          "None": None, "NaN": math.nan, "Infinity": math.inf}  # fmt: skip


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
        match = _NUMBER_TEXT.fullmatch(value)
        if match is None:  # also "nan", "inf", "1_000", "0x1": not numbers an answer writes
            return None
        value = float(match[1]) / (100.0 if match[2] else 1.0)
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


def _lenient_value(kind: str, token: str):
    if kind == "dq":
        return json.loads(token)  # ValueError on bad escapes or control characters
    if kind == "sq":
        if "\\" not in token:
            return token[1:-1]
        # A Python string literal with escapes; an invalid one such as "\d" warns, then
        # reads as Python reads it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.literal_eval(token)
    if kind == "num":
        return token  # `_number` reads numeric strings, percent signs included
    return _WORDS.get(token, token)  # another bare word: a string, a bad value


def _lenient_object(span: str) -> dict | None:
    """A flat object in relaxed syntax (module docstring), or None.

    `span` is brace-free inside its outer braces; the grammar is
    `{ (key : value ,)* [key : value] }` with keys quoted either way or bare
    words and scalar values only.
    """
    tokens, position = [], 0
    while True:
        match = _TOKEN.match(span, position)
        if match is None or match.end() == position:
            break
        tokens.append((match.lastgroup, match[match.lastgroup]))
        position = match.end()
    if span[position:].strip() or len(tokens) < 2 or tokens[0][1] != "{" or tokens[-1][1] != "}":
        return None
    out, i, end = {}, 1, len(tokens) - 1  # tokens[end] is the closing brace
    try:
        while i < end:
            if i + 2 >= end or tokens[i + 1][1] != ":":
                return None
            (kkind, key), (vkind, value) = tokens[i], tokens[i + 2]
            if kkind in ("num", "punct") or vkind == "punct":
                return None
            out[_lenient_value(kkind, key)] = _lenient_value(vkind, value)
            i += 3
            if i < end:  # a comma, possibly the trailing one
                if tokens[i][1] != ",":
                    return None
                i += 1
    except (ValueError, SyntaxError):  # a bad escape or a control character in a string
        return None
    return out


def _objects(text: str) -> list[tuple[int, dict]]:
    """(start, object) of the candidate JSON objects in `text` (module docstring), any order."""
    found = []
    for match in _FLAT_OBJECT.finditer(text):
        if match.end() - match.start() <= MAX_OBJECT_CHARS:
            value = _decode(text, match.start(), match.end())
            if not isinstance(value, dict):
                value = _lenient_object(match[0])
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


def _quoted(text: str) -> list[tuple[int, int]]:
    """(start, end) of the bodies of the fenced blocks that quote (module docstring)."""
    bodies, opener = [], None  # opener: (fence character, run length, body start)
    for m in _FENCE.finditer(text):
        start = min(m.end() + 1, len(text))
        if opener is None:
            if m["mid"]:
                opener = ("`", 3, start)
            elif not (m["run"][0] == "`" and "`" in m["info"]):  # not inline ```x```
                opener = (m["run"][0], len(m["run"]), start)
        elif (
            m["run"]
            and m["run"][0] == opener[0]
            and len(m["run"]) >= opener[1]
            and not m["info"].strip()
        ):
            bodies.append((opener[2], m.start()))
            opener = None
    if opener is not None:
        bodies.append((opener[2], len(text)))
    quoted = []
    for start, end in bodies:
        body = text[start:end].strip()
        if not (body.startswith("{") and body.endswith("}")):
            quoted.append((start, end))
    return quoted


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
    quoted = _quoted(text)
    starts = [start for start, _ in quoted]

    def is_quoted(position: int) -> bool:
        j = bisect.bisect_right(starts, position) - 1
        return j >= 0 and position < quoted[j][1]

    answers = [
        (start, o)
        for start, o in objects
        if all(k in o for k in ANSWER_KEYS) and not is_quoted(start)
    ]
    if not answers:
        if text.rfind("{") > text.rfind("}"):
            return _unusable("truncated", text)
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


def failure_counts(predictions: Iterable[WMPrediction]) -> dict[str, int]:
    """How many of `predictions` failed for each cause; every cause is present.

    For per-cause metrics (`wm/parse_fail/<cause>`) that exist at every step.

    Example:
      >>> failure_counts([parse_wm_answer("no idea"), parse_wm_answer('{"percentile": 0.5')])
      {'no_json': 1, 'truncated': 1, 'missing_keys': 0, 'bad_value': 0}
    """
    counts = collections.Counter(p.status for p in predictions)
    return {status: counts[status] for status in FAILURE_STATUSES}


def to_arrays(predictions: Sequence[WMPrediction]) -> tuple[np.ndarray, np.ndarray]:
    """`(mean, variance)` float32 arrays of shape [N] for the reward correction."""
    mean = np.array([p.mean for p in predictions], np.float32)
    variance = np.array([p.variance for p in predictions], np.float32)
    return mean, variance
