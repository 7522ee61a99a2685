"""The compute study's runs: arms, sweeps and named variants."""

import json

import pytest

from experiments.configs import study_compute
from wmrl_jax.studies import compute
from wmrl_jax.studies.runs import Variant
from wmrl_jax.train.config import override


def _config(**study):
    config = study_compute.get_config()
    with config.unlocked():
        for k, v in study.items():
            config.study[k] = v
    return config


def test_parse_variant_literals_and_strings():
    label, overrides = compute.parse_variant(
        "wmrl_wm: arm=wmrl, agent.recipe.warm_start.steps=600, correction.wm_var=per_sample"
    )
    assert label == "wmrl_wm"
    assert overrides == {
        "arm": "wmrl", "agent.recipe.warm_start.steps": 600, "correction.wm_var": "per_sample"
    }  # fmt: skip


@pytest.mark.parametrize(
    "spec", ["no colon arm=wmrl", ": arm=wmrl", "x: correction.wm_var=per_sample", "x: arm"]
)
def test_parse_variant_refuses_malformed(spec):
    with pytest.raises(ValueError, match="study variant"):
        compute.parse_variant(spec)


def test_study_runs_order_and_labels():
    config = _config(
        arms=("real", "wmrl"), rho_sweep=(0.2,), warm_sweep=(600,), warm_sweep_arms=("wmrl",),
        variants=("wmrl_pv: arm=wmrl, correction.wm_var=per_sample",),
    )  # fmt: skip
    runs = compute.study_runs(config)
    assert [label for label, _ in runs] == [
        "real", "wmrl", "wmrl_rho0.2", "wmrl_warm600", "wmrl_pv"
    ]  # fmt: skip
    assert runs[-1][1] == {"arm": "wmrl", "correction.wm_var": "per_sample"}


def test_study_runs_refuses_unknown_field_and_shared_label():
    with pytest.raises(ValueError, match="no field 'correction.wm_varr'"):
        compute.study_runs(_config(variants=("x: arm=wmrl, correction.wm_varr=per_sample",)))
    with pytest.raises(ValueError, match="share a label"):
        compute.study_runs(_config(arms=("wmrl",), variants=("wmrl: arm=wmrl_local",)))


def test_real_sweep_cells_and_the_pick():
    config = _config(real_sweep_groups=(1, 10), real_sweep_lr=(1e-3, 3e-3))
    labels = dict(compute.study_runs(config))
    # The config's own cell (10 groups, 1e-3) is `real` itself.
    assert "real_g10_lr0.001" not in labels
    assert labels["real_g1_lr0.003"] == {"arm": "real", "tasks_per_step": 1, "optimizer.lr": 3e-3}
    assert {"real_g1_lr0.001", "real_g10_lr0.003"} <= set(labels)
    config = _config(best_real="real_g5_lr0.0003")
    assert dict(compute.study_runs(config))["real_best"] == {
        "arm": "real", "tasks_per_step": 5, "optimizer.lr": 3e-4
    }  # fmt: skip
    with pytest.raises(ValueError, match="best_real"):
        compute.study_runs(_config(best_real="g5"))


def test_a_variant_is_structured_and_the_string_form_reads_the_same():
    structured = Variant("wmrl_warm600", "wmrl", (("agent.recipe.warm_start.steps", 600),))
    assert Variant.parse("wmrl_warm600: arm=wmrl, agent.recipe.warm_start.steps=600") == structured
    # The config's JSON (results.json, checkpoints) keeps it as a list; it reads back.
    assert Variant.of(json.loads(json.dumps(structured))) == structured
    assert structured.overrides() == {"arm": "wmrl", "agent.recipe.warm_start.steps": 600}
    both = _config(variants=(structured, "pv: arm=wmrl, correction.wm_var=per_sample"))
    runs = dict(compute.study_runs(both))
    assert runs["wmrl_warm600"] == structured.overrides()
    assert runs["pv"] == {"arm": "wmrl", "correction.wm_var": "per_sample"}
    for bad in (("x", "", ()), ("x", "wmrl", (("arm", "real"),)), ("x", "wmrl")):
        with pytest.raises(ValueError, match="study variant"):
            Variant.of(bad)


def test_the_wm_variants_are_the_ones_the_string_form_named():
    """`:wm`'s variants, written as `Variant`s, are the runs its earlier strings named."""
    warm = "agent.recipe.warm_start.steps=600"
    strings = (
        "wmrl_pervar: arm=wmrl, correction.wm_var=per_sample",
        "wmrl_aux3: arm=wmrl, train.loss.aux_coef=3.0",
        f"wmrl_warm600: arm=wmrl, {warm}",
        f"anchors_only_warm600: arm=anchors_only, {warm}",
        f"real_warm600: arm=real, {warm}",
    )
    config = study_compute.get_config("wm")
    assert compute.study_runs(config) == compute.study_runs(
        override(config, **{"study.variants": strings})
    )
