"""README sections written by the commands that measure them.

A generated section sits between `<!-- name:begin -->` and `<!-- name:end -->`;
the command rewrites what lies between and nothing else.

Example:
    >>> replace_between_markers("a <!-- x:begin -->old<!-- x:end --> b", "x", "new")
    'a <!-- x:begin -->\\nnew\\n<!-- x:end --> b'
"""

from __future__ import annotations


def replace_between_markers(text: str, name: str, body: str) -> str:
    """Replaces the text between `<!-- name:begin -->` and `<!-- name:end -->`.

    Raises ValueError when either marker is missing.
    """
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        raise ValueError(f"markers {begin} / {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write_section(path: str, name: str, body: str) -> None:
    """Rewrites section `name` of the file at `path` in place (markers must exist)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = replace_between_markers(text, name, body)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
