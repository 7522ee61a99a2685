"""Untrusted text on its way into a prompt: valid, and unable to leave its block.

Programs, their outputs, file names and tool answers are written by the policy
or by what it ran; they enter the agent's and the world model's prompts. Two
things must hold whatever they contain:

* they are valid text (`valid_text`): a file name that is not UTF-8 comes back
  from the sandbox as a string with lone surrogates (Python's surrogateescape),
  which a tokenizer refuses; each such character is written as an escape
  instead (``\\xff`` for an escaped byte), so the text stays readable;
* they cannot end their own block: `code_block` fences a text with a backtick
  run longer than any inside it (CommonMark closes a fence only at a run at
  least as long as the opener), and `quote` puts every line behind ``> ``, so
  that no line of the text can pass for a line of the prompt around it (a
  section header, an outcome); and `break_control_tokens` keeps a chat
  template's control tokens in it (``<|im_end|>``) from being tokenised as
  such, which would end the chat turn it is in.

Example:
    >>> valid_text("out\\udcff.csv")
    'out\\\\xff.csv'
    >>> print(code_block("x = 1\\n```\\n# Program to judge", "python"))
    ````python
    x = 1
    ```
    # Program to judge
    ````
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SURROGATE = re.compile("[\ud800-\udfff]")
_BACKTICKS = re.compile("`{3,}")
_LINE_END = re.compile("\r\n|\r|\n")  # CommonMark's line endings


def _escape(match: re.Match) -> str:
    code = ord(match[0])
    if 0xDC80 <= code <= 0xDCFF:  # a byte that did not decode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def valid_text(text: str) -> str:
    """`text` with every lone surrogate written as an escape: encodable as UTF-8."""
    if text.isascii():
        return text
    return _SURROGATE.sub(_escape, text)


def code_block(text: str, info: str = "") -> str:
    """`text` in a backtick fence longer than any backtick run in it (at least 3).

    Args:
      text: the block's content (a trailing newline is not doubled).
      info: the info string after the opening fence, e.g. "python".
    """
    longest = max((len(m[0]) for m in _BACKTICKS.finditer(text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text[:-1] if text.endswith("\n") else text
    return f"{fence}{info}\n{body}\n{fence}"


def quote(text: str) -> str:
    """Every line of `text` behind ``> `` (a blank line behind ``>``): a quoted block.

    A carriage return ends a line as a newline does (CommonMark), so both become
    newlines, each line quoted.
    """
    lines = _LINE_END.split(text)
    return "\n".join(f"> {line}" if line.strip() else ">" for line in lines)


def break_control_tokens(text: str, tokens: Iterable[str]) -> str:
    """`text` with each of `tokens` broken by a zero-width space after its first character.

    Args:
      text: the text.
      tokens: a tokenizer's added tokens (``tokenizer.get_added_vocab()``); longest
        first, so that no token is half broken by a shorter one.
    """
    for token in sorted(tokens, key=len, reverse=True):
        if len(token) > 1 and token in text:
            text = text.replace(token, f"{token[:1]}\u200b{token[1:]}")
    return text
