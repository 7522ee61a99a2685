"""Finding the program in a policy's answer: fences, the multi-block rule, rejections."""

from __future__ import annotations

import bisect
import colorsys
import heapq
import inspect
import json.decoder
import textwrap

import pytest

from wmrl_jax.agents import programs
from wmrl_jax.agents.programs import (
    PROGRAM_CAUSES,
    ProgramParse,
    cause_counts,
    extract_program,
    fenced_blocks,
    find_program,
)
from wmrl_jax.agents.text import agent as text_agent

# Real programs (standard-library modules, none with a fence line of their own).
CORPUS = [inspect.getsource(m) for m in (textwrap, json.decoder, colorsys, heapq, bisect)]


@pytest.mark.parametrize(
    "opener, closer",
    [
        ("```python", "```"),
        ("```py", "```"),
        ("```python3", "```"),
        ("```Python", "```"),
        ("```PY3", "```"),
        ("```python3.11", "```"),
        ("```", "```"),
        ("```   ", "```  "),
        ("~~~", "~~~"),
        ("~~~python", "~~~~"),
        ("````python", "````"),
        ("```python title=main.py", "```"),
    ],
)
def test_every_fence_gives_the_program_back(opener, closer):
    for source in CORPUS:
        text = f"Here is my solution.\n\n{opener}\n{source}{closer}\n\nIt trains a model."
        assert find_program(text) == ProgramParse(source, "ok")


def test_a_program_round_trips_bare_crlf_and_indented():
    for source in CORPUS:
        assert find_program(source) == ProgramParse(source, "ok")  # bare: the whole text
        crlf = source.replace("\n", "\r\n")
        assert find_program(f"Solution:\r\n```python\r\n{crlf}```\r\n").source == crlf
        # A fence inside a list item: its lines lose the item's indentation.
        indented = "".join(
            f"   {line}" if line.strip() else line for line in source.splitlines(True)
        )
        assert find_program(f"1. The code:\n   ```python\n{indented}   ```\n").source == source
        tabbed = "".join(f"\t{line}" if line.strip() else line for line in source.splitlines(True))
        assert find_program(f"-\n\t~~~python\n{tabbed}\t~~~\n").source == source


def test_mid_line_opener_and_inline_code():
    assert find_program("Sure, here it is: ```python\nx = 1\n```").source == "x = 1\n"
    assert find_program("Sure: ```Py3  \nx = 1\n```").source == "x = 1\n"
    # ```x``` on one line is inline code, not a fence; a bare ``` mid-line opens nothing.
    assert find_program("Use ```print(1)``` to check.").cause == "no_code"
    assert find_program("Write ``` then code").cause == "no_code"


def test_a_longer_fence_holds_shorter_ones_and_tags_are_not_closers():
    text = "````python\ns = '''\n```\n'''\nprint(s)\n````\n"
    assert find_program(text).source == "s = '''\n```\n'''\nprint(s)\n"
    # Inside a block, a fence with a tag is content (as Markdown reads it).
    assert fenced_blocks("```\na\n```py\nb\n```\n") == [("", "a\n```py\nb\n")]


def test_the_last_block_that_is_a_program_wins():
    first, second = "import os\nprint(os.sep)\n", "x = 2\nprint(x)\n"
    text = f"Draft:\n```python\n{first}```\nBetter:\n```python\n{second}```\nDone."
    assert find_program(text).source == second
    # A later block that does not parse (a shell line, broken code) is skipped.
    assert find_program(f"```python\n{first}```\nRun:\n```\npython main.py\n```").source == first
    assert find_program(f"```py\n{first}```\n```python\ndef f(:\n```").source == first
    # Blocks in other languages never count, even when they parse as Python.
    for tag, body in (("bash", "ls"), ("json", '{"a": 1}'), ("text", "print(3)")):
        assert find_program(f"```python\n{first}```\n```{tag}\n{body}\n```").source == first
        assert find_program(f"```{tag}\n{body}\n```").cause == "no_code"
    # Untagged blocks that do nothing (a CSV excerpt, a JSON object) are not programs.
    assert find_program(f"```\n{first}```\nOutput:\n```\nid,target\n1,0.5\n```").source == first
    assert find_program("```\nid, target\n1, 0.5\n```").cause == "no_code"


def test_an_unclosed_last_block_runs_to_the_end():
    assert find_program("intro\n```python\nunclosed = 1\nprint(unclosed)").source == (
        "unclosed = 1\nprint(unclosed)"
    )
    cut = find_program("```python\nx = 1\n```\n```python\nfor i in range(3):\n    print(i")
    assert cut.source == "x = 1\n"  # the cut block does not parse: the earlier one runs


@pytest.mark.parametrize(
    "text, cause, line",
    [
        ("", "empty", None),
        ("  \n\t\n", "empty", None),
        ("```python\n```", "empty", None),
        ("```python\n   \n```\n```\n\n```", "empty", None),
        ("I would train a gradient-boosted model on the features.", "no_code", None),
        ("Hello", "no_code", None),  # parses as a name, does nothing
        ("42", "no_code", None),
        ('"""A docstring and nothing else."""', "no_code", None),
        ("```bash\npip install xgboost\n```", "no_code", None),
        ("```python\nfor i in range(3) print(i)\n```", "syntax_error", 1),
        ("```python\nimport os\n  x = 1\n```", "syntax_error", 2),
        ("```\nx = 1\nprint(x\n```", "syntax_error", 2),
        ("```python\nx = '\0'\n```", "syntax_error", None),  # a null byte
        ("```python\n" + "(" * 1000 + "\n```", "syntax_error", None),  # parser limits
    ],
)
def test_non_code_is_rejected_with_its_cause(text, cause, line):
    parsed = find_program(text)
    assert parsed.cause == cause and parsed.source == "" and not parsed.ok
    assert cause in PROGRAM_CAUSES
    assert bool(parsed.detail) == (cause == "syntax_error")
    if line is not None:  # the interpreter's own message for the block
        body = fenced_blocks(text)[-1][1]
        with pytest.raises(SyntaxError) as error:
            compile(body, "<block>", "exec")
        assert parsed.detail == f"{error.value.msg} (line {line})"
        assert error.value.lineno == line


def test_programs_that_are_expressions_with_calls_count():
    assert find_program("print(1)").ok
    assert find_program("```\nmain()\n```").source == "main()\n"
    assert find_program("x = 1").ok and find_program("import os").ok


def test_extract_program_is_the_source_and_the_text_agent_uses_it():
    assert extract_program("```py\na = 1\n```") == "a = 1\n"
    assert extract_program("not a program at all") == ""
    assert text_agent.extract_program is extract_program


def test_cause_counts():
    parses = [find_program(t) for t in ("x = 1", "", "prose here", "```\nf(\n```", "words")]
    assert cause_counts(parses) == {"empty": 1, "no_code": 2, "syntax_error": 1,
                                    "no_submission": 0, "episode_error": 0}  # fmt: skip
    assert cause_counts([]) == dict.fromkeys(PROGRAM_CAUSES[1:], 0)


M = 1 << 20

ADVERSARIAL = {
    "backticks": ("`" * M, "empty"),
    "fence-lines": ("```\n" * (M // 4), "empty"),
    "tilde-lines": ("~~~\n" * (M // 4), "empty"),
    "python-openers": ("```python\n" * (M // 10), "syntax_error"),
    "mid-line-openers": ("a ```python\n" * (M // 12), "syntax_error"),
    "prose": ("word " * (M // 5), "no_code"),
    "spaces": (" " * M, "empty"),
    "indented-near-fences": ((" " * 1000 + "``\n") * 1000, "no_code"),
    "attribute-chain": ("x" + ".a" * (M // 2), "no_code"),
    "unary-chain": ("-" * M + "1", "no_code"),
    "open-parens": ("```python\n" + "[" * M, "syntax_error"),
    "unterminated-string": ('```python\nx = "' + "a" * M, "syntax_error"),
    "broken-blocks": ("```python\nx = (\n```\n" * (M // 20), "syntax_error"),
    "good-blocks": ("```python\nprint(1)\n```\n" * (M // 24), "ok"),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_megabyte_inputs_take_linear_work(name, monkeypatch):
    """Each candidate is parsed at most once: the characters handed to the parser stay
    within the text's length (fence finding is one regular-expression pass)."""
    text, cause = ADVERSARIAL[name]
    parsed_chars = []
    real_parse = programs._parse

    def counting_parse(source):
        parsed_chars.append(len(source))
        return real_parse(source)

    monkeypatch.setattr(programs, "_parse", counting_parse)
    assert find_program(text).cause == cause
    assert sum(parsed_chars) <= len(text)
