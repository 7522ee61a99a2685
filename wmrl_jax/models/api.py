"""User-facing model object: `from_pretrained`, `.logits`, `.save_pretrained`, chat helpers."""

import dataclasses
import os
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from wmrl_jax.models import hf_io
from wmrl_jax.models.config import Qwen3Config
from wmrl_jax.models.qwen3 import Qwen3, apply
from wmrl_jax.models.qwen3_5 import Qwen3_5
from wmrl_jax.models.qwen3_5_config import Qwen3_5Config

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# The NNX module of each typed config; `config_from_dict` picks the config type.
MODULES = {Qwen3Config: Qwen3, Qwen3_5Config: Qwen3_5}


def module_class(config: Qwen3Config | Qwen3_5Config) -> type:
    """The NNX module class (`Qwen3` or `Qwen3_5`) that implements `config`."""
    if type(config) not in MODULES:
        raise TypeError(f"no model is registered for config type {type(config).__name__}")
    return MODULES[type(config)]


@dataclasses.dataclass
class Model:
    """A loaded decoder: its graph, params pytree, config and tokenizer.

    `graphdef` and `params` are the functional boundary: a train step takes
    `params` (an `nnx.State`) and calls `qwen3.apply(graphdef, params, ...)`,
    which runs either architecture.

    Attributes:
        graphdef: `nnx.GraphDef` of the `Qwen3` or `Qwen3_5` module.
        params: `nnx.State` of its parameters.
        config: typed config.
        raw_config: the `config.json` dictionary as read.
        tokenizer: a `transformers` tokenizer, or None if the directory has none.
        layout: the checkpoint layout read, reproduced by `save_pretrained`.
        source_dir: directory the model was read from.
    """

    graphdef: nnx.GraphDef
    params: nnx.State
    config: Qwen3Config | Qwen3_5Config
    raw_config: dict
    tokenizer: object = None
    layout: hf_io.CheckpointLayout | None = None
    source_dir: str | None = None

    def __post_init__(self):
        self._logits = jax.jit(apply, static_argnums=0)

    def logits(self, input_ids, attention_mask=None) -> jax.Array:
        """Float32 logits.

        Args:
            input_ids: int of shape [B, T] (left padded).
            attention_mask: optional of shape [B, T]; 1 = real token, 0 = padding.

        Returns:
            float32 array of shape [B, T, V].
        """
        ids = jnp.asarray(input_ids, jnp.int32)
        mask = None if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
        return self._logits(self.graphdef, self.params, ids, mask)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Writes config, safetensors (same layout as read) and tokenizer files to `path`."""
        hf_io.save_checkpoint(
            path,
            nnx.to_pure_dict(self.params),
            self.config,
            self.raw_config,
            self.layout,
            source_dir=self.source_dir,
        )

    @property
    def module(self) -> Qwen3 | Qwen3_5:
        """The stateful NNX module (a fresh merge of graph and params)."""
        return nnx.merge(self.graphdef, self.params)


def abstract_split(config: Qwen3Config | Qwen3_5Config, dtype=jnp.float32):
    """(graphdef, abstract params state) of the config's module, without allocating weights."""
    cls = module_class(config)
    abstract = nnx.eval_shape(lambda: cls(config, dtype=dtype, rngs=nnx.Rngs(0)))
    return nnx.split(abstract)


def from_params(config: Qwen3Config | Qwen3_5Config, params: Mapping, **kwargs) -> Model:
    """A `Model` from a params pure dict (e.g. freshly initialised or trained)."""
    dtype = jax.tree_util.tree_leaves(params)[0].dtype
    graphdef, state = abstract_split(config, dtype)
    nnx.replace_by_pure_dict(state, params)
    kwargs.setdefault("raw_config", {})
    return Model(graphdef=graphdef, params=state, config=config, **kwargs)


def qwen3_config_dict(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    tie_word_embeddings: bool = False,
    rope_theta: float = 1_000_000.0,
    eos_token_id: int | None = None,
    dtype: str = "float32",
) -> dict:
    """A Hugging Face `config.json` dictionary for a Qwen3 dense model."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "eos_token_id": eos_token_id,
        "dtype": dtype,
    }


def random_model(raw_config: Mapping, key: jax.Array, *, dtype: str = "float32") -> Model:
    """A randomly initialised model (normal(0.02) matrices, unit norms) for a config dict.

    Example:
        >>> raw = qwen3_config_dict(vocab_size=512, hidden_size=64, intermediate_size=128,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        >>> random_model(raw, jax.random.key(0)).save_pretrained("/tmp/tiny_qwen3")
    """
    from wmrl_jax.models.config import config_from_dict

    config = config_from_dict(raw_config)
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
    module = module_class(config)(config, dtype=_DTYPES[dtype], rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(module)
    return Model(graphdef=graphdef, params=params, config=config, raw_config=dict(raw_config))


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: str = "float32",
    mesh: Mesh | None = None,
    shardings=None,
    load_tokenizer: bool = True,
) -> Model:
    """Loads a local Hugging Face checkpoint directory.

    Args:
        path: directory with config.json, model.safetensors (or shards with an
            index) and optionally tokenizer files.
        dtype: "float32" or "bfloat16" parameters.
        mesh: optional (data, fsdp, tensor) mesh: each tensor is placed directly
            into its sharding (see `wmrl_jax.models.sharding`).
        shardings: optional explicit shardings pytree (pure-dict structure).
        load_tokenizer: whether to load the tokenizer through `AutoTokenizer`.

    Returns:
        A `Model`.

    Example:
        >>> model = from_pretrained("path/to/qwen3")
        >>> logits = model.logits([[1, 2, 3]])      # [1, 3, V] float32
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    raw, config = hf_io.load_config(path)
    params, layout = hf_io.load_params(
        path, config, dtype=_DTYPES[dtype], mesh=mesh, shardings=shardings
    )
    tokenizer = load_tokenizer_from(path) if load_tokenizer else None
    return from_params(
        config,
        params,
        raw_config=raw,
        tokenizer=tokenizer,
        layout=layout,
        source_dir=str(path),
    )


def load_tokenizer_from(path: str | os.PathLike):
    """`transformers.AutoTokenizer` from `path`, or None if it has no tokenizer files."""
    if not os.path.isfile(os.path.join(path, "tokenizer.json")) and not os.path.isfile(
        os.path.join(path, "tokenizer_config.json")
    ):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat prompt (and optional completion).

    Attributes:
        ids: int32 token ids of shape [T]: prompt then completion.
        prompt_length: number of prompt tokens; completion is `ids[prompt_length:]`.
        text: the rendered text.
    """

    ids: np.ndarray
    prompt_length: int
    text: str


def render_chat(
    tokenizer,
    messages: Sequence[Mapping[str, str]],
    completion: str | None = None,
    *,
    add_generation_prompt: bool = True,
) -> ChatPrompt:
    """Renders messages with the tokenizer's chat template and tokenizes them.

    The prompt is the template applied to `messages` with the assistant header
    (`add_generation_prompt`); the completion, if given, is appended as text and
    tokenized with the prompt, and the boundary is the prompt's token count. The
    boundary is checked: the prompt's ids must be a prefix of the full ids.

    Args:
        tokenizer: a `transformers` tokenizer with a chat template.
        messages: [{"role": ..., "content": ...}, ...].
        completion: optional assistant text (e.g. a sampled solution).
        add_generation_prompt: append the assistant header to the prompt.

    Returns:
        A `ChatPrompt`.

    Example:
        >>> p = render_chat(tok, [{"role": "user", "content": "hi"}], "hello<|im_end|>")
        >>> p.ids[p.prompt_length:]    # completion ids
    """
    prompt_text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    text = prompt_text if completion is None else prompt_text + completion
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if list(ids[: len(prompt_ids)]) != list(prompt_ids):
        raise ValueError("completion merges with the prompt's last token; boundary is ambiguous")
    return ChatPrompt(np.asarray(ids, np.int32), len(prompt_ids), text)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, length: int | None = None):
    """Left-pads id lists to one array.

    Returns:
        (ids int32 [B, T], mask int32 [B, T]) with T = `length` or the longest.
    """
    length = max(len(s) for s in sequences) if length is None else length
    ids = np.full((len(sequences), length), pad_id, np.int32)
    mask = np.zeros((len(sequences), length), np.int32)
    for i, s in enumerate(sequences):
        if len(s) > length:
            raise ValueError(f"sequence {i} has {len(s)} tokens, more than {length}")
        if len(s):
            ids[i, length - len(s) :] = s
            mask[i, length - len(s) :] = 1
    return ids, mask
