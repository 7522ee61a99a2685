r"""WMRL on MLE-Dojo with a Qwen3.5-4B checkpoint (the paper's smaller backbone).

    python -m experiments.train --config=experiments/configs/qwen3_5_4b_mledojo.py \
        --config.agent.text.checkpoint=/path/to/Qwen3.5-4B \
        --config.tasks.path=/path/to/mle-dojo/prepared \
        --config.tasks.views=/path/to/views \
        --config.tasks.split_file=/path/to/competition.json \
        --config.tasks.metrics_file=/path/to/metrics.json --workdir=/path/to/workdir

Qwen3.5-4B: 32 hybrid layers (three Gated DeltaNet, then one gated attention,
repeated) of width 2560, tied embeddings, vocabulary 248,320, attention head dim
256. The checkpoint is the published vision-language directory (`model_type`
"qwen3_5"): its language model is trained, its vision tower and MTP head are
carried through unchanged into saved policies. Everything else (tasks, sandbox,
correction, optimiser, mesh) is as in `qwen3_4b_mledojo.py`.

Variant ``:runlocal`` is that config's toy-scale check on the committed
vision-language-layout Qwen3.5 fixture.
"""

from experiments.configs.qwen3_4b_mledojo import mledojo_config

RUNLOCAL_CHECKPOINT = "tests/models/fixtures/qwen3_5_vl_tied"


def get_config(arg: str | None = None):
    """Returns the Qwen3.5-4B MLE-Dojo config; `arg` selects a variant ("runlocal")."""
    config = mledojo_config("4b", arg)
    if arg == "runlocal":
        config.agent.text.checkpoint = RUNLOCAL_CHECKPOINT  # existing field: the lock allows it
    return config
