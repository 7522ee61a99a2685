"""Where a probed world model sits on the regime map, and what the map recommends there.

The regime map (`wmrl_jax.studies.regime`, `make regime`) measures, per world-model
arm, realised quality q, seconds per execution and model size N, how much less
compute than the best real-execution GRPO (`real_best`) the arm needs to reach
`real_best`'s final held-out level (`ratio_vs_best_real`, median over seeds),
and `anchors_only`'s ratio at each cost. Given a probe's q and the user's cost,
`readout` picks the map's cell for that cost and N, reads each arm's median
ratio at q (linear in realised q between the synthetic cells, as the map's
`q_break_even` is), and recommends what reaches `real_best`'s level for the
least compute: a world-model arm at the map's ρ, `anchors_only` at that ρ, or
real GRPO itself.

The cost cell is the map's dearest cost at or below the user's (a world model
pays more the dearer an execution is, so this errs against it); a cost below
the map's cheapest uses the cheapest (its recorded seconds when the map has
them) and says so. N is the map's size nearest to the user's on a log scale;
without one, the map's largest (the dearest world-model pass).

Example:
    >>> out = readout(payload, q=0.4, seconds=300.0, params=4e9)   # doctest: +SKIP
    >>> out["recommendation"]["arm"], out["recommendation"]["rho"]  # doctest: +SKIP
    ('wmrl', 0.1)
"""

from __future__ import annotations

import json
import math

import numpy as np

from wmrl_jax.studies.regime import CONTROL, TARGET, cost_key

Q_MEANING = (
    "the map's q is the realised within-group Spearman correlation of the world model's "
    "predictions with the truth (a program's mean reward over the recipe table's "
    "replicates) on the policy's groups of G programs, over programs not yet executed in "
    "the run, averaged over its updates and seeds (`oracle/wm_oos_group_rank_corr`)"
)


def load_map(path: str) -> dict:
    """The regime map's `results.json` (`python -m experiments.regime`); ValueError naming
    the file when it is absent or not a map."""
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no regime map at {path}: `make regime` writes one") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    a = payload.get("analysis") if isinstance(payload, dict) else None
    need = ("rows", "break_even", "costs", "params", "anchors_only_vs_best_real", "arms")
    if not isinstance(a, dict) or any(k not in a for k in need):
        raise ValueError(f"{path} is not a regime map's results.json (no analysis with {need})")
    return payload


def pick_cost(costs, seconds: float) -> tuple[float | None, str]:
    """The map's cost cell for `seconds` per execution, and a note on how it was picked."""
    numeric = sorted(c for c in costs if c is not None)
    below = [c for c in numeric if c <= seconds]
    if below:
        c = below[-1]
        note = "" if c == seconds else f"the map's dearest cost at or below {seconds:.3g} s"
        if c == numeric[-1] and seconds > c:
            note = f"above the map's dearest cost ({c:g} s): read there, a lower bound"
        return c, note
    if None in costs:
        return None, (
            f"{seconds:.3g} s is below the map's cheapest cost ({numeric[0]:g} s): read at its "
            "recorded seconds (the map's own programs' execution times)"
        )
    if not numeric:
        raise ValueError("the regime map has no cost axis")
    return numeric[0], f"{seconds:.3g} s is below the map's cheapest cost: read at {numeric[0]:g} s"


def pick_params(params, n: float) -> tuple[float, str]:
    """The map's model size for N = `n` (0: unknown), and a note."""
    sizes = sorted(float(p) for p in params)
    if not sizes:
        raise ValueError("the regime map has no model-size axis")
    if n <= 0:
        return sizes[-1], f"model size not given: the map's largest, N = {sizes[-1] / 1e9:g}B"
    best = min(sizes, key=lambda p: abs(math.log(p / n)))
    return best, "" if best == n else f"the map's size nearest to N = {n / 1e9:g}B"


def ratio_at(cells: list[dict], q: float, key: str = "ratio_vs_best_real") -> tuple:
    """`(median ratio at q, note)`: linear in realised q between the synthetic cells
    (a cell whose median is None, no seed reached the target, counts 0, as in
    `regime.break_even`); clamped at the map's q range, and said so."""
    pts = sorted(
        (c["q_realised"], c[key]["median"] or 0.0) for c in cells if c["q_realised"] is not None
    )
    if not pts:
        return None, "no synthetic cell of this arm at this cost"
    x, y = np.array(pts).T
    note = ""
    if q < x[0] or q > x[-1]:
        note = f"q outside the map's realised range [{x[0]:.2f}, {x[-1]:.2f}]: read at its edge"
    return float(np.interp(q, x, y)), note


def readout(payload: dict, *, q: float | None, seconds: float, params: float) -> dict:
    """The map's cell for the user's cost and N, each arm at q, and the recommendation.

    Args:
      payload: the map's `results.json` (`load_map`).
      q: the probe's mean within-group Spearman (None: it has none).
      seconds: the user's seconds per execution (> 0).
      params: the user's model size N (0: unknown).

    Returns:
      `cost`, `params`, their `notes`, `rho` (the map's anchor fraction), `group_size`
      (the map's G), `arms` (per arm: ratios at q and the break-even q at this cell),
      `anchors_only` (its ratio against `real_best`), `best_real` (the real cell's
      label), and `recommendation` {`arm`, `rho`, `ratio`, `why`}.
    """
    a, config = payload["analysis"], payload.get("config", {})
    cost, cost_note = pick_cost(a["costs"], seconds)
    n, n_note = pick_params(a["params"], params)
    rho = config.get("anchor_fraction")
    best_real = config.get("study", {}).get("best_real") or TARGET
    ao = a["anchors_only_vs_best_real"].get(f"{cost_key(cost)}|N{n:g}", {}).get("median")
    arms = {}
    for arm in a["arms"]:
        cells = [r for r in a["rows"] if r["arm"] == arm and not r["learned"]
                 and r["cost"] == cost and r["params"] == n]  # fmt: skip
        be = next((b for b in a["break_even"]
                   if b["arm"] == arm and b["cost"] == cost and b["params"] == n), {})  # fmt: skip
        entry = {"q_break_even": be.get("q_break_even"),
                 "q_break_even_vs_anchors_only": be.get("q_break_even_vs_anchors_only"),
                 "ratio_vs_best_real": None, "ratio_vs_anchors_only": None, "note": ""}  # fmt: skip
        if q is not None:
            entry["ratio_vs_best_real"], entry["note"] = ratio_at(cells, q)
            entry["ratio_vs_anchors_only"], _ = ratio_at(cells, q, "ratio_vs_anchors_only")
        arms[arm] = entry
    out = {
        "cost": cost, "params": n, "notes": [x for x in (cost_note, n_note) if x],
        "rho": rho, "group_size": config.get("group_size"), "arms": arms,
        "anchors_only": ao, "best_real": best_real,
    }  # fmt: skip
    out["recommendation"] = recommend(out, q)
    return out


def recommend(cell: dict, q: float | None) -> dict:
    """What reaches `real_best`'s level for the least compute at this cell: the candidate
    with the largest median ratio against `real_best` (real GRPO itself is 1; on a tie
    the one without a world model)."""
    rho = cell["rho"]
    best = {"arm": cell["best_real"], "rho": 1.0, "ratio": 1.0,
            "why": "no world-model arm nor anchors_only needs less compute than real GRPO "
                   "at this cost"}  # fmt: skip
    if cell["anchors_only"] is not None and cell["anchors_only"] > best["ratio"]:
        best = {"arm": CONTROL, "rho": rho, "ratio": cell["anchors_only"],
                "why": "real GRPO on the anchor groups alone is the cheapest way there; "
                       "no world-model arm beats it at this q"}  # fmt: skip
    if q is None:
        best["why"] = (
            "the probe has no within-group Spearman, so the world model cannot be placed on "
            "the map; " + best["why"]
        )
        return best
    for arm, entry in cell["arms"].items():
        r = entry["ratio_vs_best_real"]
        if r is not None and r > best["ratio"]:
            best = {"arm": arm, "rho": rho, "ratio": r,
                    "why": f"at q = {q:.2f} the map's `{arm}` reaches real GRPO's level for "
                           "the least compute"}  # fmt: skip
    return best
