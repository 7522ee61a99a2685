"""Prompts that turn the backbone LLM into a world model (WM) of program outcomes.

The WM sees what the agent saw (the task description and the computed data
report), optionally a few programs of the same task that were executed for
real with their outcomes (in-context anchors), and the program to judge with
its file names masked, so that it judges what the program does rather than
which files it names. It answers with reasoning, then one JSON object:

    {"valid_probability": <0..1>, "percentile": <0..1>}

`wmrl_jax.worldmodel.parsing` turns that answer into a prediction.

Programs and an episode's transcript are written by the policy and what it
ran; each enters the prompt as valid text in a code block fenced longer than
any backtick run inside it (`wmrl_jax.prompt_text.code_block`), so that under
CommonMark nothing in it can close its block and stand as a line of the
prompt's own (a section header, an example's outcome). The task description
and data report come from the task and are shown as they are.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from wmrl_jax.prompt_text import code_block, valid_text

ANSWER_KEYS = ("valid_probability", "percentile")
MASK = "<file>"

_SYSTEM = (
    "You are a world model of machine-learning experiments. Given a task and a "
    "solution program, you predict what happens when the program is run: whether "
    "it writes a valid submission, and where its score would rank on the task's "
    "leaderboard (percentile 0 = worst, 1 = best). Reason briefly, then end your "
    "answer with exactly one JSON object of the form "
    '{"valid_probability": <number in [0, 1]>, "percentile": <number in [0, 1]>}.'
)

# A quoted string that names a file: it has a path separator, or ends in an
# extension of the kinds programs read and write.
_FILE_LITERAL = re.compile(
    r"""(?P<q>['"])(?P<s>[^'"\n]*?(?:/[^'"\n]*|\.(?:csv|tsv|json|jsonl|parquet|feather|txt|npy|npz|pkl|pickle|joblib|zip|gz|h5|hdf5|xlsx|pt|bin)))(?P=q)""",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True)
class AnchorExample:
    """A program of the same task that was executed for real.

    Attributes:
      program: its source.
      valid: whether it produced a valid submission.
      percentile: its leaderboard percentile in [0, 1] (ignored when invalid).
    """

    program: str
    valid: bool
    percentile: float


def mask_file_names(program: str) -> str:
    """Replaces quoted file names and paths in `program` with ``"<file>"``.

    Example:
      >>> mask_file_names("pd.read_csv('public/train.csv')")
      "pd.read_csv('<file>')"
    """
    return _FILE_LITERAL.sub(lambda m: f"{m['q']}{MASK}{m['q']}", program)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} characters truncated]"


def render_wm_prompt(
    *,
    description: str,
    program: str,
    data_report: str | None = None,
    anchors: Sequence[AnchorExample] = (),
    max_program_chars: int = 8000,
    max_context_chars: int = 6000,
    transcript: str | None = None,
) -> list[dict[str, str]]:
    """Builds the WM's chat messages for one program.

    Args:
      description: the task description shown to the agent.
      program: the solution program to judge (file names are masked here).
      data_report: the task's computed data report, if any.
      anchors: executed programs of the same task, shown as examples.
      max_program_chars: programs (the judged one and each anchor) longer
        than this are truncated, with a note saying so.
      max_context_chars: the same for the description and the data report.
      transcript: what happened in a multi-turn episode before the program was
        submitted (`wmrl_jax.agents.text.episodes.render_transcript`), shown in a code
        block (the caller fits it to its budget); None for a single-turn sample.

    Returns:
      Chat messages (system, user) for a chat template
      (`wmrl_jax.models.render_chat`), the answer to be generated after them.

    Example:
      >>> messages = render_wm_prompt(description="Predict y.", program="print(1)")
      >>> [m["role"] for m in messages]
      ['system', 'user']
    """
    parts = ["# Task", _truncate(description.strip(), max_context_chars)]
    if data_report:
        parts += ["# Data report", _truncate(data_report.strip(), max_context_chars)]
    for i, anchor in enumerate(anchors, 1):
        outcome = (
            f"valid submission, leaderboard percentile {anchor.percentile:.3f}"
            if anchor.valid
            else "no valid submission"
        )
        code = _truncate(mask_file_names(valid_text(anchor.program)).rstrip(), max_program_chars)
        parts += [f"# Executed example {i} (outcome: {outcome})", code_block(code, "python")]
    if transcript:
        parts += ["# The episode before the submission", code_block(valid_text(transcript.strip()))]
    code = _truncate(mask_file_names(valid_text(program)).rstrip(), max_program_chars)
    parts += [
        "# Program to judge",
        code_block(code, "python"),
        "Predict the outcome of running this program. End with one JSON object with the "
        f"keys {', '.join(repr(k) for k in ANSWER_KEYS)}.",
    ]
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": "\n\n".join(parts)},
    ]
