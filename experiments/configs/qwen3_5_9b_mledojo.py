r"""WMRL on MLE-Dojo with a Qwen3.5-9B checkpoint (the paper's larger backbone).

    python -m experiments.train --config=experiments/configs/qwen3_5_9b_mledojo.py \
        --config.agent.text.checkpoint=/path/to/Qwen3.5-9B --config.tasks.path=... (as for 4B)

Qwen3.5-9B: 32 hybrid layers of width 4096, untied embeddings, vocabulary
248,320, attention head dim 256. Hyperparameters as `qwen3_8b_mledojo.py`
(learning rate, micro-batches); ``:runlocal`` runs the text-only Qwen3.5
fixture (untied, non-default layer types).
"""

from experiments.configs.qwen3_4b_mledojo import mledojo_config

RUNLOCAL_CHECKPOINT = "tests/models/fixtures/qwen3_5_text_untied"


def get_config(arg: str | None = None):
    """Returns the Qwen3.5-9B MLE-Dojo config; `arg` selects a variant ("runlocal")."""
    config = mledojo_config("8b", arg)
    if arg == "runlocal":
        config.agent.text.checkpoint = RUNLOCAL_CHECKPOINT  # existing field: the lock allows it
    return config
