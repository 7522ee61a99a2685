r"""WMRL on MLE-Dojo with a Qwen3-8B-architecture checkpoint on one GPU host.

    python -m experiments.train --config=experiments/configs/qwen3_8b_mledojo.py \
        --config.agent.text.checkpoint=/path/to/Qwen3-8B --config.tasks.path=... (as for 4B)

Everything as in `qwen3_4b_mledojo.py` except the learning rate and the
number of micro-batches; ``:runlocal`` is the same toy-scale check.
"""

from experiments.configs.qwen3_4b_mledojo import mledojo_config


def get_config(arg: str | None = None):
    """Returns the Qwen3-8B MLE-Dojo config; `arg` selects a variant ("runlocal")."""
    return mledojo_config("8b", arg)
