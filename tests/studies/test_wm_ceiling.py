"""The information-ceiling command: its statistic, and one small run end to end."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from experiments import wm_ceiling


def test_group_spearman_averages_within_groups_and_skips_constant_ones():
    truth = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    pred = np.array([0.0, 1.0, 2.0, 5.0, 4.0, 3.0])
    groups = np.array([[0, 1, 2], [3, 4, 5], [0, 3, 5]])
    want = np.mean([1.0, -1.0, stats.spearmanr(pred[[0, 3, 5]], truth[[0, 3, 5]]).statistic])
    # float32 ranks and sums (the shared `core.stats` measure) against scipy's float64.
    assert wm_ceiling.group_spearman(pred, truth, groups) == pytest.approx(want, abs=1e-6)
    flat = np.ones(6)
    assert np.isnan(wm_ceiling.group_spearman(flat, truth, groups))
    pred[[0, 1, 2]] = 7.0  # the first group cannot be ranked: skipped, not counted as 0
    assert wm_ceiling.group_spearman(pred, truth, groups) == pytest.approx(-1.0, abs=1e-6)


def test_small_run_writes_its_section(tmp_path):
    docs = tmp_path / "tasks.md"
    docs.write_text("a\n<!-- wm-ceiling:begin -->\nold\n<!-- wm-ceiling:end -->\nb\n")
    wm_ceiling.main(["--groups", "20", "--wm-steps", "3", "--docs", str(docs)])
    text = docs.read_text()
    assert "old" not in text and text.startswith("a\n") and text.endswith("b\n")
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| ")][1:]
    values = {(r[1].strip(), r[2].strip()): float(r[3]) for r in rows}
    assert len(values) == 6
    # One real execution ranks a group far better than chance on the held-out tasks.
    assert values["one real execution", "-"] > 0.5
    assert all(-1.0 <= v <= 1.0 for v in values.values())
