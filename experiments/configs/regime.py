r"""The regime map: world-model quality x execution cost x model size (`wmrl_jax.studies.regime`).

    make study-realsweep    # first: the best real cell, picked on seeds the map does not use
    python -m experiments.regime --config=experiments/configs/regime.py \
        --workdir=outputs/regime --readme=README.md

Every run is the compute study's (`study_compute.py`: the grown suite, replayed,
one anchor group of ten per step, the same warm start per seed) stopped at an
update cap instead of a compute budget, with the exact expected held-out
percentile after every update, so each run's compute can be priced afterwards
at every execution cost and model size. Per seed: `anchors_only`, `real_best`
(the real sweep's pick: `--config.study.best_real=<label>`, or read from
`study.best_real_from`), `wmrl` with the learned world model, and `wmrl` with
the synthetic world model at each target q. Variants: ``:ppi`` adds
`wmrl_ppi` (learned and at every q; run it with ``--extend`` after the default,
so that each command stays within about an hour here); ``:runlocal`` is the
tests' tiny version (the core suite, one seed, a few updates).
"""

from experiments.configs import study_compute
from wmrl_jax.studies import regime
from wmrl_jax.train.config import override

Q = (0.0, 0.2, 0.4, 0.6, 0.8)  # Target within-group Spearman of the synthetic world model.
COSTS = (0.0, 30.0, 300.0, 1800.0)  # Seconds per execution; 0: each run's recorded seconds.
PARAMS = (1e9, 9e9)  # N of the modelled LLM, for the token costs.


def get_config(arg: str | None = None):
    """The map's config; `arg` selects a variant ("ppi", "runlocal")."""
    known = ("ppi", "runlocal")
    if arg not in (None, "", *known):
        raise ValueError(f"unknown config variant {arg!r} (known: {', '.join(known)})")
    config = study_compute.get_config("runlocal" if arg == "runlocal" else None)
    arms, qs, costs, params = ("wmrl",), Q, COSTS, PARAMS
    steps, seeds, best = 400, 10, ""  # 10 paired seeds: about 4.3 h from scratch on 2 cores
    if arg == "ppi":
        arms = ("wmrl", "wmrl_ppi")
    if arg == "runlocal":
        qs, costs, params, steps, seeds = (0.0, 0.8), (0.0, 300.0), (1e9,), 6, 1
        best = "real_g2_lr0.001"
    return override(config, **{
        # An update cap, no compute budget: a run's trajectory does not depend on the costs.
        "num_steps": steps, "optimizer.total_steps": steps, "budget.compute_seconds": 0.0,
        "eval_every": steps, "study.exact_every": 1, "study.num_seeds": seeds,
        "study.arms": ("anchors_only", *arms),  # The control and the learned world model.
        "study.variants": regime.variants(arms, qs),
        "study.real_sweep_groups": (), "study.real_sweep_lr": (),
        "study.best_real": best,
        # Where `make study-realsweep` names its pick, when study.best_real is not given.
        "study.best_real_from": "outputs/study_compute_realsweep/results.json",
        "study.regime_arms": arms, "study.regime_q": qs,
        "study.regime_costs": costs, "study.regime_params": params,
    })  # fmt: skip
