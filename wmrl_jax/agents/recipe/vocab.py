"""The token vocabulary of the recipe LM, task prompts, and recipe <-> token conversions.

A tiny backbone writes recipes (one token per slot) for a task described by a
handful of feature tokens, and predicts the outcome as one score-bin token:

    prompt  = [BOS, type, metric, rows, features, classes, target, scale, discrete,
               nonnegative, nn1, stump, nb, linear, best, RECIPE]                  (P = 16)
    recipe  = [slot_0, slot_1, ..., slot_{S-1}]     (slot s emits only its own tokens)
    WM      = [prompt, recipe, PREDICT] -> next token over B percentile bins + 1 failure bin

Vocabulary layout (ids in this order): pad, bos, RECIPE, PREDICT; the feature
tokens of `FEATURE_GROUPS`, group by group; the slot tokens, slot by slot
(slot s value v has id `slot_offsets[s] + v`); the B percentile bins, then the
failure bin.

The prompt is computed from the task's public data only (no task id), so the
policy and the world model can generalise to unseen tasks with similar shape.
Besides the task's shape it carries landmarks (`landmarks`): the binned
cross-validated scores of four cheap probes on the training rows and which of
them scores best, the signal a reader of a data report has about which kind of
model suits the data. The observation is binned into tokens, not embedded.

Example:
    >>> vocab = RecipeVocab(slot_sizes=(4, 8, 3, 3), num_bins=10)
    >>> prompt = task_prompt(vocab, load_task("suite/iris"))      # doctest: +SKIP
    >>> tokens_from_recipes(vocab, [(0, 1, 2, 0)])
    array([[72, 77, 86, 87]], dtype=int32)
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import os
from collections.abc import Sequence

import numpy as np

from wmrl_jax.agents.recipe import landmarks

PAD, BOS, RECIPE, PREDICT = 0, 1, 2, 3
NUM_SPECIALS = 4
CLASSIFICATION_METRICS = ("accuracy", "log_loss", "auc")
REGRESSION_METRICS = ("rmse", "mae", "r2")
ROW_EDGES = (100, 200, 400, 800, 1600)
FEATURE_EDGES = (3, 5, 9, 17, 33)
LANDMARK_EDGES = (0.2, 0.4, 0.6, 0.8)
LANDMARK_LABELS = ("n/a", "<0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", ">=0.8")
# Feature groups of the prompt, in prompt order: (name, token labels).
FEATURE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("type", ("classification", "regression")),
    ("metric", (*CLASSIFICATION_METRICS, *REGRESSION_METRICS, "other")),
    ("rows", ("<100", "100-199", "200-399", "400-799", "800-1599", ">=1600")),
    ("features", ("1-2", "3-4", "5-8", "9-16", "17-32", ">=33")),
    ("classes", ("none", "2", "3", "4-5", "6-10", ">10")),
    ("target", ("balanced", "imbalanced", "symmetric", "skewed")),
    ("scale", ("homogeneous", "heterogeneous")),
    ("discrete", ("none", "some", "all")),
    ("nonnegative", ("none", "some", "all")),
    *((probe, LANDMARK_LABELS) for probe in landmarks.PROBES),
    ("best", (*landmarks.PROBES, "n/a")),
)
PROMPT_LENGTH = len(FEATURE_GROUPS) + 2  # BOS + groups + RECIPE marker


@dataclasses.dataclass(frozen=True)
class RecipeVocab:
    """Token ids of the recipe LM (hashable: usable as a static jit argument).

    Attributes:
        slot_sizes: number of values of each recipe slot; None takes
            `wmrl_jax.envs.recipes.SLOT_SIZES`.
        num_bins: B, percentile bins of equal width over [0, 1].
        failure_value: the reward the failure bin stands for (negative; rewards
            below 0 are failures, see `grading.RewardFloors`).
    """

    slot_sizes: tuple[int, ...] | None = None
    num_bins: int = 10
    failure_value: float = -0.5

    def __post_init__(self):
        sizes = self.slot_sizes
        if sizes is None:
            from wmrl_jax.envs import recipes

            sizes = recipes.SLOT_SIZES
        sizes = tuple(int(s) for s in sizes)
        if not sizes or min(sizes) < 1:
            raise ValueError(f"slot_sizes must be positive, got {sizes}")
        object.__setattr__(self, "slot_sizes", sizes)
        if self.num_bins < 1:
            raise ValueError(f"num_bins must be >= 1, got {self.num_bins}")
        if not self.failure_value < 0:
            raise ValueError(f"failure_value must be negative, got {self.failure_value}")

    @property
    def pad(self) -> int:
        return PAD

    @property
    def bos(self) -> int:
        return BOS

    @property
    def recipe(self) -> int:
        return RECIPE

    @property
    def predict(self) -> int:
        return PREDICT

    @property
    def prompt_length(self) -> int:
        """P, the fixed prompt length."""
        return PROMPT_LENGTH

    @property
    def num_slots(self) -> int:
        """S, recipe tokens per recipe."""
        return len(self.slot_sizes)

    def feature_offset(self, group: str) -> int:
        """Id of the first token of a feature group."""
        offset = NUM_SPECIALS
        for name, labels in FEATURE_GROUPS:
            if name == group:
                return offset
            offset += len(labels)
        raise ValueError(f"unknown feature group {group!r}")

    @property
    def slot_offsets(self) -> tuple[int, ...]:
        """Id of value 0 of each slot, of length S."""
        start = NUM_SPECIALS + sum(len(labels) for _, labels in FEATURE_GROUPS)
        return tuple(start + int(c) for c in np.cumsum((0, *self.slot_sizes[:-1])))

    @property
    def bin_offset(self) -> int:
        """Id of percentile bin 0; bins take ids [bin_offset, bin_offset + B + 1)."""
        return self.slot_offsets[-1] + self.slot_sizes[-1]

    @property
    def size(self) -> int:
        """Vocabulary size V."""
        return self.bin_offset + self.num_bins + 1

    def bin_ids(self) -> np.ndarray:
        """Token ids of the B percentile bins then the failure bin, int32 [B + 1]."""
        return np.arange(self.bin_offset, self.size, dtype=np.int32)

    def bin_values(self) -> np.ndarray:
        """Reward each bin stands for, float32 [B + 1]: centres of [0, 1], then failure."""
        centres = (np.arange(self.num_bins, dtype=np.float32) + 0.5) / self.num_bins
        return np.append(centres, np.float32(self.failure_value)).astype(np.float32)

    def reward_to_bin(self, reward) -> np.ndarray:
        """Bin index (0..B) of rewards: percentile r in [0, 1] -> min(floor(r B), B - 1);
        r < 0 (a failure floor) -> B. Any shape; NaN (infra error) or r > 1 raise."""
        r = np.asarray(reward, np.float64)
        if np.any(np.isnan(r)) or np.any(r > 1.0 + 1e-9):
            raise ValueError("rewards must be failure floors (< 0) or percentiles in [0, 1]")
        bins = np.minimum(np.floor(np.clip(r, 0.0, 1.0) * self.num_bins), self.num_bins - 1)
        return np.where(r < 0, self.num_bins, bins).astype(np.int32)

    def slot_mask(self) -> np.ndarray:
        """bool [S, V]: True where slot s may emit the token."""
        mask = np.zeros((self.num_slots, self.size), bool)
        for s, (offset, size) in enumerate(zip(self.slot_offsets, self.slot_sizes, strict=True)):
            mask[s, offset : offset + size] = True
        return mask

    def token_name(self, token: int) -> str:
        """Human-readable name of a token id (for debugging and reports)."""
        token = int(token)
        if 0 <= token < NUM_SPECIALS:
            return ("<pad>", "<bos>", "<recipe>", "<predict>")[token]
        for name, labels in FEATURE_GROUPS:
            offset = self.feature_offset(name)
            if offset <= token < offset + len(labels):
                return f"{name}={labels[token - offset]}"
        for s, (offset, size) in enumerate(zip(self.slot_offsets, self.slot_sizes, strict=True)):
            if offset <= token < offset + size:
                return f"slot{s}={token - offset}"
        if self.bin_offset <= token < self.size - 1:
            return f"bin{token - self.bin_offset}"
        if token == self.size - 1:
            return "bin_fail"
        raise ValueError(f"token {token} is outside the vocabulary of size {self.size}")


def _bucket(value: float, edges: Sequence[float]) -> int:
    return int(np.searchsorted(np.asarray(edges), value, side="right"))


def _read_train(path: str) -> tuple[list[str], np.ndarray]:
    """Header and float64 rows of a CSV; non-numeric cells become NaN."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)

        def num(cell: str) -> float:
            try:
                return float(cell)
            except ValueError:
                return float("nan")

        rows = [[num(c) for c in row] for row in reader if row]
    data = np.asarray(rows, np.float64).reshape(len(rows), len(header))
    return header, data


_LANDMARK_CACHE: dict[tuple, dict[str, float]] = {}


def _landmarks_of(path: str, x: np.ndarray, y: np.ndarray, classification: bool):
    """`landmarks.landmarks`, cached per training file (path, size, mtime)."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns, classification)
    if key not in _LANDMARK_CACHE:
        _LANDMARK_CACHE[key] = landmarks.landmarks(x, y, classification=classification)
    return _LANDMARK_CACHE[key]


def _landmark_features(scores: dict[str, float]) -> dict[str, int]:
    """Bins of the probes' scores ("n/a" for NaN) and the best probe."""
    out = {
        name: 0 if not np.isfinite(v) else 1 + _bucket(v, LANDMARK_EDGES)
        for name, v in scores.items()
    }
    finite = [(v, -k) for k, v in enumerate(scores.values()) if np.isfinite(v)]
    out["best"] = -max(finite)[1] if finite else len(landmarks.PROBES)
    return out


def _share(columns: np.ndarray) -> int:
    """0 when no column has the property, 2 when all do, else 1."""
    return 0 if not columns.any() else 2 if columns.all() else 1


def _column_types(x: np.ndarray) -> dict[str, int]:
    """How many feature columns hold only integers, and only non-negative values."""
    finite = np.where(np.isfinite(x), x, 0.0)
    return {
        "discrete": _share(np.all(finite == np.round(finite), axis=0)),
        "nonnegative": _share(np.all(finite >= 0, axis=0)),
    }


def task_features(task) -> dict[str, int]:
    """Bucket index of every feature group for a `wmrl_jax.envs.task.Task`.

    Reads `public/train.csv` (columns `id`, features, target column(s)):
    task type (classification iff the metric is accuracy/log_loss/auc; a custom
    grader counts as classification iff its columns are `p_*`), metric, number
    of training rows and of features, number of classes (from the submission's
    `p_*` columns, else the distinct targets), target shape (classes balanced
    when the rarest class has >= half the count of the commonest; regression
    targets skewed when |skewness| >= 1), feature scale (heterogeneous when
    feature standard deviations span more than a factor of 10), feature type
    (how many columns hold only integers: none, some, all), the four probes'
    landmark scores binned at `LANDMARK_EDGES` ("n/a" when too few rows) and the
    best-scoring probe (the first on a tie).
    """
    metric = task.metric.name
    columns = tuple(task.submission.target_columns)
    if metric is None:
        is_cls = all(c.startswith("p_") for c in columns)
    else:
        is_cls = metric in CLASSIFICATION_METRICS
    header, data = _read_train(os.path.join(task.public_dir, "train.csv"))
    answer = task.submission.answer_column
    target_names = {answer, *columns}
    feature_cols = [
        j for j, h in enumerate(header) if h != task.submission.id_column and h not in target_names
    ]
    if answer not in header:
        raise ValueError(f"task {task.id!r}: train.csv has no {answer!r} column")
    y = data[:, header.index(answer)]
    y = y[np.isfinite(y)]
    x = data[:, feature_cols]
    if is_cls:
        counts = np.unique(y, return_counts=True)[1]
        num_classes = len(columns) if columns[0].startswith("p_") else len(counts)
        classes = _bucket(num_classes, (3, 4, 6, 11)) + 1
        target = 0 if counts.size and counts.min() * 2 >= counts.max() else 1
    else:
        classes = 0
        std = y.std() if y.size else 0.0
        skew = float(np.mean(((y - y.mean()) / std) ** 3)) if std > 0 else 0.0
        target = 2 if abs(skew) < 1.0 else 3
    with np.errstate(invalid="ignore"):
        stds = np.nanstd(x, axis=0) if x.size else np.zeros(0)
    stds = stds[np.isfinite(stds) & (stds > 0)]
    scale = int(stds.size > 0 and stds.max() > 10.0 * stds.min())
    metric_labels = dict(FEATURE_GROUPS)["metric"]
    rows = np.isfinite(data[:, header.index(answer)])
    scores = _landmarks_of(
        os.path.join(task.public_dir, "train.csv"), x[rows], data[rows, header.index(answer)],
        is_cls,
    )  # fmt: skip
    return {
        "type": 0 if is_cls else 1,
        "metric": metric_labels.index(metric)
        if metric in metric_labels
        else len(metric_labels) - 1,
        "rows": _bucket(data.shape[0], ROW_EDGES),
        "features": _bucket(len(feature_cols), FEATURE_EDGES),
        "classes": classes,
        "target": target,
        "scale": scale,
        **_column_types(x),
        **_landmark_features(scores),
    }


def task_prompt(vocab: RecipeVocab, task) -> np.ndarray:
    """The fixed-length prompt of a task: int32 [P] = [BOS, feature tokens..., RECIPE].

    Example:
        >>> task_prompt(vocab, load_task("suite/iris")).shape       # doctest: +SKIP
        (16,)
    """
    features = task_features(task)
    ids = [vocab.feature_offset(name) + features[name] for name, _ in FEATURE_GROUPS]
    return np.asarray([BOS, *ids, RECIPE], np.int32)


def tokens_from_recipes(vocab: RecipeVocab, recipes) -> np.ndarray:
    """Recipe tokens, int32 [N, S], from N recipes (NamedTuples, tuples or an int [N, S]
    array of slot values)."""
    values = np.asarray([tuple(r) for r in recipes] if not hasattr(recipes, "shape") else recipes)
    if values.ndim != 2 or values.shape[1] != vocab.num_slots:
        raise ValueError(f"recipes must have shape [N, {vocab.num_slots}], got {values.shape}")
    sizes = np.asarray(vocab.slot_sizes)
    if values.size and (values.min() < 0 or np.any(values >= sizes)):
        raise ValueError(f"recipe slot values out of range for slot sizes {vocab.slot_sizes}")
    return (values + np.asarray(vocab.slot_offsets)).astype(np.int32)


def slots_from_tokens(vocab: RecipeVocab, tokens) -> np.ndarray:
    """Slot values, int32 [N, S], of recipe tokens of shape [N, S]; raises on a token
    outside its slot's range."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] != vocab.num_slots:
        raise ValueError(
            f"recipe tokens must have shape [N, {vocab.num_slots}], got {tokens.shape}"
        )
    values = tokens - np.asarray(vocab.slot_offsets)
    if values.size and (values.min() < 0 or np.any(values >= np.asarray(vocab.slot_sizes))):
        raise ValueError("a recipe token is not a token of its slot")
    return values.astype(np.int32)


def recipes_from_tokens(vocab: RecipeVocab, tokens) -> list:
    """`recipes.Recipe`s (plain tuples when the slot count differs from the recipe module's)
    of recipe tokens of shape [N, S]."""
    values = slots_from_tokens(vocab, tokens)
    try:
        from wmrl_jax.envs import recipes

        make = recipes.Recipe if len(recipes.SLOTS) == vocab.num_slots else tuple
    except ImportError:
        make = tuple
    return [make(*map(int, row)) if make is not tuple else tuple(map(int, row)) for row in values]


recipe_from_tokens = recipes_from_tokens


def all_recipe_tokens(vocab: RecipeVocab) -> np.ndarray:
    """Tokens of every recipe, int32 [R, S], R = prod(slot_sizes), in
    `recipes.recipe_from_index` order when the slot sizes are the recipe module's,
    else row-major (last slot fastest)."""
    try:
        from wmrl_jax.envs import recipes

        if tuple(recipes.SLOT_SIZES) == vocab.slot_sizes:
            rows = [tuple(recipes.recipe_from_index(i)) for i in range(recipes.NUM_RECIPES)]
            return tokens_from_recipes(vocab, rows)
    except ImportError:
        pass
    rows = list(itertools.product(*(range(s) for s in vocab.slot_sizes)))
    return tokens_from_recipes(vocab, rows)
