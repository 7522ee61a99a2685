"""Tokenizer and chat template round trips, prompt/completion boundary, padding."""

import numpy as np
import pytest

from tests.models.conftest import NAMES, load
from wmrl_jax import models


@pytest.fixture(scope="module")
def tokenizer():
    return load(NAMES[0]).tokenizer


@pytest.mark.parametrize(
    "text", ["", "x = np.mean(y[3:]) * 0.5", "héllo wörld — ünïcode ✓\n\ttabs", "<|im_end|> raw"]
)
def test_encode_decode_round_trip(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_chat_template_and_boundary(tokenizer):
    messages = [
        {"role": "system", "content": "You write programs."},
        {"role": "user", "content": "Predict the score."},
    ]
    prompt = models.render_chat(tokenizer, messages, "score = 0.91<|im_end|>")
    assert prompt.text == (
        "<|im_start|>system\nYou write programs.<|im_end|>\n"
        "<|im_start|>user\nPredict the score.<|im_end|>\n"
        "<|im_start|>assistant\nscore = 0.91<|im_end|>"
    )
    completion = prompt.ids[prompt.prompt_length :]
    assert tokenizer.decode(completion) == "score = 0.91<|im_end|>"
    assert int(completion[-1]) == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(prompt.ids) == prompt.text
    alone = models.render_chat(tokenizer, messages)
    assert alone.prompt_length == len(alone.ids) == prompt.prompt_length
    # The special tokens are single ids and the eos in config.json is <|im_end|>.
    assert load(NAMES[0]).config.eos_token_id == (tokenizer.eos_token_id,)


def test_left_pad():
    ids, mask = models.left_pad([[5, 6, 7], [8]], pad_id=0)
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 8]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1]])
    with pytest.raises(ValueError, match="more than 2"):
        models.left_pad([[1, 2, 3]], pad_id=0, length=2)
