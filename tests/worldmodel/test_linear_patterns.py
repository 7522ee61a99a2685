"""The answer parser's regular expressions cannot backtrack quadratically.

Checked on the patterns' structure, not on a clock: a pattern is *deterministic* when,
wherever a quantifier may stop or go on (or an alternation choose), the characters that
continue it and those that may follow are disjoint. Then no text is matched two ways
and a failed match backs off one character at a time, so a match attempt costs time
linear in the text. `\\d+\\.?\\d*` (the old number) is not: a run of digits splits
between `\\d+` and `\\d*` in as many ways as it is long.
"""

from __future__ import annotations

import re

import pytest

from wmrl_jax.worldmodel import parse_wm_answer, parsing

try:  # Python >= 3.11
    from re import _constants as C
    from re import _parser as sre_parse
except ImportError:  # Python 3.10
    import sre_constants as C
    import sre_parse

# Characters standing for every class the patterns name (digits, letters, e/E, space,
# quotes, escapes, the JSON punctuation, a non-ASCII letter and a non-ASCII digit).
ALPHABET = "05abcdeEx_Z \t\n\r.+-%\"'\\{}:,[]é٣"
_CATEGORIES = {
    C.CATEGORY_DIGIT: r"\d",
    C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w",
    C.CATEGORY_NOT_WORD: r"\W",
}


def _in(items) -> set[str]:
    chars, negate = set(), False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            assert chr(av) in ALPHABET, f"add {chr(av)!r} to ALPHABET"
            chars.add(chr(av))
        elif op is C.RANGE:
            chars |= {c for c in ALPHABET if av[0] <= ord(c) <= av[1]}
        elif op is C.CATEGORY:
            chars |= {c for c in ALPHABET if re.fullmatch(_CATEGORIES[av], c)}
        else:
            raise NotImplementedError(op)
    chars &= set(ALPHABET)
    return set(ALPHABET) - chars if negate else chars


def _first(seq) -> tuple[set[str], bool]:
    """(characters a match of `seq` can start with, whether it can be empty)."""
    out = set()
    for op, av in seq:
        chars, empty = _first_item(op, av)
        out |= chars
        if not empty:
            return out, False
    return out, True


def _first_item(op, av) -> tuple[set[str], bool]:
    if op is C.LITERAL:
        assert chr(av) in ALPHABET, f"add {chr(av)!r} to ALPHABET"
        return {chr(av)}, False
    if op is C.NOT_LITERAL:
        return set(ALPHABET) - {chr(av)}, False
    if op is C.ANY:
        return set(ALPHABET) - {"\n"}, False
    if op is C.IN:
        return _in(av), False
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        chars, empty = _first(av[2])
        return chars, empty or av[0] == 0
    if op is C.SUBPATTERN:
        return _first(av[-1])
    if op is C.BRANCH:
        firsts = [_first(alt) for alt in av[1]]
        return set().union(*(f for f, _ in firsts)), any(e for _, e in firsts)
    if op is C.AT:
        return set(), True
    raise NotImplementedError(op)


def _violations(seq, follow: set[str]) -> list[str]:
    """Where `seq` (followed by characters `follow`) may match one text two ways."""
    out, items = [], list(seq)
    for i, (op, av) in enumerate(items):
        rest, rest_empty = _first(items[i + 1 :])
        after = rest | (follow if rest_empty else set())
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, body = av
            chars, empty = _first(body)
            if hi != lo and (empty or chars & after):
                out.append(f"{op} {lo}..{hi} over {sorted(chars)} then {sorted(after)}")
            out += _violations(body, after | (chars if hi != lo else set()))
        elif op is C.SUBPATTERN:
            out += _violations(av[-1], after)
        elif op is C.BRANCH:
            firsts = [_first(alt) for alt in av[1]]
            for j, (a, _) in enumerate(firsts):
                for b, _ in firsts[j + 1 :]:
                    if a & b:
                        out.append(f"alternatives both start with {sorted(a & b)}")
            if sum(e for _, e in firsts) > 1:
                out.append("two alternatives match the empty string")
            for alt in av[1]:
                out += _violations(alt, after)
    return out


def violations(pattern: re.Pattern) -> list[str]:
    """`_violations` of a compiled pattern as a whole (nothing required after it)."""
    return _violations(sre_parse.parse(pattern.pattern, pattern.flags), set())


def test_the_check_finds_the_old_number_pattern():
    old = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(%?)\s*")
    found = violations(old)
    assert any("'0'" in v for v in found)  # the digit run split between \d+ and \d*
    assert any("' '" in v for v in found)  # and spaces split between the two \s*
    assert violations(re.compile(r"a*a")) and violations(re.compile(r"(?:a+b|ac)"))
    assert not violations(re.compile(r"a*b")) and not violations(re.compile(r"(?:ab|cd)e?"))


@pytest.mark.parametrize("name", ["_NUMBER_TEXT", "_TOKEN", "_FLAT_OBJECT"])
def test_parser_patterns_are_deterministic(name):
    assert violations(getattr(parsing, name)) == []


@pytest.mark.parametrize(
    "text",
    ["0", "1.", ".5", "-2.5e-3", "+7E10", "12 %", " 3%  ", "1.5.2", "..", "1e", "e5", "1 2",
     "70%%", "%", "", " ", "1_0", "0x1", "nan", "٣"],
)  # fmt: skip
def test_numbers_read_as_before(text):
    """The deterministic number pattern accepts the same strings as the old one."""
    old = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(%?)\s*")
    was, now = old.fullmatch(text), parsing._NUMBER_TEXT.fullmatch(text)
    assert (was is None) == (now is None)
    if was is not None:
        assert (was[1], bool(was[2])) == (now[1], bool(now[2]))


def test_a_long_digit_string_is_a_bad_value():
    digits = "1" * 20_000  # the old pattern took most of a minute
    answer = '{"valid_probability": "' + digits + 'x", "percentile": 0.5}'
    assert parse_wm_answer(answer).status == "bad_value"
