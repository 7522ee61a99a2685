"""The memory plan of a text-agent run: what each device holds, and the micro-batches that fit.

`plan(model_config, workload, mesh, device)` is a pure function. Per device of
the (data, fsdp, tensor) mesh it counts

* **resident** state, there for the whole run: the policy params (sharded by
  `models.sharding`, counted exactly), the AdamW moments (mu in float32, as optax
  makes it from the float32 gradients; nu in the params' dtype), the frozen reference
  params when `train.loss.kl_coef` != 0, a frozen world-model copy when
  `agent.wm_params` is "initial" (a copy of the loaded params, sharded as they are),
  and the unsharded copy the agent loads onto the first device (kept while the
  trainer holds it; the worst device is planned);
* **generation** (rollouts, then world-model passes): per sequence, the decode
  cache at P + M slots (exact) and the prefill's working set (an estimate,
  `models.memory.prefill_bytes_per_row`); the largest number of rows per device
  that fits is the micro-batch, and rows x (data x fsdp) is the agent's batch;
* **training**: the float32 gradient accumulator and one micro-batch gradient,
  plus the activations of the rows of one micro-batch on one device
  (`models.memory.train_bytes_per_row`, with per-layer remat if the config asks);
  with remat, also the layers' params stacked once in the compute dtype: the
  view the layer scan runs over (`models.layer_scan`).

With LoRA (`train.lora.rank` >= 1) the base params are frozen: they are counted
once, with no optimizer moments, no gradients and no reference copy (the base is
the reference); the adapters (sharded by their rules, `models.lora`) carry the
moments and the gradients, and each sequence keeps its [tokens, r] adapter
inputs (`lora.adapter_activation_bytes`).

A plan that does not fit lists each problem with the knob that fixes it, worked
out by searching the config's own fields (lengths, micro-batches, mesh).

Example:
    >>> p = plan(architectures.get("qwen3-8b"), workload_from_config(config),
    ...          {"data": 1, "fsdp": 8, "tensor": 1}, named_device("h200"))
    >>> print(p.format()); p.fits
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

from wmrl_jax import agents
from wmrl_jax.models import lora
from wmrl_jax.models import memory as model_memory

GIB = 2**30
# Bytes of memory per device of a named accelerator ("cpu": this host's RAM, shared).
ACCELERATORS = {"h200": 141e9, "h100": 80 * GIB, "a100-80": 80 * GIB, "a100-40": 40 * GIB}
JAX_MEM_FRACTION = 0.75  # JAX's default share of an accelerator's memory.
RESERVE = 2 * GIB  # Runtime, cuBLAS / cuDNN workspaces, fragmentation.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class Device:
    """One device's memory: its name, total bytes, and the bytes a run may use."""

    name: str
    total: float
    usable: float
    note: str = ""


def named_device(name: str, mesh_devices: int = 1) -> Device:
    """A named accelerator ("h200", "h100", "a100-80", "a100-40" or "cpu").

    GPUs give JAX `XLA_PYTHON_CLIENT_MEM_FRACTION` of their memory (0.75 unless
    set); "cpu" shares this host's RAM among the mesh's devices.
    """
    key = name.strip().lower()
    if key == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / max(mesh_devices, 1)
        return Device("cpu", total, total - RESERVE, f"host RAM / {mesh_devices} devices")
    if key not in ACCELERATORS:
        raise ValueError(f"unknown device {name!r}; known: {', '.join([*ACCELERATORS, 'cpu'])}")
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", JAX_MEM_FRACTION))
    total = ACCELERATORS[key]
    note = f"JAX's share {fraction:g} (XLA_PYTHON_CLIENT_MEM_FRACTION) less {RESERVE / GIB:g} GiB"
    return Device(key, total, total * fraction - RESERVE, note)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one training step of a text agent puts on the devices (from its config).

    Attributes:
        param_dtype, compute_dtype: the agent's params dtype and the train step's.
        rollout_rows: sequences sampled per step (tasks_per_step x group_size).
        prompt_tokens, new_tokens: P and M of the rollouts (train sequences: P + M).
        anchors_per_task: executed programs shown in each world-model prompt.
        wm_samples, wm_new_tokens: answers per program, and their length.
        microbatches: `config.train.num_microbatches`.
        wm_prompt_tokens: the world model's prompt length; None: P + (1 + anchors) M,
            the agent's default.
        mu_dtype: AdamW's first moment (float32: optax promotes it to the float32
            gradients' dtype); the second moment keeps the params' dtype.
        reference: a frozen reference copy for the KL term (`kl_coef` != 0).
        frozen_wm: a frozen world-model copy (`agent.wm_params` = "initial").
        remat: per-layer rematerialisation in the train step.
        agent_kind: the agent kind whose knobs (`config.agent.<kind>.`) a
            problem names.
        unsharded_load: the agent loads its params onto the first device before
            they are sharded, and that copy stays alive (`make_agent` before it
            loaded onto the mesh).
        lora_rank, lora_targets: LoRA adapters (`train.lora`); rank 0: none, every
            param trains.
    """

    param_dtype: str
    compute_dtype: str
    rollout_rows: int
    prompt_tokens: int
    new_tokens: int
    anchors_per_task: int
    wm_samples: int
    wm_new_tokens: int
    microbatches: int
    wm_prompt_tokens: int | None = None
    mu_dtype: str = "float32"
    reference: bool = False
    frozen_wm: bool = False
    remat: bool = False
    unsharded_load: bool = False
    agent_kind: str = "text"  # Whose length knobs a problem names (config.agent.<kind>.).
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()

    @property
    def wm_prompt(self) -> int:
        default = self.prompt_tokens + (1 + self.anchors_per_task) * self.new_tokens
        return self.wm_prompt_tokens or default

    @property
    def wm_rows(self) -> int:
        return self.rollout_rows * self.wm_samples


def workload_from_config(config, **fields) -> Workload:
    """The `Workload` of a training config whose agent kind has a memory plan.

    The agent kind says its lengths, dtype and world-model sampling
    (`agents.memory_workload`); the trainer's config the rest. `fields` override
    what the config does not say, e.g. `unsharded_load=False` once the agent loads
    its params straight into their shardings.
    """
    workload = Workload(
        **agents.memory_workload(config.agent.kind, config.agent[config.agent.kind]),
        compute_dtype=config.train.compute_dtype,
        rollout_rows=config.tasks_per_step * config.group_size,
        microbatches=config.train.num_microbatches,
        reference=config.train.loss.kl_coef != 0,
        frozen_wm=config.agent.wm_params == "initial",
        remat=bool(config.train.get("remat", False)),
        agent_kind=config.agent.kind,
    )
    adapters = config.train.get("lora")
    if adapters is not None and adapters.rank:
        workload = dataclasses.replace(
            workload, lora_rank=int(adapters.rank), lora_targets=tuple(adapters.targets)
        )
    return dataclasses.replace(workload, **fields)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of one run (see the module docstring); `problems` empty = fits."""

    mesh: dict
    device: Device
    workload: Workload
    param_count: int
    resident: dict  # name -> bytes, the whole run
    grads: float
    scan_view: float  # with remat: the layers' params stacked for the layer scan
    gen_row: float  # cache + prefill, one rollout sequence
    wm_row: float  # cache + prefill, one world-model sequence
    train_row: float  # activations, one training sequence
    train_row_remat: float  # with per-layer remat and the blocked LM head
    train_row_plain: float  # without them
    train_rows: int  # training rows per device per micro-batch
    gen_gathered: float  # FSDP-gathered weights at generation's peak (in `resident`'s)
    gen_rows: int  # largest rollout rows per device
    wm_rows: int  # largest world-model rows per device
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def train_peak(self) -> float:
        """Resident state, gradients, the stacked layers and one micro-batch's activations."""
        fixed = sum(self.resident.values()) + self.grads + self.scan_view
        return fixed + self.train_rows * self.train_row

    @property
    def train_fits(self) -> bool:
        return self.train_peak <= self.device.usable

    @property
    def batch_devices(self) -> int:
        return self.mesh["data"] * self.mesh["fsdp"]

    def batch_sizes(self) -> dict[str, int]:
        """Rows per generation call, by role ("rollout", "wm"): what fits, capped at the rows.

        Each is a multiple of the batch devices (data x fsdp), so the rows and the
        decode cache split evenly; at least one row per device, even where the plan
        says none fits (the run then fails where the plan said it would).
        """
        d, w = self.batch_devices, self.workload

        def size(per_device: int, rows: int) -> int:
            return d * max(min(per_device, -(-rows // d)), 1)

        return {"rollout": size(self.gen_rows, w.rollout_rows), "wm": size(self.wm_rows, w.wm_rows)}

    def format(self) -> str:
        """The plan as a table, one line per term, in GiB."""
        w, resident = self.workload, sum(self.resident.values())
        gathered = self.resident.get(GATHERED, 0)

        def row(label: str, size: float, note: str = "") -> str:
            return f"  {label:<40}{size / GIB:8.1f} GiB{note}"

        sizes = self.batch_sizes()

        def batch(per_device: int, role: str, rows: int) -> str:
            size = sizes[role] if per_device else 0
            return f"  -> {per_device} per device, batch_size={size} of {rows}"

        remat = (
            f"  (remat; without: {self.train_row_plain / GIB:.1f} GiB)" if w.remat
            else f"  (no remat; with remat: {self.train_row_remat / GIB:.1f} GiB)"
        )  # fmt: skip
        shown = ", ".join(f"{a}={self.mesh[a]}" for a in AXES)
        lines = [
            f"memory plan per device: {self.device.name}, mesh {shown}",
            row("usable device memory", self.device.usable,
                f" of {self.device.total / GIB:.1f} ({self.device.note})" if self.device.note
                else f" of {self.device.total / GIB:.1f}"),
            f"  model: {self.param_count:,} params in {w.param_dtype}",
            *(row(name, size) for name, size in self.resident.items()),
            row("resident total", resident),
            *([row("gathered while generating (layers only)", self.gen_gathered - gathered,
                   "  (embedding and LM head gathered after the prefill)")]
              if gathered else []),
            row(f"rollout sequence ({w.prompt_tokens}+{w.new_tokens} tokens)", self.gen_row,
                batch(self.gen_rows, "rollout", w.rollout_rows)),
            row(f"WM sequence ({w.wm_prompt}+{w.wm_new_tokens} tokens)", self.wm_row,
                batch(self.wm_rows, "wm", w.wm_rows)),
            row("gradients (f32 sum + one micro-batch)", self.grads),
            *([row("layers stacked for the remat scan", self.scan_view)] if w.remat else []),
            row(f"train sequence ({w.prompt_tokens + w.new_tokens} tokens)", self.train_row, remat),
            row(f"train peak ({self.train_rows} seq/device/micro-batch)", self.train_peak),
        ]  # fmt: skip
        verdict = ["  fits"] if self.fits else [f"  DOES NOT FIT: {p}" for p in self.problems]
        return "\n".join(lines + verdict)


def _trained_per_device(config, w: Workload, mesh: Mapping[str, int]) -> int:
    """Elements per device that get gradients and moments: the adapters, else all params."""
    if w.lora_rank:
        return lora.adapter_elements(config, rank=w.lora_rank, targets=w.lora_targets, mesh=mesh)[1]
    return model_memory.param_elements_per_device(config, mesh)


def _scan_view(config, w: Workload, mesh: Mapping[str, int]) -> int:
    """Bytes of the [L, ...] copy of the layers' params (adapters included) that the
    remat train step's layer scan runs over, in the compute dtype, per device."""
    elements = model_memory.layer_elements_per_device(config, mesh)
    if w.lora_rank:
        elements += _trained_per_device(config, w, mesh)
    return elements * DTYPE_BYTES[w.compute_dtype]


def _resident(config, w: Workload, mesh: Mapping[str, int]) -> dict:
    pb = DTYPE_BYTES[w.param_dtype]
    shard = model_memory.param_elements_per_device(config, mesh)
    full = model_memory.param_count(config)
    trained = _trained_per_device(config, w, mesh)
    out = {"params (frozen base)" if w.lora_rank else "params": shard * pb}
    if w.lora_rank:
        out[f"LoRA adapters (rank {w.lora_rank})"] = trained * pb
    out["optimizer (AdamW mu, nu)"] = trained * (DTYPE_BYTES[w.mu_dtype] + pb)
    if w.reference and not w.lora_rank:  # under LoRA the frozen base is the reference
        out["reference params (KL)"] = shard * pb
    if w.frozen_wm:  # a copy of the loaded params, sharded as they are
        out["frozen WM params"] = (full if w.unsharded_load else shard) * pb
    if w.unsharded_load and math.prod(mesh.values()) > 1:  # one device: no second copy
        out["loaded params on device 0"] = full * pb
    if mesh["fsdp"] > 1:
        out[GATHERED] = _gathered(config, mesh, pb, tables=True)
    return out


GATHERED = "FSDP-gathered weights (in use)"


def _gathered(config, mesh: Mapping[str, int], pb: int, *, tables: bool) -> int:
    """Bytes of weights gathered over `fsdp` at once, per device (0 without FSDP).

    Two layers' worth, unsharded: generating, a layer's gathered weights and the
    next layer's (prefetch); training, a layer's weights gathered inside its
    checkpoint and that layer's gradients before their reduce-scatter (XLA's
    buffer assignment of the remat step). `tables`: plus the embedding and the LM
    head, as training holds them. Generating gathers the LM head only for the last
    position's logits and each decode step, after the prefill's working set is
    gone, so its peak (the prefill) holds the two layers alone (the samplers
    compiled for 8 H200s, `benchmarks.aot`).
    """
    if mesh["fsdp"] == 1:
        return 0
    elements = 2 * model_memory.largest_layer_elements(config)
    if tables:
        elements += (
            config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
        )
    return elements * pb // mesh["tensor"]


def _rows(free: float, per_row: float) -> int:
    return max(int(free // per_row), 0) if per_row > 0 else 0


def plan(config, workload: Workload, mesh: Mapping[str, int], device: Device) -> MemoryPlan:
    """The `MemoryPlan` of `workload` on `mesh` (axis sizes) of `device`s.

    Args:
        config: the decoder's typed config (`Qwen3Config` or `Qwen3_5Config`).
        workload: lengths, batch sizes and dtypes of the run.
        mesh: {"data": d, "fsdp": f, "tensor": t}.
        device: the memory of one device.

    Returns:
        A `MemoryPlan`; its `problems` name the knob to change when it does not fit.
    """
    p = _measure(config, workload, mesh, device)
    problems = list(_knobs(config, workload, p))
    return dataclasses.replace(p, problems=tuple(problems))


def _measure(config, w: Workload, mesh: Mapping[str, int], device: Device) -> MemoryPlan:
    """The plan's numbers, without the search for knobs."""
    mesh = {a: int(mesh.get(a, 1)) for a in AXES}
    pb, cb, t = DTYPE_BYTES[w.param_dtype], DTYPE_BYTES[w.compute_dtype], mesh["tensor"]
    resident = _resident(config, w, mesh)
    grads = _trained_per_device(config, w, mesh) * (4 + cb)
    scan_view = _scan_view(config, w, mesh) if w.remat else 0

    def sequence(prompt: int, new: int) -> int:
        slots = prompt + new
        cache = model_memory.cache_bytes_per_row(config, slots, pb, t)
        return cache + model_memory.prefill_bytes_per_row(config, prompt, slots, pb, t)

    tokens = w.prompt_tokens + w.new_tokens
    gen_row, wm_row = (
        sequence(w.prompt_tokens, w.new_tokens),
        sequence(w.wm_prompt, w.wm_new_tokens),
    )
    free = device.usable - sum(resident.values())
    gen_gathered = _gathered(config, mesh, pb, tables=False)
    gen_free = free + resident.get(GATHERED, 0) - gen_gathered

    def train_row(remat: bool) -> int:
        row = model_memory.train_bytes_per_row(config, tokens, cb, t, remat)
        if w.lora_rank:
            row += lora.adapter_activation_bytes(
                config, rank=w.lora_rank, targets=w.lora_targets, tokens=tokens,
                dtype_bytes=cb, remat=remat,
            )  # fmt: skip
        return row

    return MemoryPlan(
        mesh=mesh,
        device=device,
        workload=w,
        param_count=model_memory.param_count(config),
        resident=resident,
        grads=grads,
        scan_view=scan_view,
        gen_row=gen_row,
        wm_row=wm_row,
        train_row=train_row(w.remat),
        train_row_remat=train_row(True),
        train_row_plain=train_row(False),
        train_rows=-(-w.rollout_rows // (w.microbatches * mesh["data"] * mesh["fsdp"])),
        gen_gathered=gen_gathered,
        gen_rows=_rows(gen_free, gen_row),
        wm_rows=_rows(gen_free, wm_row),
        problems=(),
    )


def _ok(config, w: Workload, mesh, device, part: str) -> bool:
    """Whether `part` ("rollout", "wm" or "train") of `w` fits."""
    p = _measure(config, w, mesh, device)
    return {"rollout": p.gen_rows >= 1, "wm": p.wm_rows >= 1, "train": p.train_fits}[part]


def _ok_with(config, p: MemoryPlan, part: str, mesh=None, **changes) -> bool:
    """Whether `part` fits with some workload fields (or the mesh) changed."""
    w = dataclasses.replace(p.workload, **changes)
    return _ok(config, w, mesh or p.mesh, p.device, part)


def _largest(ok, high: int) -> int:
    """The largest n in [1, high] with ok(n), for ok true up to some n; 0 if none."""
    lo, hi = 0, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _knobs(config, w: Workload, p: MemoryPlan):
    """One message per part that does not fit, naming the config fields that fix it."""
    split = w.microbatches * p.batch_devices
    if w.rollout_rows % split:
        yield (
            f"the {w.rollout_rows} rollout rows do not split into config.train.num_microbatches="
            f"{w.microbatches} x {p.batch_devices} batch devices (data x fsdp)"
        )
    failing = {"rollout": not p.gen_rows, "wm": not p.wm_rows, "train": not p.train_fits}
    parts = [part for part, fails in failing.items() if fails]
    rows = w.rollout_rows // (w.microbatches * p.mesh["data"])  # what fsdp must divide
    wide = [f for f in (2, 4, 8, 16, 32, 64) if parts and f > p.mesh["fsdp"] and rows % f == 0]
    fsdp = next((f for f in wide if all(
        _ok_with(config, p, part, {**p.mesh, "fsdp": f}) for part in parts)), None)  # fmt: skip
    wider = f" or config.mesh.fsdp={fsdp}" if fsdp else ""
    if "rollout" in parts:
        yield (
            f"rollout: one sequence of {w.prompt_tokens}+{w.new_tokens} tokens does not fit "
            f"({_shorter(config, w, p, 'rollout')}{wider})"
        )
    if "wm" in parts:
        fixes = [_shorter(config, w, p, "wm") + " (the WM prompt holds 1 + anchors programs)"]
        fewer = [
            a for a in range(w.anchors_per_task) if _ok_with(config, p, "wm", anchors_per_task=a)
        ]
        if fewer:
            fixes.insert(0, f"{_knob_prefix(w)}anchors_per_task<={max(fewer)}")
        yield (
            f"world model: one sequence of {w.wm_prompt}+{w.wm_new_tokens} tokens does not fit "
            f"({' or '.join(fixes)}{wider})"
        )
    if "train" in parts:
        yield (
            f"training: {p.train_rows} sequence(s) of {w.prompt_tokens + w.new_tokens} tokens "
            f"per device per micro-batch do not fit ({_train_fix(config, w, p)}{wider})"
        )


def _knob_prefix(w: Workload) -> str:
    """Where the agent kind's length knobs live, e.g. "config.agent.text."."""
    return f"config.agent.{w.agent_kind}."


def _shorter(config, w: Workload, p: MemoryPlan, part: str) -> str:
    """The longest M (else P + M, halved between them) with which `part` fits."""

    def fits(prompt: int, new: int) -> bool:
        shorter = dataclasses.replace(w, prompt_tokens=prompt, new_tokens=new)
        return _ok(config, shorter, p.mesh, p.device, part)

    new = _largest(lambda m: fits(w.prompt_tokens, m), w.new_tokens)
    if new:
        return f"{_knob_prefix(w)}max_new_tokens<={new}"
    total = _largest(lambda n: fits(n - n // 2, n // 2), w.prompt_tokens + w.new_tokens)
    if total:
        return f"{_knob_prefix(w)}max_prompt_tokens + max_new_tokens <= {total}"
    return "no shorter sequence fits"


def _train_fix(config, w: Workload, p: MemoryPlan) -> str:
    """The cheapest fix: more micro-batches, then remat (and more micro-batches with it),
    else one row per micro-batch and shorter sequences."""
    fixed = sum(p.resident.values()) + p.grads + p.scan_view
    if fixed >= p.device.usable:
        return (
            f"the resident state and gradients alone need {fixed / GIB:.1f} GiB (with remat, the "
            f"stacked layers included) of the {p.device.usable / GIB:.1f} usable: more devices, "
            "or a larger "
            "XLA_PYTHON_CLIENT_MEM_FRACTION"
        )
    per_device = max(w.rollout_rows // p.batch_devices, 1)

    def micro(work: Workload) -> int | None:
        """The fewest micro-batches (dividing the rows) with which `work` trains."""
        more = (k for k in range(work.microbatches + 1, per_device + 1) if per_device % k == 0)
        fit = (k for k in more if _ok(config, dataclasses.replace(work, microbatches=k), p.mesh,
                                      p.device, "train"))  # fmt: skip
        return next(fit, None)

    k = micro(w)
    if k:
        return f"config.train.num_microbatches={k}"
    remat = ""
    if not w.remat:
        remat, w = "config.train.remat=True", dataclasses.replace(w, remat=True)
        if _ok(config, w, p.mesh, p.device, "train"):
            return remat
        k = micro(w)
        if k:
            return f"{remat} with config.train.num_microbatches={k}"
        remat += ", "
    shorter = _shorter(config, dataclasses.replace(w, microbatches=per_device), p, "train")
    return f"{remat}config.train.num_microbatches={per_device} with {shorter}"
