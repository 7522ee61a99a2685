"""Shared fixtures: tiny task directories in the contract's on-disk layout."""

from __future__ import annotations

import csv
import json
import os

import pytest


def read_csv_rows(path):
    """A CSV file's rows as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def relative_files(root):
    """Every file below `root`, as sorted relative paths."""
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
    )


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def base_manifest(**overrides):
    manifest = {
        "format_version": 1,
        "id": "toy",
        "source": "test",
        "split": "train",
        "metric": {"name": "rmse", "direction": "lower"},
        "submission": {
            "file": "submission.csv",
            "id_column": "id",
            "target_columns": ["target"],
            "answer_column": "target",
        },
        "limits": {"wall_seconds": 60, "memory_mb": 512},
        "percentile_rule": "mid_rank",
        "leaderboards": ["private"],
    }
    manifest.update(overrides)
    return manifest


@pytest.fixture
def make_task(tmp_path):
    """`make_task(manifest=..., answers=[(id, y)], boards={name: [scores]})` -> task dir."""

    def make(*, manifest=None, answers=((0, 1.0), (1, 2.0), (2, 3.0)), boards=None):
        manifest = base_manifest() if manifest is None else manifest
        boards = {"private": [0.5, 1.0, 2.0]} if boards is None else boards
        root = tmp_path / "task"
        (root / "public").mkdir(parents=True)
        (root / "private" / "leaderboards").mkdir(parents=True)
        (root / "manifest.json").write_text(json.dumps(manifest))
        (root / "description.md").write_text("# toy\n")
        write_csv(root / "private" / "answers.csv", ["id", "target"], answers)
        for name, scores in boards.items():
            write_csv(
                root / "private" / "leaderboards" / f"{name}.csv",
                ["entry", "score"],
                [(f"e{i}", s) for i, s in enumerate(scores)],
            )
        return os.fspath(root)

    return make


@pytest.fixture(scope="session")
def builtin_suite():
    """The full built-in suite for seed 0, built once per generator source (cached on disk)."""
    from wmrl_jax.envs import builtin

    return builtin.cached_suite(seed=0)


@pytest.fixture(scope="session")
def suite_dir(tmp_path_factory) -> str:
    """The seed-0 built-in suite shared by the recipe-table tests (modules may override)."""
    from tests.envs.test_recipes import shared_suite

    return shared_suite(tmp_path_factory)


@pytest.fixture(scope="module")
def table():
    """The committed recipe table."""
    from wmrl_jax.envs import tabular

    return tabular.RecipeTable.load(tabular.DEFAULT_TABLE)
