"""Finding the program in a policy's answer, or saying why there is none.

A chat model answers with prose and code fences; what gets executed is decided
here, once, by a declared rule, so that text with no program is an `invalid`
outcome the trainer records without running anything (and charges nothing).

Fences. A fence line is three or more backticks or tildes at the start of a
line (any indentation), followed by an optional language tag: ```` ``` ````,
```` ```python ````, ```` ```Py ````, ```` ``` ```` followed by spaces, ``~~~``.
A backtick opener in the middle of a line is accepted when a Python tag ends
the line (``Here it is: ```python``). A block closes at a line holding only a
fence of the same character at least as long as its opener; a block left open
(generation cut by the token budget) runs to the end of the text. Lines of an
indented block (a fence inside a list item) lose up to the opener's
indentation (spaces or tabs), as Markdown renders them.

The rule. Blocks tagged Python (``python``, ``py``, ``python3``, ``py3``,
``python3.11``, any case) or untagged are candidates; blocks tagged with
another language (``bash``, ``json``, ``text``, ...) never are. The program is
the *last candidate that is a program*: it parses with `ast.parse` (the
grammar of the running interpreter, which is the sandbox's) and does something
(not only expressions without a call, such as a CSV excerpt ``id, target``
or a JSON object, which parse too). Without any candidate block, the whole
text is the program when it is one (a bare program), else there is none.

Causes (`PROGRAM_CAUSES`): "ok"; "empty" (blank text or only blank
candidates); "syntax_error" (a candidate block, the last non-blank one, does
not parse: its error is in `detail`); "no_code" (prose, or only candidates
that do nothing); "no_submission" (an episode of several turns that ended
without submitting, `wmrl_jax.agents.text.episodes`; `find_program` never says it);
"episode_error" (an episode the environment failed on, ended without a
program; `find_program` never says it either).

Actions. In an episode each of the agent's messages names what it asks the
environment for (`find_action`): a line holding only ``ACTION: <name>`` (any
case, optional Markdown emphasis, quotes or a list marker around it) with a
name of `ACTIONS`; the last such line counts, and every such line is removed
before the program is looked for, so that it is never executed. A message
without an action line submits its program when it holds one.

Work is linear in the text's length whatever the text (a 1 MB answer is
parsed in well under a second): fences are found by one scan with a pattern
that cannot backtrack across lines, and each candidate is parsed at most once,
from the last to the first, stopping at the first program.

Example:
    >>> find_program("Plan.\\n```Python\\nprint(1)\\n```\\nRun: `python main.py`")
    ProgramParse(source='print(1)\\n', cause='ok', detail='')
    >>> find_program("I would train a random forest.").cause
    'no_code'
"""

from __future__ import annotations

import ast
import collections
import re
from collections.abc import Iterable
from typing import NamedTuple

PROGRAM_CAUSES = ("ok", "empty", "no_code", "syntax_error", "no_submission", "episode_error")
ACTIONS = ("info", "validate", "submit")

_PYTHON_TAG = re.compile(r"(?:python|py)(?:\d[\d.]*)?", re.IGNORECASE)
# One pass over the text. First alternative: a line that starts (after indentation)
# with a fence run; `mid`: a backtick opener with a Python tag ending a line of prose.
# No quantifier crosses a line end, and none can be split two ways before a required
# part, so an attempt at a position costs at most the rest of its line.
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<run>`{3,}|~{3,})(?P<info>[^\n]*)$"
    r"|(?P<mid>```)(?P<midtag>(?:python|py)(?:\d[\d.]*)?)[ \t]*\r?$",
    re.MULTILINE | re.IGNORECASE,
)
_TAG = re.compile(r"[\w+.#-]*")
# A whole line naming an action, its line end included; no quantifier crosses a line end.
_ACTION = re.compile(
    r"^[ \t>*_#`-]*action[ \t*_`]*:[ \t*_`\"']*(?P<name>info|validate|submit)"
    r"[ \t*_`\"'.!]*\r?(?:\n|\Z)",
    re.MULTILINE | re.IGNORECASE,
)


class ProgramParse(NamedTuple):
    """What `find_program` found.

    Attributes:
      source: the program to execute; "" when there is none.
      cause: one of `PROGRAM_CAUSES`; "ok" exactly when `source` is a program.
      detail: the syntax error of a "syntax_error" (message and line), else "".
    """

    source: str
    cause: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.cause == "ok"


def _dedent(body: str, indent: int) -> str:
    """Strips up to `indent` leading spaces or tabs from every line of `body`."""
    if indent == 0:
        return body
    lines = body.split("\n")
    return "\n".join(line[min(indent, len(line) - len(line.lstrip(" \t"))) :] for line in lines)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """`(tag, body)` of every fenced block of `text`, in order (module docstring).

    Example:
        >>> fenced_blocks("a\\n~~~py\\nx = 1\\n~~~\\n```\\ny = 2")
        [('py', 'x = 1\\n'), ('', 'y = 2')]
    """
    blocks: list[tuple[str, str]] = []
    opener = None  # (fence character, run length, indentation, tag, body start)
    for m in _FENCE.finditer(text):
        start = min(m.end() + 1, len(text))  # the line after the fence
        if opener is None:
            if m["mid"]:
                opener = ("`", 3, 0, m["midtag"].lower(), start)
                continue
            info = m["info"].strip()
            if m["run"][0] == "`" and "`" in info:
                continue  # inline code such as ```x```, not a fence
            tag = _TAG.match(info)[0].lower()
            opener = (m["run"][0], len(m["run"]), len(m["indent"]), tag, start)
        elif (
            m["run"]
            and m["run"][0] == opener[0]
            and len(m["run"]) >= opener[1]
            and not m["info"].strip()
        ):
            blocks.append((opener[3], _dedent(text[opener[4] : m.start()], opener[2])))
            opener = None
    if opener is not None:  # unclosed: the generation was cut, the block runs to the end
        blocks.append((opener[3], _dedent(text[opener[4] :], opener[2])))
    return blocks


def _does_something(tree: ast.Module) -> bool:
    """Whether a parsed module has a statement other than a call-free expression."""
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr):
            return True
        if any(isinstance(node, ast.Call) for node in ast.walk(stmt.value)):
            return True
    return False


def _parse(source: str) -> tuple[ast.Module | None, str]:
    """`(tree, "")`, or `(None, why)` when `source` is not Python."""
    try:
        return ast.parse(source), ""
    except SyntaxError as e:  # IndentationError and null bytes included
        return None, f"{e.msg} (line {e.lineno})"
    except (ValueError, RecursionError, MemoryError) as e:  # nesting past the parser's limits
        return None, f"{type(e).__name__}: {e}"[:200]


def find_program(text: str) -> ProgramParse:
    """The program in a policy's answer under the rule of the module docstring.

    Args:
      text: the decoded completion.

    Returns:
      A `ProgramParse`; never raises on any text.

    Example:
        >>> find_program("```py\\nimport os\\n```\\n```bash\\npython main.py\\n```").source
        'import os\\n'
        >>> find_program("```python\\nprint(1\\n```")
        ProgramParse(source='', cause='syntax_error', detail="'(' was never closed (line 1)")
    """
    candidates = [
        body for tag, body in fenced_blocks(text) if not tag or _PYTHON_TAG.fullmatch(tag)
    ]
    if not candidates:
        if not text.strip():
            return ProgramParse("", "empty")
        tree, _ = _parse(text)
        if tree is not None and _does_something(tree):
            return ProgramParse(text, "ok")
        return ProgramParse("", "no_code")
    last_error = ""  # the syntax error of the last non-blank candidate that failed
    seen_code = False
    for body in reversed(candidates):
        if not body.strip():
            continue
        tree, why = _parse(body)
        if tree is None:
            last_error = last_error or why
        elif _does_something(tree):
            return ProgramParse(body, "ok")
        else:
            seen_code = True
    if last_error:
        return ProgramParse("", "syntax_error", last_error)
    return ProgramParse("", "no_code" if seen_code else "empty")


def extract_program(text: str) -> str:
    """`find_program(text).source`: the program, or "" when the answer has none."""
    return find_program(text).source


def cause_counts(parses: Iterable[ProgramParse]) -> dict[str, int]:
    """How many of `parses` have each cause other than "ok" (every such cause present).

    Example:
        >>> cause_counts([find_program("x = 1"), find_program("hello there")])
        {'empty': 0, 'no_code': 1, 'syntax_error': 0, 'no_submission': 0, 'episode_error': 0}
    """
    counts = collections.Counter(p.cause for p in parses)
    return {cause: counts[cause] for cause in PROGRAM_CAUSES if cause != "ok"}


class Action(NamedTuple):
    """What one message of an episode asks for (`find_action`).

    Attributes:
      name: one of `ACTIONS`, or "none" (no action line and no program).
      program: the program of the message, action lines removed (`find_program`).
      explicit: whether an action line named it (else it is implied by the program).
    """

    name: str
    program: ProgramParse
    explicit: bool


def find_action(text: str) -> Action:
    """The action of one agent message under the rule of the module docstring.

    Example:
        >>> find_action("Let me look first.\\nACTION: info").name
        'info'
        >>> a = find_action("```python\\nprint(1)\\n```\\n**Action:** validate")
        >>> a.name, a.program.source, a.explicit
        ('validate', 'print(1)\\n', True)
        >>> find_action("print(2)").name  # a program without an action line is submitted
        'submit'
    """
    matches = list(_ACTION.finditer(text))
    if matches:
        text = _ACTION.sub("", text)
    program = find_program(text)
    if matches:
        return Action(matches[-1]["name"].lower(), program, True)
    return Action("submit" if program.ok else "none", program, False)
