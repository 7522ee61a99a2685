"""The `text` agent kind: `TextAgent`, the trainer's Agent over a real chat LLM (Qwen3 checkpoints).

The same backbone plays both roles. As the policy it reads a solver prompt (task
description, data report, fixed instructions) and writes one Python program per
sample; as the world model (WM) it reads `render_wm_prompt` for a (task, program)
pair and answers with a JSON prediction, sampled K times and combined by the law
of total variance.

With `turns` > 1 a sample is an episode (`wmrl_jax.agents.episodes`): up to
`turns` messages of `max_new_tokens` each, with sandbox tool calls (data
information, validation on a sample) answered in between, and the world model
judges the submission from the transcript before it. `turns` = 1 is the
single-turn path, unchanged.

Shapes stay fixed for a fixed config, so neither the sampler nor the train step
recompiles between steps: solver prompts are left padded to `max_prompt_tokens`
(P), completions to `max_new_tokens` (M), WM prompts to `wm_max_prompt_tokens`,
and with `batch_size` every generation call is cut into equal chunks (the last
one padded with copies of a real row, whose outputs are dropped).

Token accounting (for the compute ledger): `gen_tokens` and `wm_tokens` count,
over the rows actually asked for, the real (non-padding) prompt tokens of every
row (a prompt sampled G or K times counts G or K times, as the prefill computes
it that often) plus every generated token including the stop token.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from wmrl_jax.agents.base import AgentContext, Built, Capabilities, Rollout, WMOutput
from wmrl_jax.agents.episodes import (
    EnvironmentMessages,
    episode_instructions,
    make_tools,
    middle_cut,
    run_episodes,
)
from wmrl_jax.agents.programs import extract_program, find_program
from wmrl_jax.envs.grading import DEFAULT_FLOORS
from wmrl_jax.models.api import left_pad
from wmrl_jax.models.sampler import sample
from wmrl_jax.worldmodel.parsing import combine, failure_counts, parse_wm_answer, to_arrays
from wmrl_jax.worldmodel.prompts import AnchorExample, render_wm_prompt

SOLVER_SYSTEM = (
    "You are an expert machine-learning engineer. You write one complete, correct and "
    "efficient Python program that solves a data-science task."
)


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


class _ModelView(NamedTuple):
    """What `models.sample` reads from a model, for a graphdef held without its params."""

    graphdef: Any
    params: Any
    config: Any = None


def _default_stop_ids(tokenizer) -> tuple[int, ...]:
    ids = {tokenizer.eos_token_id}
    vocab = tokenizer.get_vocab()
    ids |= {vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab}
    return tuple(sorted(i for i in ids if i is not None))


class TextAgent:
    """Agent (policy + world model) over a chat LLM; see the module docstring.

    Args:
        model_graphdef: `nnx.GraphDef` of the `Qwen3` (params come with each call).
        tokenizer: its `transformers` tokenizer, with a chat template.
        max_prompt_tokens: P, the fixed solver prompt length; the description and
            data report are cut from the middle to fit, the instructions never.
        max_new_tokens: M, the completion budget; the train batch has T = P + M.
        wm_max_new_tokens: the WM answer budget.
        wm_samples: K answers sampled per program.
        temperature, top_p, top_k: sampling filters for both roles.
        system_prompt: solver system prompt (default `SOLVER_SYSTEM`).
        anchors_per_task: executed programs kept per task (`observe`) and shown
            in later WM prompts; 0 disables in-context anchors.
        wm_max_prompt_tokens: fixed WM prompt length; default
            P + (1 + anchors_per_task) * M. Anchors are dropped (oldest first), then
            context and program cut from the middle, to fit.
        invalid_reward: reward of an invalid submission, the WM's floor.
        batch_size: rows per rollout / evaluation generation call (None = all rows
            in one call).
        wm_batch_size: rows per world-model generation call (None = all rows).
        stop_ids: stop tokens (default: the tokenizer's EOS, <|im_end|>, <|endoftext|>).
        mesh: optional mesh for the sampler's KV cache.
        sample_fn: the sampler (`models.sample`), injectable for tests.
        chat_template_kwargs: extra chat-template variables, e.g.
            `{"enable_thinking": False}` for Qwen3's template.
        turns: K, the most messages of an episode; 1 = one program per sample.
        tool_max_tokens: E, the most tokens of one environment message (K > 1);
            a K-turn train row has T = P + K * M + (K - 1) * E tokens.
        tools: the `wmrl_jax.sandbox.tools.ToolBox` answering tool calls; required
            when K > 1.

    Example:
        >>> model = models.from_pretrained("path/to/qwen3")
        >>> agent = TextAgent(model.graphdef, model.tokenizer, max_prompt_tokens=2048,
        ...     max_new_tokens=1024, wm_max_new_tokens=256, wm_samples=4,
        ...     temperature=1.0, top_p=1.0, top_k=0)
        >>> ro = agent.rollout(model.params, tasks, group_size=8, key=jax.random.key(0))
        >>> wm = agent.predict(model.params, tasks, ro, key=jax.random.key(1))
    """

    def __init__(
        self,
        model_graphdef,
        tokenizer,
        *,
        max_prompt_tokens: int,
        max_new_tokens: int,
        wm_max_new_tokens: int,
        wm_samples: int,
        temperature: float,
        top_p: float,
        top_k: int,
        system_prompt: str | None = None,
        anchors_per_task: int = 0,
        wm_max_prompt_tokens: int | None = None,
        invalid_reward: float = DEFAULT_FLOORS.invalid,
        batch_size: int | None = None,
        wm_batch_size: int | None = None,
        stop_ids: Sequence[int] | None = None,
        mesh=None,
        sample_fn: Callable = sample,
        chat_template_kwargs: dict | None = None,
        turns: int = 1,
        tool_max_tokens: int = 256,
        tools=None,
    ):
        for name, value in (
            ("max_prompt_tokens", max_prompt_tokens),
            ("max_new_tokens", max_new_tokens),
            ("wm_max_new_tokens", wm_max_new_tokens),
            ("wm_samples", wm_samples),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if temperature <= 0 or not 0 < top_p <= 1 or top_k < 0:
            raise ValueError(f"bad sampling filters: {temperature=}, {top_p=}, {top_k=}")
        if int(turns) < 1 or int(tool_max_tokens) < 1 or (turns > 1 and tools is None):
            raise ValueError(
                f"need turns >= 1, tool_max_tokens >= 1 and tools when turns > 1; got "
                f"{turns=}, {tool_max_tokens=}, tools={tools!r}"
            )
        if anchors_per_task < 0 or any(
            b is not None and b < 1 for b in (batch_size, wm_batch_size)
        ):
            raise ValueError(f"bad {anchors_per_task=}, {batch_size=} or {wm_batch_size=}")
        self.graphdef = model_graphdef
        self.tokenizer = tokenizer
        self.max_prompt_tokens = int(max_prompt_tokens)
        self.max_new_tokens = int(max_new_tokens)
        self.wm_max_new_tokens = int(wm_max_new_tokens)
        self.wm_samples = int(wm_samples)
        self.turns = int(turns)
        self.env_budget = int(tool_max_tokens)
        self.tools = tools
        # The transcript before a submission: K - 1 messages and their answers.
        transcript = (self.turns - 1) * (max_new_tokens + self.env_budget)
        self.wm_max_prompt_tokens = int(
            wm_max_prompt_tokens
            or max_prompt_tokens + (1 + anchors_per_task) * max_new_tokens + transcript
        )
        self.sampling = dict(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k))
        self.system_prompt = SOLVER_SYSTEM if system_prompt is None else system_prompt
        self.anchors_per_task = int(anchors_per_task)
        self.invalid_reward = float(invalid_reward)
        self.batch_size = batch_size
        self.wm_batch_size = wm_batch_size
        self.stop_ids = tuple(stop_ids) if stop_ids is not None else _default_stop_ids(tokenizer)
        if not self.stop_ids:
            raise ValueError("no stop token: pass stop_ids or use a tokenizer with an EOS")
        pad = tokenizer.pad_token_id
        self.pad_id = int(self.stop_ids[0] if pad is None else pad)
        self.mesh = mesh
        self.sample_fn = sample_fn
        self.template_kwargs = dict(chat_template_kwargs or {})
        self._solver_cache: dict[tuple[str, str], list[int]] = {}
        self._anchors: dict[str, collections.deque] = {}
        self._env_messages: EnvironmentMessages | None = None
        self.last_answer_failures = 0

    # -- prompts ---------------------------------------------------------------------------

    def _ids(self, messages) -> list[int]:
        # As `models.render_chat` (prompt only), plus template options such as Qwen3's
        # `enable_thinking`; one tokenisation per prompt.
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _fit(self, build: Callable[[int | None], list], total: int, limit: int):
        """Token ids of `build(keep)` for the largest kept-character count that fits `limit`.

        `build(None)` is the uncut prompt; returns None when even `build(0)` is too long.
        """
        ids = self._ids(build(None))
        if len(ids) <= limit:
            return ids
        best = self._ids(build(0))
        if len(best) > limit:
            return None
        lo, hi = 0, total  # build(lo) fits; search the largest such lo.
        while hi - lo > 1:
            mid = (lo + hi) // 2
            cand = self._ids(build(mid))
            if len(cand) <= limit:
                lo, best = mid, cand
            else:
                hi = mid
        return best

    def solver_messages(self, task, keep: int | None = None) -> list[dict[str, str]]:
        """Solver chat messages; `keep` cuts description + data report to that many chars."""
        texts = [task.description.strip(), (task.data_report or "").strip()]
        if keep is not None:
            total = max(sum(len(t) for t in texts), 1)
            texts = [middle_cut(t, keep * len(t) // total) for t in texts]
        parts = ["# Task", texts[0]]
        if texts[1]:
            parts += ["# Data report", texts[1]]
        parts += ["# Instructions", solver_instructions(task)]
        if self.turns > 1:
            parts += ["# Actions", episode_instructions(self.turns, self.tools.validate_rows)]
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    def solver_prompt_ids(self, task) -> list[int]:
        """The task's solver prompt ids (cached), at most `max_prompt_tokens` long."""
        cache_key = (task.id, task.public_dir)
        if cache_key not in self._solver_cache:
            total = len(task.description) + len(task.data_report or "")
            ids = self._fit(
                lambda keep: self.solver_messages(task, keep), total, self.max_prompt_tokens
            )
            if ids is None:
                least = len(self._ids(self.solver_messages(task, 0)))
                raise ValueError(
                    f"task {task.id!r}: instructions alone ({least} tokens) exceed "
                    f"max_prompt_tokens={self.max_prompt_tokens}; raise "
                    "config.agent.text.max_prompt_tokens"
                )
            self._solver_cache[cache_key] = ids
        return self._solver_cache[cache_key]

    def wm_prompt_ids(
        self,
        task,
        program: str,
        anchors: Sequence[AnchorExample] | None = None,
        transcript: str = "",
    ) -> list[int]:
        """WM prompt ids for (task, program), at most `wm_max_prompt_tokens` long.

        `anchors` (oldest first) default to those kept for the task by `observe`;
        `transcript` is an episode's before its submission (`Rollout.transcripts`).
        To fit, anchors are dropped (oldest first), then the transcript is cut from
        the middle (or dropped), then the task context and the program are cut.
        """
        description, report = task.description, task.data_report or ""
        anchors = list(self._anchors.get(task.id, ()) if anchors is None else anchors)
        limit = self.wm_max_prompt_tokens

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
            ids = self._ids(build(None, anchors))
            if len(ids) <= limit or not anchors:
                break
            anchors = anchors[1:]
        if len(ids) > limit and transcript:

            def cut(keep):
                history = transcript if keep is None else middle_cut(transcript, keep)
                return build(None, [], history=history)

            fitted = self._fit(cut, len(transcript), limit)
            ids = ids if fitted is None else fitted
        if len(ids) > limit:
            total = len(description) + len(report)
            ids = self._fit(lambda keep: build(keep, [], history=""), total, limit)
        if ids is None:
            ids = self._fit(
                lambda keep: build(0, [], 8000 if keep is None else keep, history=""),
                len(program),
                limit,
            )
        if ids is None:
            raise ValueError(f"WM prompt cannot fit wm_max_prompt_tokens={limit}")
        return ids

    # -- generation ------------------------------------------------------------------------

    def generate(
        self,
        params,
        prompts: list[list[int]],
        length: int,
        repeat: int,
        key,
        *,
        call_rows=None,
        **kw,
    ):
        """Left pads `prompts` to `length`, repeats each row `repeat` times, samples.

        Without `batch_size`, one call of `call_rows` rows (default: as many as asked,
        the rest copies of a real row), so that asking for fewer rows does not recompile.

        Returns:
            (prompt ids [R, length], prompt mask [R, length], SampleOutput as numpy [R, M]).
        """
        ids, mask = left_pad(prompts, self.pad_id, length)
        ids, mask = np.repeat(ids, repeat, axis=0), np.repeat(mask, repeat, axis=0)
        rows = ids.shape[0]
        size = self.batch_size or max(rows, call_rows or 0)
        chunks = []
        for c, start in enumerate(range(0, rows, size)):
            take = np.arange(start, start + size)
            take = np.where(take < rows, take, rows - 1)  # pad the last chunk with a real row
            out = self.sample_fn(
                _ModelView(self.graphdef, params),
                ids[take],
                mask[take],
                jax.random.fold_in(key, c),
                params=params,
                eos_ids=self.stop_ids,
                pad_id=self.pad_id,
                mesh=self.mesh,
                **kw,
            )
            n = min(size, rows - start)
            chunks.append([np.asarray(x)[:n] for x in out])
        out = type(out)(*(np.concatenate(parts) for parts in zip(*chunks, strict=True)))
        return ids, mask, out

    def environment_messages(self) -> EnvironmentMessages:
        """How the environment's answers are tokenised in an episode (built once)."""
        if self._env_messages is None:
            self._env_messages = EnvironmentMessages(
                self.tokenizer, self.stop_ids, self.env_budget, self.template_kwargs
            )
        return self._env_messages

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
        """Text of each row's tokens under `mask` ([R, M] each), stop tokens left out."""
        stops = set(self.stop_ids)
        rows = [
            [int(t) for t, m in zip(r, k, strict=True) if m and t not in stops]
            for r, k in zip(tokens, mask, strict=True)
        ]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def rollout(self, params, tasks: Sequence, *, group_size: int, key) -> Rollout:
        """Samples `group_size` programs per task; rows are task-major (N = len(tasks) * G).

        Returns:
            `Rollout` with N programs and the train batch, arrays of shape [N, P + M]:
            tokens, attention_mask (int32), loss_mask and old_logprobs (float32; the
            untempered policy's log-probs of the sampled tokens, stop token included).
        """
        if self.turns > 1:
            return run_episodes(self, params, tasks, group_size=group_size, key=key)
        if not tasks or group_size < 1:
            raise ValueError(f"need tasks and group_size >= 1, got {len(tasks)}, {group_size}")
        prompts = [self.solver_prompt_ids(t) for t in tasks]
        ids, mask, out = self.generate(
            params,
            prompts,
            self.max_prompt_tokens,
            group_size,
            key,
            max_new_tokens=self.max_new_tokens,
            **self.sampling,
        )
        live = out.mask.astype(np.int32)
        batch = {
            "tokens": np.concatenate([ids, out.tokens.astype(np.int32)], axis=1),
            "attention_mask": np.concatenate([mask, live], axis=1),
            "loss_mask": np.concatenate([np.zeros_like(mask), live], axis=1).astype(np.float32),
            "old_logprobs": np.concatenate(
                [np.zeros(mask.shape, np.float32), np.where(live > 0, out.logprobs, 0.0)], axis=1
            ).astype(np.float32),
        }
        parses = [find_program(t) for t in self.decode(out.tokens, live)]
        return Rollout(
            [p.source for p in parses],
            batch,
            int(mask.sum()) + int(live.sum()),
            tuple(p.cause for p in parses),
        )

    def greedy_programs(self, params, tasks: Sequence) -> list[str]:
        """One greedily decoded program per task (evaluation); an episode when turns > 1."""
        if not tasks:
            return []
        if self.turns > 1:
            episodes = run_episodes(self, params, tasks, group_size=1, key=jax.random.key(0),
                                    greedy=True)  # fmt: skip
            return episodes.programs
        prompts = [self.solver_prompt_ids(t) for t in tasks]
        _, _, out = self.generate(
            params,
            prompts,
            self.max_prompt_tokens,
            1,
            jax.random.key(0),
            max_new_tokens=self.max_new_tokens,
            greedy=True,
        )
        return [extract_program(t) for t in self.decode(out.tokens, out.mask)]

    # -- world model -----------------------------------------------------------------------

    def predict(self, params, tasks: Sequence, rollout: Rollout, *, key) -> WMOutput:
        """WM predictions for the rollout's programs (row i judged under tasks[i // G]).

        Rows without a program (`Rollout.causes`) are not asked: their outcome is
        known (invalid), so they cost no WM tokens and get NaN / inf.

        Returns:
            `WMOutput`: mean / var float32 [N] on the reward scale (NaN / inf where no
            answer of the K parses or there is no program), the WM tokens,
            `parse_failures`: the programs asked with no usable answer, and per cause
            (`parse_causes`) the unusable answers among the K sampled per program, with
            `clamped` those with an out-of-range number. `last_answer_failures` keeps
            the number of unusable answers.
        """
        n = len(rollout.programs)
        if not tasks or n % len(tasks):
            raise ValueError(f"{n} programs do not split into groups over {len(tasks)} tasks")
        group, k = n // len(tasks), self.wm_samples
        asked = [i for i, c in enumerate(rollout.causes or ("ok",) * n) if c == "ok"]
        mean, var = np.full(n, np.nan, np.float32), np.full(n, np.inf, np.float32)
        if not asked:
            self.last_answer_failures = 0
            return WMOutput(mean, var, 0, 0, failure_counts([]), 0)
        history = rollout.transcripts or ("",) * n
        prompts = [
            self.wm_prompt_ids(tasks[i // group], rollout.programs[i], transcript=history[i])
            for i in asked
        ]
        _, mask, out = self.generate(
            params,
            prompts,
            self.wm_max_prompt_tokens,
            k,
            key,
            call_rows=n * k,  # one compiled shape, however many rows hold a program
            max_new_tokens=self.wm_max_new_tokens,
            **self.sampling,
        )
        answers = [
            parse_wm_answer(t, invalid_reward=self.invalid_reward)
            for t in self.decode(out.tokens, out.mask)
        ]
        combined = [combine(answers[j * k : (j + 1) * k]) for j in range(len(asked))]
        mean[asked], var[asked] = to_arrays(combined)
        var = np.where(np.isnan(mean), np.inf, var).astype(np.float32)
        self.last_answer_failures = sum(not a.usable for a in answers)
        failures = sum(not c.usable for c in combined)
        return WMOutput(
            mean,
            var,
            int(mask.sum()) + int(out.mask.sum()),
            failures,
            failure_counts(answers),
            sum(a.clamped for a in answers),
        )

    def observe(self, task, program: str, outcome) -> None:
        """Keeps an executed (program, outcome) as an in-context anchor for `task`.

        Outcomes with status "infra_error" say nothing about the program and are skipped.
        """
        if self.anchors_per_task == 0 or outcome.status == "infra_error":
            return
        valid = outcome.status == "ok" and math.isfinite(outcome.percentile)
        anchor = AnchorExample(program, valid, float(outcome.percentile) if valid else 0.0)
        queue = self._anchors.setdefault(task.id, collections.deque(maxlen=self.anchors_per_task))
        queue.append(anchor)

    def aux_batch(self, tasks, rollout: Rollout, real, executed) -> dict[str, np.ndarray]:
        """No auxiliary targets: free-form JSON answers have no score-bin token."""
        del tasks, rollout, real, executed
        return {}

    def describe(self, rollout: Rollout) -> list[str]:
        """The first line of each program (60 characters at most), or why there is none."""
        causes = rollout.causes or ("ok",) * len(rollout.programs)
        return [
            p.strip().splitlines()[0][:60] if c == "ok" else f"<no program: {c}>"
            for p, c in zip(rollout.programs, causes, strict=True)
        ]

    def anchors(self, task) -> list[AnchorExample]:
        """The anchors currently shown for `task`, oldest first."""
        return list(self._anchors.get(task.id, ()))


CAPABILITIES = Capabilities(aux_loss=False, replayable=False, memory_plan=True)


def default_config() -> ml_collections.ConfigDict:
    """`config.agent.text`: the checkpoint, lengths and sampling of a `TextAgent`."""
    c = ml_collections.ConfigDict()
    c.checkpoint = ""  # A local Hugging Face directory (config.json, safetensors, tokenizer).
    c.dtype = "float32"
    c.max_prompt_tokens = 1024
    c.max_new_tokens = 512
    c.wm_max_new_tokens = 128
    c.wm_samples = 4
    c.temperature = 1.0
    c.top_p = 1.0
    c.top_k = 0
    c.anchors_per_task = 0  # Executed anchors shown in later WM prompts.
    c.enable_thinking = False  # Qwen3 chat template switch.
    # Episodes (wmrl_jax.agents.episodes): 1 = one program per sample; K > 1 = up to K
    # messages of max_new_tokens each, with tool calls answered in between.
    c.turns = 1
    c.tool_max_tokens = 256  # E: tokens of one environment message in the transcript.
    c.tools = ml_collections.ConfigDict()
    c.tools.executor = "auto"  # "auto" (Docker if it can run, else local), "docker", "local".
    c.tools.image = ""  # Docker image ("" = the default sandbox image).
    c.tools.workers = 4  # Tool calls run at once.
    c.tools.info_timeout_s = 30.0  # Wall-clock budget of one `info` call.
    c.tools.validate_timeout_s = 120.0  # Wall-clock budget of one `validate` call.
    c.tools.validate_rows = 100  # Records per CSV file in the validation sample.
    return c


TOOL_EXECUTORS = ("auto", "docker", "local")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first bad field of `config.agent.text`."""
    if not config.checkpoint:
        raise ValueError("config.agent.text.checkpoint must name a local Hugging Face directory")
    for field in ("max_prompt_tokens", "max_new_tokens", "wm_max_new_tokens", "wm_samples"):
        if not config[field] >= 1:
            raise ValueError(f"config.agent.text.{field} must be >= 1, got {config[field]}")
    if not config.temperature > 0 or not 0 < config.top_p <= 1 or config.top_k < 0:
        raise ValueError(
            "config.agent.text needs temperature > 0, 0 < top_p <= 1, top_k >= 0; got "
            f"{config.temperature}, {config.top_p}, {config.top_k}"
        )
    if config.anchors_per_task < 0:
        raise ValueError(
            f"config.agent.text.anchors_per_task must be >= 0, got {config.anchors_per_task}"
        )
    for field in ("turns", "tool_max_tokens"):
        if not config[field] >= 1:
            raise ValueError(f"config.agent.text.{field} must be >= 1, got {config[field]}")
    tools = config.tools
    if tools.executor not in TOOL_EXECUTORS:
        raise ValueError(
            f"config.agent.text.tools.executor must be one of {TOOL_EXECUTORS}, "
            f"got {tools.executor!r}"
        )
    for field in ("info_timeout_s", "validate_timeout_s", "validate_rows", "workers"):
        if not tools[field] > 0:
            raise ValueError(f"config.agent.text.tools.{field} must be > 0, got {tools[field]}")


def make_agent(config: ml_collections.ConfigDict, context: AgentContext) -> Built:
    """A `TextAgent` over the checkpoint at `config.checkpoint` (nothing is downloaded)."""
    import os

    from wmrl_jax.models import api

    validate_config(config)
    if config.turns > 1 and jax.process_count() > 1:
        raise ValueError(
            "config.agent.text.turns > 1 runs tool calls on every process, whose answers "
            "(timings, output) may differ and split the processes' rollouts; run episodes "
            "in one process"
        )
    tools = make_tools(config.tools) if config.turns > 1 else None
    # Straight into the mesh's shardings: no unsharded copy on the first device.
    model = api.from_pretrained(
        os.path.expanduser(config.checkpoint), dtype=config.dtype, mesh=context.mesh
    )
    sizes = dict(context.batch_sizes or {})
    agent = TextAgent(
        model.graphdef,
        model.tokenizer,
        max_prompt_tokens=config.max_prompt_tokens,
        max_new_tokens=config.max_new_tokens,
        wm_max_new_tokens=config.wm_max_new_tokens,
        wm_samples=config.wm_samples,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        anchors_per_task=config.anchors_per_task,
        invalid_reward=context.floors.invalid,
        batch_size=sizes.get("rollout"),
        wm_batch_size=sizes.get("wm"),
        mesh=context.mesh,
        chat_template_kwargs={"enable_thinking": bool(config.enable_thinking)},
        turns=config.turns,
        tool_max_tokens=config.tool_max_tokens,
        tools=tools,
    )
    return Built(agent, model.params, model.graphdef, model.raw_config, {})
