"""README and docs sections written by the commands that measure them.

A generated section sits between `<!-- name:begin -->` and `<!-- name:end -->`;
the command rewrites what lies between and nothing else. A study writes its
full section (tables, plot, every sentence) into its page under `docs/` and
its headline (the sentences that carry the answer) into the README's
`<!-- name-headline:begin -->` section.

Example:
    >>> replace_between_markers("a <!-- x:begin -->old<!-- x:end --> b", "x", "new")
    'a <!-- x:begin -->\\nnew\\n<!-- x:end --> b'
"""

from __future__ import annotations

import os

DOCS_DIR = "docs"
# Each generated section and the page under docs/ that holds it in full.
PAGES = {
    "study": "compute_study.md",
    "realsweep": "compute_study.md",  # The real sweep and the paired study: the same page.
    "paired": "compute_study.md",
    "controlled": "controlled_study.md",
    "embodied": "embodied.md",
    "board-checks": "tasks.md",
    "main-job": "main_job.md",
    "regime": "regime.md",
    "regime-controlled": "regime.md",  # The controlled study's map, beside the real one.
    "wm-probe": "wm_probe.md",
}
# The sections that also write a headline into the README.
HEADLINES = ("main-job", "study", "controlled", "embodied", "regime", "regime-controlled")


def headline_marker(name: str) -> str:
    """The README marker of section `name`'s headline, e.g. `study-headline`."""
    return f"{name}-headline"


def docs_page(readme: str, name: str) -> str:
    """The docs page of section `name` beside the README at `readme`: `<dir>/docs/<page>`."""
    return os.path.join(os.path.dirname(os.path.abspath(readme)), DOCS_DIR, PAGES[name])


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
    """Rewrites section `name` of the file at `path` in place (markers must exist).

    Raises ValueError naming the file when its markers are missing.
    """
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        text = replace_between_markers(text, name, body)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def report_paths(name: str, readme: str | None, docs: str | None) -> tuple[str | None, str | None]:
    """The README and the docs page a command writes section `name` to.

    `docs` defaults to the section's page beside `readme` (`docs_page`); with neither
    given, nothing is written. Raises ValueError naming a flag whose file is missing.
    """
    if docs is None and readme is not None:
        docs = docs_page(readme, name)
    for flag, path in (("--readme", readme), ("--docs", docs)):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{flag} {path} is not a file (section {name!r})")
    return readme, docs


def write_report(
    name: str, full: str, headline: str, *, readme: str | None, docs: str | None
) -> None:
    """Writes section `name` in full into the docs page and its headline into the README.

    Args:
      name: the section (a key of `PAGES`).
      full: the full section, written between `name`'s markers of `docs`.
      headline: written between the README's `name-headline` markers.
      readme: the README, or None for no headline.
      docs: the docs page; None: `docs_page(readme, name)` when `readme` is given.
    """
    readme, docs = report_paths(name, readme, docs)
    if docs is not None:
        write_section(docs, name, full)
    if readme is not None:
        write_section(readme, headline_marker(name), headline)
