"""The studies' one moving average: trailing, NaN-aware, shorter windows at the start."""

from __future__ import annotations

import numpy as np


def trailing_mean(x: np.ndarray, window: int, *, over_seeds: bool = False) -> np.ndarray:
    """Trailing moving average along the last axis.

    Point t averages the finite values among x[..., t - window + 1 : t + 1]
    (fewer at the start); NaN where that window holds none. NaN values are
    left out, never read as 0.

    Args:
      x: array of shape [..., T].
      window: points in the average (1 returns `x`, NaN kept).
      over_seeds: first average over axis 0 (seeds, NaN-aware), then smooth.

    Returns:
      Array of shape [..., T] (of shape [T] with `over_seeds` on a 2-D `x`).

    Example:
      >>> trailing_mean(np.array([1.0, 3.0, np.nan, 5.0]), 2)
      array([1., 2., 3., 5.])
    """
    x = np.asarray(x, np.float64)
    if over_seeds:
        finite = np.isfinite(x)
        count = finite.sum(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            x = np.where(count > 0, np.where(finite, x, 0.0).sum(0) / count, np.nan)
    window = max(1, int(window))
    pad = [(0, 0)] * (x.ndim - 1) + [(1, 0)]
    finite = np.isfinite(x)
    total = np.cumsum(np.pad(np.where(finite, x, 0.0), pad), axis=-1)
    count = np.cumsum(np.pad(finite.astype(np.float64), pad), axis=-1)
    n = np.arange(1, x.shape[-1] + 1)
    lo = n - np.minimum(n, window)
    num, den = total[..., n] - total[..., lo], count[..., n] - count[..., lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
