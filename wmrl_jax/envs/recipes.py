"""The recipe action space: four tokens that compile to a real solution program.

A small or randomly initialised policy cannot write free-form Python, but it
can pick a recipe: a preprocessing step, a model family and two hyperparameter
levels `a` and `b` whose meaning depends on the family. `compile_program`
turns a recipe into a readable, self-contained, seeded Python program (numpy
and scikit-learn only) that reads the task's CSVs and writes the submission in
the task's exact format; it is executed and graded like any other program.

Programs vary as real ML does: each holds out a seeded validation split of the
training rows (`VALIDATION`), fits on the rest, prints its validation score and
seeds its model with the replicate index the executor passes in the
environment variable `REPLICATE_ENV` (`WMRL_REPLICATE`, a non-negative integer;
unset means 0). One program run under replicates 0, 1, 2 is three executions
with different model seeds and splits; the same replicate gives the same file.

The space runs from bad (a uniform guess on raw features) to good (scaled
features into a tuned forest or boosting), with flat and costly directions, so
that the best recipes are competitive on a leaderboard without owning it.

Example:
    >>> r = recipe_from_index(100)
    >>> recipe_index(r) == 100
    True
    >>> describe(Recipe(preprocess=1, model=5, a=2, b=0))
    'standard/forest/a=2/b=0 (n_estimators=200, max_depth=4)'
"""

from __future__ import annotations

import json
from typing import NamedTuple

from wmrl_jax.envs.task import Task

SLOTS: tuple[str, ...] = ("preprocess", "model", "a", "b")
PREPROCESS: tuple[str, ...] = ("none", "standard", "quantile", "poly2")
MODELS: tuple[str, ...] = (
    "prior", "naive_bayes", "linear", "knn", "tree", "forest", "boosting", "mlp",
)  # fmt: skip
LEVELS = 3
SLOT_SIZES: tuple[int, ...] = (len(PREPROCESS), len(MODELS), LEVELS, LEVELS)
NUM_RECIPES: int = SLOT_SIZES[0] * SLOT_SIZES[1] * SLOT_SIZES[2] * SLOT_SIZES[3]
CLASSIFICATION_METRICS = ("accuracy", "log_loss", "auc")
REGRESSION_METRICS = ("rmse", "mae", "r2")
# The environment variable carrying the replicate index; executors set it
# (`outcomes.SandboxOutcomes`, `table_build.run_in_process`).
REPLICATE_ENV = "WMRL_REPLICATE"
# Share of the training rows every program holds out to report a validation score.
VALIDATION = 0.2
# Mixed into every probability row: one confident mistake must not cost the whole log-loss.
HEDGE = 0.005
FRACTIONS = (0.1, 0.3, 1.0)
# Task generation 2 (`families.GENERATION`) adds failures a reader of the task and the
# recipe can foresee: naive Bayes levels a=0, 1 become a multinomial (count) model, which
# refuses negative features (any scaled, transformed or signed data), and on a
# regression target the family is a classifier, which refuses a continuous target.
_NB_GEN2_ALPHA = (1.0, 1e-2)
_KNN_WEIGHTS = ("uniform", "distance", "manhattan")


class Param(NamedTuple):
    """One hyperparameter slot of a family: name and levels (classification, regression)."""

    name: str
    cls: tuple
    reg: tuple


# Family -> (estimator names (classification, regression), module, slot a, slot b).
_FAMILIES = {
    "prior": (
        ("DummyClassifier", "DummyRegressor"), "sklearn.dummy",
        Param("strategy", ("uniform", "stratified", "prior"), ("quantile", "median", "mean")),
        Param("fraction", FRACTIONS, FRACTIONS),
    ),
    "naive_bayes": (
        ("GaussianNB", "BayesianRidge"), ("sklearn.naive_bayes", "sklearn.linear_model"),
        Param("smoothing", (1e-1, 1e-5, 1e-9), (1e2, 1.0, 1e-2)),
        Param("fraction", FRACTIONS, FRACTIONS),
    ),
    "linear": (
        ("LogisticRegression", "Ridge"), "sklearn.linear_model",
        Param("C", (0.01, 1.0, 100.0), (100.0, 1.0, 0.01)),
        Param("fraction", FRACTIONS, FRACTIONS),
    ),
    "knn": (
        ("KNeighborsClassifier", "KNeighborsRegressor"), "sklearn.neighbors",
        Param("n_neighbors", (1, 7, 31), (1, 7, 31)),
        Param("weights", _KNN_WEIGHTS, _KNN_WEIGHTS),
    ),
    "tree": (
        ("DecisionTreeClassifier", "DecisionTreeRegressor"), "sklearn.tree",
        Param("max_depth", (2, 6, None), (2, 6, None)),
        Param("min_samples_leaf", (1, 5, 20), (1, 5, 20)),
    ),
    "forest": (
        ("RandomForestClassifier", "RandomForestRegressor"), "sklearn.ensemble",
        Param("n_estimators", (10, 50, 200), (10, 50, 200)),
        Param("max_depth", (4, 10, None), (4, 10, None)),
    ),
    "boosting": (
        ("HistGradientBoostingClassifier", "HistGradientBoostingRegressor"), "sklearn.ensemble",
        Param("learning_rate", (0.03, 0.1, 0.3), (0.03, 0.1, 0.3)),
        Param("max_iter", (10, 30, 100), (10, 30, 100)),
    ),
    "mlp": (
        ("MLPClassifier", "MLPRegressor"), "sklearn.neural_network",
        Param("hidden", (8, 32, 128), (8, 32, 128)),
        Param("alpha", (1.0, 1e-2, 1e-4), (1.0, 1e-2, 1e-4)),
    ),
}  # fmt: skip


class Recipe(NamedTuple):
    """One point of the space: an index into each slot of `SLOTS`."""

    preprocess: int
    model: int
    a: int
    b: int


def recipe_from_index(i: int) -> Recipe:
    """The recipe with flat index `i` in [0, NUM_RECIPES), slots in row-major order."""
    if not 0 <= int(i) < NUM_RECIPES:
        raise ValueError(f"recipe index must be in [0, {NUM_RECIPES}), got {i}")
    digits, rest = [], int(i)
    for size in reversed(SLOT_SIZES):
        rest, d = divmod(rest, size)
        digits.append(d)
    return Recipe(*reversed(digits))


def recipe_index(r: Recipe) -> int:
    """The flat index of `r`; inverse of `recipe_from_index`."""
    _check(r)
    i = 0
    for value, size in zip(r, SLOT_SIZES, strict=True):
        i = i * size + int(value)
    return i


def _check(r: Recipe) -> None:
    if len(r) != len(SLOTS) or any(not 0 <= int(v) < s for v, s in zip(r, SLOT_SIZES, strict=True)):
        raise ValueError(f"recipe {tuple(r)} is outside the slot sizes {SLOT_SIZES}")


def _param_text(p: Param, level: int) -> str:
    c, g = p.cls[level], p.reg[level]
    return f"{p.name}={c!r}" if c == g else f"{p.name}={c!r}|{g!r}"


def failure_modes() -> bool:
    """Whether programs are compiled with generation 2's foreseeable failures."""
    from wmrl_jax.envs import families

    return families.GENERATION >= 2


def describe(r: Recipe) -> str:
    """A short readable name, e.g. "standard/forest/a=2/b=0 (n_estimators=200, max_depth=4)".

    Where classification and regression levels differ both are shown, "cls|reg".
    """
    _check(r)
    family = MODELS[r.model]
    _, _, pa, pb = _FAMILIES[family]
    first = _param_text(pa, r.a)
    if family == "naive_bayes" and failure_modes():
        model = f"multinomial alpha={_NB_GEN2_ALPHA[r.a]!r}" if r.a < 2 else "gaussian"
        first = f"{model}|GaussianNB on the target"
    params = f"{first}, {_param_text(pb, r.b)}"
    return f"{PREPROCESS[r.preprocess]}/{family}/a={r.a}/b={r.b} ({params})"


def is_classification(task: Task) -> bool:
    """Whether recipes treat `task` as classification (by its named metric)."""
    name = task.metric.name
    if name in CLASSIFICATION_METRICS:
        return True
    if name in REGRESSION_METRICS:
        return False
    raise ValueError(
        f"task {task.id!r}: recipes need a named metric in "
        f"{CLASSIFICATION_METRICS + REGRESSION_METRICS}, got {name or task.metric.grader!r}"
    )


def _lit(value) -> str:
    """A Python literal in the generated code's quote style (double quotes)."""
    return json.dumps(value) if isinstance(value, str | list) else repr(value)


def _estimator(family: str, a, b, cls: bool) -> tuple[str, str]:
    """(import line, constructor expression) for a family at levels (a, b)."""
    names, modules, _, _ = _FAMILIES[family]
    name = names[0 if cls else 1]
    module = modules if isinstance(modules, str) else modules[0 if cls else 1]
    seed = "random_state=SEED"
    if family == "prior":
        args = f"strategy={_lit(a)}" + (", quantile=0.1" if a == "quantile" else "")
        if a == "stratified":
            args += f", {seed}"
    elif family == "naive_bayes":
        args = f"var_smoothing={a!r}" if cls else f"lambda_init={a!r}"
    elif family == "linear":
        args = f"C={a!r}, max_iter=1000" if cls else f"alpha={a!r}"
    elif family == "knn":
        weights = "uniform" if b == "manhattan" else b
        args = f"n_neighbors=min({a}, len(y_fit)), weights={_lit(weights)}"
        args += ", p=1" if b == "manhattan" else ""
    elif family == "tree":
        args = f"max_depth={a!r}, min_samples_leaf={b!r}, {seed}"
    elif family == "forest":
        args = f"n_estimators={a!r}, max_depth={b!r}, {seed}"
    elif family == "boosting":
        args = f"learning_rate={a!r}, max_iter={b!r}, max_leaf_nodes=15, early_stopping=False, "
        args += seed
    else:
        args = f"hidden_layer_sizes=({a},), alpha={b!r}, max_iter=100, {seed}"
    return f"from {module} import {name}", f"{name}({args})"


_PREPROCESS_CODE = {
    "none": (None, None),
    "standard": ("from sklearn.preprocessing import StandardScaler", "StandardScaler()"),
    "quantile": (
        "from sklearn.preprocessing import QuantileTransformer",
        "QuantileTransformer(\n    n_quantiles=min(1000, len(x_fit)), "
        'output_distribution="normal", random_state=SEED\n)',
    ),
    "poly2": (
        "from sklearn.pipeline import make_pipeline\n"
        "from sklearn.preprocessing import PolynomialFeatures, StandardScaler",
        "make_pipeline(\n    StandardScaler(),\n"
        "    PolynomialFeatures(degree=2, include_bias=False),\n    StandardScaler(),\n)",
    ),
}

_READ = '''

def read_csv(path):
    """The header and the non-empty rows of a CSV file, as strings."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [row for row in csv.reader(f) if row]
    return rows[0], rows[1:]


input_dir, output_dir = os.environ["WMRL_INPUT_DIR"], os.environ["WMRL_OUTPUT_DIR"]
train_header, train_rows = read_csv(os.path.join(input_dir, "train.csv"))
test_header, test_rows = read_csv(os.path.join(input_dir, "test.csv"))
features = [name for name in train_header if name not in ({id}, {answer})]
train_cols = [train_header.index(name) for name in features]
test_cols = [test_header.index(name) for name in features]
x_train = np.array([[float(row[j]) for j in train_cols] for row in train_rows])
y_train = np.array([float(row[train_header.index({answer})]) for row in train_rows])
x_test = np.array([[float(row[j]) for j in test_cols] for row in test_rows])
ids = [row[test_header.index({id})] for row in test_rows]
'''

_SPLIT = """
# Hold out a seeded validation split; fit on the other rows{subsample_note}.
rng = np.random.default_rng(SEED)
order = rng.permutation(len(y_train))
n_valid = max(1, int(round(VALIDATION * len(y_train))))
x_valid, y_valid = x_train[order[:n_valid]], y_train[order[:n_valid]]
fit_rows = {fit_rows}
x_fit, y_fit = x_train[fit_rows], y_train[fit_rows]
"""

_TRANSFORM = """
transform = {ctor}.fit(x_fit)
x_fit, x_valid, x_test = (transform.transform(x) for x in (x_fit, x_valid, x_test))
"""

_CLASSIFY = """
y_fit = y_fit.astype(int)
num_classes = {num_classes}
model = {ctor}
if len(np.unique(y_fit)) < 2:  # one class in the fitted rows: predict its prior instead
    model = DummyClassifier(strategy="prior")
model.fit(x_fit, y_fit)


def predict_proba(x):
    proba = np.zeros((len(x), num_classes))
    # Classes absent from the fitted rows keep probability 0 before the hedge.
    proba[:, model.classes_.astype(int)] = model.predict_proba(x)
    return (1.0 - HEDGE) * proba + HEDGE / num_classes


proba, valid_proba = predict_proba(x_test), predict_proba(x_valid)
"""

_REGRESS = """
# Fit on a standardised target so that every family sees the same scale.
y_mean, y_scale = y_fit.mean(), y_fit.std() or 1.0
model = {ctor}
model.fit(x_fit, (y_fit - y_mean) / y_scale)
prediction = model.predict(x_test) * y_scale + y_mean
valid_prediction = model.predict(x_valid) * y_scale + y_mean
"""

# The validation score, by the task's metric (what a competitor checks before submitting).
_VALIDATE = {
    "accuracy": ("accuracy_score", "accuracy_score(y_valid, np.argmax(valid_proba, axis=1))"),
    "log_loss": ("log_loss", "log_loss(y_valid, valid_proba, labels=list(range(num_classes)))"),
    "auc": (
        "roc_auc_score",
        "roc_auc_score(y_valid, valid_proba[:, 1]) if num_classes == 2 else roc_auc_score(\n"
        '        y_valid, valid_proba, multi_class="ovr", labels=list(range(num_classes))\n'
        "    )",
    ),
    "rmse": ("mean_squared_error", "mean_squared_error(y_valid, valid_prediction) ** 0.5"),
    "mae": ("mean_absolute_error", "mean_absolute_error(y_valid, valid_prediction)"),
    "r2": ("r2_score", "r2_score(y_valid, valid_prediction)"),
}

_REPORT = """
try:
    valid_score = {expr}
except ValueError as e:  # e.g. AUC on a split with one class
    print(f"validation {name}: undefined ({{e}})")
else:
    print(f"validation {name}: {{valid_score:.6f}} on {{len(y_valid)}} held-out rows")
"""

_WRITE = """
with open(os.path.join(output_dir, {file}), "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\\n")
    writer.writerow({header})
    for row_id, value in zip(ids, {values}):
        writer.writerow([row_id, {cells}])
"""


def compile_program(r: Recipe, task: Task) -> str:
    """The Python source of recipe `r` for `task`; same inputs give the same text.

    The program reads `$WMRL_INPUT_DIR/{train,test}.csv`, holds out a
    `VALIDATION` share of the training rows drawn with seed `$WMRL_REPLICATE`
    (default 0), fits a model seeded the same way on the other rows, prints its
    validation score and writes the task's submission file under
    `$WMRL_OUTPUT_DIR`: one probability per class for log_loss / auc (hedged
    away from 0 and 1), a class index for accuracy, a value for regression.

    Args:
        r: the recipe.
        task: the task; only its metric and submission spec are read.

    Raises:
        ValueError: `r` is out of range, or the task's metric is not a named one.
    """
    _check(r)
    cls = is_classification(task)
    spec = task.submission
    family, prep = MODELS[r.model], PREPROCESS[r.preprocess]
    _, _, pa, pb = _FAMILIES[family]
    a, b = (pa.cls, pb.cls) if cls else (pa.reg, pb.reg)
    a, b = a[r.a], b[r.b]
    model_import, ctor = _estimator(family, a, b, cls)
    if family == "naive_bayes" and failure_modes() and not (cls and r.a == 2):
        model_import, ctor = (
            (
                "from sklearn.naive_bayes import MultinomialNB",
                f"MultinomialNB(alpha={_NB_GEN2_ALPHA[r.a]!r})",
            )
            if cls
            else ("from sklearn.naive_bayes import GaussianNB", "GaussianNB()")
        )
    prep_import, prep_ctor = _PREPROCESS_CODE[prep]
    imports = {model_import} | ({prep_import} if prep_import else set())
    if cls:
        imports.add("from sklearn.dummy import DummyClassifier")
    metric_fn, metric_expr = _VALIDATE[task.metric.name]
    imports.add(f"from sklearn.metrics import {metric_fn}")
    subsample = pb.name == "fraction" and b < 1.0
    constants = [
        "# The replicate index seeds the model and the splits (one run of a replicated study).",
        f'SEED = int(os.environ.get({_lit(REPLICATE_ENV)}, "0"))',
        f"VALIDATION = {VALIDATION!r}",
    ]
    constants += [f"FRACTION = {b!r}"] if subsample else []
    constants += [f"HEDGE = {HEDGE!r}"] if cls else []
    doc = (
        f'"""Recipe {describe(r)} for task {task.id!r}.\n\n'
        f"Metric {task.metric.name} ({task.metric.direction} is better); writes "
        f"{spec.file} with columns {[spec.id_column, *spec.target_columns]}.\n"
        'Compiled from a recipe: numpy and scikit-learn only, seeded by the replicate.\n"""\n\n'
    )
    parts = [
        doc,
        "import csv\nimport os\nimport warnings\n\n"
        "# One core, as the task limits say; set before numpy loads its thread pools.\n"
        'os.environ.setdefault("OMP_NUM_THREADS", "1")\n\n'
        "import numpy as np  # noqa: E402\n"
        + "".join(f"{line}  # noqa: E402\n" for line in sorted("\n".join(imports).split("\n")))
        + "\n"
        + "\n".join(constants)
        + "\n"
        + 'warnings.filterwarnings("ignore")  # convergence warnings are part of the recipe\n',
        _READ.format(id=_lit(spec.id_column), answer=_lit(spec.answer_column)),
        _SPLIT.format(
            subsample_note=" (a seeded FRACTION of them)" if subsample else "",
            fit_rows=(
                "order[n_valid:]\n"
                "fit_rows = np.sort(fit_rows[: max(10, int(round(FRACTION * len(fit_rows))))])"
                if subsample
                else "np.sort(order[n_valid:])"
            ),
        ),
        _TRANSFORM.format(ctor=prep_ctor) if prep_ctor else "",
    ]
    columns = list(spec.target_columns)
    if cls:
        probabilities = all(c.startswith("p_") for c in columns) and len(columns) >= 2
        num_classes = len(columns) if probabilities else "max(2, int(y_train.max()) + 1)"
        parts.append(_CLASSIFY.format(num_classes=num_classes, ctor=ctor))
        if probabilities:
            values, cells = "proba", "*(repr(float(p)) for p in value)"
        elif task.metric.name == "accuracy":
            values, cells = "np.argmax(proba, axis=1)", "int(value)"
        else:  # a single-column auc: the positive-class probability
            values, cells = "proba[:, 1]", "repr(float(value))"
    else:
        parts.append(_REGRESS.format(ctor=ctor))
        values, cells = "prediction", "repr(float(value))"
    parts.append(_REPORT.format(expr=metric_expr, name=task.metric.name))
    parts.append(
        _WRITE.format(
            file=_lit(spec.file),
            header=_lit([spec.id_column, *columns]),
            values=values,
            cells=cells,
        )
    )
    return "".join(parts)
