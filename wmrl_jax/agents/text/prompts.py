"""The text agent's prompts: the solver's and the world model's, fitted to token budgets.

The policy reads a solver prompt: a system prompt, then the task description,
its data report and the fixed `solver_instructions` (and, in an episode, the
actions it may take). The world model (WM) reads `render_wm_prompt` for a
(task, program) pair. Both are chat messages, rendered by the tokenizer's chat
template (`chat_ids`) and fitted to a fixed token budget, so that the sampler's
shapes never change:

* a solver prompt cuts the description and the data report from the middle
  (`middle_cut`, in proportion to their lengths), never the instructions;
* a WM prompt drops anchors (oldest first), then cuts the episode's transcript
  from the middle (or drops it), then the task context, then the program.

Every cut is the largest that fits (`fit_ids`: a binary search over the kept
characters, one tokenisation per candidate). The functions take the encoder
(`messages -> ids`) as an argument; `wmrl_jax.agents.text.agent.TextAgent`
binds its tokenizer and caches solver prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from wmrl_jax.agents.text.episodes import cut_transcript, middle_cut
from wmrl_jax.prompt_text import break_control_tokens, valid_text
from wmrl_jax.worldmodel.prompts import AnchorExample, render_wm_prompt

SOLVER_SYSTEM = (
    "You are an expert machine-learning engineer. You write one complete, correct and "
    "efficient Python program that solves a data-science task."
)

Messages = list[dict[str, str]]
Encode = Callable[[Messages], list[int]]


def solver_instructions(task, *, libraries: str = "numpy and scikit-learn") -> str:
    """The fixed instructions closing every solver prompt (never truncated)."""
    sub = task.submission
    metric = task.metric.name or task.metric.grader
    columns = ", ".join([sub.id_column, *sub.target_columns])
    return (
        "Write one complete Python program that:\n"
        "1. reads `train.csv` and `test.csv` (CSV files with a header row) from the directory "
        "given by the environment variable WMRL_INPUT_DIR, e.g. "
        "`os.path.join(os.environ['WMRL_INPUT_DIR'], 'train.csv')`;\n"
        "2. trains a model on the training rows and predicts every test row;\n"
        f"3. writes `{sub.file}` into the directory given by the environment variable "
        f"WMRL_OUTPUT_DIR: a CSV file with a header row and exactly the columns {columns}, "
        "one row per test row, in the test file's order.\n"
        f"The submission is scored with {metric} ({task.metric.direction} is better). "
        f"Use only the Python standard library, {libraries}. Answer with the whole program "
        "in a single ```python code block."
    )


def chat_ids(tokenizer, messages: Messages, template_kwargs: dict | None = None) -> list[int]:
    """Token ids of `messages` under the chat template, with the assistant header.

    As `models.render_chat` (prompt only), plus template options such as Qwen3's
    `enable_thinking`; one tokenisation per prompt. The messages' contents hold
    untrusted text (programs, tool answers): it is made valid text and its
    control-token strings are broken (`wmrl_jax.prompt_text`), so that it cannot
    crash the tokenizer nor end its chat turn.
    """
    added = tokenizer.get_added_vocab()
    messages = [
        {**m, "content": break_control_tokens(valid_text(m["content"]), added)} for m in messages
    ]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def fit_ids(
    encode: Encode, build: Callable[[int | None], Messages], total: int, limit: int
) -> list[int] | None:
    """Token ids of `build(keep)` for the largest kept-character count that fits `limit`.

    Args:
      encode: messages -> token ids (`chat_ids` with a tokenizer bound).
      build: kept characters -> messages; `build(None)` is the uncut prompt.
      total: the most characters `build` can keep (the search's upper end).
      limit: the token budget.

    Returns:
      The ids, or None when even `build(0)` is too long.
    """
    ids = encode(build(None))
    if len(ids) <= limit:
        return ids
    best = encode(build(0))
    if len(best) > limit:
        return None
    lo, hi = 0, total  # build(lo) fits; search the largest such lo.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cand = encode(build(mid))
        if len(cand) <= limit:
            lo, best = mid, cand
        else:
            hi = mid
    return best


def solver_messages(
    task, *, system_prompt: str, actions: str | None = None, keep: int | None = None
) -> Messages:
    """Solver chat messages; `keep` cuts description + data report to that many chars.

    Args:
      task: the task (its description, data report, submission and metric).
      system_prompt: the system message (e.g. `SOLVER_SYSTEM`).
      actions: an episode's action instructions
        (`wmrl_jax.agents.text.episodes.episode_instructions`), or None (one turn).
      keep: characters of description and data report kept (None: all).
    """
    texts = [task.description.strip(), (task.data_report or "").strip()]
    if keep is not None:
        total = max(sum(len(t) for t in texts), 1)
        texts = [middle_cut(t, keep * len(t) // total) for t in texts]
    parts = ["# Task", texts[0]]
    if texts[1]:
        parts += ["# Data report", texts[1]]
    parts += ["# Instructions", solver_instructions(task)]
    if actions is not None:
        parts += ["# Actions", actions]
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def fit_wm_prompt(
    encode: Encode,
    task,
    program: str,
    anchors: Sequence[AnchorExample],
    *,
    limit: int,
    transcript: str = "",
) -> list[int]:
    """WM prompt ids for (task, program), at most `limit` long.

    To fit, anchors are dropped (oldest first), then the transcript is cut from
    the middle (or dropped), then the task context and the program are cut.

    Args:
      encode: messages -> token ids (`chat_ids` with a tokenizer bound).
      task: the task (its description and data report).
      program: the program judged.
      anchors: executed programs of the task shown as examples, oldest first.
      limit: the token budget.
      transcript: an episode's before its submission (`Rollout.transcripts`).

    Raises:
      ValueError: when even the prompt without context and program exceeds `limit`.
    """
    description, report = task.description, task.data_report or ""
    anchors = list(anchors)

    def build(keep, anchors, program_chars=8000, history=transcript):
        texts = [description, report]
        if keep is not None:
            total = max(len(description) + len(report), 1)
            texts = [middle_cut(t, keep * len(t) // total) for t in texts]
        return render_wm_prompt(
            description=texts[0],
            program=program,
            data_report=texts[1] or None,
            anchors=anchors,
            max_program_chars=program_chars,
            transcript=history or None,
        )

    while True:  # Drop the oldest anchors before cutting the task context.
        ids = encode(build(None, anchors))
        if len(ids) <= limit or not anchors:
            break
        anchors = anchors[1:]
    if len(ids) > limit and transcript:

        def cut(keep):
            history = transcript if keep is None else cut_transcript(transcript, keep)
            return build(None, [], history=history)

        fitted = fit_ids(encode, cut, len(transcript), limit)
        ids = ids if fitted is None else fitted
    if len(ids) > limit:
        total = len(description) + len(report)
        ids = fit_ids(encode, lambda keep: build(keep, [], history=""), total, limit)
    if ids is None:
        ids = fit_ids(
            encode,
            lambda keep: build(0, [], 8000 if keep is None else keep, history=""),
            len(program),
            limit,
        )
    if ids is None:
        raise ValueError(f"WM prompt cannot fit wm_max_prompt_tokens={limit}")
    return ids
