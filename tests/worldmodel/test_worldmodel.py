"""World-model prompts, answer parsing and the score-bin readout."""

import ast
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wmrl_jax.worldmodel import (
    FAILURE_STATUSES,
    AnchorExample,
    combine,
    failure_counts,
    mask_file_names,
    parse_wm_answer,
    render_wm_prompt,
    score_bin_readout,
    to_arrays,
)
from wmrl_jax.worldmodel.readout import bin_centres

GOLDEN = pathlib.Path(__file__).parent / "golden"


def _golden_messages():
    return render_wm_prompt(
        description="Predict the species of iris flowers. Metric: log-loss (lower is better).",
        data_report="train.csv: 120 rows x 5 columns; classes: 40/40/40.",
        program=(
            "import pandas as pd\ndf = pd.read_csv('public/train.csv')\n"
            'df.to_csv("output/submission.csv")\n'
        ),
        anchors=[
            AnchorExample("print('hello')\nopen('x.csv')", True, 0.4213),
            AnchorExample("raise SystemExit(1)", False, 0.0),
        ],
    )


def test_prompt_matches_golden():
    text = "".join(f"<<{m['role']}>>\n{m['content']}\n" for m in _golden_messages())
    assert text == (GOLDEN / "prompt.txt").read_text()


@pytest.mark.parametrize(
    "source, expected",
    [
        ("pd.read_csv('public/train.csv')", "pd.read_csv('<file>')"),
        ('np.save("feats.NPY", x)', 'np.save("<file>", x)'),
        ("open('/etc/passwd')", "open('<file>')"),
        ("print('hello world')", "print('hello world')"),  # Not a file name.
        ("x = 'a.b'", "x = 'a.b'"),  # Unknown extension.
    ],
)
def test_mask_file_names(source, expected):
    assert mask_file_names(source) == expected


def test_long_inputs_are_truncated_with_a_note():
    messages = render_wm_prompt(
        description="d" * 50, program="x" * 100, max_program_chars=10, max_context_chars=20
    )
    user = messages[1]["content"]
    assert "x" * 11 not in user and "[90 characters truncated]" in user
    assert "[30 characters truncated]" in user


@pytest.mark.parametrize(
    "text, status, mean",
    [
        ('ok {"valid_probability": 0.5, "percentile": 0.8}', "ok", 0.4),
        ("no json at all", "no_json", math.nan),
        ('{"valid_probability": 0.9, "percentile": 0.', "truncated", math.nan),
        ('{"confidence": 0.9}', "missing_keys", math.nan),
        ('{"valid_probability": NaN, "percentile": 0.5}', "bad_value", math.nan),
        ('{"valid_probability": 1, "percentile": Infinity}', "bad_value", math.nan),
        ('{"valid_probability": "high", "percentile": 0.5}', "bad_value", math.nan),
        ('{"valid_probability": true, "percentile": 0.5}', "bad_value", math.nan),
        # Several objects: the last one holding the keys wins.
        (
            'draft {"valid_probability": 1, "percentile": 0.1} then '
            '{"valid_probability": 1, "percentile": 0.9} {"note": "done"}',
            "ok",
            0.9,
        ),
        # Braces inside strings and nesting.
        (
            '{"why": "a {weird} }", "answer": {"valid_probability": 1, "percentile": 0.3}}',
            "ok",
            0.3,
        ),
        ('{"valid_probability": "1", "percentile": "70%"}', "ok", 0.7),
    ],
)
def test_hostile_answers(text, status, mean):
    prediction = parse_wm_answer(text)
    assert prediction.status == status
    if status == "ok":
        assert prediction.usable
        assert prediction.mean == pytest.approx(mean)
    else:
        assert not prediction.usable
        assert math.isnan(prediction.mean) and prediction.variance == math.inf


def test_out_of_range_numbers_are_clamped():
    p = parse_wm_answer('{"valid_probability": 1.7, "percentile": -3}')
    assert p.usable and p.clamped
    assert (p.valid_probability, p.percentile, p.mean) == (1.0, 0.0, 0.0)


def test_mixture_mean_and_variance_against_sampling():
    p = parse_wm_answer('{"valid_probability": 0.7, "percentile": 0.6}', invalid_reward=-0.25)
    rng = np.random.default_rng(0)
    draws = np.where(rng.random(400_000) < 0.7, 0.6, -0.25)
    assert p.mean == pytest.approx(draws.mean(), abs=2e-3)
    assert p.variance == pytest.approx(draws.var(), rel=1e-2)


def test_combine_law_of_total_variance():
    texts = [
        '{"valid_probability": 0.5, "percentile": 0.2}',
        "garbage",
        '{"valid_probability": 1.0, "percentile": 0.8}',
    ]
    preds = [parse_wm_answer(t) for t in texts]
    combined = combine(preds)
    usable = [p for p in preds if p.usable]
    means = np.array([p.mean for p in usable])
    expected = np.mean([p.variance for p in usable]) + np.var(means, ddof=1)
    assert combined.samples == 3 and combined.usable
    assert combined.mean == pytest.approx(means.mean())
    assert combined.variance == pytest.approx(expected)
    assert not combine([parse_wm_answer("x"), parse_wm_answer("y")]).usable
    with pytest.raises(ValueError):
        combine([])


def test_to_arrays_feeds_the_correction():
    from wmrl_jax.core.correction import make_reward_correction

    preds = [parse_wm_answer('{"valid_probability": 1, "percentile": 0.6}'), parse_wm_answer("?")]
    mean, var = to_arrays(preds)
    assert mean.dtype == np.float32 and np.isnan(mean[1]) and var[1] == np.inf
    c = make_reward_correction(min_anchors=1)
    rewards, _, diag = c.update(
        c.init(), mean, var, np.array([0.5, np.nan]), np.array([True, False])
    )
    assert np.isfinite(np.asarray(rewards)).all() and float(diag["n_unusable"]) == 1


def _numpy_readout(logits, ids, values):
    z = np.exp(logits - logits.max())
    mass = z[ids].sum() / z.sum()
    p = z[ids] / z[ids].sum()
    mean = (p * values).sum()
    return mean, (p * (values - mean) ** 2).sum(), mass


@pytest.mark.parametrize("jit", [False, True])
def test_score_bin_readout_matches_numpy(jit):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 50)).astype(np.float32) * 3
    ids = np.array([40, 41, 42, 43, 44, 45, 46, 47, 48, 49])
    values = np.asarray(bin_centres(10))
    fn = jax.vmap(
        lambda lg: score_bin_readout(lg, jnp.asarray(ids), jnp.asarray(values), min_mass=0)
    )
    fn = jax.jit(fn) if jit else fn
    mean, var, mass = fn(jnp.asarray(logits))
    for i in range(5):
        ref = _numpy_readout(logits[i].astype(np.float64), ids, values)
        np.testing.assert_allclose([mean[i], var[i], mass[i]], ref, rtol=1e-5, atol=1e-7)


def test_readout_low_mass_is_unusable_and_bf16_is_fine():
    logits = jnp.zeros(100).at[0].set(20.0).astype(jnp.bfloat16)
    mean, var, mass = score_bin_readout(logits, jnp.array([5, 6]), jnp.array([0.0, 1.0]))
    assert float(mass) < 0.05 and float(var) == math.inf and float(mean) == pytest.approx(0.5)


def test_readout_errors():
    with pytest.raises(ValueError, match="shape \\[V\\]"):
        score_bin_readout(jnp.zeros((2, 3)), jnp.array([0]), jnp.array([0.5]))
    with pytest.raises(ValueError, match="\\[B\\]"):
        score_bin_readout(jnp.zeros(3), jnp.array([0, 1]), jnp.array([0.5]))
    with pytest.raises(ValueError, match="integer"):
        score_bin_readout(jnp.zeros(3), jnp.array([0.0]), jnp.array([0.5]))
    with pytest.raises(ValueError):
        bin_centres(0)


# ---- hostile answers: never a crash, linear work -----------------------------------------

ANSWER = '{"valid_probability": 1, "percentile": 0.25}'


def _repeat_to_1mib(span: str) -> str:
    return " ".join([span] * ((1 << 20) // (len(span) + 1)))


@pytest.mark.parametrize(
    "text, status",
    [
        ('{"valid_probability": 1' + "0" * 400 + ', "percentile": 0.5}', "bad_value"),
        ('{"valid_probability": 1, "percentile": ' + "9" * 5000 + "}", "bad_value"),
        ('{"valid_probability": "1' + "0" * 400 + '", "percentile": 0.5}', "bad_value"),
        ('{"valid_probability": 1e400, "percentile": 0.5}', "bad_value"),
        ("[" * 100_000 + "]" * 100_000, "no_json"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "missing_keys"),
        ("{" * (1 << 20), "truncated"),  # ends inside an object
        ("{" * (1 << 20) + ANSWER, "ok"),
        ('{"a": ' * 50_000 + ANSWER + "}" * 50_000, "ok"),  # the nested answer is still found
        ('{"valid_probability": 1, "percentile": 0.5, "why": {"a": [1, {"b": 2}]}}', "ok"),
        ('{"valid_probability": 1, "percentile": 0.5, "note": "}"}', "ok"),
        ("\0\ud800" + '"' * 1000 + "{}" * 1000, "missing_keys"),
        # The relaxed syntax: spans of thousands of pairs, a megabyte of them.
        (
            _repeat_to_1mib("{" + ",".join(f"k{i}: {i}%" for i in range(5000)) + ",}"),
            "missing_keys",
        ),
        (
            _repeat_to_1mib("{" + ",".join(f"'k{i}': 'v\\n'" for i in range(4000)) + "}"),
            "missing_keys",
        ),
        ("{'valid_probability': '" + "x" * (1 << 20), "truncated"),
        ("{'a': 1" + ", 'b" * 100_000 + "}", "no_json"),
    ],
    ids=[
        "400-digit-int",
        "5000-digit-int",
        "400-digit-string",
        "float-overflow",
        "deep-list",
        "deep-object",
        "1MiB-of-braces",
        "braces-then-answer",
        "answer-nested-deep",
        "answer-with-nested-values",
        "brace-inside-a-string",
        "odd-characters",
        "1MiB-of-bare-key-pairs",
        "1MiB-of-escaped-strings",
        "unterminated-single-quote",
        "unterminated-keys",
    ],
)
def test_adversarial_answers_are_unusable_not_crashes(text, status):
    prediction = parse_wm_answer(text)
    assert prediction.status == status
    assert prediction.usable == (status == "ok")


def test_parsing_work_is_linear_in_the_text(monkeypatch):
    """The characters handed to the JSON decoder, summed over every attempt, stay within
    a constant times the text's length (the old search re-decoded from every brace)."""
    from wmrl_jax.worldmodel import parsing

    decoded = []

    class CountingDecoder:
        def raw_decode(self, doc, idx=0):
            decoded.append(len(doc) - idx)
            return parsing.json.JSONDecoder().raw_decode(doc, idx)

    monkeypatch.setattr(parsing, "_DECODER", CountingDecoder())
    bound_extra = parsing.MAX_TAIL_STARTS * parsing.MAX_OBJECT_CHARS
    for text in ("{" * (1 << 17), '{"a": ' * 20_000, "{}" * (1 << 16), "x{" * (1 << 16)):
        decoded.clear()
        parse_wm_answer(text)
        assert sum(decoded) <= 2 * len(text) + bound_extra, (text[:20], sum(decoded))


# ---- golden answers, tolerated syntax, per-cause counts ----------------------------------

GOLDEN_ANSWERS = json.loads((GOLDEN / "answers.json").read_text())


@pytest.mark.parametrize("case", GOLDEN_ANSWERS, ids=[c["note"] for c in GOLDEN_ANSWERS])
def test_golden_answers(case):
    """Answers as chat models write them, with values read by hand."""
    p = parse_wm_answer(case["text"], invalid_reward=-0.5)
    assert p.status == case["status"]
    assert p.clamped == case["clamped"]
    if case["status"] == "ok":
        vp, q = case["valid_probability"], case["percentile"]
        assert (p.valid_probability, p.percentile) == pytest.approx((vp, q), abs=1e-12)
        assert p.mean == pytest.approx(vp * q + (1 - vp) * -0.5, abs=1e-12)
    else:
        assert math.isnan(p.mean) and p.variance == math.inf


def test_golden_answers_cover_every_failure_cause():
    assert {c["status"] for c in GOLDEN_ANSWERS} == {"ok", *FAILURE_STATUSES}


def test_failure_counts_over_a_batch():
    preds = [parse_wm_answer(c["text"]) for c in GOLDEN_ANSWERS]
    expected = {s: sum(c["status"] == s for c in GOLDEN_ANSWERS) for s in FAILURE_STATUSES}
    assert failure_counts(preds) == expected
    assert list(failure_counts([])) == list(FAILURE_STATUSES)
    assert set(failure_counts([])).isdisjoint({"ok"}) and sum(failure_counts([]).values()) == 0
    # Combined predictions keep the cause of their last answer when none is usable.
    both = combine([parse_wm_answer("no idea"), parse_wm_answer('{"percentile": 0.')])
    assert failure_counts([both]) == {**dict.fromkeys(FAILURE_STATUSES, 0), "truncated": 1}


_printable = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="{}"),
    max_size=12,
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    _printable,
)


@settings(max_examples=300, deadline=None)
@given(
    extra=st.dictionaries(_printable, _scalars, max_size=4),
    p=st.floats(0, 1),
    q=st.floats(0, 1),
    trailing_comma=st.booleans(),
)
def test_python_style_objects_read_as_python_reads_them(extra, p, q, trailing_comma):
    """A dict written the way Python prints it (single quotes, True / None, maybe a
    trailing comma) reads as `ast.literal_eval` reads it: the independent reference."""
    answer = {k: v for k, v in extra.items() if k not in ("valid_probability", "percentile")}
    answer.update(valid_probability=p, percentile=q)
    text = repr(answer)
    if trailing_comma:
        text = text[:-1] + ",}"
    reference = ast.literal_eval(text)
    parsed = parse_wm_answer(f"My estimate: {text} (done)")
    assert parsed.status == "ok"
    assert parsed.valid_probability == reference["valid_probability"]
    assert parsed.percentile == reference["percentile"]
