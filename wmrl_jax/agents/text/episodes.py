"""Episodes: a text agent's short multi-turn conversation with a task's environment.

With ``turns = K > 1`` a sample is an episode instead of one completion. The
agent reads the solver prompt (with `episode_instructions`) and writes up to
K messages of at most M = `max_new_tokens` tokens each. Each message names an
action (`programs.find_action`):

* ``info`` and ``validate`` are real tool calls into the sandbox
  (`wmrl_jax.sandbox.tools.ToolBox`, each with its own time budget); the
  answer comes back as an environment message of at most E =
  `tool_max_tokens` tokens (cut from the middle to fit);
* ``submit`` ends the episode: its program is the sample's program, which the
  world model judges and, in anchor groups, the trainer executes and grades
  like any single-turn program;
* a message that asks for nothing usable (no action line and no program, or a
  tool that needs a program without one) gets an environment message saying
  so, and costs its turn.

Message K ends the episode whatever it asks: its program is submitted when it
submits one; otherwise the sample holds no program, with cause
"no_submission" when it asked for a tool, else the program's own cause
("empty", "no_code", "syntax_error"). Such a row is an invalid outcome that
nothing executes, as in a single turn.

Whatever a program writes, a tool's answer is text: it enters the transcript
as valid text (`wmrl_jax.prompt_text.valid_text`; a file name that is not
UTF-8 is escaped) and a tool never raises. Should the environment fail on one
episode anyway (a tool's future failing, its answer not tokenisable), that
episode ends without a program, cause "episode_error", with the error as the
environment's last answer in its transcript and in the log; the other
episodes go on, and `run_episodes` does not raise.

Token layout, fixed for a config: row i of the train batch is the solver
prompt left-padded to P, then the transcript (agent and environment tokens
alternating, as generated), then right padding, T = P + K * M + (K - 1) * E.
Message k is generated from the prompt plus the transcript so far, left-padded
to P + (k - 1) * (M + E): the model conditions on exactly the tokens the train
step sees, at the same positions. `loss_mask` and `old_logprobs` are 1 and the
sampling log-probs on the agent's own tokens of every message (stop tokens
included) and 0 on the prompt, on environment tokens (the chat template's
wrapper and the tool's answer, and the stop token closing a message cut by the
budget) and on padding, so tool outputs are never trained on nor counted in a
log-prob sum.

The world model judges an episode's submission from the transcript before it
(`render_transcript`): the agent's earlier messages and the environment's
answers, each a quoted block (`prompt_text.quote`) so that nothing in them
passes for the transcript's own headers; `cut_transcript` cuts it to a budget
and keeps that so. With K = 1 none of this runs: `TextAgent` keeps its single-turn path.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from wmrl_jax.agents.base import Rollout
from wmrl_jax.agents.programs import find_action
from wmrl_jax.prompt_text import break_control_tokens, quote, valid_text

log = logging.getLogger(__name__)
# Characters of each agent message kept in the world model's transcript.
TRANSCRIPT_MESSAGE_CHARS = 2000
_SENTINELS = ("\x00AGENT\x00", "\x00ENV\x00")


def _middle_parts(text: str, keep: int) -> tuple[str, str, int]:
    """(head, tail, dropped): `keep` characters of `text` around a cut of `dropped`."""
    if keep >= len(text):
        return text, "", 0
    head = keep // 2
    tail = text[len(text) - (keep - head) :] if keep > head else ""
    return text[:head], tail, len(text) - keep


def middle_cut(text: str, keep: int) -> str:
    """`text` with its middle replaced by a marker so that `keep` characters remain."""
    head, tail, dropped = _middle_parts(text, keep)
    if not dropped:
        return text
    return f"{head}\n[... {dropped} characters truncated ...]\n{tail}"


def episode_instructions(turns: int, validate_rows: int) -> str:
    """The paragraph that tells the agent how an episode of `turns` messages works."""
    return (
        f"You may send up to {turns} messages; end each with one line naming an action:\n"
        "ACTION: info - describe the input files;\n"
        "ACTION: validate - run this message's ```python block on the first "
        f"{validate_rows} rows of each input file and report its errors and the "
        "submission's format;\n"
        "ACTION: submit - submit this message's ```python block as your final, graded "
        f"program.\nA program without an action line is submitted. Submit by message {turns}."
    )


def render_transcript(messages: Sequence[tuple[str, str]]) -> str:
    """The world model's view of an episode before its submission.

    Every line written by the agent or the environment is quoted (``> ``), so
    the only unquoted lines are the headers written here.

    Args:
      messages: (agent message, environment answer) pairs, in order.
    """
    parts = []
    for k, (agent, env) in enumerate(messages, 1):
        parts += [
            f"## Message {k} of the agent",
            quote(valid_text(middle_cut(agent.strip(), TRANSCRIPT_MESSAGE_CHARS))),
            f"## Answer {k} of the environment",
            quote(valid_text(env.strip())),
        ]
    return "\n\n".join(parts)


def cut_transcript(transcript: str, keep: int) -> str:
    """`middle_cut` of a `render_transcript` text, its lines still quoted or headers.

    The kept tail may start inside a line; that fragment is quoted, so that no
    fragment of a quoted line stands as a line of its own.
    """
    head, tail, dropped = _middle_parts(transcript, keep)
    if not dropped:
        return transcript
    if tail and transcript[-len(tail) - 1] != "\n":
        first, sep, rest = tail.partition("\n")
        tail = quote(first) + sep + rest
    return f"{head}\n[... {dropped} characters truncated ...]\n{tail}"


@dataclasses.dataclass
class _Episode:
    """One row's transcript so far (token ids after the prompt) and its end."""

    ids: list = dataclasses.field(default_factory=list)
    agent: list = dataclasses.field(default_factory=list)  # 1 on the agent's tokens
    logp: list = dataclasses.field(default_factory=list)
    messages: list = dataclasses.field(default_factory=list)  # (agent text, env answer)
    program: str = ""
    cause: str | None = None  # None while the episode runs

    def extend(self, ids, agent: int, logp=None) -> None:
        self.ids += [int(t) for t in ids]
        self.agent += [agent] * len(ids)
        self.logp += [0.0] * len(ids) if logp is None else [float(x) for x in logp]


class EnvironmentMessages:
    """Token ids of the environment's messages under a tokenizer's chat template.

    An answer is rendered as a user turn of the template after the agent's
    message, followed by the template's generation prompt for the next one:
    for Qwen3, ``\\n<|im_start|>user\\n{answer}<|im_end|>\\n<|im_start|>assistant\\n``
    (and the template's empty thinking block when thinking is off). The stop
    token closing the agent's message is the agent's own when it sampled it,
    else it is added here, as an environment token.

    Args:
      tokenizer: a `transformers` tokenizer with a chat template.
      stop_ids: the agent's stop tokens.
      budget: E, the most tokens of one message.
      template_kwargs: chat-template variables (e.g. ``enable_thinking``).

    Raises:
      ValueError: the template does not render an answer after an agent
        message, or its wrapper alone exceeds `budget`.
    """

    def __init__(self, tokenizer, stop_ids: Sequence[int], budget: int, template_kwargs=None):
        agent, env = _SENTINELS
        conv = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": agent},
            {"role": "user", "content": env},
        ]
        text = tokenizer.apply_chat_template(
            conv, tokenize=False, add_generation_prompt=True, **dict(template_kwargs or {})
        )
        if agent not in text or env not in text.split(agent, 1)[1]:
            raise ValueError("the chat template does not render a user turn after the agent's")
        head, _, self.tail = text.split(agent, 1)[1].partition(env)
        stops = [tokenizer.convert_ids_to_tokens(int(i)) for i in stop_ids]
        self.closing = next((s for s in stops if s and head.startswith(s)), "")
        self.head = head[len(self.closing) :]
        self.tokenizer = tokenizer
        self.budget = int(budget)
        self._added = list(tokenizer.get_added_vocab())
        if len(self.ids("", stopped=False)) > self.budget:
            raise ValueError(
                f"tool_max_tokens={budget} cannot hold the chat template's message wrapper "
                f"({len(self.ids('', stopped=False))} tokens)"
            )

    def _encode(self, content: str, stopped: bool) -> list[int]:
        text = ("" if stopped else self.closing) + self.head + content + self.tail
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def ids(self, content: str, *, stopped: bool) -> list[int]:
        """The message's ids, `content` cut from the middle to fit the budget.

        Args:
          content: the environment's answer; control-token strings in it (a
            program printing ``<|im_end|>``) are broken so they stay text, and
            lone surrogates are escaped (`prompt_text.valid_text`).
          stopped: whether the agent's message ended with its stop token.
        """
        content = break_control_tokens(valid_text(content), self._added)
        ids = self._encode(content, stopped)
        if len(ids) <= self.budget:
            return ids
        best = self._encode(middle_cut(content, 0), stopped)
        if len(best) > self.budget:  # not even the cut marker: the wrapper alone (it fits)
            return self._encode("", stopped)
        lo, hi = 0, len(content)  # the content cut to lo characters fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            cand = self._encode(middle_cut(content, mid), stopped)
            if len(cand) <= self.budget:
                lo, best = mid, cand
            else:
                hi = mid
        return best


def _answer(episode: _Episode, action, turn: int, turns: int, tools, task):
    """What the environment does with message `turn`: a Future of (label, text, seconds,
    is_call), or None when the episode ends here (its program and cause set)."""
    last = turn == turns - 1
    program = action.program
    if action.name == "submit" and program.ok:
        episode.program, episode.cause = program.source, "ok"
        return None
    if last:
        tool = action.name in ("info", "validate")
        episode.cause = "no_submission" if tool else program.cause
        return None
    done: concurrent.futures.Future = concurrent.futures.Future()
    if action.name == "info" or (action.name == "validate" and program.ok):
        inner = tools.call(task, action.name, program.source)

        def forward(f: concurrent.futures.Future) -> None:
            try:
                result = f.result()
                done.set_result((f"{action.name} result", result.text, result.seconds, True))
            except Exception as e:  # resolve `done` whatever happens, or the turn waits forever
                done.set_exception(e)

        inner.add_done_callback(forward)
        return done
    why = program.cause + (f": {program.detail}" if program.detail else "")
    if action.name == "none":
        text = (
            "No action found. End your message with one line `ACTION: info`, `ACTION: "
            f"validate` or `ACTION: submit` (the last two with a ```python block); {why}."
        )
    else:
        text = f"`{action.name}` needs a program in a ```python block; none was found ({why})."
    done.set_result(("error", text, 0.0, False))
    return done


def _fail(episode: _Episode, text: str, task, error: Exception) -> None:
    """Ends `episode` after the agent's message `text`: the environment failed on it."""
    why = valid_text(f"{type(error).__name__}: {error}")[:500]
    log.warning("an episode of task %r ended: the environment failed: %s", task.id, why)
    episode.program, episode.cause = "", "episode_error"
    episode.messages.append((text, f"[error]\nthe environment failed: {why}"))


def run_episodes(agent, params, tasks: Sequence, *, group_size: int, key, greedy: bool = False):
    """`group_size` episodes per task (task-major rows) with `agent`'s tools.

    Args:
      agent: a `TextAgent` with `turns > 1` and `tools`.
      params: the policy's params.
      tasks: the tasks; row i plays tasks[i // group_size].
      group_size: G.
      key: PRNG key (message k samples with `fold_in(key, k)`).
      greedy: decode greedily (evaluation).

    Returns:
      A `Rollout` of N = len(tasks) * G rows: the submitted programs, the train
      batch of shape [N, T] (module docstring), the tokens of every prefill and
      sample, the causes, the world model's transcripts, and the tool calls
      with their sandbox seconds and the wall seconds spent waiting on them.

    Example:
        >>> tools = ToolBox(LocalExecutor(timeout_s=120))            # doctest: +SKIP
        >>> agent = TextAgent(graphdef, tokenizer, ..., turns=3, tools=tools)  # doctest: +SKIP
        >>> ro = agent.rollout(params, tasks, group_size=8, key=key)  # doctest: +SKIP
        >>> ro.causes[0], ro.tool_calls, ro.transcripts[0][:40]       # doctest: +SKIP
        ('ok', 11, '## Message 1 of the agent\n\nLet me look')
    """
    if not tasks or group_size < 1:
        raise ValueError(f"need tasks and group_size >= 1, got {len(tasks)}, {group_size}")
    turns, p, m, e = agent.turns, agent.max_prompt_tokens, agent.max_new_tokens, agent.env_budget
    prompts = [agent.solver_prompt_ids(t) for t in tasks]
    n = len(tasks) * group_size
    rows = [_Episode() for _ in range(n)]
    stops = set(agent.stop_ids)
    env = agent.environment_messages()
    gen_tokens, calls, tool_seconds, wait_seconds = 0, 0, 0.0, 0.0
    options = {"greedy": True} if greedy else agent.sampling
    for turn in range(turns):
        live = [i for i in range(n) if rows[i].cause is None]
        if not live:
            break
        context = [prompts[i // group_size] + rows[i].ids for i in live]
        _, mask, out = agent.generate(
            params, context, p + turn * (m + e), 1, jax.random.fold_in(key, turn),
            call_rows=n, max_new_tokens=m, **options,
        )  # fmt: skip
        gen_tokens += int(mask.sum()) + int(out.mask.sum())
        texts = agent.decode(out.tokens, out.mask)
        pending = {}
        for j, i in enumerate(live):
            sampled = out.mask[j] > 0
            tokens = out.tokens[j][sampled]
            rows[i].extend(tokens, 1, out.logprobs[j][sampled])
            task = tasks[i // group_size]
            try:
                answer = _answer(rows[i], find_action(texts[j]), turn, turns, agent.tools, task)
            except Exception as error:  # one episode's failure, not the rollout's
                _fail(rows[i], texts[j], task, error)
                continue
            if answer is not None:
                stopped = len(tokens) > 0 and int(tokens[-1]) in stops
                pending[i] = (answer, texts[j], stopped)
        start = time.perf_counter()
        concurrent.futures.wait([a for a, _, _ in pending.values()])
        wait_seconds += time.perf_counter() - start
        left = turns - turn - 1
        note = "This is your last message: submit." if left == 1 else f"{left} messages left."
        for i, (answer, text, stopped) in pending.items():
            try:
                label, body, seconds, called = answer.result()
                calls, tool_seconds = calls + called, tool_seconds + seconds
                content = valid_text(f"[{label}]\n{body.rstrip()}\n\n({note})")
                ids = env.ids(content, stopped=stopped)
            except Exception as error:  # one episode's failure, not the rollout's
                _fail(rows[i], text, tasks[i // group_size], error)
                continue
            rows[i].extend(ids, 0)
            rows[i].messages.append((text, content))
    prompts = [prompts[i // group_size] for i in range(n)]
    batch = _batch(rows, prompts, p, turns * m + (turns - 1) * e, agent.pad_id)
    return Rollout(
        [r.program for r in rows],
        batch,
        gen_tokens,
        tuple(r.cause for r in rows),
        transcripts=tuple(render_transcript(r.messages) for r in rows),
        tool_calls=calls,
        tool_seconds=tool_seconds,
        tool_wait_seconds=wait_seconds,
    )


def _batch(rows: list[_Episode], prompts: list, p: int, length: int, pad_id: int) -> dict:
    """The train arrays [N, p + length]: left-padded prompts, transcripts, right padding."""
    n, t = len(rows), p + length
    batch = {
        "tokens": np.full((n, t), pad_id, np.int32),
        "attention_mask": np.zeros((n, t), np.int32),
        "loss_mask": np.zeros((n, t), np.float32),
        "old_logprobs": np.zeros((n, t), np.float32),
    }
    for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
        if len(row.ids) > length:  # each message is bounded: a broken invariant
            raise AssertionError(f"row {i}: transcript of {len(row.ids)} > {length} tokens")
        end = p + len(row.ids)
        batch["tokens"][i, p - len(prompt) : end] = prompt + row.ids
        batch["attention_mask"][i, p - len(prompt) : end] = 1
        batch["loss_mask"][i, p:end] = row.agent
        batch["old_logprobs"][i, p:end] = row.logp
    return batch


def sequence_lengths(config: ml_collections.ConfigDict) -> dict[str, int]:
    """Token lengths of `config.agent.text`'s sequences, for memory plans.

    Returns:
      train: T, a train row; prompt: the longest generation prompt (the last
      message's); new: M, tokens sampled per message; wm_prompt: the default
      world-model prompt (unless `wm_max_prompt_tokens` is set). A single-turn
      memory plan at `prompt` and `new` tokens holds an episode: prompt + new is
      the train row and prompt + (1 + anchors) * new the default WM prompt.
    """
    k, p, m, e = config.turns, config.max_prompt_tokens, config.max_new_tokens, 0
    if k > 1:
        e = config.tool_max_tokens
    return {
        "train": p + k * m + (k - 1) * e,
        "prompt": p + (k - 1) * (m + e),
        "new": m,
        "wm_prompt": config.get("wm_max_prompt_tokens")
        or p + (1 + config.anchors_per_task) * m + (k - 1) * (m + e),
    }


def make_tools(config: ml_collections.ConfigDict):
    """The `ToolBox` of `config.agent.text.tools`, on its own executor.

    Raises:
      ValueError: `executor="docker"` and Docker cannot run (the message says why).
    """
    import sys

    from wmrl_jax import sandbox
    from wmrl_jax.sandbox.tools import ToolBox

    kwargs = dict(max_workers=config.workers, timeout_s=config.validate_timeout_s)
    if config.executor == "local":
        executor = sandbox.LocalExecutor(python=sys.executable, **kwargs)
    elif config.executor == "docker":
        try:
            executor = sandbox.DockerExecutor(config.image or None, **kwargs)
        except sandbox.InfraError as e:
            raise ValueError(f"config.agent.text.tools.executor='docker' but: {e}") from e
    else:
        executor = sandbox.make_executor(config.image or None, python=sys.executable, **kwargs)
    return ToolBox(
        executor,
        info_timeout_s=config.info_timeout_s,
        validate_timeout_s=config.validate_timeout_s,
        validate_rows=config.validate_rows,
    )
