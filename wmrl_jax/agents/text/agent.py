"""`TextAgent`: the trainer's Agent over a real chat LLM (Qwen3 checkpoints).

The same backbone plays both roles. As the policy it reads a solver prompt
(`wmrl_jax.agents.text.prompts`: task description, data report, fixed
instructions) and writes one Python program per sample; as the world model (WM)
it reads `render_wm_prompt` for a (task, program) pair and answers with a JSON
prediction, sampled K times and combined by the law of total variance.

With `turns` > 1 a sample is an episode (`wmrl_jax.agents.text.episodes`): up to
`turns` messages of `max_new_tokens` each, with sandbox tool calls (data
information, validation on a sample) answered in between, and the world model
judges the submission from the transcript before it. `turns` = 1 is the
single-turn path, unchanged.

Shapes stay fixed for a fixed config (`wmrl_jax.agents.text.generation`):
solver prompts are left padded to `max_prompt_tokens` (P), completions to
`max_new_tokens` (M), WM prompts to `wm_max_prompt_tokens`, and with
`batch_size` every generation call is cut into equal chunks.

Token accounting (for the compute ledger): `gen_tokens` and `wm_tokens` count,
over the rows actually asked for, the real (non-padding) prompt tokens of every
row (a prompt sampled G or K times counts G or K times, as the prefill computes
it that often) plus every generated token including the stop token.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence

import jax
import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.agents.programs import extract_program, find_program
from wmrl_jax.agents.text import generation
from wmrl_jax.agents.text import prompts as prompts_lib
from wmrl_jax.agents.text.episodes import EnvironmentMessages, episode_instructions, run_episodes
from wmrl_jax.envs.grading import DEFAULT_FLOORS
from wmrl_jax.models.sampler import sample
from wmrl_jax.worldmodel.parsing import combine, failure_counts, parse_wm_answer, to_arrays
from wmrl_jax.worldmodel.prompts import AnchorExample


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
        system_prompt: solver system prompt (default `prompts.SOLVER_SYSTEM`).
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
        self.system_prompt = prompts_lib.SOLVER_SYSTEM if system_prompt is None else system_prompt
        self.anchors_per_task = int(anchors_per_task)
        self.invalid_reward = float(invalid_reward)
        self.batch_size = batch_size
        self.wm_batch_size = wm_batch_size
        self.stop_ids = (
            tuple(stop_ids) if stop_ids is not None else generation.default_stop_ids(tokenizer)
        )
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
        return prompts_lib.chat_ids(self.tokenizer, messages, self.template_kwargs)

    def solver_messages(self, task, keep: int | None = None) -> list[dict[str, str]]:
        """Solver chat messages; `keep` cuts description + data report to that many chars."""
        actions = None
        if self.turns > 1:
            actions = episode_instructions(self.turns, self.tools.validate_rows)
        return prompts_lib.solver_messages(
            task, system_prompt=self.system_prompt, actions=actions, keep=keep
        )

    def solver_prompt_ids(self, task) -> list[int]:
        """The task's solver prompt ids (cached), at most `max_prompt_tokens` long."""
        cache_key = (task.id, task.public_dir)
        if cache_key not in self._solver_cache:
            total = len(task.description) + len(task.data_report or "")
            ids = prompts_lib.fit_ids(
                self._ids,
                lambda keep: self.solver_messages(task, keep),
                total,
                self.max_prompt_tokens,
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
        the middle (or dropped), then the task context and the program are cut
        (`prompts.fit_wm_prompt`).
        """
        anchors = self._anchors.get(task.id, ()) if anchors is None else anchors
        return prompts_lib.fit_wm_prompt(
            self._ids,
            task,
            program,
            anchors,
            limit=self.wm_max_prompt_tokens,
            transcript=transcript,
        )

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
        wm: bool = False,
        **kw,
    ):
        """Left pads `prompts` to `length`, repeats each row `repeat` times, samples.

        `generation.generate` with the agent's sampler, model, tokens, mesh and
        `batch_size` (`wm_batch_size` for the world model's calls, `wm=True`);
        without one, a single call of `call_rows` rows (default: as many as
        asked), so that asking for fewer rows does not recompile.

        Returns:
            (prompt ids [R, length], prompt mask [R, length], SampleOutput as numpy [R, M]).
        """
        return generation.generate(
            self.sample_fn,
            self.graphdef,
            params,
            prompts,
            length,
            repeat,
            key,
            pad_id=self.pad_id,
            stop_ids=self.stop_ids,
            batch_size=self.wm_batch_size if wm else self.batch_size,
            call_rows=call_rows,
            mesh=self.mesh,
            **kw,
        )

    def environment_messages(self) -> EnvironmentMessages:
        """How the environment's answers are tokenised in an episode (built once)."""
        if self._env_messages is None:
            self._env_messages = EnvironmentMessages(
                self.tokenizer, self.stop_ids, self.env_budget, self.template_kwargs
            )
        return self._env_messages

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
        """Text of each row's tokens under `mask` ([R, M] each), stop tokens left out."""
        return generation.decode(self.tokenizer, tokens, mask, self.stop_ids)

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
            wm=True,
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
