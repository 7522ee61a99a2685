r"""The world-model readiness probe over any training config (`wmrl_jax.studies.wm_probe`).

    python -m experiments.wm_probe --config=experiments/configs/wm_probe.py \
        --workdir=outputs/wm_probe
    python -m experiments.wm_probe --config=experiments/configs/wm_probe.py:qwen3_4b_mledojo \
        --config.agent.text.checkpoint=/ckpt/Qwen3-4B --config.tasks.path=... \
        --config.probe.execution_seconds=600 \
        --config.probe.regime=outputs/regime/results.json --workdir=/runs/probe

`arg` names the training config to probe: ``<name>[:<variant>]`` of a file in
`experiments/configs/` (``tiny_cpu:runlocal``, ``qwen3_4b_mledojo``), or a path
to a config file (``path/to/config.py[:variant]``). Without one: the main job's
recipe agent (`tiny_cpu.py`), its outcomes replayed from the recipe table. The
training config's fields are overridden as usual (``--config.executor.kind=replay``,
``--config.world_model.kind=synthetic``); the probe's own are ``config.probe.*``
(`wm_probe.default_config`): k programs per task, the split, the executions per
program, your seconds per execution and model size, and the regime map to read.
"""

import importlib
import importlib.util
import os

from wmrl_jax.studies import wm_probe
from wmrl_jax.train.config import override

DEFAULT = "tiny_cpu"


def training_config(arg: str):
    """The training config `arg` names (`<name or path.py>[:<variant>]`)."""
    name, _, variant = arg.partition(":")
    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("probed_config", os.path.expanduser(name))
        if spec is None or not os.path.isfile(os.path.expanduser(name)):
            raise ValueError(f"no config file {name!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(f"experiments.configs.{name}")
        except ModuleNotFoundError:
            raise ValueError(f"no config experiments/configs/{name}.py") from None
    return module.get_config(variant or None)


def get_config(arg: str | None = None):
    """The training config `arg` names (default: `tiny_cpu`, replayed) with `config.probe`."""
    config = training_config(arg or DEFAULT)
    if not arg:
        config = override(config, **{"executor.kind": "replay"})
    config = override(config, probe=wm_probe.default_config())
    config.lock()
    return config
